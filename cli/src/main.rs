//! `calico`: device info, kernel compile/disassembly, a correctness check against the CPU
//! backend, and the benchmark suite.

mod check;
mod compile;
mod info;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(
    name = "calico",
    version,
    about = "Calico: fast AI GPU kernels on CUDA, HIP and the CPU"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Backends tried in order, the device chosen and its architecture.
    Info,
    /// Print the assembled source of an op's kernel variants for a target; with --disasm,
    /// compile them (no device needed) and print the disassembly and key instruction counts.
    Compile(compile::CompileArgs),
    /// Run the benchmark suite on the device found and write reports/<device>/.
    Bench(calico_benches::BenchArgs),
    /// Run each op once on the device found and compare with the CPU backend.
    Check,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info => info::run(),
        Command::Compile(args) => compile::run(&args).map(|()| true),
        Command::Bench(args) => args.execute().map(|()| true),
        Command::Check => check::run(),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("calico: {e}");
            ExitCode::FAILURE
        }
    }
}
