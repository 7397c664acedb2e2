//! Allreduce algorithms, the cost model that chooses between them, and the ordered
//! reduction of reproducible mode.
//!
//! Every algorithm is correct for any rank count: the power-of-two algorithms
//! (recursive doubling, Rabenseifner) first fold the `n - p` extra ranks into
//! partners (`p` the largest power of two not above `n`) and hand them the result at
//! the end. Every algorithm leaves bitwise identical results on every rank.

use futures::future::{try_join, try_join_all};
use hcomm_core::{Element, Error, LocalTransport, OpKind, ReduceOp, Result, Signature};

use crate::exchange::ring_allgatherv_in;
use crate::exchange::{AllgatherAlgo, AlltoallAlgo, ReduceScatterAlgo};
use crate::rooted::{BCAST_CHAIN_CHUNK_BYTES, BcastAlgo};
use crate::rooted::{bcast_binomial, reduce_binomial};
use crate::{OpCtx, bound, check_reduce_op, copy_in, reduce_in};

/// Target size of one pipelined piece of a ring allreduce. A segment larger than this
/// is cut into columns that travel the ring independently, so that reducing one piece
/// overlaps sending the next.
pub const RING_CHUNK_BYTES: usize = 256 << 10;
/// Most columns a ring allreduce uses.
pub const RING_MAX_COLUMNS: usize = 64;

algo_enum! {
    /// Allreduce algorithms.
    AllreduceAlgo, "allreduce" {
        /// Reduce-scatter then allgather around a ring, pipelined in columns:
        /// bandwidth-optimal (`2(n-1)/n · S` per rank), `2(n-1)` steps.
        Ring = 1 => "ring",
        /// `log2 p` exchanges of the whole buffer: latency-optimal for small messages.
        RecursiveDoubling = 2 => "recursive_doubling",
        /// Reduce-scatter by recursive halving, allgather by recursive doubling
        /// (Rabenseifner): bandwidth-optimal in `2 log2 p` steps.
        Rabenseifner = 3 => "rabenseifner",
        /// Binomial-tree reduce to rank 0, then binomial-tree broadcast.
        Tree = 4 => "tree",
        /// Reproducible mode: every segment's owner receives every rank's contribution
        /// and reduces them in rank order, then the segments are allgathered.
        Ordered = 5 => "ordered",
    }
}

impl AllreduceAlgo {
    /// The algorithms the selection chooses from (`Ordered` is reproducible mode's).
    pub const SELECTABLE: [AllreduceAlgo; 4] =
        [AllreduceAlgo::Ring, AllreduceAlgo::RecursiveDoubling, AllreduceAlgo::Rabenseifner, AllreduceAlgo::Tree];
}

/// The cost of communication, in NCCL's style: a message of `b` bytes costs
/// `alpha + b · beta` seconds, and reducing `b` bytes costs `b · gamma`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Seconds per message (latency).
    pub alpha: f64,
    /// Seconds per byte sent (inverse bandwidth).
    pub beta: f64,
    /// Seconds per byte reduced (inverse reduction bandwidth).
    pub gamma: f64,
}

impl CostModel {
    /// Defaults for a transport, from measurements on small 2-core VMs: in-process
    /// (`mem`) messages are cheap and wide, loopback TCP ones cost tens of microseconds
    /// and about 2 GB/s.
    pub fn for_transport(name: &str) -> CostModel {
        match name {
            "mem" => CostModel { alpha: 2e-6, beta: 1.0 / 8e9, gamma: 1.0 / 10e9 },
            _ => CostModel { alpha: 40e-6, beta: 1.0 / 2e9, gamma: 1.0 / 10e9 },
        }
    }

    /// Predicted time of `algo` for `bytes` over `n` ranks, in seconds.
    pub fn allreduce_time(&self, algo: AllreduceAlgo, n: usize, bytes: usize) -> f64 {
        if n <= 1 {
            return 0.0;
        }
        let (a, b, g, s) = (self.alpha, self.beta, self.gamma, bytes as f64);
        let nf = n as f64;
        let p = pow2_floor(n) as f64;
        let steps = p.log2();
        let fold = if pow2_floor(n) == n { 0.0 } else { 2.0 * a + 2.0 * s * b + s * g };
        match algo {
            AllreduceAlgo::Ring => 2.0 * (nf - 1.0) * a + 2.0 * (nf - 1.0) / nf * s * b + (nf - 1.0) / nf * s * g,
            AllreduceAlgo::RecursiveDoubling => steps * (a + s * b + s * g) + fold,
            AllreduceAlgo::Rabenseifner => 2.0 * steps * a + 2.0 * (p - 1.0) / p * s * b + (p - 1.0) / p * s * g + fold,
            AllreduceAlgo::Tree => {
                let depth = nf.log2().ceil();
                2.0 * depth * (a + s * b) + depth * s * g
            }
            AllreduceAlgo::Ordered => 2.0 * (nf - 1.0) * a + 2.0 * (nf - 1.0) / nf * s * b + (nf - 1.0) / nf * s * g,
        }
    }

