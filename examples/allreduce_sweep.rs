//! Every allreduce algorithm, forced, beside the automatic choice, over a range of
//! sizes, in one run: how close the cost model's choice comes to the best.
//!
//! ```text
//! cargo run --release --example allreduce_sweep -- [--ranks 4] [--max-bytes 16M] [--transport tcp|mem]
//! ```
//!
//! Ranks are processes over TCP (started by the example itself, or by a launcher), or
//! tasks of one process (`--transport mem`). Each cell is the median over repeated
//! allreduces (each after a barrier; rank 0's clock; the algorithms take turns within
//! each iteration), f32 sum.

use std::time::{Duration, Instant};

use clap::Parser;
use common::{fail, launch_self, parse_size, rank_runtime};
use hcomm::{AllreduceAlgo, Communicator, LocalTransport, ReduceOp};

mod common;

#[derive(Parser, Debug, Clone)]
#[command(about = "Allreduce algorithms against the automatic choice")]
struct Args {
    #[arg(long, default_value_t = 4)]
    ranks: usize,
    /// Largest size (bytes); sizes go from 8 bytes up by factors of 4.
    #[arg(long, default_value = "16M", value_parser = parse_size)]
    max_bytes: usize,
    /// tcp (processes) or mem (tasks).
    #[arg(long, default_value = "tcp")]
    transport: String,
    /// Measure the cost model's parameters first (`Communicator::calibrate`) instead
    /// of the transport's defaults.
    #[arg(long)]
    calibrate: bool,
}

const ALGOS: [Option<AllreduceAlgo>; 5] = [
    Some(AllreduceAlgo::Ring),
    Some(AllreduceAlgo::RecursiveDoubling),
    Some(AllreduceAlgo::Rabenseifner),
    Some(AllreduceAlgo::Tree),
    None,
];

fn sizes(max: usize) -> Vec<usize> {
    std::iter::successors(Some(8usize), |s| (s * 4 <= max).then_some(s * 4)).collect()
}

fn iters_for(bytes: usize) -> usize {
    (8 << 20) / bytes.max(1) + 1
}

/// Median time of one allreduce per (size, algorithm), rows by size.
async fn sweep<T: LocalTransport>(comm: &Communicator<T>, a: &Args) -> Result<Vec<Vec<Duration>>, String> {
    let mut rows = Vec::new();
    for bytes in sizes(a.max_bytes) {
        let mut buf = vec![1.0f32; bytes / 4];
        // The algorithms take turns within every iteration, so that the machine's
        // drift (it is shared) falls on all of them alike.
        let iters = iters_for(bytes).clamp(7, 200);
        let mut times: Vec<Vec<Duration>> = vec![Vec::with_capacity(iters); ALGOS.len()];
        for it in 0..iters + 1 {
            for (k, algo) in ALGOS.iter().enumerate() {
                comm.barrier().await.map_err(|e| e.to_string())?;
                let t = Instant::now();
                match algo {
                    Some(al) => comm.all_reduce_with(&mut buf, ReduceOp::Sum, *al).await,
                    None => comm.all_reduce(&mut buf, ReduceOp::Sum).await,
                }
                .map_err(|e| e.to_string())?;
                if it > 0 {
                    times[k].push(t.elapsed());
                }
            }
        }
        rows.push(
            times
                .into_iter()
                .map(|mut t| {
                    t.sort();
                    t[t.len() / 2]
                })
                .collect(),
        );
    }
    Ok(rows)
}

fn report<T: LocalTransport>(comm: &Communicator<T>, a: &Args, rows: &[Vec<Duration>], how: &str) {
    println!(
        "allreduce sweep: {} ranks ({how}), transport {}, f32 sum, median per cell (ms)",
        comm.size(),
        comm.transport_name()
    );
    println!("| bytes | ring | recursive_doubling | rabenseifner | tree | auto | auto picks | auto / best |");
    println!("|---|---|---|---|---|---|---|---|");
    for (bytes, row) in sizes(a.max_bytes).into_iter().zip(rows) {
        let ms: Vec<f64> = row.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        let best = ms[..4].iter().copied().fold(f64::INFINITY, f64::min);
        let pick = comm.tuning().allreduce_algo(comm.size(), bytes / 4 * 4, true, None);
        println!(
            "| {bytes} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {} | {:.2} |",
            ms[0],
            ms[1],
            ms[2],
            ms[3],
            ms[4],
            pick,
            ms[4] / best
        );
    }
}

fn main() {
    let a = Args::parse();
    if a.ranks == 0 {
        fail("--ranks must be at least 1");
    }
    match (a.transport.as_str(), hcomm::env::LaunchEnv::launched()) {
        ("mem", _) => rank_runtime().block_on(async {
            let comms = hcomm::local(a.ranks);
            let rows = futures::future::join_all(comms.iter().map(|c| sweep(c, &a))).await;
            let rows: Vec<_> = rows.into_iter().map(|r| r.unwrap_or_else(|e| fail(e))).collect();
            report(&comms[0], &a, &rows[0], "tasks in one process");
        }),
        ("tcp", true) => rank_runtime().block_on(async {
            let mut comm = hcomm::init().await.unwrap_or_else(|e| fail(e));
            if a.calibrate {
                let c = comm.calibrate().await.unwrap_or_else(|e| fail(e));
                if comm.rank() == 0 {
                    println!(
                        "calibrated: alpha {:.1} us, link {:.2} GB/s, reduction {:.2} GB/s",
                        c.alpha * 1e6,
                        1e-9 / c.beta,
                        1e-9 / c.gamma
                    );
                }
            }
            let rows = sweep(&comm, &a).await.unwrap_or_else(|e| fail(e));
            if comm.rank() == 0 {
                report(&comm, &a, &rows, "processes");
            }
        }),
        ("tcp", false) => launch_self(a.ranks),
        (other, _) => fail(format!("unknown transport {other:?} (tcp, mem)")),
    }
}
