//! `hcomm-bench`: OSU / nccl-tests style measurements of HComm.
//!
//! ```text
//! cargo run --release -p hcomm-bench -- [--ranks 2] [--transport tcp|uring|shm|mem|rdma]
//!     [--ops latency,bw,allreduce,broadcast,allgather,reduce_scatter,alltoall]
//!     [--min 4] [--max 64M] [--iters N] [--warmup N] [--window 64]
//!     [--algo allreduce=ring] [--csv out.csv] [--json out.json]
//!     [--plot busbw.svg [--plot-op allreduce] [--with earlier.json ...]]
//!     [--runtime multi|current] [--timing osu|b2b]
//! ```
//!
//! Sizes double from `--min` to `--max`. For each operation and size every rank runs
//! `--warmup` untimed then `--iters` timed operations after a barrier: by default each
//! alone, with an untimed barrier after it (OSU's way), or back to back under one
//! timer (`--timing b2b`); its time per operation is the mean. Ranks run on tokio's
//! multi-thread runtime unless `--runtime current` says otherwise; the table gives the mean, minimum and maximum
//! of that over ranks, algbw = size / time and busbw = algbw × the nccl-tests factor
//! (allreduce 2(n−1)/n; allgather, reduce_scatter and alltoall (n−1)/n; broadcast
//! and point to point 1). As in nccl-tests, the size of allgather, reduce_scatter and
//! alltoall is the whole buffer (n blocks). `latency` is half the round trip of a
//! ping-pong between ranks 0 and 1; `bw` streams windows of `--window` messages from
//! rank 0 to rank 1, each window answered by a 4-byte acknowledgement (as osu_bw);
//! rank 1 posts a window's receives at once, each into its own buffer (at most 1 GiB
//! of them; a window of larger messages is received in rounds), as
//! `benches/compare/mpi_p2p.c` does with `MPI_Irecv`.
//! `latency_bytes` and `bw_bytes` (not in `all`) do the same through `send_bytes` and
//! `recv_bytes`, which hand buffers over instead of copying them in and out.
//! Ranks above 1 idle during both.
//!
//! Ranks are processes (tcp, uring: started by this program itself, or by a
//! launcher) or tasks of one process (mem). A progress bar shows on a terminal.
//! Processes take `HCOMM_CALIBRATE`, `HCOMM_TUNE` and `HCOMM_TUNE_FILE` as
//! `hcomm::init` does (`hcomm::measure_from_env`), so the automatic choice can be
//! the measured one.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use hcomm::{
    AllgatherAlgo, AllreduceAlgo, AlltoallAlgo, BcastAlgo, Bytes, Communicator, LocalTransport, ReduceOp,
    ReduceScatterAlgo,
};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