    /// Predicted time of a broadcast of `bytes` by `algo` over `n` ranks, in seconds.
    pub fn bcast_time(&self, algo: BcastAlgo, n: usize, bytes: usize) -> f64 {
        if n <= 1 {
            return 0.0;
        }
        let (a, b, s, nf) = (self.alpha, self.beta, bytes as f64, n as f64);
        match algo {
            BcastAlgo::Binomial => nf.log2().ceil() * (a + s * b),
            BcastAlgo::Chain => {
                let pieces = (bytes.div_ceil(BCAST_CHAIN_CHUNK_BYTES)).max(1) as f64;
                (nf - 2.0 + pieces) * (a + s / pieces * b)
            }
            // The root's link carries (n-1)/n of the message, then the ring allgather.
            BcastAlgo::ScatterAllgather => 2.0 * (nf - 1.0) * a + 2.0 * (nf - 1.0) / nf * s * b,
        }
    }

    /// The broadcast algorithm with the lowest predicted time.
    pub fn choose_bcast(&self, n: usize, bytes: usize) -> BcastAlgo {
        cheapest(&BcastAlgo::ALL, |a| self.bcast_time(a, n, bytes))
    }

    /// Predicted time of an allgather of `bytes` per rank by `algo` over `n` ranks.
    pub fn allgather_time(&self, algo: AllgatherAlgo, n: usize, bytes: usize) -> f64 {
        if n <= 1 {
            return 0.0;
        }
        let (a, b, g, s, nf) = (self.alpha, self.beta, self.gamma, bytes as f64, n as f64);
        match algo {
            AllgatherAlgo::Ring => (nf - 1.0) * (a + s * b),
            // Bruck moves the same bytes in fewer messages, then rotates them locally
            // (charged at the reduction rate, a memory-bound pass).
            AllgatherAlgo::Bruck => nf.log2().ceil() * a + (nf - 1.0) * s * b + nf * s * g,
            // The folded ranks send their block in and get the whole result back.
            AllgatherAlgo::RecursiveDoubling => {
                let p = pow2_floor(n) as f64;
                let fold = if p < nf { 2.0 * a + s * b + nf * s * b } else { 0.0 };
                p.log2() * a + (nf - 1.0) * s * b + fold
            }
        }
    }

    /// Predicted time of a reduce-scatter of blocks of `bytes` by `algo` over `n` ranks.
    pub fn reduce_scatter_time(&self, algo: ReduceScatterAlgo, n: usize, bytes: usize) -> f64 {
        if n <= 1 {
            return 0.0;
        }
        let (a, b, g, s, nf) = (self.alpha, self.beta, self.gamma, bytes as f64, n as f64);
        match algo {
            ReduceScatterAlgo::Ring => (nf - 1.0) * (a + s * (b + g)),
            ReduceScatterAlgo::RecursiveHalving => {
                let p = pow2_floor(n) as f64;
                let whole = nf * s;
                let fold = if p < nf { 2.0 * a + whole * (b + g) + s * b } else { 0.0 };
                p.log2() * a + (p - 1.0) / p * whole * (b + g) + fold
            }
        }
    }

    /// The reduce-scatter algorithm with the lowest predicted time.
    pub fn choose_reduce_scatter(&self, n: usize, bytes: usize) -> ReduceScatterAlgo {
        cheapest(&ReduceScatterAlgo::ALL, |a| self.reduce_scatter_time(a, n, bytes))
    }

    /// The allgather algorithm with the lowest predicted time.
    pub fn choose_allgather(&self, n: usize, bytes: usize) -> AllgatherAlgo {
        cheapest(&AllgatherAlgo::ALL, |a| self.allgather_time(a, n, bytes))
    }

    /// Predicted time of an alltoall of `bytes` per block by `algo` over `n` ranks.
    pub fn alltoall_time(&self, algo: AlltoallAlgo, n: usize, bytes: usize) -> f64 {
        if n <= 1 {
            return 0.0;
        }
        let (a, b, g, s, nf) = (self.alpha, self.beta, self.gamma, bytes as f64, n as f64);
        match algo {
            AlltoallAlgo::Pairwise => (nf - 1.0) * (a + s * b),
            // About half the blocks move in each of log2 n steps, plus packing and the
            // two rotations (charged as memory passes).
            AlltoallAlgo::Bruck => {
                let steps = nf.log2().ceil();
                steps * (a + nf / 2.0 * s * b) + (2.0 + steps) * nf * s * g
            }
        }
    }

