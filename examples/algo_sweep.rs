//! Every algorithm of a collective, forced, beside the automatic choice, over a range
//! of sizes, in one run: how close the selection comes to the best.
//!
//! ```text
//! cargo run --release --example algo_sweep -- [--ranks 4] [--op all] [--max-bytes 16M]
//!     [--transport tcp|mem] [--calibrate | --tune] [--step 2] [--runs 3]
//! ```
//!
//! Ranks are processes over TCP (started by the example itself, or by a launcher), or
//! tasks of one process (`--transport mem`). The selection is the cost model with the
//! transport's defaults, or measured parameters (`--calibrate`,
//! `Communicator::calibrate`), or the table `Communicator::tune` measures first
//! (`--tune`; it measures at 8 B × 2^k by default, `--tune-step 4` for 8 B × 4^k so
//! that with `--step 2` half of the swept sizes fall between its points). Each cell is the median over repeated runs, each after
//! a barrier, of the slowest rank's time; the columns run in a shuffled order in each round,
//! each timed run after an untimed run of the same column (`--unprimed`: without it, for
//! the tuner too; see `TuneOptions::primed`).
//! `--confirm` then times the automatic choice against the best forced column head to
//! head wherever its algorithm differs or it took over 1.10x (see `duels`; medians of
//! `--duel-blocks` blocks, 5 by default; `--aa` also times the best against itself
//! alike, the duels' own noise). f32 data,
//! sum. `RUST_LOG=hcomm::tune=debug` logs (on stderr) each timing the tuner makes
//! (`tune timed`: family, size, pass, algorithms, the slowest rank's median times);
//! `RUST_LOG=hcomm::adapt=debug` each switch of the adaptive selection, and
//! `hcomm::adapt=trace` each timing it keeps (family, class, call number, algorithm).

use std::time::{Duration, Instant};

use clap::Parser;
use common::{fail, launch_self, parse_size};
use hcomm::{
    AllgatherAlgo, AllreduceAlgo, AlltoallAlgo, BcastAlgo, Communicator, LocalTransport, ReduceOp, ReduceScatterAlgo,
    TuneOptions,
};

mod common;

#[derive(Parser, Debug, Clone)]
#[command(about = "Collective algorithms against the automatic choice")]
struct Args {
    #[arg(long, default_value_t = 4)]
    ranks: usize,
    /// allreduce, broadcast, allgather, reduce_scatter, alltoall, or all.
    #[arg(long, default_value = "all")]
    op: String,
    /// Largest size (bytes): the whole buffer for allreduce and broadcast, all blocks
    /// together for the others.
    #[arg(long, default_value = "16M", value_parser = parse_size)]
    max_bytes: usize,
    /// Factor between consecutive sizes (from 8 bytes).
    #[arg(long, default_value_t = 4)]
    step: usize,
    /// tcp (processes) or mem (tasks).
    #[arg(long, default_value = "tcp")]
    transport: String,
    /// Measure the cost model's parameters first.
    #[arg(long, conflicts_with = "tune")]
    calibrate: bool,
    /// Measure the selection table first (`Communicator::tune`).
    #[arg(long)]
    tune: bool,
    /// Factor between the sizes `--tune` measures.
    #[arg(long, default_value_t = 2)]
    tune_step: usize,
    /// Passes `--tune` makes (`TuneOptions::passes`; the default's).
    #[arg(long)]
    tune_passes: Option<usize>,
    /// Timed runs `--tune` makes of each algorithm at a size that moves 8 MiB or more
    /// (`TuneOptions::reps`; the default's).
    #[arg(long)]
    tune_reps: Option<usize>,
    /// Whole sweeps to run; each cell reports the median of the runs.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// After the sweep, time the pick against the best forced algorithm head to head
    /// wherever they differ (see [`duels`]).
    #[arg(long)]
    confirm: bool,
    /// Blocks each duel of `--confirm` takes the median of.
    #[arg(long, default_value_t = 5)]
    duel_blocks: usize,
    /// With `--confirm`, also duel the best forced algorithm against itself at each
    /// contested cell, in blocks alike: what the same code measures in both columns,
    /// the duels' own noise in the same minutes.
    #[arg(long)]
    aa: bool,
    /// Time each column right after whichever column ran before it in the round's
    /// shuffle, instead of after an untimed run of its own; the tuner likewise.
    #[arg(long)]
    unprimed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Allreduce,
    Broadcast,
    Allgather,
    ReduceScatter,
    Alltoall,
}