#[derive(Parser, Debug, Clone)]
#[command(name = "hcomm-bench", about = "HComm latency, bandwidth and collectives over message sizes")]
struct Args {
    /// Ranks (processes for tcp, uring and shm, tasks for mem).
    #[arg(long, default_value_t = 2)]
    ranks: usize,
    /// tcp, uring, shm (shared memory to the peers on this host) or mem.
    #[arg(long, default_value = "tcp")]
    transport: String,
    /// Comma-separated: latency, bw, allreduce, broadcast, allgather, reduce_scatter,
    /// alltoall, or all.
    #[arg(long, default_value = "all")]
    ops: String,
    /// Smallest size (bytes; K, M, G suffixes).
    #[arg(long, default_value = "4", value_parser = parse_size)]
    min: usize,
    /// Largest size.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    max: usize,
    /// Timed operations per size (default: 64 MiB worth, between 10 and 1000).
    #[arg(long)]
    iters: Option<usize>,
    /// Untimed operations per size first (default: a tenth of the timed, at least 2).
    #[arg(long)]
    warmup: Option<usize>,
    /// Messages in flight per window of `bw`.
    #[arg(long, default_value_t = 64)]
    window: usize,
    /// Force an algorithm, `OP=NAME` (repeatable), e.g. `allreduce=ring`.
    #[arg(long)]
    algo: Vec<String>,
    /// Write the rows as CSV.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Write the run as JSON (meta and rows), for `--with` of a later run.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw busbw against size as SVG: this run and every `--with` run, one line each.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// The operation the plot shows.
    #[arg(long, default_value = "allreduce")]
    plot_op: String,
    /// Earlier runs' JSON files to draw beside this one.
    #[arg(long)]
    with: Vec<PathBuf>,
    /// Draw the plot from `--with` files only, without measuring.
    #[arg(long)]
    no_run: bool,
    /// No progress bar.
    #[arg(long)]
    no_progress: bool,
    /// The ranks' tokio runtime: `multi` (the multi-thread runtime most applications
    /// run, one worker per core) or `current` (a current-thread runtime).
    #[arg(long, default_value = "multi", value_parser = ["multi", "current"])]
    runtime: String,
    /// `osu`: each operation timed alone with an untimed barrier after it, as the OSU
    /// micro-benchmarks time collectives; `b2b`: operations back to back, one timer
    /// around them all.
    #[arg(long, default_value = "osu", value_parser = ["osu", "b2b"])]
    timing: String,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (num, shift) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    num.parse::<usize>().map(|n| n << shift).map_err(|e| format!("bad size {s:?}: {e}"))
}

fn fail(msg: impl std::fmt::Display) -> ! {
    eprintln!("hcomm-bench: {msg}");
    std::process::exit(1);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Latency,
    Bw,
    /// `latency` and `bw` through `send_bytes` / `recv_bytes` (no copy in user space).
    LatencyBytes,
    BwBytes,
    Allreduce,
    Broadcast,
    Allgather,
    ReduceScatter,
    Alltoall,
}

/// The first 7 are `all`.
const OPS: [(Op, &str); 9] = [
    (Op::Latency, "latency"),
    (Op::Bw, "bw"),
    (Op::Allreduce, "allreduce"),
    (Op::Broadcast, "broadcast"),
    (Op::Allgather, "allgather"),
    (Op::ReduceScatter, "reduce_scatter"),
    (Op::Alltoall, "alltoall"),
    (Op::LatencyBytes, "latency_bytes"),
    (Op::BwBytes, "bw_bytes"),
];

impl Op {
    /// Point to point between ranks 0 and 1.
    fn p2p(self) -> bool {
        matches!(self, Op::Latency | Op::Bw | Op::LatencyBytes | Op::BwBytes)
    }

    fn name(self) -> &'static str {
        OPS.iter().find(|(o, _)| *o == self).expect("listed").1
    }

    /// The nccl-tests bus bandwidth factor.
    fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Op::Allreduce => 2.0 * (n - 1.0) / n,
            Op::Allgather | Op::ReduceScatter | Op::Alltoall => (n - 1.0) / n,
            Op::Latency | Op::Bw | Op::LatencyBytes | Op::BwBytes | Op::Broadcast => 1.0,
        }
    }

    /// Whether the size is `n` blocks (nccl-tests' convention for these).
    fn blocked(self) -> bool {
        matches!(self, Op::Allgather | Op::ReduceScatter | Op::Alltoall)
    }
}

/// Algorithms forced with `--algo`.
#[derive(Debug, Clone, Default)]
struct Forced {
    allreduce: Option<AllreduceAlgo>,
    broadcast: Option<BcastAlgo>,
    allgather: Option<AllgatherAlgo>,
    reduce_scatter: Option<ReduceScatterAlgo>,
    alltoall: Option<AlltoallAlgo>,
}

