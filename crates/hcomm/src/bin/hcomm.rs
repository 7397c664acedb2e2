//! The `hcomm` command: `hcomm run -n N [--] PROGRAM [ARGS...]` starts N local ranks.

use std::ffi::OsString;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "hcomm", version, about = "HComm job launcher")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start N ranks of PROGRAM on this host, with HCOMM_RANK, HCOMM_SIZE, HCOMM_ADDR and
    /// HCOMM_JOB_ID set; prefix their output with the rank; stop all when one fails.
    Run {
        /// Number of ranks.
        #[arg(short = 'n', long = "ranks", value_parser = clap::value_parser!(u32).range(1..=4096))]
        ranks: u32,
        /// Do not prefix output lines with the rank.
        #[arg(long)]
        no_prefix: bool,
        /// The program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<OsString>,
    },
}

fn main() {
    let cli = Cli::parse();
    let Cmd::Run { ranks, no_prefix, mut command } = cli.cmd;
    let program = command.remove(0);
    let launch =
        hcomm::launch::Launch { ranks: ranks as usize, program, args: command, prefix: !no_prefix, env: Vec::new() };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("hcomm: cannot start a runtime: {e}");
            std::process::exit(1);
        }
    };
    match rt.block_on(hcomm::launch::run(launch)) {
        Ok(o) => std::process::exit(o.code),
        Err(e) => {
            eprintln!("hcomm: {e}");
            std::process::exit(1);
        }
    }
}