    /// The alltoall algorithm with the lowest predicted time.
    pub fn choose_alltoall(&self, n: usize, bytes: usize) -> AlltoallAlgo {
        cheapest(&AlltoallAlgo::ALL, |a| self.alltoall_time(a, n, bytes))
    }

    /// The selectable algorithm with the lowest predicted time.
    pub fn choose_allreduce(&self, n: usize, bytes: usize) -> AllreduceAlgo {
        cheapest(&AllreduceAlgo::SELECTABLE, |a| self.allreduce_time(a, n, bytes))
    }
}

/// Algorithm choices measured on one job (see `Communicator::tune`): for each
/// collective, the fastest algorithm at each measured size, as `(bytes, algorithm)`
/// sorted by size. A size between two measured ones takes the choice of the nearer
/// on a log scale. The sizes mean what the selection functions of [`Tuning`] take
/// (the whole buffer for allreduce and broadcast, one rank's block for the others).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Measured {
    /// The rank count the table was measured with; other groups (such as those of a
    /// split) ignore it.
    pub ranks: usize,
    pub allreduce: Vec<(usize, AllreduceAlgo)>,
    pub broadcast: Vec<(usize, BcastAlgo)>,
    pub allgather: Vec<(usize, AllgatherAlgo)>,
    pub reduce_scatter: Vec<(usize, ReduceScatterAlgo)>,
    pub alltoall: Vec<(usize, AlltoallAlgo)>,
}

impl Measured {
    fn pick<A: Copy>(&self, table: &[(usize, A)], n: usize, bytes: usize) -> Option<A> {
        if n != self.ranks {
            return None;
        }
        let dist = |size: usize| ((bytes as f64 + 1.0).log2() - (size as f64 + 1.0).log2()).abs();
        table.iter().min_by(|x, y| dist(x.0).total_cmp(&dist(y.0))).map(|e| e.1)
    }
}

/// How a communicator chooses its algorithms.
#[derive(Debug, Clone, PartialEq)]
pub struct Tuning {
    pub cost: CostModel,
    /// Forces this allreduce algorithm (`HCOMM_ALGO_ALLREDUCE`).
    pub allreduce: Option<AllreduceAlgo>,
    /// Reproducible mode (`HCOMM_REPRODUCIBLE=1`): float reductions in fixed rank order.
    pub reproducible: bool,
    /// Forces this broadcast algorithm (`HCOMM_ALGO_BROADCAST`).
    pub broadcast: Option<BcastAlgo>,
    /// Forces this allgather algorithm (`HCOMM_ALGO_ALLGATHER`).
    pub allgather: Option<AllgatherAlgo>,
    /// Forces this alltoall algorithm (`HCOMM_ALGO_ALLTOALL`).
    pub alltoall: Option<AlltoallAlgo>,
    /// Forces this reduce-scatter algorithm (`HCOMM_ALGO_REDUCE_SCATTER`).
    pub reduce_scatter: Option<ReduceScatterAlgo>,
    /// Choices measured on this job; they take precedence over the cost model.
    pub measured: Measured,
}

impl Tuning {
    /// Defaults for a transport.
    pub fn for_transport(name: &str) -> Tuning {
        Tuning {
            cost: CostModel::for_transport(name),
            allreduce: None,
            reproducible: false,
            broadcast: None,
            allgather: None,
            alltoall: None,
            reduce_scatter: None,
            measured: Measured::default(),
        }
    }