impl Forced {
    fn parse(specs: &[String]) -> Result<Forced, String> {
        let mut f = Forced::default();
        for spec in specs {
            let (op, name) = spec.split_once('=').ok_or_else(|| format!("--algo {spec:?} is not OP=NAME"))?;
            let e = |e: hcomm::Error| e.to_string();
            match op {
                "allreduce" => f.allreduce = Some(name.parse().map_err(e)?),
                "broadcast" => f.broadcast = Some(name.parse().map_err(e)?),
                "allgather" => f.allgather = Some(name.parse().map_err(e)?),
                "reduce_scatter" => f.reduce_scatter = Some(name.parse().map_err(e)?),
                "alltoall" => f.alltoall = Some(name.parse().map_err(e)?),
                _ => return Err(format!("--algo {spec:?}: no algorithms to choose for {op:?}")),
            }
        }
        Ok(f)
    }

    fn name(&self, op: Op) -> String {
        let forced = match op {
            Op::Allreduce => self.allreduce.map(|a| a.name()),
            Op::Broadcast => self.broadcast.map(|a| a.name()),
            Op::Allgather => self.allgather.map(|a| a.name()),
            Op::ReduceScatter => self.reduce_scatter.map(|a| a.name()),
            Op::Alltoall => self.alltoall.map(|a| a.name()),
            Op::Latency | Op::Bw | Op::LatencyBytes | Op::BwBytes => Some("direct"),
        };
        forced.unwrap_or("auto").to_string()
    }
}

/// One line of the table.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Row {
    op: String,
    ranks: usize,
    transport: String,
    algo: String,
    bytes: usize,
    iters: usize,
    avg_us: f64,
    min_us: f64,
    max_us: f64,
    algbw_gbs: f64,
    busbw_gbs: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Run {
    label: String,
    unix_time: u64,
    ranks: usize,
    transport: String,
    how: String,
    rows: Vec<Row>,
}

fn ops_of(a: &Args) -> Vec<Op> {
    if a.ops == "all" {
        return OPS[..7].iter().map(|o| o.0).collect();
    }
    a.ops
        .split(',')
        .map(|s| {
            OPS.iter().find(|(_, n)| *n == s.trim()).map(|o| o.0).unwrap_or_else(|| fail(format!("unknown op {s:?}")))
        })
        .collect()
}

fn sizes(a: &Args, op: Op, n: usize) -> Vec<usize> {
    let unit = if op.blocked() { 4 * n } else { 4 };
    let lo = a.min.max(if op.p2p() { 1 } else { unit });
    std::iter::successors(Some(lo), |s| s.checked_mul(2).filter(|&d| d <= a.max)).filter(|s| *s <= a.max).collect()
}

fn iters(a: &Args, bytes: usize) -> (usize, usize) {
    let it = a.iters.unwrap_or_else(|| ((64 << 20) / bytes.max(1)).clamp(10, 1000));
    (it, a.warmup.unwrap_or((it / 10).max(2)))
}

/// Buffers for one size.
#[derive(Debug)]
struct Bufs {
    a: Vec<f32>,
    b: Vec<f32>,
    bytes: Vec<u8>,
    /// The same bytes, to hand over whole (`*_bytes` ops).
    owned: Bytes,
    /// Receive buffers of `bw` at rank 1: the receives of a window are posted at once,
    /// each into its own buffer (as MPI_Irecv into the window's buffers).
    window: Vec<Vec<u8>>,
}

/// The most memory the receive buffers of a `bw` window take: a window of larger
/// messages is received in rounds of as many as fit.
const WINDOW_BYTES: usize = 1 << 30;

/// Whether the ranks run on tokio-uring (`--transport uring`).
static ON_URING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Lets the transport's tasks run between the copies of a `bw` window's sends. Under
/// io_uring, large copies also wait for the thread to park: tokio-uring hands queued
/// operations to the kernel only then, and a window of 64 copies of 16 MiB with only
/// yields between them kept this rank's writes and heartbeats queued past the
/// peer timeout (the peer failed it as hung about half the time). Below 64 KiB the
/// window's copies take microseconds in all and the sends are made back to back,
/// as OSU's `osu_bw` posts its window: a yield after each let the writer task write
/// each small message alone, where a window made at once goes out in few writes.
async fn between_copies(bytes: usize) {
    if bytes < 64 << 10 {
        return;
    }
    #[cfg(all(feature = "uring", target_os = "linux"))]
    if bytes >= 1 << 20 && ON_URING.load(std::sync::atomic::Ordering::Relaxed) {
        // Completes once submitted, that is once the thread has parked.
        let _ = tokio_uring::no_op().await;
        return;
    }
    tokio::task::yield_now().await;
}

