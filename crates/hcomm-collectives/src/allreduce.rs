//! Allreduce algorithms, the cost model that chooses between them, and the ordered
//! reduction of reproducible mode.
//!
//! Every algorithm is correct for any rank count: the power-of-two algorithms
//! (recursive doubling, Rabenseifner) first fold the `n - p` extra ranks into
//! partners (`p` the largest power of two not above `n`) and hand them the result at
//! the end. Every algorithm leaves bitwise identical results on every rank.

use futures::future::{try_join, try_join_all};
use hcomm_core::keys::{Phase, op_tag, step_tag};
use hcomm_core::{Element, Error, LocalTransport, OpKind, ReduceOp, Result, Signature};
use hcomm_topology::{Level, Topology};

use crate::adapt::{AlgoFamily, Contest};
use crate::exchange::ring_allgatherv_in;
use crate::exchange::{AllgatherAlgo, AlltoallAlgo, ReduceScatterAlgo};
use crate::rooted::{BCAST_CHAIN_CHUNK_BYTES, BcastAlgo};
use crate::rooted::{bcast_binomial, reduce_binomial};
use crate::{OpCtx, bound, check_reduce_op, copy_in, reduce_in};

/// Target size of one pipelined piece of a ring allreduce. A segment larger than this
/// is cut into columns that travel the ring independently, so that reducing one piece
/// overlaps sending the next. At the size from which TCP receives land in their
/// buffer (`HCOMM_TCP_LAND`, 512 KiB), so that a column's pieces do.
pub const RING_CHUNK_BYTES: usize = 512 << 10;
/// Most columns a ring allreduce uses.
pub const RING_MAX_COLUMNS: usize = 64;
/// Most columns a ring allreduce uses where its ranks crowd their host
/// ([`Tuning::crowded`]): larger pieces, fewer of them in flight at once, since
/// each piece in flight costs context switches the crowded processors pay for.
pub const RING_MAX_COLUMNS_CROWDED: usize = 16;
/// From this size the ring is the allreduce of ranks that crowd their host
/// ([`CostModel::choose_allreduce_crowded`]); see that method for why.
pub const CROWDED_RING_BYTES: usize = 16 << 20;

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
        /// Topology-aware: reduce-scatter among the ranks of each host, then among
        /// the hosts of each rack, a ring allreduce of the remaining block across the
        /// racks (one ring per rail), then allgathers back out. Equal to the ring when
        /// the group has no hierarchy (one host, or one rank per host in one rack).
        Hierarchical = 6 => "hierarchical",
    }
}

impl AllreduceAlgo {
    /// The algorithms the selection chooses from on a flat network (`Ordered` is
    /// reproducible mode's).
    pub const SELECTABLE: [AllreduceAlgo; 4] =
        [AllreduceAlgo::Ring, AllreduceAlgo::RecursiveDoubling, AllreduceAlgo::Rabenseifner, AllreduceAlgo::Tree];

    /// The algorithms the selection chooses from on `layout`: [`Self::SELECTABLE`],
    /// and the hierarchical allreduce when the layout has a hierarchy.
    pub fn candidates(layout: &Layout) -> Vec<AllreduceAlgo> {
        let mut v = AllreduceAlgo::SELECTABLE.to_vec();
        if !layout.stages.is_empty() {
            v.push(AllreduceAlgo::Hierarchical);
        }
        v
    }
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
    /// Links between ranks of one host (shared memory), when they differ from the
    /// transport's.
    pub host: LinkCost,
    /// Links between racks (the spine). `alpha` and `beta` above stand for the links
    /// between hosts of one rack.
    pub spine: LinkCost,
    /// Processor time of one message where the ranks outnumber the processors
    /// ([`Tuning::crowded`]): the system calls and wake-ups at its two ends, without
    /// the wire's latency that `alpha` holds. 3 µs by default: about one 8-byte
    /// `writev` to a polling reader (`benches/compare/msg_ceiling.c` measures it).
    pub msg_work: f64,
}

/// Latency and inverse bandwidth of one level's links.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkCost {
    /// Seconds per message.
    pub alpha: f64,
    /// Seconds per byte.
    pub beta: f64,
}

/// What the algorithm selection knows of a group's topology: the levels its ring
/// crosses and the shape of its hierarchical allreduce. The default is one flat
/// network, where every level costs the same.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// The slowest level a ring edge crosses, and how many edges cross it.
    pub ring_level: Level,
    pub ring_slow_edges: usize,
    /// The hierarchical allreduce's stages from the innermost out: group size and the
    /// level of the links inside each group.
    pub stages: Vec<(usize, Level)>,
    /// Ranks of the top ring, the slowest level it crosses and how many of its edges
    /// cross it.
    pub top: usize,
    pub top_level: Level,
    pub top_slow_edges: usize,
}

impl Layout {
    /// A flat network of `n` ranks (what [`CostModel::allreduce_time`] assumes).
    pub fn flat(n: usize) -> Layout {
        Layout {
            ring_level: Level::Rack,
            ring_slow_edges: n,
            stages: Vec::new(),
            top: n,
            top_level: Level::Rack,
            top_slow_edges: n,
        }
    }

    /// The layout of a group whose ring is `ring` over `topo`, from the hierarchical
    /// plan of any of its ranks (every rank's has the same shape).
    pub fn new(topo: &Topology, ring: &[usize]) -> Layout {
        let n = ring.len();
        if n < 2 {
            return Layout::flat(n);
        }
        let slowest = |r: &[usize]| -> (Level, usize) {
            let lv: Vec<Level> = (0..r.len()).map(|i| topo.level(r[i], r[(i + 1) % r.len()])).collect();
            let worst = lv.iter().copied().max().unwrap_or(Level::Rank).max(Level::Host);
            (worst, lv.iter().filter(|&&l| l == worst).count())
        };
        let plan = HierPlan::new(topo, ring, ring[0]);
        let (ring_level, ring_slow_edges) = slowest(ring);
        let (top_level, top_slow_edges) = if plan.top.len() < 2 { (Level::Host, 0) } else { slowest(&plan.top) };
        Layout {
            ring_level,
            ring_slow_edges,
            stages: plan.stages.iter().map(|st| (st.members.len(), st.level)).collect(),
            top: plan.top.len(),
            top_level,
            top_slow_edges,
        }
    }
}

/// One stage of a hierarchical allreduce, as one rank sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Stage {
    /// The ranks of this rank's group at this level, in ring order.
    pub members: Vec<usize>,
    /// This rank's index among them: the block it keeps.
    pub index: usize,
    /// The level of the links inside the group.
    pub level: Level,
}

/// One rank's part in a hierarchical allreduce over a topology.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HierPlan {
    /// From the innermost level out.
    pub stages: Vec<Stage>,
    /// The ranks of the ring that allreduces this rank's last block: the ranks with
    /// the same index in every group of the last stage (its rail).
    pub top: Vec<usize>,
}