    /// Applies `HCOMM_ALGO_ALLREDUCE`, `HCOMM_ALGO_BROADCAST`, `HCOMM_ALGO_ALLGATHER`,
    /// `HCOMM_ALGO_ALLTOALL`, `HCOMM_ALGO_REDUCE_SCATTER` (an algorithm name or `auto`),
    /// `HCOMM_REPRODUCIBLE` (`0`/`1`), and the cost parameters `HCOMM_COST_ALPHA_US`
    /// (microseconds per message), `HCOMM_COST_GBPS` (link bandwidth) and
    /// `HCOMM_COST_REDUCE_GBPS`, read through `get`. Every rank must see the same
    /// values: ranks that choose different algorithms fail with a mismatch error.
    ///
    /// # Errors
    /// A configuration error naming the variable at fault.
    pub fn with_env(mut self, get: impl Fn(&str) -> Option<String>) -> Result<Tuning> {
        if let Some(v) = get("HCOMM_ALGO_ALLREDUCE") {
            self.allreduce = if v.trim() == "auto" { None } else { Some(v.parse()?) };
        }
        if let Some(v) = get("HCOMM_ALGO_BROADCAST") {
            self.broadcast = if v.trim() == "auto" { None } else { Some(v.parse()?) };
        }
        if let Some(v) = get("HCOMM_ALGO_ALLGATHER") {
            self.allgather = if v.trim() == "auto" { None } else { Some(v.parse()?) };
        }
        if let Some(v) = get("HCOMM_ALGO_ALLTOALL") {
            self.alltoall = if v.trim() == "auto" { None } else { Some(v.parse()?) };
        }
        if let Some(v) = get("HCOMM_ALGO_REDUCE_SCATTER") {
            self.reduce_scatter = if v.trim() == "auto" { None } else { Some(v.parse()?) };
        }
        if let Some(v) = get("HCOMM_REPRODUCIBLE") {
            self.reproducible = Error::parse_flag("HCOMM_REPRODUCIBLE", &v)?;
        }
        let num = |var: &str| -> Result<Option<f64>> {
            match get(var) {
                None => Ok(None),
                Some(v) => match v.trim().parse::<f64>() {
                    Ok(x) if x > 0.0 && x.is_finite() => Ok(Some(x)),
                    _ => Err(Error::config(format!("{var}={v:?} is not a positive number"))),
                },
            }
        };
        if let Some(us) = num("HCOMM_COST_ALPHA_US")? {
            self.cost.alpha = us * 1e-6;
        }
        if let Some(gbps) = num("HCOMM_COST_GBPS")? {
            self.cost.beta = 1.0 / (gbps * 1e9);
        }
        if let Some(gbps) = num("HCOMM_COST_REDUCE_GBPS")? {
            self.cost.gamma = 1.0 / (gbps * 1e9);
        }
        Ok(self)
    }

    /// The algorithm asked for or forced, else the measured table's, else the cost
    /// model's.
    fn choose<A: Copy>(
        &self,
        forced: Option<A>,
        table: &[(usize, A)],
        n: usize,
        bytes: usize,
        model: impl FnOnce() -> A,
    ) -> A {
        forced.or_else(|| self.measured.pick(table, n, bytes)).unwrap_or_else(model)
    }

    /// The broadcast algorithm for `bytes` over `n` ranks: asked, forced, measured, or
    /// cheapest by the cost model (so for every family below).
    pub fn bcast_algo(&self, n: usize, bytes: usize, asked: Option<BcastAlgo>) -> BcastAlgo {
        self.choose(asked.or(self.broadcast), &self.measured.broadcast, n, bytes, || self.cost.choose_bcast(n, bytes))
    }

    /// The alltoall algorithm for blocks of `bytes` over `n` ranks.
    pub fn alltoall_algo(&self, n: usize, bytes: usize, asked: Option<AlltoallAlgo>) -> AlltoallAlgo {
        self.choose(asked.or(self.alltoall), &self.measured.alltoall, n, bytes, || self.cost.choose_alltoall(n, bytes))
    }

    /// The allgather algorithm for `bytes` per rank over `n` ranks.
    pub fn allgather_algo(&self, n: usize, bytes: usize, asked: Option<AllgatherAlgo>) -> AllgatherAlgo {
        self.choose(asked.or(self.allgather), &self.measured.allgather, n, bytes, || {
            self.cost.choose_allgather(n, bytes)
        })
    }

    /// The reduce-scatter algorithm for blocks of `bytes` over `n` ranks.
    pub fn reduce_scatter_algo(&self, n: usize, bytes: usize, asked: Option<ReduceScatterAlgo>) -> ReduceScatterAlgo {
        self.choose(asked.or(self.reduce_scatter), &self.measured.reduce_scatter, n, bytes, || {
            self.cost.choose_reduce_scatter(n, bytes)
        })
    }

    /// The algorithm an allreduce of `bytes` of `dtype` over `n` ranks runs:
    /// `Ordered` for floats in reproducible mode, else the forced one, else the
    /// cheapest by the cost model.
    pub fn allreduce_algo(&self, n: usize, bytes: usize, float: bool, asked: Option<AllreduceAlgo>) -> AllreduceAlgo {
        if self.reproducible && float {
            return AllreduceAlgo::Ordered;
        }
        self.choose(asked.or(self.allreduce), &self.measured.allreduce, n, bytes, || {
            self.cost.choose_allreduce(n, bytes)
        })
    }
}