async fn once<T: LocalTransport>(
    comm: &Communicator<T>,
    op: Op,
    f: &Forced,
    bufs: &mut Bufs,
    window: usize,
) -> hcomm::Result<()> {
    let n = comm.size();
    match op {
        Op::Allreduce => match f.allreduce {
            Some(al) => comm.all_reduce_with(&mut bufs.a, ReduceOp::Sum, al).await,
            None => comm.all_reduce(&mut bufs.a, ReduceOp::Sum).await,
        },
        Op::Broadcast => match f.broadcast {
            Some(al) => comm.broadcast_with(&mut bufs.a, 0, al).await,
            None => comm.broadcast(&mut bufs.a, 0).await,
        },
        Op::Allgather => {
            let mine = &bufs.b[..bufs.a.len() / n];
            match f.allgather {
                Some(al) => comm.all_gather_with(mine, &mut bufs.a, al).await,
                None => comm.all_gather(mine, &mut bufs.a).await,
            }
        }
        Op::ReduceScatter => {
            let out = &mut bufs.b[..bufs.a.len() / n];
            match f.reduce_scatter {
                Some(al) => comm.reduce_scatter_with(&bufs.a, out, ReduceOp::Sum, al).await,
                None => comm.reduce_scatter(&bufs.a, out, ReduceOp::Sum).await,
            }
        }
        Op::Alltoall => match f.alltoall {
            Some(al) => comm.all_to_all_with(&bufs.a, &mut bufs.b, al).await,
            None => comm.all_to_all(&bufs.a, &mut bufs.b).await,
        },
        Op::Latency => match comm.rank() {
            0 => {
                comm.send(1, 1, &bufs.bytes).await?;
                comm.recv_into(1, 1, &mut bufs.bytes).await
            }
            1 => {
                comm.recv_into(0, 1, &mut bufs.bytes).await?;
                comm.send(0, 1, &bufs.bytes).await
            }
            _ => Ok(()),
        },
        Op::Bw => match comm.rank() {
            0 => {
                // `send` copies the message when called: a window of large ones is
                // seconds of copying, so let the transport's tasks (heartbeats
                // among them) run between the calls, or the peer thinks this rank
                // hung (a current-thread runtime runs nothing else meanwhile).
                let mut sends = Vec::with_capacity(window);
                for _ in 0..window {
                    sends.push(comm.send(1, 2, &bufs.bytes));
                    between_copies(bufs.bytes.len()).await;
                }
                futures::future::try_join_all(sends).await?;
                comm.recv::<u8>(1, 3).await.map(drop)
            }
            1 => {
                let mut left = window;
                while left > 0 {
                    let k = left.min(bufs.window.len());
                    let recvs = bufs.window[..k].iter_mut().map(|b| comm.recv_into(0, 2, b));
                    futures::future::try_join_all(recvs).await?;
                    left -= k;
                }
                comm.send(0, 3, &[0u8; 4]).await
            }
            _ => Ok(()),
        },
        Op::LatencyBytes => match comm.rank() {
            0 => {
                comm.send_bytes(1, 1, bufs.owned.clone()).await?;
                comm.recv_bytes(1, 1).await.map(drop)
            }
            1 => {
                let echo = comm.recv_bytes(0, 1).await?;
                comm.send_bytes(0, 1, echo).await
            }
            _ => Ok(()),
        },
        Op::BwBytes => match comm.rank() {
            0 => {
                let sends = (0..window).map(|_| comm.send_bytes(1, 2, bufs.owned.clone()));
                futures::future::try_join_all(sends).await?;
                comm.recv_bytes(1, 3).await.map(drop)
            }
            1 => {
                for _ in 0..window {
                    comm.recv_bytes(0, 2).await?;
                }
                comm.send_bytes(0, 3, Bytes::from_static(&[0; 4])).await
            }
            _ => Ok(()),
        },
    }
}