impl HierPlan {
    /// The plan of rank `me` of a group whose ring is `ring`. Level by level (host,
    /// then rack), the remaining ranks are grouped; a level where every group holds
    /// one rank is skipped, and the plan stops at a level with a single group or with
    /// groups of different sizes (the top ring then spans what remains, so the
    /// algorithm stays correct on any placement).
    pub fn new(topo: &Topology, ring: &[usize], me: usize) -> HierPlan {
        let mut m = ring.to_vec();
        let mut stages = Vec::new();
        for level in [Level::Host, Level::Rack] {
            let key = |r: usize| if level == Level::Host { topo.host_of(r) } else { topo.rack_of(r) };
            let mut keys: Vec<usize> = Vec::new();
            let mut groups: Vec<Vec<usize>> = Vec::new();
            for &r in &m {
                match keys.iter().position(|&k| k == key(r)) {
                    Some(i) => groups[i].push(r),
                    None => {
                        keys.push(key(r));
                        groups.push(vec![r]);
                    }
                }
            }
            if groups.len() == m.len() {
                continue;
            }
            if groups.len() == 1 || groups.iter().any(|g| g.len() != groups[0].len()) {
                break;
            }
            let Some(g) = groups.iter().find(|g| g.contains(&me)) else { break };
            let index = g.iter().position(|&r| r == me).expect("found above");
            stages.push(Stage { members: g.clone(), index, level });
            m = groups.iter().map(|g| g[index]).collect();
        }
        HierPlan { stages, top: m }
    }
}

impl CostModel {
    /// Defaults for a transport, from measurements on small 2-core VMs: in-process
    /// (`mem`) messages are cheap and wide, loopback TCP ones cost tens of microseconds
    /// and about 2 GB/s.
    /// Links inside a host and across the spine default to the transport's own
    /// figures: nothing says they differ until configured (`HCOMM_COST_HOST_*`,
    /// `HCOMM_COST_SPINE_*`).
    pub fn for_transport(name: &str) -> CostModel {
        let (alpha, beta) = match name {
            "mem" => (2e-6, 1.0 / 8e9),
            _ => (40e-6, 1.0 / 2e9),
        };
        let same = LinkCost { alpha, beta };
        CostModel { alpha, beta, gamma: 1.0 / 10e9, host: same, spine: same, msg_work: 3e-6 }
    }

    /// The links of `level`.
    pub fn link(&self, level: Level) -> LinkCost {
        match level {
            Level::Rank | Level::Host => self.host,
            Level::Rack => LinkCost { alpha: self.alpha, beta: self.beta },
            Level::Spine => self.spine,
        }
    }

