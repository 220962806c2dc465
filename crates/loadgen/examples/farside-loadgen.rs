//! Stand-alone load generator for benchmarks and the wrk cross-check
//! (`farside loadgen` is the product command line).

use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: farside_loadgen::LoadgenArgs,
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = farside_loadgen::run_cli(&cli.args) {
        eprintln!("farside-loadgen: {e}");
        std::process::exit(1);
    }
}
