//! A data-parallel training step in miniature: computation overlapped with
//! communication.
//!
//! ```text
//! cargo run --release --example overlap -- [--ranks 4] [--buckets 8] [--bucket-bytes 1M] [--work 2] [--iters 5]
//! ```
//!
//! A "backward pass" produces gradient buckets one after another (real arithmetic, on
//! tokio's blocking pool so that the runtime thread stays free to drive the
//! transport); each bucket's allreduce is spawned the moment the bucket is ready, and
//! the step awaits them all at the end. For comparison it also times the computation
//! alone, the communication alone, and the step without overlap (compute every
//! bucket, then allreduce them). Rank 0 prints the medians and the fraction of the
//! communication that the overlap hid:
//! `hidden = (t_sequential − t_overlapped) / t_communication`.
//! Both modes' results are compared bit for bit.
//!
//! Started by hand it launches `--ranks` copies of itself (processes, over TCP);
//! started by a launcher it is one rank.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use common::{fail, launch_self, parse_size};
use hcomm::{Communicator, ReduceOp};

mod common;

#[derive(Parser, Debug, Clone)]
#[command(about = "Overlap of gradient computation and allreduce")]
struct Args {
    /// Number of ranks when not started by a launcher.
    #[arg(long, default_value_t = 4)]
    ranks: usize,
    /// Gradient buckets per step.
    #[arg(long, default_value_t = 8)]
    buckets: usize,
    /// Bytes per bucket (f32; suffixes K, M).
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    bucket_bytes: usize,
    /// Arithmetic per gradient element (inner iterations); the default makes the
    /// computation about as long as the communication on a 2-core VM.
    #[arg(long, default_value_t = 2)]
    work: u32,
    /// Timed steps per mode (after one warm-up).
    #[arg(long, default_value_t = 5)]
    iters: usize,
}

/// One bucket's gradient: a short recurrence per element, different on every rank.
fn gradient(rank: usize, bucket: usize, len: usize, work: u32) -> Vec<f32> {
    (0..len)
        .map(|i| {
            let mut x = (i as f32 * 1e-3 + bucket as f32) * (rank + 1) as f32;
            for _ in 0..work {
                x = x * 0.999_9 + (x * 0.5).sin() * 1e-3;
            }
            x
        })
        .collect()
}

async fn compute(rank: usize, bucket: usize, a: &Args) -> Vec<f32> {
    let (len, work) = (a.bucket_bytes / 4, a.work);
    tokio::task::spawn_blocking(move || gradient(rank, bucket, len, work)).await.unwrap_or_else(|e| fail(e))
}

struct Step {
    compute: Duration,
    comm: Duration,
    sequential: Duration,
    overlapped: Duration,
}

async fn step(comm: &Arc<Communicator>, a: &Args) -> Result<Step, String> {
    let r = comm.rank();
    let sync = || async { comm.barrier().await.map_err(|e| e.to_string()) };

    // Computation alone.
    sync().await?;
    let t = Instant::now();
    let mut grads = Vec::new();
    for k in 0..a.buckets {
        grads.push(compute(r, k, a).await);
    }
    let compute_t = t.elapsed();

    // Communication alone: every bucket's allreduce at once.
    sync().await?;
    let t = Instant::now();
    let mut reduced = grads.clone();
    futures::future::try_join_all(reduced.iter_mut().map(|g| comm.all_reduce(g, ReduceOp::Sum)))
        .await
        .map_err(|e| e.to_string())?;
    let comm_t = t.elapsed();

    // No overlap: compute everything, then communicate.
    sync().await?;
    let t = Instant::now();
    let mut seq = Vec::new();
    for k in 0..a.buckets {
        seq.push(compute(r, k, a).await);
    }
    futures::future::try_join_all(seq.iter_mut().map(|g| comm.all_reduce(g, ReduceOp::Sum)))
        .await
        .map_err(|e| e.to_string())?;
    let sequential_t = t.elapsed();

    // Overlap: each bucket's allreduce runs while the next bucket is computed.
    sync().await?;
    let t = Instant::now();
    let mut inflight = Vec::new();
    for k in 0..a.buckets {
        let g = compute(r, k, a).await;
        inflight.push(tokio::spawn(comm.all_reduce_owned(g, ReduceOp::Sum)));
    }
    let mut over = Vec::new();
    for h in inflight {
        over.push(h.await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?);
    }
    let overlapped_t = t.elapsed();

    if over != seq || seq != reduced {
        return Err(format!("rank {r}: overlapped and sequential results differ"));
    }
    Ok(Step { compute: compute_t, comm: comm_t, sequential: sequential_t, overlapped: overlapped_t })
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e3
}

fn as_rank(a: &Args) {
    tokio::runtime::Runtime::new().unwrap_or_else(|e| fail(e)).block_on(async {
        let comm = Arc::new(hcomm::init().await.unwrap_or_else(|e| fail(e)));
        step(&comm, a).await.unwrap_or_else(|e| fail(e));
        let steps: Vec<Step> = {
            let mut v = Vec::new();
            for _ in 0..a.iters {
                v.push(step(&comm, a).await.unwrap_or_else(|e| fail(e)));
            }
            v
        };
        if comm.rank() == 0 {
            let c = median(steps.iter().map(|s| s.compute).collect());
            let m = median(steps.iter().map(|s| s.comm).collect());
            let s = median(steps.iter().map(|s| s.sequential).collect());
            let o = median(steps.iter().map(|s| s.overlapped).collect());
            println!(
                "overlap: {} ranks (processes), {} buckets x {} bytes f32, work {}, {} steps (median)",
                comm.size(),
                a.buckets,
                a.bucket_bytes,
                a.work,
                a.iters
            );
            println!("  compute only           {c:9.3} ms");
            println!("  communication only     {m:9.3} ms");
            println!("  compute, then allreduce {s:8.3} ms");
            println!("  overlapped             {o:9.3} ms");
            println!("  hidden fraction of communication: {:.0}%", 100.0 * (s - o) / m);
            println!("  verified: overlapped and sequential results are bitwise equal on every rank");
        }
        comm.finalize().await.unwrap_or_else(|e| fail(e));
    });
}

fn main() {
    let a = Args::parse();
    if a.ranks == 0 || a.buckets == 0 || a.iters == 0 {
        fail("--ranks, --buckets and --iters must be at least 1");
    }
    if hcomm::env::LaunchEnv::launched() {
        return as_rank(&a);
    }
    launch_self(a.ranks)
}