    /// Predicted time of `algo` for `bytes` over a group laid out as `layout`. The
    /// ring and the power-of-two algorithms pay for the slowest level their messages
    /// cross; messages that cross the spine at the same time share it (a ring's edges
    /// across it, half in each direction; every rail of the hierarchical top ring).
    /// The hierarchical allreduce pays each stage's exchange at its own level.
    pub fn allreduce_time_on(&self, layout: &Layout, algo: AllreduceAlgo, n: usize, bytes: usize) -> f64 {
        let share = |level: Level, edges: usize| if level == Level::Spine { (edges / 2).max(1) as f64 } else { 1.0 };
        let on = |level: Level, share: f64| CostModel {
            alpha: self.link(level).alpha,
            beta: self.link(level).beta * share,
            ..*self
        };
        match algo {
            AllreduceAlgo::Ring | AllreduceAlgo::Ordered => {
                on(layout.ring_level, share(layout.ring_level, layout.ring_slow_edges)).allreduce_time(algo, n, bytes)
            }
            AllreduceAlgo::RecursiveDoubling | AllreduceAlgo::Rabenseifner => {
                on(layout.ring_level, share(layout.ring_level, n)).allreduce_time(algo, n, bytes)
            }
            AllreduceAlgo::Tree => on(layout.ring_level, 1.0).allreduce_time(algo, n, bytes),
            AllreduceAlgo::Hierarchical => {
                let mut len = bytes as f64;
                let mut t = 0.0;
                let mut rails = 1.0;
                for &(k, level) in &layout.stages {
                    let (l, f) = (self.link(level), (k as f64 - 1.0) / k as f64);
                    t += 2.0 * (l.alpha + f * len * l.beta) + f * len * self.gamma;
                    len /= k as f64;
                    rails *= k as f64;
                }
                let top = on(layout.top_level, rails * share(layout.top_level, layout.top_slow_edges));
                t + top.allreduce_time(AllreduceAlgo::Ring, layout.top, len as usize)
            }
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
            AllreduceAlgo::Ordered | AllreduceAlgo::Hierarchical => {
                2.0 * (nf - 1.0) * a + 2.0 * (nf - 1.0) / nf * s * b + (nf - 1.0) / nf * s * g
            }
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

    /// The sum of every transfer of a broadcast of `bytes` by `algo` over `n` ranks
    /// (each [`msg_work`](CostModel::msg_work) plus its bytes times `beta`): its time
    /// where transfers cannot run at the same time.
    pub fn bcast_work(&self, algo: BcastAlgo, n: usize, bytes: usize) -> f64 {
        if n <= 1 {
            return 0.0;
        }
        let (a, b, s, nf) = (self.msg_work, self.beta, bytes as f64, n as f64);
        match algo {
            BcastAlgo::Binomial => (nf - 1.0) * (a + s * b),
            BcastAlgo::Chain => {
                let pieces = (bytes.div_ceil(BCAST_CHAIN_CHUNK_BYTES)).max(1) as f64;
                (nf - 1.0) * (pieces * a + s * b)
            }
            // The root's n-1 blocks, then n-1 blocks from each rank.
            BcastAlgo::ScatterAllgather => (nf - 1.0) * (nf + 1.0) * (a + s / nf * b),
        }
    }

    /// [`CostModel::choose_bcast`] for `n` ranks that share one host with fewer
    /// processors than ranks (`None`: not so). A transfer between two ranks
    /// of one host keeps two processors busy (the sender's copy into the kernel, the
    /// receiver's out of it), so at most half the processors' worth run at once, and
    /// an algorithm takes at least its [`work`](CostModel::bcast_work) divided by
    /// that. What the chain's pipeline and scatter-allgather's spread gain is
    /// transfers at the same time, which crowded processors cannot give, so the
    /// binomial tree, whose transfers are the fewest, wins there where the model
    /// without this bound chose the chain.
    pub fn choose_bcast_crowded(&self, n: usize, bytes: usize, crowded: Option<Crowded>) -> BcastAlgo {
        let Some(c) = Crowded::of(crowded, n) else { return self.choose_bcast(n, bytes) };
        cheapest(&BcastAlgo::ALL, |a| {
            self.bcast_time(a, n, bytes).max(crowded_time(c.processors, self.bcast_work(a, n, bytes), 0.0))
        })
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

    /// The selectable algorithm with the lowest predicted time on a flat network.
    pub fn choose_allreduce(&self, n: usize, bytes: usize) -> AllreduceAlgo {
        cheapest(&AllreduceAlgo::SELECTABLE, |a| self.allreduce_time(a, n, bytes))
    }

    /// The algorithm with the lowest predicted time on `layout`: the hierarchical one
    /// competes when the layout has stages.
    pub fn choose_allreduce_on(&self, layout: &Layout, n: usize, bytes: usize) -> AllreduceAlgo {
        cheapest(&AllreduceAlgo::candidates(layout), |a| self.allreduce_time_on(layout, a, n, bytes))
    }

    /// The work of an allreduce of `bytes` by `algo` over `n` ranks, summed over the
    /// ranks: its transfers (each [`msg_work`](CostModel::msg_work) plus its bytes
    /// times `beta`) and its reductions (bytes times `gamma`), as a pair.
    pub fn allreduce_work(&self, algo: AllreduceAlgo, n: usize, bytes: usize) -> (f64, f64) {
        if n <= 1 {
            return (0.0, 0.0);
        }
        let (w, b, g, s, nf) = (self.msg_work, self.beta, self.gamma, bytes as f64, n as f64);
        let p = pow2_floor(n) as f64;
        let steps = p.log2();
        // Ranks beyond a power of two send their buffer to a partner, which reduces
        // it, and get the result back.
        let extra = nf - p;
        let (fold_t, fold_r) = (2.0 * extra * (w + s * b), extra * s * g);
        match algo {
            AllreduceAlgo::Ring | AllreduceAlgo::Ordered | AllreduceAlgo::Hierarchical => {
                let columns =
                    (bytes.div_ceil(n) as f64 / RING_CHUNK_BYTES as f64).ceil().clamp(1.0, RING_MAX_COLUMNS as f64);
                (2.0 * nf * (nf - 1.0) * columns * w + 2.0 * (nf - 1.0) * s * b, (nf - 1.0) * s * g)
            }
            AllreduceAlgo::RecursiveDoubling => (p * steps * (w + s * b) + fold_t, p * steps * s * g + fold_r),
            AllreduceAlgo::Rabenseifner => {
                (2.0 * p * steps * w + 2.0 * (p - 1.0) * s * b + fold_t, (p - 1.0) * s * g + fold_r)
            }
            AllreduceAlgo::Tree => (2.0 * (nf - 1.0) * (w + s * b), (nf - 1.0) * s * g),
        }
    }

    /// [`CostModel::choose_allreduce_on`] for ranks that share one host with fewer
    /// processors than ranks (`None`: not so): each algorithm takes at least its
    /// [`work`](CostModel::allreduce_work) spread over the processors (see
    /// [`CostModel::choose_bcast_crowded`]). Recursive doubling, the cheapest in time up to
    /// 256 KiB on 4 ranks, moves every rank's whole buffer `log2 n` times, against
    /// `2(n-1)/n` of it for the others. The tree, whose work (the fewest messages)
    /// the bound favours from 128 KiB, competes only where the ranks are bound to
    /// processors in blocks ([`Crowded::blocks`]), since its time depends on which
    /// ranks share a processor; unbound, Rabenseifner's algorithm takes over from
    /// 64 KiB.
    ///
    /// From [`CROWDED_RING_BYTES`] the ring, whatever the bound says: its pieces
    /// are reduced as they come, while the tree and Rabenseifner's algorithm
    /// receive whole buffers (or halves) before they reduce and pass them on, and
    /// crowded processors cannot hide that wait. The measurements behind the rules
    /// for crowded hosts are in `docs/tuning-rules.md`.
    pub fn choose_allreduce_crowded(
        &self,
        layout: &Layout,
        n: usize,
        bytes: usize,
        crowded: Option<Crowded>,
    ) -> AllreduceAlgo {
        let Some(c) = Crowded::of(crowded, n) else { return self.choose_allreduce_on(layout, n, bytes) };
        let (p, mut algos) = (c.processors, AllreduceAlgo::candidates(layout));
        if bytes >= CROWDED_RING_BYTES && algos.contains(&AllreduceAlgo::Ring) {
            return AllreduceAlgo::Ring;
        }
        if !c.blocks {
            algos.retain(|&a| a != AllreduceAlgo::Tree);
        }
        cheapest(&algos, |a| {
            let (moved, reduced) = self.allreduce_work(a, n, bytes);
            self.allreduce_time_on(layout, a, n, bytes).max(crowded_time(p, moved, reduced))
        })
    }
}

/// A host that every rank of a group shares, with fewer processors than ranks
/// ([`Tuning::crowded`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crowded {
    /// Its online processors.
    pub processors: usize,
    /// Whether its ranks bind themselves to processors in blocks (`HCOMM_BIND`, on
    /// by default for ranks launched as processes; every rank must ask alike, as it
    /// changes the algorithms chosen).
    pub blocks: bool,
}

impl Crowded {
    /// `crowded` where `n` ranks outnumber its processors, else `None`: the test
    /// every crowded rule applies.
    pub fn of(crowded: Option<Crowded>, n: usize) -> Option<Crowded> {
        crowded.filter(|c| c.processors < n)
    }
}

/// The least time of transfers and reductions of `moved` and `reduced` seconds of
/// work in all on `processors` processors: a transfer between two ranks of one host
/// keeps two of them busy (the sender's copy into the kernel, the receiver's out of
/// it), a reduction one.
fn crowded_time(processors: usize, moved: f64, reduced: f64) -> f64 {
    moved / (processors / 2).max(1) as f64 + reduced / processors.max(1) as f64
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
    /// The allreduce's alternatives to its choice at the sizes of `allreduce` where
    /// any came close (fastest first): the adaptive selection ([`Tuning::adaptive`])
    /// keeps timing them there while the job runs, and switches when one gets ahead.
    pub allreduce_alternatives: Vec<(usize, Vec<AllreduceAlgo>)>,
    pub broadcast: Vec<(usize, BcastAlgo)>,
    /// As `allreduce_alternatives`, for the broadcast.
    pub broadcast_alternatives: Vec<(usize, Vec<BcastAlgo>)>,
    pub allgather: Vec<(usize, AllgatherAlgo)>,
    /// As `allreduce_alternatives`, for the allgather.
    pub allgather_alternatives: Vec<(usize, Vec<AllgatherAlgo>)>,
    pub reduce_scatter: Vec<(usize, ReduceScatterAlgo)>,
    /// As `allreduce_alternatives`, for the reduce-scatter.
    pub reduce_scatter_alternatives: Vec<(usize, Vec<ReduceScatterAlgo>)>,
    pub alltoall: Vec<(usize, AlltoallAlgo)>,
    /// As `allreduce_alternatives`, for the alltoall.
    pub alltoall_alternatives: Vec<(usize, Vec<AlltoallAlgo>)>,
}

impl Measured {
    /// The choice measured at the size nearest to `bytes` on a log scale (the first
    /// of equally near ones).
    ///
    /// This runs on every collective call that is not forced, so it compares ratios
    /// in integers: the float version (two `log2` per entry and comparison) cost
    /// about a microsecond per call, a visible share of a small shared-memory
    /// collective.
    fn pick<A: Copy>(&self, table: &[(usize, A)], n: usize, bytes: usize) -> Option<A> {
        if n != self.ranks {
            return None;
        }
        nearest(table, bytes).map(|i| table[i].1)
    }

    /// Where the adaptive selection decides a call of family `A` of `bytes` on `n`
    /// ranks: the measured size nearest to `bytes` (its class), with the choice and
    /// the alternatives there, if the table has any at that size.
    pub fn contest<A: AlgoFamily>(&self, n: usize, bytes: usize) -> Option<Contest<A>> {
        if n != self.ranks {
            return None;
        }
        let (table, alternatives) = A::tables(self);
        let (size, first) = table[nearest(table, bytes)?];
        let (_, others) = alternatives.iter().find(|(s, _)| *s == size)?;
        Contest::new(size, first, others)
    }
}

/// The index of the entry of `table` whose size is nearest to `bytes` on a log scale
/// (the first of equally near ones).
fn nearest<A>(table: &[(usize, A)], bytes: usize) -> Option<usize> {
    // How far `size` is from `bytes` on a log scale, as the ratio hi / lo of the
    // two (each plus one, at most 2^62 + 1), kept as the fraction (hi, lo).
    let at_most = |x: usize| x.min(1 << 62) as u128 + 1;
    let ratio = |size: usize| {
        let (a, b) = (at_most(bytes), at_most(size));
        if a >= b { (a, b) } else { (b, a) }
    };
    let mut best: Option<((u128, u128), usize)> = None;
    for (i, &(size, _)) in table.iter().enumerate() {
        let r = ratio(size);
        // r < best  <=>  r.0 / r.1 < b.0 / b.1  <=>  r.0 * b.1 < b.0 * r.1 (no
        // overflow: each factor is below 2^63).
        if best.is_none_or(|(b, _)| r.0 * b.1 < b.0 * r.1) {
            best = Some((r, i));
        }
    }
    best.map(|(_, i)| i)
}

/// How rooted collectives (broadcast, reduce, gather, scatter and their v-variants)
/// and scans make sure that every rank called them with the same arguments. Every
/// message carries its operation's signature (kind, element type, operator, count,
/// root, algorithm) and every receive compares it with its own; but in these
/// operations some ranks only send (a broadcast's root, a gather's leaves, a scan's
/// rank 0), and a rank that waits for a message another rank's different arguments
/// sent elsewhere would only see its deadline. The check adds one 24-byte record
/// per rank (the operation's number and signature), posted lazily: over TCP the
/// records of consecutive operations leave in one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgCheck {
    /// No check message (`HCOMM_CHECK_ARGS=0`): the ranks that receive still find a
    /// mismatch in the data's signature; those that only send return `Ok`, and a
    /// rank waiting for a message that never comes waits for its deadline.
    Off,
    /// The default (`HCOMM_CHECK_ARGS=1`): each rank sends a record of its signature
    /// to the next rank of the group and checks the previous one's, beside the data,
    /// without waiting for it. A rank that finds a difference while the operation runs
    /// fails it and aborts it on every rank; a rank whose operation ended before its
    /// neighbour's record arrived checks it later, and a difference found then fails
    /// the next collective it starts, with a mismatch error naming the operation at
    /// fault (that operation is aborted on every rank still in it, and the next one
    /// on every rank, whose error then carries the finder's message). A root thus runs
    /// ahead into its next broadcast as in MPI. At most [`MAX_UNCHECKED`]
    /// operations wait for their check at once; `Communicator::finalize` (crate
    /// `hcomm`) waits for the last ones.
    ///
    /// [`MAX_UNCHECKED`]: crate::MAX_UNCHECKED
    Deferred,
    /// `HCOMM_CHECK_ARGS=sync`: the signatures go round `ceil(log2 n)` dissemination
    /// rounds beside the data, and no rank finishes before every signature has been
    /// checked against its own, so that a mismatch fails the operation itself on
    /// every rank. Each such operation then waits for every rank, which costs small
    /// broadcasts a synchronisation they otherwise do without.
    Sync,
}

impl std::str::FromStr for ArgCheck {
    type Err = Error;

