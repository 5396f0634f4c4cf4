//! `calico-bench`: runs the benchmark suite on the device `Device::auto()` finds.

use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "calico-bench",
    version,
    about = "Benchmark Calico's ops on the device found and write reports/<device>/"
)]
struct Cli {
    #[command(flatten)]
    bench: calico_benches::BenchArgs,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.bench.execute() {
        Ok(_) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("calico-bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