/// Signature of an allreduce of `count` elements of `E` with `op` by `algo` (the
/// algorithm travels in the signature: ranks that chose differently get a mismatch
/// error instead of a hang).
pub fn allreduce_signature<E: Element>(count: usize, op: ReduceOp, algo: AllreduceAlgo) -> Signature {
    Signature {
        op: OpKind::AllReduce,
        dtype: Some(E::DTYPE),
        reduce: Some(op),
        count: count as u64,
        root: None,
        algo: algo as u8,
    }
}

/// The entry of `all` with the lowest predicted time (the first of equals).
fn cheapest<A: Copy>(all: &[A], time: impl Fn(A) -> f64) -> A {
    all.iter().copied().min_by(|x, y| time(*x).total_cmp(&time(*y))).expect("every algorithm family has members")
}

pub(crate) fn pow2_floor(n: usize) -> usize {
    if n == 0 { 0 } else { 1 << (usize::BITS - 1 - n.leading_zeros()) }
}

/// Allreduce of `buf` with `op` by `algo`.
///
/// # Errors
/// Invalid operator for the element type; mismatched signatures; peer failure;
/// timeout; abort by another rank.
pub async fn allreduce<T: LocalTransport, E: Element>(
    ctx: OpCtx<'_, T>,
    buf: &mut [E],
    op: ReduceOp,
    algo: AllreduceAlgo,
) -> Result<()> {
    let body = async {
        check_reduce_op::<E>(op)?;
        let n = ctx.size();
        if n == 1 {
            return Ok(());
        }
        match algo {
            AllreduceAlgo::Ring => ring(&ctx, buf, op).await,
            AllreduceAlgo::RecursiveDoubling => recursive_doubling(&ctx, buf, op).await,
            AllreduceAlgo::Rabenseifner => rabenseifner(&ctx, buf, op).await,
            AllreduceAlgo::Tree => {
                reduce_binomial(&ctx, buf, op, 0, 0).await?;
                if ctx.rank() == 0 && op == ReduceOp::Avg {
                    E::div_count(buf, n);
                }
                bcast_binomial(&ctx, buf, 0, 1).await
            }
            AllreduceAlgo::Ordered => ordered(&ctx, buf, op).await,
        }
    };
    let r = ctx.deadline(body).await;
    ctx.finish(r)
}

async fn ring<T: LocalTransport, E: Element>(ctx: &OpCtx<'_, T>, buf: &mut [E], op: ReduceOp) -> Result<()> {
    let n = ctx.size();
    let ring = ctx.ring();
    let pos = ring.iter().position(|&r| r == ctx.rank()).expect("the ring holds every rank");
    let (left, right) = (ring[(pos + n - 1) % n], ring[(pos + 1) % n]);
    let seg_bytes = buf.len().div_ceil(n) * std::mem::size_of::<E>();
    let m = seg_bytes.div_ceil(RING_CHUNK_BYTES).clamp(1, RING_MAX_COLUMNS);
    try_join_all(
        carve(buf, n, m)
            .into_iter()
            .enumerate()
            .map(|(c, pieces)| async move { ring_column(ctx, pieces, c, pos, left, right, op).await }),
    )
    .await?;
    Ok(())
}

pub(crate) const FOLD_TAG: u32 = 1 << 20;
pub(crate) const UNFOLD_TAG: u32 = FOLD_TAG + 1;

/// Folds the ranks beyond the largest power of two `p` into partners: among the first
/// `2(n-p)` ranks, even ones hand their data to the next odd one and sit out. Returns
/// this rank's index among the `p` that go on, or `None` if it sits out.
async fn fold_in<T: LocalTransport, E: Element>(
    ctx: &OpCtx<'_, T>,
    buf: &mut [E],
    op: ReduceOp,
) -> Result<Option<usize>> {
    let (n, r) = (ctx.size(), ctx.rank());
    let rem = n - pow2_floor(n);
    if r >= 2 * rem {
        return Ok(Some(r - rem));
    }
    if r % 2 == 0 {
        ctx.send(r + 1, FOLD_TAG, ctx.payload(buf)).await?;
        Ok(None)
    } else {
        reduce_in(op, buf, &ctx.recv(r - 1, FOLD_TAG).await?)?;
        Ok(Some(r / 2))
    }
}

/// The group rank of index `v` among the ranks that go on after [`fold_in`].
pub(crate) fn unfolded(v: usize, n: usize) -> usize {
    let rem = n - pow2_floor(n);
    if v < rem { 2 * v + 1 } else { v + rem }
}