    fn from_str(s: &str) -> Result<ArgCheck> {
        match s.trim() {
            "0" | "off" | "false" | "no" => Ok(ArgCheck::Off),
            "1" | "on" | "true" | "yes" | "deferred" => Ok(ArgCheck::Deferred),
            "sync" => Ok(ArgCheck::Sync),
            _ => Err(Error::config(format!("HCOMM_CHECK_ARGS={s:?} is not 0, 1 (deferred) or sync"))),
        }
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
    /// Rings follow the topology (rack, then host contiguous) and the hierarchical
    /// allreduce competes (`HCOMM_TOPO_AWARE`, default on). Off, rings run in rank
    /// order over a flat network: the baseline the topology-aware algorithms are
    /// measured against.
    pub topology_aware: bool,
    /// How rooted collectives and scans check that every rank called them with the
    /// same arguments (`HCOMM_CHECK_ARGS`; see [`ArgCheck`]). Default: deferred.
    pub check_args: ArgCheck,
    /// The one host every rank of the group runs on, when the ranks outnumber its
    /// processors (`None` otherwise, and where the ranks are on several hosts): the
    /// broadcast's and the allreduce's cost models then count every transfer
    /// ([`CostModel::choose_bcast_crowded`], [`CostModel::choose_allreduce_crowded`]).
    /// Set at `init` from the operating system's count of online processors, which
    /// every rank of one host reads alike.
    pub crowded: Option<Crowded>,
    /// The adaptive selection (`HCOMM_ADAPT`, default on): where the measured
    /// table has alternatives ([`Measured::allreduce_alternatives`] and the other
    /// families'), allreduces and broadcasts of 64 KiB and more, and allgathers,
    /// reduce-scatters and alltoalls of 4 KiB blocks and more, keep timing the
    /// choice and them while the job runs, and every rank switches to the fastest
    /// at the same call (see [`crate::adapt`]). Off, the table decides alone.
    pub adaptive: bool,
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
            topology_aware: true,
            check_args: ArgCheck::Deferred,
            crowded: None,
            adaptive: true,
        }
    }

