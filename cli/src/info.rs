//! `calico info`: what discovery found.

use calico::{Arch, BackendKind, Device, Error, Result};

pub fn run() -> Result<bool> {
    let d = Device::discover();
    match &d.forced {
        Some(f) => println!("Backends tried (CALICO_BACKEND={f}):"),
        None => println!("Backends tried, in order:"),
    }
    for (kind, attempt) in &d.attempts {
        match attempt {
            Ok(dev) => println!(
                "  {:<5} found: {} ({})",
                kind.name(),
                dev.name(),
                dev.arch().target
            ),
            Err(Error::BackendUnavailable { reason, .. }) => {
                println!("  {:<5} unavailable: {reason}", kind.name())
            }
            Err(e) => println!("  {:<5} unavailable: {e}", kind.name()),
        }
    }
    if d.forced.is_none() {
        for kind in [BackendKind::Cuda, BackendKind::Hip, BackendKind::Cpu] {
            if !d.attempts.iter().any(|(k, _)| *k == kind) {
                println!(
                    "  {:<5} not tried (an earlier backend was chosen)",
                    kind.name()
                );
            }
        }
    }
    let Some(dev) = &d.chosen else {
        println!("\nNo device chosen.");
        return Ok(false);
    };
    println!("\nChosen: {} ({})", dev.name(), dev.device_id());
    print_arch(dev.arch());
    Ok(true)
}

fn print_arch(a: &Arch) {
    println!("Arch:");
    println!("  vendor                 {:?}", a.vendor);
    println!("  target                 {}", a.target);
    println!("  lanes                  {}", a.lanes);
    println!("  compute units          {}", a.compute_units);
    println!(
        "  shared mem per block   {} bytes ({} KiB)",
        a.shared_mem_per_block,
        a.shared_mem_per_block / 1024
    );
    if a.l2_bytes == 0 {
        println!("  L2 / last-level cache  unknown");
    } else {
        println!(
            "  L2 / last-level cache  {} bytes ({} MiB)",
            a.l2_bytes,
            a.l2_bytes >> 20
        );
    }
    println!(
        "  fp8                    {}",
        a.fp8.map_or("none".into(), |f| format!("{f:?}"))
    );
    let copies: Vec<String> = a.async_copies.iter().map(|c| format!("{c:?}")).collect();
    println!(
        "  async copies           {}",
        if copies.is_empty() {
            "none".into()
        } else {
            copies.join(", ")
        }
    );
    if a.mma.is_empty() {
        println!("  mma atoms              none");
    } else {
        println!("  mma atoms:");
        for m in &a.mma {
            println!(
                "    {:?} {}x{} -> {} m{}n{}k{}",
                m.kind, m.a, m.b, m.acc, m.m, m.n, m.k
            );
        }
    }
}