/// Hands the result back to the ranks that sat out.
async fn fold_out<T: LocalTransport, E: Element>(ctx: &OpCtx<'_, T>, buf: &mut [E]) -> Result<()> {
    let (n, r) = (ctx.size(), ctx.rank());
    let rem = n - pow2_floor(n);
    if r >= 2 * rem {
        Ok(())
    } else if r % 2 == 0 {
        copy_in(buf, &ctx.recv(r + 1, UNFOLD_TAG).await?)
    } else {
        ctx.send(r - 1, UNFOLD_TAG, ctx.payload(buf)).await
    }
}

async fn recursive_doubling<T: LocalTransport, E: Element>(
    ctx: &OpCtx<'_, T>,
    buf: &mut [E],
    op: ReduceOp,
) -> Result<()> {
    let n = ctx.size();
    if let Some(v) = fold_in(ctx, buf, op).await? {
        let p = pow2_floor(n);
        let mut mask = 1;
        let mut step = 0u32;
        while mask < p {
            let partner = unfolded(v ^ mask, n);
            let incoming = ctx.recv(partner, step);
            let (_, data) = try_join(ctx.send(partner, step, ctx.payload(buf)), incoming).await?;
            // a op b on one side, b op a on the other: the same bits, as the
            // operators are commutative.
            reduce_in(op, buf, &data)?;
            mask <<= 1;
            step += 1;
        }
        if op == ReduceOp::Avg {
            E::div_count(buf, n);
        }
    }
    fold_out(ctx, buf).await
}

async fn rabenseifner<T: LocalTransport, E: Element>(ctx: &OpCtx<'_, T>, buf: &mut [E], op: ReduceOp) -> Result<()> {
    let n = ctx.size();
    if let Some(v) = fold_in(ctx, buf, op).await? {
        let p = pow2_floor(n);
        let count = buf.len();
        let blk = |i: usize| bound(count, p, i);
        // Reduce-scatter by recursive halving: keep the half of the block range that
        // holds block v, send the other half to the partner.
        let (mut lo, mut hi) = (0, p);
        let mut mask = p >> 1;
        let mut step = 0u32;
        while mask > 0 {
            let partner = unfolded(v ^ mask, n);
            let mid = (lo + hi) / 2;
            let (keep, give) = if v & mask == 0 { ((lo, mid), (mid, hi)) } else { ((mid, hi), (lo, mid)) };
            let payload = ctx.payload(&buf[blk(give.0)..blk(give.1)]);
            let incoming = ctx.recv(partner, step);
            let dst = &mut buf[blk(keep.0)..blk(keep.1)];
            try_join(ctx.send(partner, step, payload), async move { reduce_in(op, dst, &incoming.await?) }).await?;
            (lo, hi) = keep;
            mask >>= 1;
            step += 1;
        }
        if op == ReduceOp::Avg {
            E::div_count(&mut buf[blk(lo)..blk(hi)], n);
        }
        // Allgather by recursive doubling: the owned range doubles each step.
        let mut mask = 1;
        while mask < p {
            let partner = unfolded(v ^ mask, n);
            let width = hi - lo;
            let (theirs_lo, theirs_hi) = if v & mask == 0 { (hi, hi + width) } else { (lo - width, lo) };
            let payload = ctx.payload(&buf[blk(lo)..blk(hi)]);
            let incoming = ctx.recv(partner, step);
            let dst = &mut buf[blk(theirs_lo)..blk(theirs_hi)];
            try_join(ctx.send(partner, step, payload), async move { copy_in(dst, &incoming.await?) }).await?;
            (lo, hi) = (lo.min(theirs_lo), hi.max(theirs_hi));
            mask <<= 1;
            step += 1;
        }
    }
    fold_out(ctx, buf).await
}

/// Reproducible mode: segment `g` is reduced at rank `g` as
/// `x_0 op x_1 op … op x_{n-1}`, element by element, whatever the message size, then
/// allgathered.
async fn ordered<T: LocalTransport, E: Element>(ctx: &OpCtx<'_, T>, buf: &mut [E], op: ReduceOp) -> Result<()> {
    let (n, me) = (ctx.size(), ctx.rank());
    let count = buf.len();
    let seg = |g: usize| bound(count, n, g)..bound(count, n, g + 1);
    let mine = seg(me);
    let recvs: Vec<_> = (0..n).map(|g| (g != me).then(|| ctx.recv(g, 0))).collect();
    let sends = try_join_all((0..n).filter(|&g| g != me).map(|g| ctx.send(g, 0, ctx.payload(&buf[seg(g)]))));
    let gather = async {
        let mut parts = Vec::with_capacity(n);
        for (g, r) in recvs.into_iter().enumerate() {
            parts.push(match r {
                Some(f) => Some(f.await?),
                None => None,
            });
            let _ = g;
        }
        Ok::<_, Error>(parts)
    };
    let (_, parts) = try_join(sends, gather).await?;
    let own: Vec<E> = buf[mine.clone()].to_vec();
    let acc = &mut buf[mine];
    // Rank 0's contribution first, then each next rank's, in order.
    match &parts[0] {
        Some(p0) => copy_in(acc, p0)?,
        None => acc.copy_from_slice(&own),
    }
    for (g, part) in parts.iter().enumerate().skip(1) {
        match part {
            Some(p) => reduce_in(op, acc, p)?,
            None => E::reduce(op, acc, &own),
        }
        let _ = g;
    }
    if op == ReduceOp::Avg {
        E::div_count(acc, n);
    }
    let counts: Vec<usize> = (0..n).map(|g| seg(g).len()).collect();
    ring_allgatherv_in(ctx, buf, &counts, 1 << 16).await
}