const OPS: [(Op, &str); 5] = [
    (Op::Allreduce, "allreduce"),
    (Op::Broadcast, "broadcast"),
    (Op::Allgather, "allgather"),
    (Op::ReduceScatter, "reduce_scatter"),
    (Op::Alltoall, "alltoall"),
];

impl Op {
    /// The name `--op` takes and the tables print.
    fn name(self) -> &'static str {
        OPS.iter().find(|(x, _)| *x == self).expect("every operation is listed").1
    }

    fn algos(self) -> Vec<&'static str> {
        match self {
            Op::Allreduce => AllreduceAlgo::SELECTABLE.iter().map(|a| a.name()).collect(),
            Op::Broadcast => BcastAlgo::ALL.iter().map(|a| a.name()).collect(),
            Op::Allgather => AllgatherAlgo::ALL.iter().map(|a| a.name()).collect(),
            Op::ReduceScatter => ReduceScatterAlgo::ALL.iter().map(|a| a.name()).collect(),
            Op::Alltoall => AlltoallAlgo::ALL.iter().map(|a| a.name()).collect(),
        }
    }

    /// Whether `bytes` is per rank's block (else the whole buffer).
    fn per_block(self) -> bool {
        matches!(self, Op::Allgather | Op::ReduceScatter | Op::Alltoall)
    }

    /// The automatic choice's name for `bytes` (as the selection sees them): where
    /// the adaptive selection decides, its algorithm now.
    fn pick<T: LocalTransport>(self, comm: &Communicator<T>, bytes: usize) -> &'static str {
        match self {
            Op::Allreduce => comm.allreduce_algo_for(bytes, true).name(),
            Op::Broadcast => comm.algo_for::<BcastAlgo>(bytes, true).name(),
            Op::Allgather => comm.algo_for::<AllgatherAlgo>(bytes, true).name(),
            Op::ReduceScatter => comm.algo_for::<ReduceScatterAlgo>(bytes, true).name(),
            Op::Alltoall => comm.algo_for::<AlltoallAlgo>(bytes, true).name(),
        }
    }

    /// Runs the collective once on `c` elements (per block where [`Op::per_block`]):
    /// algorithm `k` of [`Op::algos`], or the automatic choice for `None`.
    async fn run<T: LocalTransport>(
        self,
        comm: &Communicator<T>,
        k: Option<usize>,
        bufs: &mut Bufs,
    ) -> hcomm::Result<()> {
        let Bufs { one, all, out } = bufs;
        match (self, k) {
            (Op::Allreduce, Some(k)) => comm.all_reduce_with(one, ReduceOp::Sum, AllreduceAlgo::SELECTABLE[k]).await,
            (Op::Allreduce, None) => comm.all_reduce(one, ReduceOp::Sum).await,
            (Op::Broadcast, Some(k)) => comm.broadcast_with(one, 0, BcastAlgo::ALL[k]).await,
            (Op::Broadcast, None) => comm.broadcast(one, 0).await,
            (Op::Allgather, Some(k)) => comm.all_gather_with(one, all, AllgatherAlgo::ALL[k]).await,
            (Op::Allgather, None) => comm.all_gather(one, all).await,
            (Op::ReduceScatter, Some(k)) => {
                comm.reduce_scatter_with(all, one, ReduceOp::Sum, ReduceScatterAlgo::ALL[k]).await
            }
            (Op::ReduceScatter, None) => comm.reduce_scatter(all, one, ReduceOp::Sum).await,
            (Op::Alltoall, Some(k)) => comm.all_to_all_with(all, out, AlltoallAlgo::ALL[k]).await,
            (Op::Alltoall, None) => comm.all_to_all(all, out).await,
        }
    }
}

#[derive(Debug)]
struct Bufs {
    one: Vec<f32>,
    all: Vec<f32>,
    out: Vec<f32>,
}

fn sizes(a: &Args, op: Op, n: usize) -> Vec<usize> {
    let max = if op.per_block() { a.max_bytes / n } else { a.max_bytes };
    let step = a.step.max(2);
    std::iter::successors(Some(8usize), |s| (s * step <= max).then_some(s * step)).collect()
}