    /// Applies `HCOMM_ALGO_ALLREDUCE`, `HCOMM_ALGO_BROADCAST`, `HCOMM_ALGO_ALLGATHER`,
    /// `HCOMM_ALGO_ALLTOALL`, `HCOMM_ALGO_REDUCE_SCATTER` (an algorithm name or `auto`),
    /// `HCOMM_REPRODUCIBLE`, `HCOMM_ADAPT`, `HCOMM_TOPO_AWARE`, `HCOMM_CHECK_ARGS` (`0`, `1`, `sync`), and the cost
    /// parameters `HCOMM_COST_ALPHA_US` (microseconds per message), `HCOMM_COST_GBPS`
    /// (bandwidth of the links between hosts of a rack), `HCOMM_COST_REDUCE_GBPS`,
    /// `HCOMM_COST_HOST_US` / `HCOMM_COST_HOST_GBPS` (links inside a host) and
    /// `HCOMM_COST_SPINE_US` / `HCOMM_COST_SPINE_GBPS` (links between racks), read
    /// through `get`. The spine and host links default to the rack's figures, set
    /// before them. Every rank must see the same
    /// values: ranks that choose different algorithms fail with a mismatch error.
    ///
    /// # Errors
    /// A configuration error naming the variable at fault.
    pub fn with_env(mut self, get: impl Fn(&str) -> Option<String>) -> Result<Tuning> {
        use hcomm_core::settings as set;
        let get = &get;
        fn algo<A: std::str::FromStr<Err = Error>>(v: Option<String>) -> Result<Option<Option<A>>> {
            v.map(|v| if v == "auto" { Ok(None) } else { v.parse().map(Some) }).transpose()
        }
        if let Some(a) = algo(set::ALGO_ALLREDUCE.text(get)?)? {
            self.allreduce = a;
        }
        if let Some(a) = algo(set::ALGO_BROADCAST.text(get)?)? {
            self.broadcast = a;
        }
        if let Some(a) = algo(set::ALGO_ALLGATHER.text(get)?)? {
            self.allgather = a;
        }
        if let Some(a) = algo(set::ALGO_ALLTOALL.text(get)?)? {
            self.alltoall = a;
        }
        if let Some(a) = algo(set::ALGO_REDUCE_SCATTER.text(get)?)? {
            self.reduce_scatter = a;
        }
        if let Some(on) = set::REPRODUCIBLE.flag(get)? {
            self.reproducible = on;
        }
        if let Some(on) = set::ADAPT.flag(get)? {
            self.adaptive = on;
        }
        if let Some(on) = set::TOPO_AWARE.flag(get)? {
            self.topology_aware = on;
        }
        if let Some(v) = set::CHECK_ARGS.text(get)? {
            self.check_args = v.parse()?;
        }
        let before = LinkCost { alpha: self.cost.alpha, beta: self.cost.beta };
        if let Some(us) = set::COST_ALPHA_US.number(get)? {
            self.cost.alpha = us * 1e-6;
        }
        if let Some(gbps) = set::COST_GBPS.number(get)? {
            self.cost.beta = 1.0 / (gbps * 1e9);
        }
        if let Some(gbps) = set::COST_REDUCE_GBPS.number(get)? {
            self.cost.gamma = 1.0 / (gbps * 1e9);
        }
        let rack = LinkCost { alpha: self.cost.alpha, beta: self.cost.beta };
        for (us, gbps, link) in [
            (set::COST_HOST_US, set::COST_HOST_GBPS, &mut self.cost.host),
            (set::COST_SPINE_US, set::COST_SPINE_GBPS, &mut self.cost.spine),
        ] {
            let us = us.number(get)?;
            let gbps = gbps.number(get)?;
            if *link == before {
                // Not set apart from the rack's links: follow them.
                *link = rack;
            }
            if let Some(us) = us {
                link.alpha = us * 1e-6;
            }
            if let Some(gbps) = gbps {
                link.beta = 1.0 / (gbps * 1e9);
            }
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
        self.choose(asked.or(self.broadcast), &self.measured.broadcast, n, bytes, || {
            self.cost.choose_bcast_crowded(n, bytes, self.crowded)
        })
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
        self.allreduce_algo_on(&Layout::flat(n), n, bytes, float, asked)
    }

    /// As [`Tuning::allreduce_algo`], for a group laid out as `layout`.
    pub fn allreduce_algo_on(
        &self,
        layout: &Layout,
        n: usize,
        bytes: usize,
        float: bool,
        asked: Option<AllreduceAlgo>,
    ) -> AllreduceAlgo {
        if self.reproducible && float {
            return AllreduceAlgo::Ordered;
        }
        self.choose(asked.or(self.allreduce), &self.measured.allreduce, n, bytes, || {
            self.cost.choose_allreduce_crowded(layout, n, bytes, self.crowded)
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
        // Each algorithm's future on the heap: inline, the largest of them made this
        // future kilobytes large, copied whole on every move before its first poll.
        match algo {
            AllreduceAlgo::Ring => Box::pin(ring(&ctx, buf, op)).await,
            AllreduceAlgo::RecursiveDoubling => Box::pin(recursive_doubling(&ctx, buf, op)).await,
            AllreduceAlgo::Rabenseifner => Box::pin(rabenseifner(&ctx, buf, op)).await,
            AllreduceAlgo::Tree => {
                Box::pin(reduce_binomial(&ctx, buf, op, 0, 0)).await?;
                if ctx.rank() == 0 && op == ReduceOp::Avg {
                    E::div_count(buf, n);
                }
                Box::pin(bcast_binomial(&ctx, buf, 0, 1)).await
            }
            AllreduceAlgo::Ordered => Box::pin(ordered(&ctx, buf, op)).await,
            AllreduceAlgo::Hierarchical => Box::pin(hierarchical(&ctx, buf, op)).await,
        }
    };
    let r = ctx.deadline(body).await;
    ctx.finish(r)
}

async fn ring<T: LocalTransport, E: Element>(ctx: &OpCtx<'_, T>, buf: &mut [E], op: ReduceOp) -> Result<()> {
    ring_over(ctx, ctx.ring(), buf, op).await
}

/// Ring allreduce of `buf` among `members` (group ranks in ring order, this rank
/// among them), its steps tagged in [`Phase::Steps`].
async fn ring_over<T: LocalTransport, E: Element>(
    ctx: &OpCtx<'_, T>,
    members: &[usize],
    buf: &mut [E],
    op: ReduceOp,
) -> Result<()> {
    let n = members.len();
    if n < 2 {
        return Ok(());
    }
    let pos = members.iter().position(|&r| r == ctx.rank()).expect("the ring holds this rank");
    let (left, right) = (members[(pos + n - 1) % n], members[(pos + 1) % n]);
    let seg_bytes = buf.len().div_ceil(n) * std::mem::size_of::<E>();
    let most = if Crowded::of(ctx.group().tuning().crowded, ctx.size()).is_some() {
        RING_MAX_COLUMNS_CROWDED
    } else {
        RING_MAX_COLUMNS
    };
    let m = seg_bytes.div_ceil(RING_CHUNK_BYTES).clamp(1, most);
    try_join_all(
        carve(buf, n, m)
            .into_iter()
            .enumerate()
            .map(|(c, pieces)| async move { ring_column(ctx, pieces, c as u32, pos, left, right, op).await }),
    )
    .await?;
    Ok(())
}

/// Stage `s` of a hierarchical plan, as its tags' phase counts it ([`Phase::Hier`]):
/// a plan has a stage per topology level below the top, far fewer than a tag tells
/// apart.
fn stage(s: usize) -> u8 {
    u8::try_from(s).unwrap_or(u8::MAX)
}

/// The hierarchical allreduce: see [`AllreduceAlgo::Hierarchical`] and [`HierPlan`].
/// Each element is reduced at one rank only (the owner of its block at the top
/// ring) and copied everywhere else, so every rank gets the same bits.
async fn hierarchical<T: LocalTransport, E: Element>(ctx: &OpCtx<'_, T>, buf: &mut [E], op: ReduceOp) -> Result<()> {
    let plan = ctx.group().hier_plan();
    // Averages are sums until the end.
    let inner = if op == ReduceOp::Avg { ReduceOp::Sum } else { op };
    let mut ranges = Vec::with_capacity(plan.stages.len());
    let (mut lo, mut hi) = (0, buf.len());
    // Down: each stage's group reduce-scatters this rank's current range; every
    // member sends its copy of each block straight to the block's keeper.
    for (s, st) in plan.stages.iter().enumerate() {
        ranges.push((lo, hi));
        let k = st.members.len();
        let at = |j: usize| lo + bound(hi - lo, k, j);
        let tag = step_tag(Phase::Hier(stage(s), false), 0);
        let others = || st.members.iter().enumerate().filter(|&(j, _)| j != st.index);
        let recvs: Vec<_> = others().map(|(_, &r)| ctx.recv(r, tag)).collect();
        let sends = try_join_all(others().map(|(j, &r)| ctx.send(r, tag, ctx.payload(&buf[at(j)..at(j + 1)]))));
        let (mlo, mhi) = (at(st.index), at(st.index + 1));
        let mine = &mut buf[mlo..mhi];
        let reduce = async move {
            for r in recvs {
                reduce_in(inner, mine, &r.await?)?;
            }
            Ok(())
        };
        try_join(sends, reduce).await?;
        (lo, hi) = (mlo, mhi);
    }
    ring_over(ctx, &plan.top, &mut buf[lo..hi], inner).await?;
    // Up: each stage's group allgathers the blocks it scattered.
    for (s, st) in plan.stages.iter().enumerate().rev() {
        let (plo, phi) = ranges[s];
        let k = st.members.len();
        let tag = step_tag(Phase::Hier(stage(s), true), 0);
        let payload = ctx.payload(&buf[lo..hi]);
        let sends = try_join_all(
            st.members
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != st.index)
                .map(|(_, &r)| ctx.send(r, tag, payload.clone())),
        );
        let mut blocks = Vec::with_capacity(k);
        let mut rest = &mut buf[plo..phi];
        for j in 0..k {
            let (b, tail) = std::mem::take(&mut rest).split_at_mut(bound(phi - plo, k, j + 1) - bound(phi - plo, k, j));
            rest = tail;
            blocks.push(b);
        }
        let fills = try_join_all(
            blocks
                .into_iter()
                .zip(&st.members)
                .enumerate()
                .filter(|&(j, _)| j != st.index)
                .map(|(_, (dst, &r))| async move { copy_in(dst, &ctx.recv(r, tag).await?) }),
        );
        try_join(sends, fills).await?;
        (lo, hi) = (plo, phi);
    }
    if op == ReduceOp::Avg {
        E::div_count(buf, ctx.size());
    }
    Ok(())
}

pub(crate) const FOLD_TAG: u32 = step_tag(Phase::Fold, 0);
pub(crate) const UNFOLD_TAG: u32 = step_tag(Phase::Unfold, 0);

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
            let incoming = ctx.recv(partner, step);
            let (src, dst) = read_write(buf, blk(give.0)..blk(give.1), blk(keep.0)..blk(keep.1));
            try_join(ctx.send_slice(partner, step, src), async move { reduce_in(op, dst, &incoming.await?) }).await?;
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
            let (src, dst) = read_write(buf, blk(lo)..blk(hi), blk(theirs_lo)..blk(theirs_hi));
            let incoming = ctx.recv_into(partner, step, dst);
            try_join(ctx.send_slice(partner, step, src), incoming).await?;
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
    ring_allgatherv_in(ctx, buf, &counts, Phase::Allgather).await
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

/// One column of a ring allreduce; `col` is its index, which its tags carry beside
/// the step ([`op_tag`]).
async fn ring_column<T: LocalTransport, E: Element>(
    ctx: &OpCtx<'_, T>,
    mut pieces: Vec<&mut [E]>,
    col: u32,
    pos: usize,
    left: usize,
    right: usize,
    op: ReduceOp,
) -> Result<()> {
    let n = pieces.len();
    // Each step sends one piece and receives into another, and awaits both: the piece
    // sent goes out of the caller's buffer itself (over shared memory the neighbour
    // copies it from there), and an allgather piece is received straight into place.
    // Reduce-scatter: after step s, the piece received is reduced over s + 2 ranks.
    for s in 0..n - 1 {
        let (send_seg, recv_seg) = ((pos + n - s) % n, (pos + 2 * n - s - 1) % n);
        let tag = op_tag(Phase::Steps, s as u32, col);
        let recv = ctx.recv(left, tag);
        let (src, dst) = send_and_recv(&mut pieces, send_seg, recv_seg);
        try_join(ctx.send_slice(right, tag, src), async move { reduce_in(op, dst, &recv.await?) }).await?;
    }
    let own = (pos + 1) % n;
    if op == ReduceOp::Avg {
        E::div_count(pieces[own], n);
    }
    // Allgather: pass the reduced pieces on.
    for s in 0..n - 1 {
        let (send_seg, recv_seg) = ((pos + 1 + n - s) % n, (pos + n - s) % n);
        let tag = op_tag(Phase::Steps, (n - 1 + s) as u32, col);
        let (src, dst) = send_and_recv(&mut pieces, send_seg, recv_seg);
        // Posted first, so that the neighbour's message finds it waiting.
        let recv = ctx.recv_into(left, tag, dst);
        try_join(ctx.send_slice(right, tag, src), recv).await?;
    }
    Ok(())
}

/// Ranges `read` and `write` of `buf`, which do not overlap: the first to read (a
/// step's send), the second to write (its receive).
fn read_write<E>(buf: &mut [E], read: std::ops::Range<usize>, write: std::ops::Range<usize>) -> (&[E], &mut [E]) {
    if read.end <= write.start {
        let (head, tail) = buf.split_at_mut(write.start);
        (&head[read], &mut tail[..write.end - write.start])
    } else {
        assert!(write.end <= read.start, "a step sends and receives disjoint ranges");
        let (head, tail) = buf.split_at_mut(read.start);
        (&tail[..read.end - read.start], &mut head[write])
    }
}

/// Pieces `send` (to read) and `recv` (to write) of `pieces`, which differ.
fn send_and_recv<'p, E>(pieces: &'p mut [&mut [E]], send: usize, recv: usize) -> (&'p [E], &'p mut [E]) {
    assert_ne!(send, recv, "a ring step sends and receives different pieces");
    if send < recv {
        let (head, tail) = pieces.split_at_mut(recv);
        (&*head[send], &mut *tail[0])
    } else {
        let (head, tail) = pieces.split_at_mut(send);
        (&*tail[0], &mut *head[recv])
    }
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
    fn a_crowded_host_counts_every_transfer_of_a_broadcast_and_an_allreduce() {
        let tcp = CostModel::for_transport("tcp");
        let free = Crowded { processors: 2, blocks: false };
        let blocks = Crowded { blocks: true, ..free };
        // Spread out, the chain's pipeline wins from 1 MiB on 4 ranks.
        assert_eq!(tcp.choose_bcast(4, 1 << 20), BcastAlgo::Chain);
        assert_eq!(tcp.choose_bcast_crowded(4, 1 << 20, None), BcastAlgo::Chain);
        // 4 ranks on 2 processors: one transfer at a time, and the tree's are fewest.
        for bytes in [8, 64 << 10, 1 << 20, 16 << 20, 256 << 20] {
            assert_eq!(tcp.choose_bcast_crowded(4, bytes, Some(free)), BcastAlgo::Binomial, "{bytes}");
        }
        // As many processors as ranks: not crowded.
        assert_eq!(tcp.choose_bcast_crowded(4, 1 << 20, Some(Crowded { processors: 4, ..free })), BcastAlgo::Chain);
        // The work: every algorithm moves the message to each of the n-1 others at
        // least once; the chain in more messages, scatter-allgather in more bytes.
        let (w, t) = (|a| tcp.bcast_work(a, 4, 1 << 20), |a| tcp.bcast_time(a, 4, 1 << 20));
        assert!(w(BcastAlgo::Binomial) < w(BcastAlgo::Chain) && w(BcastAlgo::Chain) < w(BcastAlgo::ScatterAllgather));
        for a in BcastAlgo::ALL {
            assert!(w(a) >= t(a) * 0.999, "{a:?}: work {} below the time {}", w(a), t(a));
            assert_eq!(tcp.bcast_work(a, 1, 1 << 20), 0.0);
        }
        // Allreduce: recursive doubling while messages cost more than bytes, then
        // the algorithms that move 2(n-1)/n of the buffer, not log2(n) times all of it.
        let flat = Layout::flat(4);
        assert_eq!(tcp.choose_allreduce_on(&flat, 4, 128 << 10), AllreduceAlgo::RecursiveDoubling);
        for bytes in [8, 4 << 10, 32 << 10] {
            assert_eq!(
                tcp.choose_allreduce_crowded(&flat, 4, bytes, Some(free)),
                AllreduceAlgo::RecursiveDoubling,
                "{bytes}"
            );
        }
        for bytes in [64 << 10, 128 << 10, 1 << 20, 8 << 20] {
            assert_eq!(
                tcp.choose_allreduce_crowded(&flat, 4, bytes, Some(free)),
                AllreduceAlgo::Rabenseifner,
                "{bytes}"
            );
        }
        // Bound in blocks, the tree competes, and wins where the bytes outweigh the
        // messages.
        assert_eq!(tcp.choose_allreduce_crowded(&flat, 4, 8, Some(blocks)), AllreduceAlgo::RecursiveDoubling);
        for bytes in [256 << 10, 1 << 20, CROWDED_RING_BYTES - 1] {
            assert_eq!(tcp.choose_allreduce_crowded(&flat, 4, bytes, Some(blocks)), AllreduceAlgo::Tree, "{bytes}");
        }
        // From 16 MiB the ring, its pieces reduced as they come, bound or not.
        for c in [free, blocks] {
            for bytes in [CROWDED_RING_BYTES, 64 << 20, 256 << 20] {
                assert_eq!(tcp.choose_allreduce_crowded(&flat, 4, bytes, Some(c)), AllreduceAlgo::Ring, "{bytes}");
            }
        }
        // Not crowded, the bound and the threshold do not apply: the model alone
        // takes Rabenseifner's algorithm there.
        let spread = Some(Crowded { processors: 4, ..blocks });
        assert_eq!(tcp.choose_allreduce_crowded(&flat, 4, 16 << 20, spread), AllreduceAlgo::Rabenseifner);
        assert_eq!(tcp.choose_allreduce_on(&flat, 4, 16 << 20), AllreduceAlgo::Rabenseifner);
        assert_eq!(tcp.choose_allreduce_crowded(&flat, 4, 128 << 10, None), AllreduceAlgo::RecursiveDoubling);
        // Every algorithm moves at least 2(n-1)/n of the buffer per rank; recursive
        // doubling all of it log2(n) times; folded ranks add theirs.
        for n in [3, 4, 5, 8] {
            let s = 1 << 20;
            let bytes = |a| (tcp.allreduce_work(a, n, s).0 - tcp.allreduce_work(a, n, 0).0) / tcp.beta / s as f64;
            for a in AllreduceAlgo::SELECTABLE {
                assert!(bytes(a) >= 2.0 * (n as f64 - 1.0) - 1e-9, "{a:?} on {n}: {}", bytes(a));
            }
            if n.is_power_of_two() {
                assert!(bytes(AllreduceAlgo::RecursiveDoubling) > bytes(AllreduceAlgo::Tree), "{n}");
            }
            assert_eq!(tcp.allreduce_work(AllreduceAlgo::Ring, 1, s), (0.0, 0.0));
        }
        // The tuning carries it to the choice.
        let mut tuning = Tuning::for_transport("tcp");
        assert_eq!(tuning.bcast_algo(4, 1 << 20, None), BcastAlgo::Chain);
        assert_eq!(tuning.allreduce_algo(4, 128 << 10, true, None), AllreduceAlgo::RecursiveDoubling);
        tuning.crowded = Some(Crowded { processors: 2, blocks: false });
        assert_eq!(tuning.bcast_algo(4, 1 << 20, None), BcastAlgo::Binomial);
        assert_ne!(tuning.allreduce_algo(4, 128 << 10, true, None), AllreduceAlgo::RecursiveDoubling);
        assert_eq!(tuning.bcast_algo(4, 1 << 20, Some(BcastAlgo::Chain)), BcastAlgo::Chain);
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

    /// Rank `r` of `n` on host `r % hosts`, hosts alternating between two racks:
    /// neighbours in rank order never share a host, nor (with an even host count) a
    /// rack.
    fn interleaved(n: usize, hosts: usize) -> Topology {
        let p: Vec<hcomm_topology::Placement> = (0..n)
            .map(|r| hcomm_topology::Placement {
                host: format!("h{}", r % hosts),
                rack: Some(format!("rack{}", r % hosts % 2)),
                numa: None,
            })
            .collect();
        Topology::from_placements(&p)
    }

    #[test]
    fn hierarchical_plan_over_two_racks() {
        // 8 ranks, 4 hosts of 2, 2 racks of 2 hosts.
        let topo = interleaved(8, 4);
        let ring = topo.ring_order();
        assert_eq!(topo.ring_crossings(&ring, Level::Spine), 2);
        let plans: Vec<HierPlan> = (0..8).map(|me| HierPlan::new(&topo, &ring, me)).collect();
        for (me, p) in plans.iter().enumerate() {
            assert_eq!(p.stages.len(), 2, "rank {me}: {p:?}");
            assert_eq!(p.stages[0].level, Level::Host);
            assert_eq!(p.stages[1].level, Level::Rack);
            // The host group is this rank and the other rank of its host.
            assert!(p.stages[0].members.iter().all(|&r| topo.host_of(r) == topo.host_of(me)));
            assert!(p.stages[1].members.iter().all(|&r| topo.rack_of(r) == topo.rack_of(me)));
            assert_eq!(p.stages[1].members[p.stages[1].index], me);
            // The top ring has one rank per rack.
            assert_eq!(p.top.len(), 2);
            assert_ne!(topo.rack_of(p.top[0]), topo.rack_of(p.top[1]));
            assert!(p.top.contains(&me));
        }
        let l = Layout::new(&topo, &ring);
        assert_eq!(l.stages, vec![(2, Level::Host), (2, Level::Rack)]);
        assert_eq!((l.top, l.top_level, l.top_slow_edges), (2, Level::Spine, 2));
        assert_eq!((l.ring_level, l.ring_slow_edges), (Level::Spine, 2));
        // Hosts of different sizes: the host stage stops, the top ring spans all.
        let uneven = Topology::from_hosts(&["a", "a", "a", "b"]);
        let p = HierPlan::new(&uneven, &uneven.ring_order(), 3);
        assert!(p.stages.is_empty());
        assert_eq!(p.top, vec![0, 1, 2, 3]);
        // One host: no stage.
        assert!(HierPlan::new(&Topology::single_host(4), &[0, 1, 2, 3], 2).stages.is_empty());
    }

    #[test]
    fn a_slow_spine_selects_the_hierarchical_allreduce() {
        let topo = interleaved(8, 4);
        let aware = Layout::new(&topo, &topo.ring_order());
        let flat = Layout::flat(8);
        let mut cost = CostModel::for_transport("tcp");
        // Spine no slower than the rack: nothing to gain from the hierarchy at 16 MiB.
        assert_eq!(cost.choose_allreduce_on(&flat, 8, 16 << 20), cost.choose_allreduce(8, 16 << 20));
        // A spine at a tenth of the rack's bandwidth and shared memory inside hosts.
        cost.spine = LinkCost { alpha: 100e-6, beta: cost.beta * 10.0 };
        cost.host = LinkCost { alpha: 5e-6, beta: 1.0 / 5e9 };
        assert_eq!(cost.choose_allreduce_on(&aware, 8, 16 << 20), AllreduceAlgo::Hierarchical);
        let t = |a| cost.allreduce_time_on(&aware, a, 8, 16 << 20);
        assert!(t(AllreduceAlgo::Hierarchical) < t(AllreduceAlgo::Ring));
        // Small messages: with a spine as fast as the rack, the latency-bound
        // algorithms win; with a slow spine, crossing it once (hierarchical) does.
        let plain = CostModel::for_transport("tcp");
        assert_eq!(plain.choose_allreduce_on(&aware, 8, 64), AllreduceAlgo::RecursiveDoubling);
        assert_eq!(cost.choose_allreduce_on(&aware, 8, 64), AllreduceAlgo::Hierarchical);
        // The flat layout never offers it.
        assert!(!AllreduceAlgo::candidates(&flat).contains(&AllreduceAlgo::Hierarchical));
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
        // Host and spine links follow the rack's figures unless set apart.
        let t = Tuning::for_transport("tcp")
            .with_env(|k| match k {
                "HCOMM_COST_GBPS" => Some("4".into()),
                "HCOMM_COST_SPINE_GBPS" => Some("0.5".into()),
                "HCOMM_TOPO_AWARE" => Some("0".into()),
                _ => None,
            })
            .unwrap();
        assert!((t.cost.host.beta - 1.0 / 4e9).abs() < 1e-18 && (t.cost.spine.beta - 1.0 / 0.5e9).abs() < 1e-18);
        assert_eq!(t.cost.spine.alpha, t.cost.alpha);
        assert!(!t.topology_aware);
        let e =
            Tuning::for_transport("tcp").with_env(|k| (k == "HCOMM_COST_SPINE_US").then(|| "-1".into())).unwrap_err();
        assert!(e.to_string().contains("HCOMM_COST_SPINE_US"), "{e}");
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

    /// The integer comparison picks what the nearest size on a log scale is, for
    /// tables as `tune` leaves them (8 B x 2^k and 8 B x 4^k) and for sizes between
    /// and beyond their entries; the extremes do not overflow.
    #[test]
    fn measured_pick_is_the_nearest_on_a_log_scale() {
        for step in [2usize, 4] {
            let sizes: Vec<usize> = std::iter::successors(Some(8usize), |s| Some(s * step)).take(12).collect();
            let m = Measured { ranks: 2, ..Default::default() };
            let table: Vec<(usize, usize)> = sizes.iter().map(|&s| (s, s)).collect();
            let log = |x: usize| (x as f64 + 1.0).log2();
            let mut x = 0usize;
            while x < 1 << 26 {
                let d: Vec<f64> = sizes.iter().map(|&s| (log(x) - log(s)).abs()).collect();
                let mut order: Vec<usize> = (0..d.len()).collect();
                order.sort_by(|&a, &b| d[a].total_cmp(&d[b]));
                // Sizes within rounding of the midpoint of two entries may go either way.
                if d[order[1]] - d[order[0]] > 1e-9 {
                    assert_eq!(m.pick(&table, 2, x), Some(sizes[order[0]]), "{x} bytes, table 8 x {step}^k");
                }
                x = x * 9 / 8 + 1;
            }
            assert_eq!(m.pick(&table, 2, usize::MAX), Some(*sizes.last().unwrap()));
            assert_eq!(m.pick(&table, 3, 8), None, "another rank count");
        }
        let m = Measured { ranks: 1, ..Default::default() };
        assert_eq!(m.pick(&[(usize::MAX, 1u8), (0, 2)], 1, usize::MAX), Some(1));
        assert_eq!(m.pick::<u8>(&[], 1, 5), None);
    }
}
