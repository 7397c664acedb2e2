//! Ring allreduce across N local ranks, verified element by element.
//!
//! ```text
//! cargo run --release --example ring_allreduce -- [--ranks 4] [--bytes 16M] [--transport tcp|uring|shm|mem] [--iters 20]
//! ```
//!
//! Started by hand, it launches `--ranks` copies of itself as processes (tcp, uring, shm) or
//! runs the ranks as tasks of one process (mem). Started by a launcher (`hcomm run`,
//! `mpirun`, `srun`, `torchrun`), it is one rank and takes rank, size and rendezvous
//! from the environment.
//!
//! Each rank fills its buffer with `(rank + 1) * (i % 251 + 1)`, so the exact sum is
//! `n (n + 1) / 2 * (i % 251 + 1)`, which f32 represents exactly; every element is
//! checked. Rank 0 prints the median time, algbw = S / t and busbw = algbw · 2(n−1)/n
//! (the nccl-tests convention).

use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use common::{fail, launch_self, parse_size};
use hcomm::{AllreduceAlgo, Communicator, LocalTransport, ReduceOp};
use tracing_subscriber::prelude::*;

mod common;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Kind {
    /// TCP on tokio to every peer (shared memory off).
    Tcp,
    /// TCP on io_uring to every peer.
    Uring,
    /// Shared-memory rings to the peers on this host (the default of `hcomm::init`).
    Shm,
    /// Ranks as tasks of one process.
    Mem,
}

#[derive(Parser, Debug, Clone)]
#[command(about = "Verified ring allreduce across local ranks")]
struct Args {
    /// Number of ranks when not started by a launcher.
    #[arg(long, default_value_t = 4)]
    ranks: usize,
    /// Buffer size per rank in bytes (suffixes K, M, G), f32 elements.
    #[arg(long, default_value = "16M", value_parser = parse_size)]
    bytes: usize,
    /// Transport.
    #[arg(long, value_enum, default_value_t = Kind::Tcp)]
    transport: Kind,
    /// Timed iterations (after 2 warm-up iterations).
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Allreduce algorithm: ring, recursive_doubling, rabenseifner, tree, ordered, or
    /// auto (the cost model's choice, or HCOMM_ALGO_ALLREDUCE).
    #[arg(long, default_value = "ring")]
    algo: String,
}

/// The algorithm to force, or `None` for the communicator's choice.
fn algo_of(args: &Args) -> Option<AllreduceAlgo> {
    match args.algo.as_str() {
        "auto" => None,
        name => Some(name.parse().unwrap_or_else(|e| fail(e))),
    }
}

fn fill(rank: usize, buf: &mut [f32]) {
    for (i, x) in buf.iter_mut().enumerate() {
        *x = ((rank + 1) * (i % 251 + 1)) as f32;
    }
}

fn verify(n: usize, rank: usize, buf: &[f32]) -> Result<(), String> {
    let tri = (n * (n + 1) / 2) as f32;
    match buf.iter().enumerate().find(|(i, x)| **x != tri * (i % 251 + 1) as f32) {
        None => Ok(()),
        Some((i, x)) => Err(format!("rank {rank}: element {i} is {x}, expected {}", tri * (i % 251 + 1) as f32)),
    }
}

/// Runs warm-up and timed iterations on one rank; returns the per-iteration times.
async fn rank_main<T: LocalTransport>(comm: &Communicator<T>, args: &Args) -> Result<Vec<Duration>, String> {
    let count = args.bytes / 4;
    let mut buf = vec![0f32; count];
    let mut times = Vec::with_capacity(args.iters);
    for it in 0..args.iters + 2 {
        fill(comm.rank(), &mut buf);
        comm.barrier().await.map_err(|e| e.to_string())?;
        let t0 = Instant::now();
        match algo_of(args) {
            Some(a) => comm.all_reduce_with(&mut buf, ReduceOp::Sum, a).await,
            None => comm.all_reduce(&mut buf, ReduceOp::Sum).await,
        }
        .map_err(|e| e.to_string())?;
        let dt = t0.elapsed();
        verify(comm.size(), comm.rank(), &buf)?;
        if it >= 2 {
            times.push(dt);
        }
    }
    Ok(times)
}

fn report(n: usize, transport: &str, how: &str, args: &Args, times: &mut [Duration]) {
    times.sort();
    let med = times[times.len() / 2].as_secs_f64();
    let bytes = (args.bytes / 4 * 4) as f64;
    let algbw = bytes / med / 1e9;
    let busbw = algbw * 2.0 * (n as f64 - 1.0) / n as f64;
    println!(
        "allreduce ({}): {n} ranks ({how}), transport {transport}, {} bytes f32 sum, {} iterations",
        args.algo,
        bytes as u64,
        times.len()
    );
    println!(
        "  verified: every element of every rank equals the exact sum\n  time median {:.3} ms (min {:.3}, max {:.3})  algbw {algbw:.3} GB/s  busbw {busbw:.3} GB/s",
        med * 1e3,
        times[0].as_secs_f64() * 1e3,
        times[times.len() - 1].as_secs_f64() * 1e3
    );
}

/// One rank of a launched job.
fn as_rank(args: &Args) {
    let run = |comm: Communicator| async move {
        let mut times = rank_main(&comm, args).await.unwrap_or_else(|e| fail(e));
        if comm.rank() == 0 {
            report(comm.size(), comm.transport_name(), "one process each", args, &mut times);
        }
        comm.finalize().await.unwrap_or_else(|e| fail(e));
    };
    match args.transport {
        Kind::Tcp | Kind::Shm => tokio::runtime::Runtime::new().unwrap_or_else(|e| fail(e)).block_on(async {
            let mut cfg = hcomm::Config::from_env().unwrap_or_else(|e| fail(e));
            cfg.shm = args.transport == Kind::Shm;
            run(cfg.connect().await.unwrap_or_else(|e| fail(e))).await
        }),
        #[cfg(all(feature = "uring", target_os = "linux"))]
        Kind::Uring => tokio_uring::start(async {
            let mut cfg = hcomm::Config::from_env().unwrap_or_else(|e| fail(e));
            cfg.shm = false;
            run(cfg.connect_uring().await.unwrap_or_else(|e| fail(e))).await
        }),
        #[cfg(not(all(feature = "uring", target_os = "linux")))]
        Kind::Uring => fail("this build has no io_uring transport (Linux, feature `uring`)"),
        Kind::Mem => fail("--transport mem runs ranks as tasks of one process; start it without a launcher"),
    }
}

fn main() {
    // Logs as RUST_LOG asks, and HCOMM_STATS' statistics beside them.
    let stats = hcomm::stats::layer_from_env().unwrap_or_else(|e| fail(e));
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(tracing_subscriber::EnvFilter::from_default_env()),
        )
        .with(stats)
        .init();
    let args = Args::parse();
    if args.ranks == 0 {
        fail("--ranks must be at least 1");
    }
    algo_of(&args);
    if hcomm::env::LaunchEnv::launched() {
        return as_rank(&args);
    }
    match args.transport {
        Kind::Mem => {
            tokio::runtime::Runtime::new().unwrap_or_else(|e| fail(e)).block_on(async {
                let comms = hcomm::local(args.ranks);
                let results = futures::future::join_all(comms.iter().map(|c| rank_main(c, &args))).await;
                let mut all = Vec::new();
                for r in results {
                    all.push(r.unwrap_or_else(|e| fail(e)));
                }
                report(args.ranks, "mem", "tasks in one process", &args, &mut all[0]);
            });
        }
        Kind::Tcp | Kind::Uring | Kind::Shm => launch_self(args.ranks),
    }
}