/// Rounds per column at `bytes`: more for small messages, whose times scatter more.
fn rounds(op: Op, n: usize, bytes: usize) -> usize {
    let moved = if op.per_block() { bytes * n } else { bytes };
    ((8 << 20) / moved.max(1) + 1).clamp(15, 100)
}

/// One row: the slowest rank's median time per column (forced algorithms, then auto).
async fn row<T: LocalTransport>(comm: &Communicator<T>, a: &Args, op: Op, bytes: usize) -> Result<Vec<f64>, String> {
    let cols: Vec<Option<usize>> = (0..op.algos().len()).map(Some).chain([None]).collect();
    timed(comm, a, op, bytes, &cols, rounds(op, comm.size(), bytes)).await
}

/// The slowest rank's median time (ms) of each of `cols` (an algorithm of
/// [`Op::algos`], or `None` for the automatic choice) over `iters` rounds; in each
/// round the columns run in a shuffled order, each after a barrier, and (unless
/// `--unprimed`) after an untimed run of the same column and a barrier, else after
/// a round of warm-up.
async fn timed<T: LocalTransport>(
    comm: &Communicator<T>,
    a: &Args,
    op: Op,
    bytes: usize,
    cols: &[Option<usize>],
    iters: usize,
) -> Result<Vec<f64>, String> {
    let n = comm.size();
    let c = (bytes / 4).max(1);
    let mut bufs = Bufs { one: vec![1.0; c], all: vec![1.0; n * c], out: vec![0.0; n * c] };
    let mut times: Vec<Vec<Duration>> = vec![Vec::with_capacity(iters); cols.len()];
    let primed = !a.unprimed;
    for round in usize::from(primed)..=iters {
        for j in hcomm::round_order(cols.len(), round + 7919) {
            if primed {
                comm.barrier().await.map_err(|e| e.to_string())?;
                op.run(comm, cols[j], &mut bufs).await.map_err(|e| e.to_string())?;
            }
            comm.barrier().await.map_err(|e| e.to_string())?;
            let t = Instant::now();
            op.run(comm, cols[j], &mut bufs).await.map_err(|e| e.to_string())?;
            if round > 0 {
                times[j].push(t.elapsed());
            }
        }
    }
    let mut med: Vec<f64> = times
        .into_iter()
        .map(|mut t| {
            t.sort();
            t[t.len() / 2].as_secs_f64() * 1e3
        })
        .collect();
    comm.all_reduce_with(&mut med, ReduceOp::Max, AllreduceAlgo::RecursiveDoubling).await.map_err(|e| e.to_string())?;
    Ok(med)
}

async fn sweep<T: LocalTransport>(comm: &Communicator<T>, a: &Args, how: &str) -> Result<(), String> {
    let ops: Vec<Op> = OPS.iter().filter(|(_, name)| a.op == "all" || a.op == *name).map(|(op, _)| *op).collect();
    // rows[op][size][run][column]: whole sweeps repeat, so that each cell's runs are
    // minutes apart and the machine's slow phases do not fall on one cell alone.
    let mut rows: Vec<Vec<Vec<Vec<f64>>>> =
        ops.iter().map(|&op| vec![Vec::new(); sizes(a, op, comm.size()).len()]).collect();
    for _ in 0..a.runs.max(1) {
        for (o, &op) in ops.iter().enumerate() {
            for (i, bytes) in sizes(a, op, comm.size()).into_iter().enumerate() {
                rows[o][i].push(row(comm, a, op, bytes).await?);
            }
        }
    }
    // Every rank holds the same rows (the slowest rank's times) and the same
    // selection, so every rank finds the same contested cells for the duels.
    let mut contested = Vec::new();
    for (o, &op) in ops.iter().enumerate() {
        let name = op.name();
        let algos = op.algos();
        let k = algos.len();
        let what = if op.per_block() { "bytes per block" } else { "bytes" };
        if comm.rank() == 0 {
            println!(
                "\n{name} sweep: {} ranks ({how}), transport {}, f32 sum, median of {} runs of the slowest rank's median (ms), {}\n",
                comm.size(),
                comm.transport_name(),
                a.runs.max(1),
                if a.unprimed {
                    "each after the round's previous column"
                } else {
                    "each after an untimed run of its own"
                }
            );
            println!("| {what} | {} | auto | auto picks | auto / best | pick / best |", algos.join(" | "));
            println!("|---|{}---|---|---|---|", "---|".repeat(k));
        }
        for (bytes, runs) in sizes(a, op, comm.size()).into_iter().zip(&rows[o]) {
            let ms: Vec<f64> = (0..=k)
                .map(|c| {
                    let mut v: Vec<f64> = runs.iter().map(|r| r[c]).collect();
                    v.sort_by(f64::total_cmp);
                    v[v.len() / 2]
                })
                .collect();
            let best = (0..k).min_by(|&x, &y| ms[x].total_cmp(&ms[y])).expect("every operation has algorithms");
            let pick = op.pick(comm, bytes / 4 * 4);
            let pick = algos.iter().position(|a| *a == pick).expect("the pick is one of the algorithms");
            if pick != best || ms[k] / ms[best] > 1.10 {
                contested.push(Contested { op, bytes, pick, best, sweep: ms[k] / ms[best] });
            }
            if comm.rank() == 0 {
                let cells: Vec<String> = ms[..k].iter().map(|t| format!("{t:.3}")).collect();
                println!(
                    "| {bytes} | {} | {:.3} | {} | {:.2} | {:.2} |",
                    cells.join(" | "),
                    ms[k],
                    algos[pick],
                    ms[k] / ms[best],
                    ms[pick] / ms[best]
                );
            }
        }
    }
    if a.confirm {
        duels(comm, a, &contested).await?;
    }
    Ok(())
}