/// Measures one operation at one size; every rank returns the row (rank 0 prints).
async fn measure<T: LocalTransport>(
    comm: &Communicator<T>,
    a: &Args,
    f: &Forced,
    op: Op,
    bytes: usize,
) -> hcomm::Result<Row> {
    let n = comm.size();
    let elems = (bytes / 4).max(1);
    let mut bufs = Bufs {
        a: vec![1.0; elems],
        b: vec![1.0; if op == Op::Alltoall { elems } else { elems.div_ceil(n).max(1) }],
        bytes: vec![7u8; bytes],
        owned: Bytes::from(vec![7u8; bytes]),
        window: match (op, comm.rank()) {
            // One zeroed allocation each, not clones of one buffer: a clone copies
            // (and faults in) every page at once, up to 1 GiB here, which held this
            // rank's current-thread runtime for over the peer timeout (0.6 s) at
            // 4-8 MiB, so that rank 0 failed it as hung; zeroed allocations map
            // pages only as the receives write them.
            (Op::Bw, 1) => (0..a.window.min(WINDOW_BYTES / bytes.max(1)).max(1)).map(|_| vec![0u8; bytes]).collect(),
            _ => Vec::new(),
        },
    };
    let (it, warm) = iters(a, bytes);
    for _ in 0..warm {
        once(comm, op, f, &mut bufs, a.window).await?;
    }
    comm.barrier().await?;
    let per_op = if a.timing == "osu" {
        // Each operation alone: the barrier after it keeps the next from overlapping
        // it, and its time is not counted.
        let mut total = Duration::ZERO;
        for _ in 0..it {
            let t = Instant::now();
            once(comm, op, f, &mut bufs, a.window).await?;
            total += t.elapsed();
            comm.barrier().await?;
        }
        total.as_secs_f64() / it as f64
    } else {
        let t = Instant::now();
        for _ in 0..it {
            once(comm, op, f, &mut bufs, a.window).await?;
        }
        t.elapsed().as_secs_f64() / it as f64
    };
    // Point to point: rank 0's view (half a round trip; a window's time per message).
    let mine = match op {
        Op::Latency | Op::LatencyBytes => per_op / 2.0,
        Op::Bw | Op::BwBytes => per_op / a.window as f64,
        _ => per_op,
    };
    let p2p = op.p2p();
    let mut stats =
        [if p2p && comm.rank() > 1 { 0.0 } else { mine }, if p2p && comm.rank() > 1 { f64::MIN } else { -mine }, mine];
    let mut sum = [stats[0]];
    comm.all_reduce(&mut sum, ReduceOp::Sum).await?;
    comm.all_reduce(&mut stats, ReduceOp::Max).await?;
    let counted = if p2p { n.min(2) } else { n };
    let avg = sum[0] / counted as f64;
    let (min, max) = (-stats[1], stats[0]);
    let algbw = bytes as f64 / avg / 1e9;
    Ok(Row {
        op: op.name().to_string(),
        ranks: n,
        transport: comm.transport_name().to_string(),
        algo: f.name(op),
        bytes,
        iters: it,
        avg_us: avg * 1e6,
        min_us: min * 1e6,
        max_us: max * 1e6,
        algbw_gbs: algbw,
        busbw_gbs: algbw * op.bus_factor(n),
    })
}

const HEADER: &str =
    "#   operation            size     iters      avg(us)      min(us)      max(us)  algbw(GB/s)  busbw(GB/s)  algo";

