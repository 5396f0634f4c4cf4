//! Progress output (a bar on a terminal, one line per finished case always) and a watchdog
//! that ends the process if one case stalls, so an unattended run cannot hang.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Prints a finished case above the bar, or plainly when the bar is hidden.
#[derive(Debug)]
pub struct Progress {
    bar: ProgressBar,
    visible: bool,
}

impl Progress {
    pub fn new(len: usize) -> Progress {
        // The bar draws on stderr and case lines go above it; when either stream is not a
        // terminal the bar is hidden and lines go plainly to stdout.
        let visible = std::io::stdout().is_terminal() && std::io::stderr().is_terminal();
        let bar = if visible {
            let bar = ProgressBar::new(len as u64);
            if let Ok(style) = ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed} {msg}")
            {
                bar.set_style(style);
            }
            bar
        } else {
            ProgressBar::hidden()
        };
        Progress { bar, visible }
    }

    pub fn start(&self, name: &str) {
        self.bar.set_message(name.to_string());
    }

    pub fn done(&self, line: String) {
        if self.visible {
            self.bar.println(line);
        } else {
            println!("{line}");
        }
        self.bar.inc(1);
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// Ends the process (exit code 3) when no case finishes for `limit`: a kernel that never
/// completes blocks its event wait forever, and nothing else could stop it.
#[derive(Debug)]
pub struct Watchdog {
    start: Instant,
    /// Milliseconds since `start` of the last progress.
    last: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Watchdog {
    pub fn start(limit: Duration) -> Watchdog {
        let start = Instant::now();
        let last = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (l, s) = (last.clone(), stop.clone());
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(500));
            if s.load(Ordering::Relaxed) {
                return;
            }
            let idle = start.elapsed().as_millis() as u64 - l.load(Ordering::Relaxed);
            if idle > limit.as_millis() as u64 {
                eprintln!(
                    "calico-bench: watchdog: no case finished in {} s (a kernel may hang); exiting. The cases finished so far are in the partial report.",
                    limit.as_secs()
                );
                std::process::exit(3);
            }
        });
        Watchdog { start, last, stop }
    }

    /// Records progress.
    pub fn tick(&self) {
        self.last
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