fn ring_tag(step: usize, column: usize) -> u32 {
    ((step as u32) << 8) | column as u32
}

/// Cuts `buf` into `n` segments of `m` pieces each and returns them by column:
/// `cols[c][j]` is piece `c` of segment `j`.
fn carve<E>(buf: &mut [E], n: usize, m: usize) -> Vec<Vec<&mut [E]>> {
    let count = buf.len();
    let mut cols: Vec<Vec<&mut [E]>> = (0..m).map(|_| Vec::with_capacity(n)).collect();
    let mut rest = buf;
    for j in 0..n {
        let (mut seg, tail) = std::mem::take(&mut rest).split_at_mut(bound(count, n, j + 1) - bound(count, n, j));
        rest = tail;
        let seg_len = seg.len();
        for (c, col) in cols.iter_mut().enumerate() {
            let (piece, t) = std::mem::take(&mut seg).split_at_mut(bound(seg_len, m, c + 1) - bound(seg_len, m, c));
            seg = t;
            col.push(piece);
        }
    }
    cols
}

async fn ring_column<T: LocalTransport, E: Element>(
    ctx: &OpCtx<'_, T>,
    mut pieces: Vec<&mut [E]>,
    col: usize,
    pos: usize,
    left: usize,
    right: usize,
    op: ReduceOp,
) -> Result<()> {
    let n = pieces.len();
    // Reduce-scatter: after step s, the piece received is reduced over s + 2 ranks.
    for s in 0..n - 1 {
        let (send_seg, recv_seg) = ((pos + n - s) % n, (pos + 2 * n - s - 1) % n);
        let tag = ring_tag(s, col);
        let payload = ctx.payload(pieces[send_seg]);
        let recv = ctx.recv(left, tag);
        let dst = &mut *pieces[recv_seg];
        try_join(ctx.send(right, tag, payload), async move { reduce_in(op, dst, &recv.await?) }).await?;
    }
    let own = (pos + 1) % n;
    if op == ReduceOp::Avg {
        E::div_count(pieces[own], n);
    }
    // Allgather: pass the reduced pieces on.
    for s in 0..n - 1 {
        let (send_seg, recv_seg) = ((pos + 1 + n - s) % n, (pos + n - s) % n);
        let tag = ring_tag(n - 1 + s, col);
        let payload = ctx.payload(pieces[send_seg]);
        let recv = ctx.recv(left, tag);
        let dst = &mut *pieces[recv_seg];
        try_join(ctx.send(right, tag, payload), async move { copy_in(dst, &recv.await?) }).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carve_covers_everything_once() {
        for count in [0usize, 1, 7, 64, 1001] {
            for n in 1..6 {
                for m in 1..4 {
                    let mut buf: Vec<usize> = (0..count).collect();
                    let cols = carve(&mut buf, n, m);
                    assert_eq!(cols.len(), m);
                    let mut seen: Vec<usize> = cols.iter().flatten().flat_map(|p| p.iter().copied()).collect();
                    seen.sort();
                    assert_eq!(seen, (0..count).collect::<Vec<_>>());
                }
            }
        }
    }

    #[test]
    fn selection_follows_size() {
        let tcp = CostModel::for_transport("tcp");
        assert_eq!(tcp.choose_allreduce(8, 8), AllreduceAlgo::RecursiveDoubling);
        assert!(matches!(tcp.choose_allreduce(8, 64 << 20), AllreduceAlgo::Ring | AllreduceAlgo::Rabenseifner));
        assert_eq!(tcp.choose_allreduce(1, 1 << 20), AllreduceAlgo::Ring);
        assert_eq!(tcp.choose_bcast(8, 8), BcastAlgo::Binomial);
        assert_eq!(tcp.choose_bcast(8, 64 << 20), BcastAlgo::Chain);
        // Small blocks: recursive doubling on a power of two (no rotation), Bruck
        // otherwise (no fold).
        assert_eq!(tcp.choose_allgather(8, 8), AllgatherAlgo::RecursiveDoubling);
        assert_eq!(tcp.choose_allgather(6, 8), AllgatherAlgo::Bruck);
        assert_eq!(tcp.choose_reduce_scatter(8, 8), ReduceScatterAlgo::RecursiveHalving);
        assert_eq!(tcp.choose_reduce_scatter(6, 1 << 20), ReduceScatterAlgo::Ring);
        assert_eq!(tcp.choose_alltoall(16, 8), AlltoallAlgo::Bruck);
        assert_eq!(tcp.choose_alltoall(16, 1 << 20), AlltoallAlgo::Pairwise);
        assert_eq!(pow2_floor(1), 1);
        assert_eq!(pow2_floor(12), 8);
        assert_eq!(unfolded(0, 6), 1);
        assert_eq!(unfolded(3, 6), 5);
    }

    #[test]
    fn env_overrides() {
        let t = Tuning::for_transport("tcp")
            .with_env(|k| match k {
                "HCOMM_ALGO_ALLREDUCE" => Some("tree".into()),
                "HCOMM_COST_ALPHA_US" => Some("5".into()),
                _ => None,
            })
            .unwrap();
        assert_eq!(t.allreduce, Some(AllreduceAlgo::Tree));
        assert!((t.cost.alpha - 5e-6).abs() < 1e-12);
        assert_eq!(t.allreduce_algo(4, 100, true, Some(AllreduceAlgo::Ring)), AllreduceAlgo::Ring);
        assert_eq!(t.allreduce_algo(4, 100, true, None), AllreduceAlgo::Tree);
        let e = Tuning::for_transport("tcp")
            .with_env(|k| (k == "HCOMM_ALGO_ALLREDUCE").then(|| "fast".into()))
            .unwrap_err();
        assert!(e.to_string().contains("unknown allreduce algorithm"), "{e}");
        let e =
            Tuning::for_transport("tcp").with_env(|k| (k == "HCOMM_REPRODUCIBLE").then(|| "maybe".into())).unwrap_err();
        assert!(e.to_string().contains("HCOMM_REPRODUCIBLE"), "{e}");
        let t = Tuning::for_transport("tcp")
            .with_env(|k| (k == "HCOMM_ALGO_REDUCE_SCATTER").then(|| "recursive_halving".into()))
            .unwrap();
        assert_eq!(t.reduce_scatter_algo(4, 1 << 30, None), ReduceScatterAlgo::RecursiveHalving);
    }

    #[test]
    fn measured_table_takes_the_nearest_size_on_a_log_scale() {
        let mut t = Tuning::for_transport("tcp");
        t.measured = Measured {
            ranks: 4,
            allreduce: vec![
                (8, AllreduceAlgo::Tree),
                (4096, AllreduceAlgo::RecursiveDoubling),
                (1 << 20, AllreduceAlgo::Ring),
            ],
            reduce_scatter: vec![(8, ReduceScatterAlgo::RecursiveHalving)],
            ..Measured::default()
        };
        assert_eq!(t.allreduce_algo(4, 0, false, None), AllreduceAlgo::Tree);
        assert_eq!(t.allreduce_algo(4, 100, false, None), AllreduceAlgo::Tree);
        assert_eq!(t.allreduce_algo(4, 300, false, None), AllreduceAlgo::RecursiveDoubling);
        assert_eq!(t.allreduce_algo(4, 60_000, false, None), AllreduceAlgo::RecursiveDoubling);
        assert_eq!(t.allreduce_algo(4, 70_000, false, None), AllreduceAlgo::Ring);
        assert_eq!(t.allreduce_algo(4, 1 << 30, false, None), AllreduceAlgo::Ring);
        assert_eq!(t.reduce_scatter_algo(4, 1 << 30, None), ReduceScatterAlgo::RecursiveHalving);
        // Asked and forced algorithms win; an empty family and other rank counts fall
        // back to the cost model.
        assert_eq!(t.allreduce_algo(4, 100, false, Some(AllreduceAlgo::Ring)), AllreduceAlgo::Ring);
        assert_eq!(t.allreduce_algo(8, 8, false, None), t.cost.choose_allreduce(8, 8));
        assert_eq!(t.bcast_algo(4, 8, None), t.cost.choose_bcast(4, 8));
        t.allreduce = Some(AllreduceAlgo::Rabenseifner);
        assert_eq!(t.allreduce_algo(4, 100, false, None), AllreduceAlgo::Rabenseifner);
    }
}