fn line(r: &Row) -> String {
    format!(
        "  {:<15} {:>12} {:>9} {:>12.2} {:>12.2} {:>12.2} {:>12.3} {:>12.3}  {}",
        r.op, r.bytes, r.iters, r.avg_us, r.min_us, r.max_us, r.algbw_gbs, r.busbw_gbs, r.algo
    )
}

async fn bench<T: LocalTransport>(comm: &Communicator<T>, a: &Args, f: &Forced) -> hcomm::Result<Vec<Row>> {
    let n = comm.size();
    let ops = ops_of(a);
    let plan: Vec<(Op, usize)> = ops
        .iter()
        .filter(|&&op| n >= 2 || !op.p2p())
        .flat_map(|&op| sizes(a, op, n).into_iter().map(move |s| (op, s)))
        .collect();
    let lead = comm.rank() == 0;
    let bar = if lead && !a.no_progress { ProgressBar::new(plan.len() as u64) } else { ProgressBar::hidden() };
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {msg} [{elapsed_precise}]").expect("a valid template"),
    );
    if lead {
        // `suspend`, not `println`: a hidden bar (no terminal) drops `println` lines.
        bar.suspend(|| println!("# hcomm-bench: {n} ranks, transport {}\n{HEADER}", comm.transport_name()));
    }
    let mut rows = Vec::with_capacity(plan.len());
    for (op, bytes) in plan {
        bar.set_message(format!("{} {bytes} B", op.name()));
        let row = measure(comm, a, f, op, bytes).await?;
        if lead {
            bar.suspend(|| println!("{}", line(&row)));
        }
        bar.inc(1);
        rows.push(row);
    }
    bar.finish_and_clear();
    Ok(rows)
}

fn csv(rows: &[Row]) -> String {
    let mut s = String::from("op,ranks,transport,algo,bytes,iters,avg_us,min_us,max_us,algbw_gbs,busbw_gbs\n");
    for r in rows {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{:.3},{:.3},{:.3},{:.6},{:.6}",
            r.op,
            r.ranks,
            r.transport,
            r.algo,
            r.bytes,
            r.iters,
            r.avg_us,
            r.min_us,
            r.max_us,
            r.algbw_gbs,
            r.busbw_gbs
        );
    }
    s
}

fn human(b: usize) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}G", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => format!("{b}"),
    }
}

