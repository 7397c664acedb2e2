//! The `hcomm` command: `hcomm run -n N [--] PROGRAM [ARGS...]` starts N local ranks;
//! `hcomm stats FILES...` merges per-rank statistics files (`HCOMM_STATS_FILE`);
//! `hcomm topo` prints the topology (`hcomm run -n N -- hcomm topo`: the job's);
//! `hcomm settings` lists the `HCOMM_*` settings.

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
    /// Merge per-rank statistics files (written with HCOMM_STATS=1 and
    /// HCOMM_STATS_FILE) into one report: per operation the slowest rank, the
    /// busiest links and the longest waits.
    Stats {
        /// The files, one per rank.
        #[arg(required = true)]
        files: Vec<std::path::PathBuf>,
        /// Also print each rank's own summary.
        #[arg(long)]
        per_rank: bool,
    },
    /// Print the topology. Alone: this process's placement (host identity, rack from
    /// HCOMM_RACK or HCOMM_TOPOLOGY, NUMA node). As a rank of a job (`hcomm run -n N
    /// -- hcomm topo`, or any launcher HComm reads): the job's racks, hosts and
    /// ranks, printed by rank 0 after bootstrap.
    Topo,
    /// Print every HCOMM_* setting: its default, the values it takes and what it does
    /// (Markdown; the same as docs/settings.md).
    Settings,
}

fn topo() -> i32 {
    let fail = |e: hcomm::Error| {
        eprintln!("hcomm topo: {e}");
        1
    };
    if !hcomm::env::LaunchEnv::launched() {
        // Not a rank of a job: this process's own view.
        return match hcomm::local_placement() {
            Ok(p) => {
                println!("host: {}", p.host);
                println!(
                    "rack: {}",
                    p.rack.as_deref().unwrap_or("(none: HCOMM_RACK unset, and no HCOMM_TOPOLOGY file lists this host)")
                );
                match p.numa {
                    Some(n) => println!("numa node: {n}"),
                    None => println!("numa node: (this process may run on several, or sysfs says nothing)"),
                }
                0
            }
            Err(e) => fail(e),
        };
    }
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fail(hcomm::Error::io("starting a runtime", e)),
    };
    rt.block_on(async {
        let comm = hcomm::init().await?;
        if comm.rank() == 0 {
            print!("{}", comm.topology());
        }
        comm.barrier().await?;
        comm.finalize().await
    })
    .map_or_else(fail, |()| 0)
}

fn main() {
    let cli = Cli::parse();
    let (ranks, no_prefix, mut command) = match cli.cmd {
        Cmd::Run { ranks, no_prefix, command } => (ranks, no_prefix, command),
        Cmd::Topo => std::process::exit(topo()),
        Cmd::Settings => {
            print!("{}", hcomm::settings::document());
            std::process::exit(0);
        }
        Cmd::Stats { files, per_rank } => match hcomm::stats::read_files(&files) {
            Ok(ranks) => {
                if per_rank {
                    ranks.iter().for_each(|r| print!("{}", hcomm::stats::summary(r)));
                }
                print!("{}", hcomm::stats::merge_report(&ranks));
                std::process::exit(0);
            }
            Err(e) => {
                eprintln!("hcomm stats: {e}");
                std::process::exit(1);
            }
        },
    };
    let program = command.remove(0);
    let launch =
        hcomm_launch::Launch { ranks: ranks as usize, program, args: command, prefix: !no_prefix, env: Vec::new() };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("hcomm: cannot start a runtime: {e}");
            std::process::exit(1);
        }
    };
    match rt.block_on(hcomm_launch::run(launch)) {
        Ok(o) => std::process::exit(o.code),
        Err(e) => {
            eprintln!("hcomm: {e}");
            std::process::exit(1);
        }
    }
}