/// A cell of the sweep where the automatic choice's algorithm at the end is not the
/// fastest forced column, or the automatic column took over 1.10x the best.
#[derive(Debug, Clone, Copy)]
struct Contested {
    op: Op,
    bytes: usize,
    pick: usize,
    best: usize,
    /// auto / best in the sweep.
    sweep: f64,
}

/// Times, for every contested cell, the automatic choice (which, for an allreduce
/// the adaptive selection decides, keeps timing and may switch as it runs) against
/// the sweep's best alone, head to head: `--duel-blocks` blocks of three times the
/// sweep's rounds, each round running the two in a shuffled order after a barrier.
/// Two columns instead of four or five give each three to five times the sweep's
/// samples in the same minutes, and their rounds sit closer in time, so the machine's
/// phases fall on both alike. Every cell where the pick is not the best is timed, not
/// only those over 10% in the sweep, so that the duels can move a cell either way.
///
/// The median of blocks, not of every round: a block's ratio is of two medians
/// taken in the same minute, and the blocks spread over the run. With 3 blocks the
/// same code in both columns (below the selection's floors, where the automatic
/// choice is the table's) measured 1.11-1.17 in 6 of 22 sweeps over shared memory
///; `--aa` measures that spread beside each duel.
async fn duels<T: LocalTransport>(comm: &Communicator<T>, a: &Args, contested: &[Contested]) -> Result<(), String> {
    let blocks = a.duel_blocks.max(1);
    let duel = async |cols: [Option<usize>; 2], c: &Contested| -> Result<Vec<f64>, String> {
        let iters = 3 * rounds(c.op, comm.size(), c.bytes);
        let mut ratios = Vec::with_capacity(blocks);
        for _ in 0..blocks {
            let ms = timed(comm, a, c.op, c.bytes, &cols, iters).await?;
            ratios.push(ms[0] / ms[1]);
        }
        ratios.sort_by(f64::total_cmp);
        Ok(ratios)
    };
    let mut results = Vec::with_capacity(contested.len());
    for c in contested {
        let auto = duel([None, Some(c.best)], c).await?;
        let same = if a.aa { Some(duel([Some(c.best), Some(c.best)], c).await?) } else { None };
        results.push((auto, same));
    }
    if comm.rank() != 0 {
        return Ok(());
    }
    println!(
        "\nduels: {} ranks, auto against the sweep's best where the pick differs or auto took over 1.10x, {blocks} blocks of 3x the sweep's rounds{}\n",
        comm.size(),
        if a.aa { "; beside it, the best against itself alike" } else { "" }
    );
    let median = |r: &[f64]| r[r.len() / 2];
    let range = |r: &[f64]| format!("{:.2}-{:.2}", r[0], r[r.len() - 1]);
    if a.aa {
        println!(
            "| collective | bytes | pick at the sweep's end | sweep's best | auto / best in the sweep | head to head auto / best: median of blocks | blocks' range | best / itself: median of blocks | blocks' range |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
    } else {
        println!(
            "| collective | bytes | pick at the sweep's end | sweep's best | auto / best in the sweep | head to head auto / best: median of blocks | blocks' range |"
        );
        println!("|---|---|---|---|---|---|---|");
    }
    for (c, (r, same)) in contested.iter().zip(&results) {
        let algos = c.op.algos();
        let aa = same.as_ref().map(|s| format!(" {:.2} | {} |", median(s), range(s))).unwrap_or_default();
        println!(
            "| {} | {} | {} | {} | {:.2} | {:.2} | {} |{aa}",
            c.op.name(),
            c.bytes,
            algos[c.pick],
            algos[c.best],
            c.sweep,
            median(r),
            range(r),
        );
    }
    let over = |x: f64| x > 1.10;
    println!(
        "\ncontested cells: {}; over 1.10 in the sweep: {}; over 1.10 head to head: {}{}",
        contested.len(),
        contested.iter().filter(|c| over(c.sweep)).count(),
        results.iter().filter(|(r, _)| over(median(r))).count(),
        if a.aa {
            let same: Vec<f64> = results.iter().filter_map(|(_, s)| s.as_deref().map(median)).collect();
            let (lo, hi) = same.iter().fold((f64::INFINITY, 0.0f64), |(l, h), &x| (l.min(x), h.max(x)));
            if same.is_empty() { String::new() } else { format!("; the best against itself: {lo:.2}-{hi:.2}") }
        } else {
            String::new()
        }
    );
    Ok(())
}

async fn prepare<T: LocalTransport>(comm: &mut Communicator<T>, a: &Args) -> Result<String, String> {
    if a.calibrate {
        let c = comm.calibrate().await.map_err(|e| e.to_string())?;
        return Ok(format!(
            "calibrated: alpha {:.1} us, link {:.2} GB/s, reduction {:.2} GB/s",
            c.alpha * 1e6,
            1e-9 / c.beta,
            1e-9 / c.gamma
        ));
    }
    if a.tune {
        let t = Instant::now();
        let m = comm
            .tune(&TuneOptions {
                max_bytes: a.max_bytes,
                step: a.tune_step,
                passes: a.tune_passes.unwrap_or(TuneOptions::default().passes),
                reps: a.tune_reps.unwrap_or(TuneOptions::default().reps),
                primed: !a.unprimed,
            })
            .await
            .map_err(|e| e.to_string())?;
        if comm.rank() == 0 && std::env::var_os("SWEEP_SHOW_TABLE").is_some() {
            println!("{m:?}");
        }
        return Ok(format!("tuned in {:.1} s", t.elapsed().as_secs_f64()));
    }
    Ok("cost model defaults".into())
}

fn main() {
    // Logs as RUST_LOG asks: `RUST_LOG=hcomm::tune=debug` shows what the tuner timed.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let a = Args::parse();
    if a.ranks == 0 {
        fail("--ranks must be at least 1");
    }
    if a.op != "all" && !OPS.iter().any(|(_, n)| *n == a.op) {
        fail(format!("unknown --op {:?}", a.op));
    }
    match (a.transport.as_str(), hcomm::env::LaunchEnv::launched()) {
        ("mem", _) => tokio::runtime::Runtime::new().unwrap_or_else(|e| fail(e)).block_on(async {
            let mut comms = hcomm::local(a.ranks);
            let how = futures::future::join_all(comms.iter_mut().map(|c| prepare(c, &a))).await;
            let how = format!("tasks in one process; {}", how[0].clone().unwrap_or_else(|e| fail(e)));
            for r in futures::future::join_all(comms.iter().map(|c| sweep(c, &a, &how))).await {
                r.unwrap_or_else(|e| fail(e));
            }
        }),
        ("tcp", true) => tokio::runtime::Runtime::new().unwrap_or_else(|e| fail(e)).block_on(async {
            let mut comm = hcomm::init().await.unwrap_or_else(|e| fail(e));
            let how = prepare(&mut comm, &a).await.unwrap_or_else(|e| fail(e));
            sweep(&comm, &a, &format!("processes; {how}")).await.unwrap_or_else(|e| fail(e));
            comm.finalize().await.unwrap_or_else(|e| fail(e));
        }),
        ("tcp", false) => launch_self(a.ranks),
        (other, _) => fail(format!("unknown transport {other:?} (tcp, mem)")),
    }
}