/// busbw against size (log scale), one polyline per run.
fn svg(runs: &[Run], op: &str) -> Result<String, String> {
    let series: Vec<(String, Vec<(f64, f64)>)> = runs
        .iter()
        .map(|r| {
            let pts = r.rows.iter().filter(|x| x.op == op).map(|x| ((x.bytes as f64).log2(), x.busbw_gbs)).collect();
            (r.label.clone(), pts)
        })
        .filter(|(_, p): &(String, Vec<(f64, f64)>)| !p.is_empty())
        .collect();
    if series.is_empty() {
        return Err(format!("no {op} rows to plot"));
    }
    let all = series.iter().flat_map(|s| s.1.iter());
    let (x0, x1) = all.clone().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let y1 = all.fold(0.0f64, |m, p| m.max(p.1)).max(1e-9) * 1.1;
    let (w, h, l, r, t, b) = (900.0, 520.0, 70.0, 20.0, 40.0, 50.0);
    let px = |x: f64| l + (x - x0) / (x1 - x0).max(1.0) * (w - l - r);
    let py = |y: f64| h - b - y / y1 * (h - t - b);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{op}: bus bandwidth against size</text>\n",
        w / 2.0
    );
    let _ = writeln!(s, "<line x1=\"{l}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>", h - b, w - r, h - b);
    let _ = writeln!(s, "<line x1=\"{l}\" y1=\"{t}\" x2=\"{l}\" y2=\"{}\" stroke=\"black\"/>", h - b);
    let mut k = x0.ceil() as i64;
    while k as f64 <= x1 {
        if k % 2 == 0 || x1 - x0 < 12.0 {
            let x = px(k as f64);
            let _ = writeln!(s, "<line x1=\"{x}\" y1=\"{}\" x2=\"{x}\" y2=\"{}\" stroke=\"#ddd\"/>", t, h - b);
            let _ = writeln!(
                s,
                "<text x=\"{x}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                h - b + 18.0,
                human(1usize << k)
            );
        }
        k += 1;
    }
    for i in 0..=5 {
        let y = y1 * i as f64 / 5.0;
        let _ = writeln!(s, "<line x1=\"{l}\" y1=\"{0}\" x2=\"{1}\" y2=\"{0}\" stroke=\"#ddd\"/>", py(y), w - r);
        let _ = writeln!(s, "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{y:.2}</text>", l - 6.0, py(y) + 4.0);
    }
    let _ = writeln!(s, "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">size (bytes)</text>", w / 2.0, h - 10.0);
    let _ = writeln!(
        s,
        "<text x=\"16\" y=\"{}\" transform=\"rotate(-90 16 {})\" text-anchor=\"middle\">busbw (GB/s)</text>",
        h / 2.0,
        h / 2.0
    );
    const COLOURS: [&str; 8] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
    for (i, (label, pts)) in series.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        let path: Vec<String> = pts.iter().map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y))).collect();
        let _ =
            writeln!(s, "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" points=\"{}\"/>", path.join(" "));
        let ly = t + 16.0 + 18.0 * i as f64;
        let _ = writeln!(
            s,
            "<line x1=\"{}\" y1=\"{ly}\" x2=\"{}\" y2=\"{ly}\" stroke=\"{c}\" stroke-width=\"3\"/>",
            l + 12.0,
            l + 36.0
        );
        let _ = writeln!(s, "<text x=\"{}\" y=\"{}\">{}</text>", l + 42.0, ly + 4.0, escape(label));
    }
    s.push_str("</svg>\n");
    Ok(s)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

fn write(path: &PathBuf, data: &str) {
    std::fs::write(path, data).unwrap_or_else(|e| fail(format!("cannot write {}: {e}", path.display())));
}

/// Writes the outputs of a finished run (rank 0).
fn outputs(a: &Args, run: Option<Run>) {
    if let Some(run) = &run {
        if let Some(p) = &a.csv {
            write(p, &csv(&run.rows));
        }
        if let Some(p) = &a.json {
            write(p, &serde_json::to_string_pretty(run).expect("rows serialise"));
        }
    }
    if let Some(p) = &a.plot {
        let mut runs: Vec<Run> = a
            .with
            .iter()
            .map(|f| {
                let data = std::fs::read(f).unwrap_or_else(|e| fail(format!("cannot read {}: {e}", f.display())));
                serde_json::from_slice(&data)
                    .unwrap_or_else(|e| fail(format!("{} is not an hcomm-bench run: {e}", f.display())))
            })
            .collect();
        runs.extend(run);
        write(p, &svg(&runs, &a.plot_op).unwrap_or_else(|e| fail(e)));
    }
}

fn finish(a: &Args, how: &str, rows: Vec<Row>) {
    let (ranks, transport) =
        rows.first().map(|r| (r.ranks, r.transport.clone())).unwrap_or((a.ranks, a.transport.clone()));
    let unix_time = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_secs();
    let label = format!("hcomm {transport}, {ranks} ranks ({how}, {} runtime, {} timing)", a.runtime, a.timing);
    outputs(a, Some(Run { label, unix_time, ranks, transport, how: how.to_string(), rows }));
}

/// The ranks' runtime, as `--runtime` says (the launcher's own runtime is always a
/// current-thread one: it only waits for its children).
fn runtime(a: &Args) -> tokio::runtime::Runtime {
    let mut b = match a.runtime.as_str() {
        "multi" => tokio::runtime::Builder::new_multi_thread(),
        _ => tokio::runtime::Builder::new_current_thread(),
    };
    b.enable_all().build().unwrap_or_else(|e| fail(e))
}

fn main() {
    let a = Args::parse();
    // The library's tracing events (debug logs, warnings) on standard error, filtered
    // as `RUST_LOG` says.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    if a.no_run {
        if a.plot.is_none() || a.with.is_empty() {
            fail("--no-run draws --plot from --with files: give both");
        }
        return outputs(&a, None);
    }
    if a.ranks == 0 || a.min == 0 || a.min > a.max {
        fail("need --ranks >= 1 and 0 < --min <= --max");
    }
    let f = Forced::parse(&a.algo).unwrap_or_else(|e| fail(e));
    let launched = hcomm::env::LaunchEnv::launched();
    match (a.transport.as_str(), launched) {
        ("mem", _) => runtime(&a).block_on(async {
            let comms = hcomm::local(a.ranks);
            let rows = futures::future::join_all(comms.iter().map(|c| bench(c, &a, &f))).await;
            let rows: Vec<Vec<Row>> = rows.into_iter().map(|r| r.unwrap_or_else(|e| fail(e))).collect();
            finish(&a, "tasks in one process", rows.into_iter().next().unwrap_or_default());
        }),
        ("tcp" | "shm", true) => runtime(&a).block_on(async {
            let mut cfg = hcomm::Config::from_env().unwrap_or_else(|e| fail(e));
            cfg.shm = a.transport == "shm";
            let comm = cfg.connect().await.unwrap_or_else(|e| fail(e));
            let comm = hcomm::measure_from_env(comm).await.unwrap_or_else(|e| fail(e));
            let rows = bench(&comm, &a, &f).await.unwrap_or_else(|e| fail(e));
            if comm.rank() == 0 {
                finish(&a, "processes", rows);
            }
            comm.finalize().await.unwrap_or_else(|e| fail(e));
        }),
        #[cfg(all(feature = "uring", target_os = "linux"))]
        ("uring", true) => tokio_uring::start(async {
            ON_URING.store(true, std::sync::atomic::Ordering::Relaxed);
            let mut cfg = hcomm::Config::from_env().unwrap_or_else(|e| fail(e));
            cfg.shm = false;
            let comm = cfg.connect_uring().await.unwrap_or_else(|e| fail(e));
            let comm = hcomm::measure_from_env(comm).await.unwrap_or_else(|e| fail(e));
            let rows = bench(&comm, &a, &f).await.unwrap_or_else(|e| fail(e));
            if comm.rank() == 0 {
                finish(&a, "processes", rows);
            }
            comm.finalize().await.unwrap_or_else(|e| fail(e));
        }),
        #[cfg(all(feature = "rdma", target_os = "linux"))]
        ("rdma", true) => runtime(&a).block_on(async {
            let comm =
                hcomm::Config::from_env().unwrap_or_else(|e| fail(e)).connect_rdma().await.unwrap_or_else(|e| fail(e));
            let comm = hcomm::measure_from_env(comm).await.unwrap_or_else(|e| fail(e));
            let rows = bench(&comm, &a, &f).await.unwrap_or_else(|e| fail(e));
            if comm.rank() == 0 {
                eprintln!("# rank 0 registered memory: {:?}", comm.transport().buffer_stats());
                finish(&a, "processes", rows);
            }
            comm.finalize().await.unwrap_or_else(|e| fail(e));
        }),
        ("tcp" | "uring" | "shm" | "rdma", false) => {
            let exe = std::env::current_exe().unwrap_or_else(|e| fail(e));
            let launch = hcomm_launch::Launch {
                ranks: a.ranks,
                program: exe.into_os_string(),
                args: std::env::args_os().skip(1).collect(),
                prefix: false,
                env: Vec::new(),
            };
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap_or_else(|e| fail(e));
            let out = rt.block_on(hcomm_launch::run(launch)).unwrap_or_else(|e| fail(e));
            std::process::exit(out.code);
        }
        (other, _) => fail(format!(
            "unknown or unavailable transport {other:?} (tcp, uring, shm, mem; rdma with the cargo feature `rdma`)"
        )),
    }
}
