//! The communicator.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::Either;
use hcomm_collectives as coll;
use hcomm_collectives::Group;
use hcomm_core::events;
use hcomm_core::keys::{P2P_SEQ, RESERVED_TAGS};
use hcomm_core::{
    DType, Element, Error, ErrorKind, Frame, Header, LocalTransport, MatchKey, OpKind, ReduceOp, Result, Signature, Tag,
};
use hcomm_topology::{Grid, Topology};
use hcomm_transport::StreamTransport;
use tracing::Instrument;

use crate::store::StoreServer;

/// The longest [`Communicator::finalize`] waits for its peers: a rank that finishes
/// should not hang on one that never will, whatever the operations' timeout.
const FINALIZE_MOST: Duration = Duration::from_secs(60);

/// What a job keeps alive while any of its communicators lives.
#[derive(Debug, Default)]
pub(crate) struct Keep {
    pub store: Option<StoreServer>,
}

/// A group of ranks that communicate: point-to-point messages and collectives, each a
/// future that the caller awaits, joins or spawns on its own executor.
///
/// Collectives are numbered when they are *called*, and ranks match them by that
/// order (as MPI and NCCL require): call them in the same order on every rank; poll
/// them in any order, or all at once. Point-to-point messages are matched by source,
/// tag and order, separately from collectives.
///
/// Generic over the transport: [`StreamTransport`] (TCP over tokio or io_uring,
/// the default) from [`crate::init`], `MemTransport` from [`crate::local`].
/// Generic code whose futures must be `Send` (to go to `tokio::spawn`) bounds the
/// transport with `T: hcomm::Transport + Sync` (the `Send` variant of
/// [`LocalTransport`], which every transport of this crate implements); with
/// `LocalTransport` alone, the futures are not known to be `Send`.
#[derive(Debug)]
pub struct Communicator<T: LocalTransport = StreamTransport> {
    pub(crate) group: Group<T>,
    keep: Arc<Keep>,
}

impl<T: LocalTransport> Communicator<T> {
    pub(crate) fn new(group: Group<T>, keep: Arc<Keep>) -> Communicator<T> {
        Communicator { group, keep }
    }

    /// This process's rank in the communicator.
    pub fn rank(&self) -> usize {
        self.group.rank()
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.group.size()
    }

    /// The transport's name: `mem`, `tcp` or `uring`.
    pub fn transport_name(&self) -> &'static str {
        self.group.transport().name()
    }

    /// The transport under this communicator (for its own reports, such as
    /// `StreamTransport::link_stats`).
    pub fn transport(&self) -> &T {
        self.group.transport()
    }

    /// Where the ranks run.
    pub fn topology(&self) -> &Topology {
        self.group.topology()
    }

    /// Ends this rank's part in the job in an orderly way, as `MPI_Finalize` does:
    /// closes the connections and waits until everything this rank queued is written
    /// and every peer has finalized or gone, for at most the communicator's timeout
    /// (and never more than a minute). Without it, a process that exits right after
    /// its last operation can cut off data still on its way to a slower peer: a
    /// socket closed with unread bytes is reset, and the kernel drops what it had not
    /// sent yet. Every rank calls it on its world communicator, after every
    /// communicator split from it is done. It takes `&self`, so a communicator
    /// shared between tasks (in an `Arc`) can be finalized by any of them; every
    /// operation called afterwards, from any clone, fails at once with a closed or
    /// peer-failed error, and a second call returns at once.
    ///
    /// # Errors
    /// A mismatch error that the argument checks of the last rooted collectives found
    /// (see [`Communicator::settle_checks`]), or a timeout if they did not end; a
    /// timeout error naming the ranks that had not closed in time. The connections
    /// are closed all the same.
    ///
    /// # Cancel safety
    /// Dropping the future stops the wait; the part of the shutdown it reached (close
    /// frames queued, readers stopped) stays done. Calling it again finishes it.
    pub async fn finalize(&self) -> Result<()> {
        let deadline = self.timeout().map_or(FINALIZE_MOST, |t| t.min(FINALIZE_MOST));
        let start = tokio::time::Instant::now();
        // The last rooted collectives' argument checks first (`ArgCheck::Deferred`):
        // a mismatch they find is this call's error. The shutdown has what is left
        // of the deadline.
        let checked = match tokio::time::timeout(deadline, self.settle_checks()).await {
            Ok(r) => r,
            Err(_) => Err(Error::new(
                ErrorKind::Timeout,
                format!("the argument checks of the last rooted collectives did not end within {deadline:?}"),
            )
            .at_rank(self.rank())),
        };
        let closed = self.group.transport().shutdown(deadline.saturating_sub(start.elapsed())).await;
        checked.and(closed)
    }

    /// Waits until the argument checks of this rank's earlier rooted collectives and
    /// scans have ended, and returns the first mismatch they found. Under the
    /// default deferred check ([`coll::ArgCheck::Deferred`]), such an operation may
    /// return here before the previous rank's signature arrived; a mismatch found
    /// then fails the next collective this rank starts. Call this where the answer
    /// is wanted sooner, for example before acting on the last broadcast's data.
    /// Not collective: it only waits for messages the other ranks' calls sent.
    ///
    /// # Errors
    /// A mismatch error of the operation at fault (its kind and sequence number;
    /// that operation is aborted on every rank still in it).
    ///
    /// # Cancel safety
    /// Dropping the future changes nothing: the checks it waited for stay for later.
    /// (A check whose operation was aborted, here or on another rank, is given up:
    /// the rank that gave up on it may never send its record.)
    pub async fn settle_checks(&self) -> Result<()> {
        self.group.settle_checks(0).await
    }

    /// Ring order of the ranks, as the ring algorithms use it: rack- and
    /// host-contiguous, or rank order with `HCOMM_TOPO_AWARE=0`.
    pub fn ring_order(&self) -> &[usize] {
        self.group.ring()
    }

    /// The allreduce algorithm an `all_reduce` of `bytes` would run now (floats:
    /// `float`), by the selection rules of the crate documentation: where the
    /// adaptive selection decides, the algorithm its current window runs (whose
    /// last two calls may run another).
    pub fn allreduce_algo_for(&self, bytes: usize, float: bool) -> coll::AllreduceAlgo {
        self.algo_for(bytes, float)
    }

    /// As [`Communicator::allreduce_algo_for`], for any family the adaptive
    /// selection serves: the allreduce, the broadcast, the allgather, the
    /// reduce-scatter and the alltoall (`bytes` as their tables count them: the
    /// whole buffer for the first two, one rank's block for the others; `float`
    /// matters to the reductions alone).
    pub fn algo_for<A: coll::AlgoFamily>(&self, bytes: usize, float: bool) -> A {
        self.group.algo_now::<A>(bytes, float)
    }

    /// Number of levels (host, rack) at which the hierarchical allreduce
    /// reduce-scatters before its top ring: 0 when the placement has no hierarchy it
    /// can use.
    pub fn hierarchical_stages(&self) -> usize {
        self.group.hier_plan().stages.len()
    }

    /// Deadline of each operation, counted from the call; `None` for never.
    pub fn timeout(&self) -> Option<Duration> {
        self.group.timeout()
    }

    /// Sets the deadline of operations called from now on: a duration, or `None`
    /// for never (as is anything longer than [`hcomm_core::NEVER`], about 34 years,
    /// `Duration::MAX` included). Operations already called keep theirs; a
    /// communicator shared between tasks (in an `Arc`) can be changed by any of them.
    pub fn set_timeout(&self, timeout: impl Into<Option<Duration>>) {
        self.group.set_timeout(timeout);
    }

    /// After how long an operation that waits reports which operation it is and
    /// which ranks have not sent their part (a `tracing` warning with target
    /// `hcomm::stall`, or a line on standard error when no subscriber is installed);
    /// again at twice, four times … that. `None` for never.
    pub fn stall_warn(&self) -> Option<Duration> {
        self.group.stall_warn()
    }

    /// Sets the stall threshold of operations called from now on (`None`: never).
    pub fn set_stall_warn(&self, after: Option<Duration>) {
        self.group.set_stall_warn(after);
    }

    /// Aborts this communicator on every rank, as `MPI_Abort` and `ncclCommAbort` do
    /// for a job that cannot go on: every pending and later operation on it, on every
    /// rank, fails with an aborted error that carries `reason` and names this rank.
    /// Not collective: any one rank may call it; the others learn it from a frame
    /// that goes out at once. Communicators made from this one by `split` are not
    /// affected (abort them too). Returns the error the operations fail with.
    pub fn abort(&self, reason: &str) -> Error {
        self.group.abort(reason).at_rank(self.rank())
    }

    /// After a rank failed: the surviving ranks agree on which ranks failed and build
    /// a communicator of the others (as MPI ULFM's `MPI_Comm_shrink` and NCCL's
    /// `ncclCommShrink`), so that a job can carry on. Ranks keep their order; a
    /// survivor's new rank is its old rank minus the failed ranks below it. Every
    /// surviving rank must call it (typically after an operation failed with a
    /// peer-failed error). It works on an aborted communicator too.
    ///
    /// A rank that fails *during* the shrink is noticed and left out; one that fails
    /// after it is the next shrink's business.
    ///
    /// # Errors
    /// A timeout naming the ranks that did not answer within the communicator's
    /// deadline; a peer-failed error if the others counted this rank as failed (it is
    /// not in their new communicator); a protocol error for a malformed message. The
    /// error carries this rank, `shrink` and the shrink's number.
    ///
    /// # Cancel safety
    /// Dropping the future leaves this rank out of the agreement, and the others wait
    /// for it until their deadline. This communicator is unaffected; retry by calling
    /// `shrink` again on every surviving rank.
    pub async fn shrink(&self) -> Result<Communicator<T>> {
        let g = self.group.shrink().instrument(tracing::debug_span!("shrink", size = self.size())).await?;
        Ok(Communicator::new(g, self.keep.clone()))
    }

    /// Number of collectives called so far.
    pub fn collectives_called(&self) -> u64 {
        self.group.collectives_started()
    }

    /// Element-wise reduction of `buf` across all ranks; every rank ends with the
    /// result, bitwise identical on every rank.
    ///
    /// # Errors
    /// An invalid-argument error if `op` is not defined for `E` (`Avg` on integers,
    /// bitwise operators on floats); a mismatch error on every rank if ranks pass
    /// different lengths, element types or operators; a peer-failed error if a rank
    /// dies or its connection breaks; a timeout naming the ranks that did not send
    /// their part; an aborted error if another rank failed or cancelled the operation;
    /// a mismatch error of an earlier rooted collective or scan whose argument check
    /// found a difference after that call had returned here
    /// ([`coll::ArgCheck::Deferred`]; this operation then did not run, and is aborted
    /// on every rank); where the adaptive selection decides ([`coll::adapt`]), a
    /// timeout naming the rank whose timings did not come before this call's window
    /// was due. The error carries this rank, the operation and its sequence
    /// number (of the earlier operation, for the last kind).
    ///
    /// # Cancel safety
    /// Not cancel safe for the data: dropping the future leaves `buf` partly reduced.
    /// The communicator stays usable: the dropped operation is aborted on every rank
    /// (their futures of it fail with an aborted error naming this rank), and later
    /// operations, which have other sequence numbers, are unaffected (the adaptive
    /// selection's timings are held by the communicator, not by the future).
    pub fn all_reduce<'a, E: Element>(
        &'a self,
        buf: &'a mut [E],
        op: ReduceOp,
    ) -> impl Future<Output = Result<()>> + 'a {
        self.all_reduce_impl(buf, op, None)
    }

    /// [`Communicator::all_reduce`] with a chosen algorithm (instead of the cost
    /// model's choice or `HCOMM_ALGO_ALLREDUCE`). Every rank must choose the same;
    /// ranks that do not get a mismatch error. In reproducible mode, float reductions
    /// use the ordered algorithm whatever is asked.
    ///
    /// # Errors
    /// As [`Communicator::all_reduce`].
    ///
    /// # Cancel safety
    /// As [`Communicator::all_reduce`].
    pub fn all_reduce_with<'a, E: Element>(
        &'a self,
        buf: &'a mut [E],
        op: ReduceOp,
        algo: coll::AllreduceAlgo,
    ) -> impl Future<Output = Result<()>> + 'a {
        self.all_reduce_impl(buf, op, Some(algo))
    }

    fn all_reduce_impl<'a, E: Element>(
        &'a self,
        buf: &'a mut [E],
        op: ReduceOp,
        asked: Option<coll::AllreduceAlgo>,
    ) -> impl Future<Output = Result<()>> + 'a {
        let bytes = std::mem::size_of_val(buf);
        match self.group.plan(bytes, E::DTYPE.is_float(), asked) {
            coll::AlgoPlan::Now(algo) => {
                let ctx = self.group.begin(coll::allreduce_signature::<E>(buf.len(), op, algo));
                Either::Left(traced_all_reduce(ctx, buf, op, algo))
            }
            coll::AlgoPlan::Adaptive(ticket) => {
                let seq = self.group.reserve();
                let sig = coll::allreduce_signature::<E>(buf.len(), op, ticket.first());
                Either::Right(adaptive_all_reduce(self.group.unstarted(seq, sig), ticket, buf, op))
            }
        }
    }

    /// [`Communicator::all_reduce`] on an owned buffer, for a future that must be
    /// `'static` (to hand to `tokio::spawn`): the buffer comes back with the result.
    /// The operation is numbered when this method is called, like every collective,
    /// so spawned tasks may start in any order.
    ///
    /// # Errors
    /// As [`Communicator::all_reduce`].
    ///
    /// # Cancel safety
    /// As [`Communicator::all_reduce`]; the buffer is dropped with the future. A
    /// future dropped before it was first polled aborts the operation on every rank
    /// too.
    pub fn all_reduce_owned<E: Element>(
        self: &Arc<Self>,
        mut buf: Vec<E>,
        op: ReduceOp,
    ) -> impl Future<Output = Result<Vec<E>>> + 'static
    where
        T: 'static,
    {
        let plan = self.group.plan(std::mem::size_of_val(&buf[..]), E::DTYPE.is_float(), None);
        let algo = match plan {
            coll::AlgoPlan::Now(algo) => algo,
            coll::AlgoPlan::Adaptive(ticket) => ticket.first(),
        };
        let sig = coll::allreduce_signature::<E>(buf.len(), op, algo);
        let ticket = Reserved { comm: self.clone(), seq: self.group.reserve(), sig: Some(sig) };
        async move {
            let mut ticket = ticket;
            let sig = ticket.sig.take().expect("a ticket starts once");
            let group = &ticket.comm.group;
            if let coll::AlgoPlan::Adaptive(adapt) = plan {
                return adaptive_all_reduce(group.unstarted(ticket.seq, sig), adapt, &mut buf, op).await.map(|()| buf);
            }
            let ctx = group.begin_reserved(ticket.seq, sig);
            traced_all_reduce(ctx, &mut buf, op, algo).await.map(|()| buf)
        }
    }

    /// How this communicator chooses algorithms (cost model, forced algorithms,
    /// reproducible mode).
    pub fn tuning(&self) -> &coll::Tuning {
        self.group.tuning()
    }

    /// Replaces the tuning for operations called from now on. Every rank must make the
    /// same change at the same point.
    pub fn set_tuning(&mut self, tuning: coll::Tuning) {
        self.group.set_tuning(tuning);
    }

    /// Measures the cost model's parameters on this job and uses them for algorithm
    /// selection from now on. For each level of link that joins two ranks here
    /// (the same host, hosts of one rack, racks through the spine), the first pair of
    /// ranks in rank order joined by it measures α (latency) and β (inverse
    /// bandwidth) from ping-pongs of 8 bytes and 1 MiB, one pair after the other; γ
    /// comes from a 1 MiB f32 reduction at rank 0. The rack level gives the model's
    /// own α and β (the host level does when all ranks share a host, the spine when
    /// every host has its own rack); the host and spine links take their level's
    /// figures, unless they were set apart by `HCOMM_COST_HOST_*` or
    /// `HCOMM_COST_SPINE_*` (a configured figure wins) or their level joins no two
    /// ranks here (they follow the model's α and β). Every rank gets the same figures,
    /// so every rank chooses alike. Collective; uses point-to-point tags from
    /// [`RESERVED_TAGS`] upward.
    ///
    /// # Errors
    /// As [`Communicator::all_reduce`] and [`Communicator::send`].
    ///
    /// # Cancel safety
    /// Dropping the future leaves the tuning unchanged; the communicator may hold
    /// unmatched ping-pong messages, and its next collective may fail: drop it too.
    pub async fn calibrate(&mut self) -> Result<coll::CostModel> {
        use hcomm_topology::Level;
        let (n, me) = (self.size(), self.rank());
        let mut cost = self.group.tuning().cost;
        if n < 2 {
            return Ok(cost);
        }
        let levels = [Level::Host, Level::Rack, Level::Spine];
        let topo = self.topology().clone();
        let pair_at = |level: Level| {
            (0..n).flat_map(|a| (a + 1..n).map(move |b| (a, b))).find(|&(a, b)| topo.level(a, b) == level)
        };
        // Per level: α, β, and 1 if measured; then γ.
        let mut params = vec![0f64; 3 * levels.len() + 1];
        for (k, &level) in levels.iter().enumerate() {
            let Some((a, b)) = pair_at(level) else { continue };
            let tag = RESERVED_TAGS + 2 * k as Tag;
            if me == a || me == b {
                let peer = a + b - me;
                let median = |t: Vec<f64>| t[t.len() / 2];
                let small = median(self.round_trips(peer, me == a, 8, 21, tag).await?);
                let big = median(self.round_trips(peer, me == a, 1 << 20, 5, tag + 1).await?);
                if me == a {
                    let alpha = (small / 2.0).max(1e-7);
                    let beta = ((big / 2.0 - alpha) / f64::from(1u32 << 20)).max(1e-12);
                    params[3 * k..3 * k + 3].copy_from_slice(&[alpha, beta, 1.0]);
                }
            }
        }
        if me == 0 {
            let mut a = vec![1.0f32; 1 << 18];
            let b = vec![2.0f32; 1 << 18];
            let t = std::time::Instant::now();
            for _ in 0..4 {
                f32::reduce(ReduceOp::Sum, &mut a, &b);
            }
            params[3 * levels.len()] = (t.elapsed().as_secs_f64() / 4.0 / f64::from(1u32 << 20)).max(1e-13);
        }
        // Each figure was measured by one rank; the others hold zeros.
        self.all_reduce(&mut params, ReduceOp::Max).await?;
        let measured = |k: usize| {
            (params[3 * k + 2] > 0.0).then(|| coll::LinkCost { alpha: params[3 * k], beta: params[3 * k + 1] })
        };
        let (host, rack, spine) = (measured(0), measured(1), measured(2));
        let base = rack.or(host).or(spine).expect("two ranks are joined by some level");
        let before = coll::LinkCost { alpha: cost.alpha, beta: cost.beta };
        (cost.alpha, cost.beta, cost.gamma) = (base.alpha, base.beta, params[3 * levels.len()]);
        for (link, level) in [(&mut cost.host, host), (&mut cost.spine, spine)] {
            if *link == before {
                *link = level.unwrap_or(base);
            }
        }
        let mut t = self.group.tuning().clone();
        t.cost = cost;
        self.group.set_tuning(t);
        tracing::debug!(
            alpha = cost.alpha,
            beta = cost.beta,
            gamma = cost.gamma,
            host_alpha = cost.host.alpha,
            host_beta = cost.host.beta,
            spine_alpha = cost.spine.alpha,
            spine_beta = cost.spine.beta,
            "calibrated"
        );
        Ok(cost)
    }

    /// Infers the racks by probing: the first rank of each host measures the round
    /// trip of an 8-byte message to the first rank of every other host (fastest of 7,
    /// one pair at a time), every rank gets the whole matrix by an allreduce, and
    /// hosts whose round trip is under half the largest share a rack
    /// (`hcomm_topology::racks_from_rtt`). The racks found (named `probed0`, …) replace
    /// the ones the ranks reported, and rings, trees and the hierarchical allreduce
    /// follow them. Returns the number of racks. With fewer than 3 hosts, or round
    /// trips within 2× of each other, everything is one rack. Run by `connect` under
    /// `HCOMM_TOPOLOGY=probe`. Every rank must call it, on an idle communicator.
    ///
    /// # Errors
    /// As [`Communicator::send`] and [`Communicator::all_reduce`].
    ///
    /// # Cancel safety
    /// Dropping the future leaves the topology unchanged; the communicator may hold
    /// unmatched probe messages, and its next collective may fail: drop it too.
    pub async fn probe_racks(&mut self) -> Result<usize> {
        let topo = self.topology().clone();
        let (n, h) = (self.size(), topo.host_count());
        let leader: Vec<usize> =
            (0..h).map(|k| (0..n).find(|&r| topo.host_of(r) == k).expect("hosts hold ranks")).collect();
        let me = self.rank();
        let tag = RESERVED_TAGS + 2;
        let mut rtt = vec![0.0f64; h * h];
        for a in 0..h {
            for b in a + 1..h {
                if me == leader[a] {
                    // The fastest trip: noise only adds.
                    let best = self.round_trips(leader[b], true, 8, 7, tag).await?[0];
                    (rtt[a * h + b], rtt[b * h + a]) = (best, best);
                } else if me == leader[b] {
                    self.round_trips(leader[a], false, 8, 7, tag).await?;
                }
            }
        }
        self.all_reduce(&mut rtt, ReduceOp::Max).await?;
        let matrix: Vec<Vec<f64>> = rtt.chunks(h).map(<[f64]>::to_vec).collect();
        let rack = hcomm_topology::racks_from_rtt(&matrix);
        let placements: Vec<hcomm_topology::Placement> = (0..n)
            .map(|r| hcomm_topology::Placement {
                rack: Some(format!("probed{}", rack[topo.host_of(r)])),
                ..topo.placement(r).clone()
            })
            .collect();
        self.group.set_topology(Topology::from_placements(&placements)).map_err(|e| e.at_rank(me))?;
        Ok(rack.iter().max().map_or(0, |m| m + 1))
    }

    /// Seconds of each of `reps` round trips of `bytes` with `peer`, sorted; this rank
    /// starts them if `first`, and echoes them otherwise.
    async fn round_trips(&self, peer: usize, first: bool, bytes: usize, reps: usize, tag: Tag) -> Result<Vec<f64>> {
        let data = vec![0u8; bytes];
        let mut times = Vec::with_capacity(reps);
        for _ in 0..reps {
            let t = std::time::Instant::now();
            if first {
                self.send(peer, tag, &data).await?;
                self.recv::<u8>(peer, tag).await?;
            } else {
                let got = self.recv::<u8>(peer, tag).await?;
                self.send(peer, tag, &got).await?;
            }
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        Ok(times)
    }

    /// Reproducible mode: float allreduces reduce every element in rank order
    /// (`x_0 op x_1 op … op x_{n-1}`), so the result is bitwise the same whatever the
    /// algorithm asked for and whatever the message size. Every rank must set the same.
    pub fn set_reproducible(&mut self, on: bool) {
        let mut t = self.group.tuning().clone();
        t.reproducible = on;
        self.group.set_tuning(t);
    }

    /// Waits until every rank has called the barrier.
    ///
    /// # Errors
    /// Peer failure, timeout, or abort, as for [`Communicator::all_reduce`].
    ///
    /// # Cancel safety
    /// Dropping the future aborts this barrier on every rank; later operations are
    /// unaffected.
    pub fn barrier(&self) -> impl Future<Output = Result<()>> + '_ {
        let ctx = self.group.begin(Signature::bare(OpKind::Barrier, 0));
        let span = tracing::debug_span!("barrier", seq = ctx.seq(), algo = "dissemination");
        coll::barrier(ctx).instrument(span)
    }

    /// Gathers every rank's `send` into `recv`, rank by rank: `recv` must hold
    /// `size() * send.len()` elements.
    ///
    /// # Errors
    /// An invalid-argument error for a wrong `recv` length; otherwise as
    /// [`Communicator::all_reduce`].
    ///
    /// # Cancel safety
    /// As [`Communicator::all_reduce`]: `recv` is left partly filled.
    pub fn all_gather<'a, E: Element>(
        &'a self,
        send: &'a [E],
        recv: &'a mut [E],
    ) -> impl Future<Output = Result<()>> + 'a {
        match self.group.plan(std::mem::size_of_val(send), false, None) {
            coll::AlgoPlan::Now(algo) => Either::Left(self.all_gather_with(send, recv, algo)),
            coll::AlgoPlan::Adaptive(ticket) => {
                let count = send.len();
                let sig = move |algo| coll::allgather_signature::<E>(count, algo);
                Either::Right(adaptive_now(&self.group, ticket, sig, move |ctx, algo| {
                    traced_all_gather(ctx, send, recv, algo)
                }))
            }
        }
    }

    /// [`Communicator::all_gather`] with a chosen algorithm. Every rank must choose
    /// the same.
    ///
    /// # Errors
    /// As [`Communicator::all_gather`].
    ///
    /// # Cancel safety
    /// As [`Communicator::all_gather`].
    pub fn all_gather_with<'a, E: Element>(
        &'a self,
        send: &'a [E],
        recv: &'a mut [E],
        algo: coll::AllgatherAlgo,
    ) -> impl Future<Output = Result<()>> + 'a {
        let ctx = self.group.begin(coll::allgather_signature::<E>(send.len(), algo));
        traced_all_gather(ctx, send, recv, algo)
    }

    /// Splits the communicator, as `MPI_Comm_split`: ranks that pass the same `color`
    /// form a new communicator, ranked by `key` (ties by their rank here); ranks that
    /// pass `None` get `None`. Collective: every rank must call it. The new
    /// communicator has its own tag and sequence space.
    ///
    /// # Errors
    /// As [`Communicator::all_gather`].
    ///
    /// # Cancel safety
    /// Dropping the future aborts the split on every rank; this communicator stays
    /// usable.
    pub fn split(&self, color: Option<u32>, key: i64) -> impl Future<Output = Result<Option<Communicator<T>>>> + '_ {
        let ctx = self.group.begin(coll::split_signature());
        let span = tracing::debug_span!("split", seq = ctx.seq(), ?color, key);
        let keep = self.keep.clone();
        async move { Ok(coll::split(ctx, color, key).await?.map(|g| Communicator::new(g, keep))) }.instrument(span)
    }

    /// A communicator laid out as a Cartesian grid of `dims` (row-major; `periodic`
    /// per dimension), as `MPI_Cart_create` with reordering: its rank `g` is grid
    /// position `g`, and the ranks are placed so that grid neighbours share a host as
    /// often as the topology allows ([`Grid::placement`]). Use the returned [`Grid`]
    /// for coordinates and shifts ([`Grid::shift`], as `MPI_Cart_shift`). Collective:
    /// every rank must call it with the same arguments.
    ///
    /// [`Grid`]: hcomm_topology::Grid
    /// [`Grid::placement`]: hcomm_topology::Grid::placement
    /// [`Grid::shift`]: hcomm_topology::Grid::shift
    ///
    /// # Errors
    /// An invalid-argument error if the grid is empty or its size is not this
    /// communicator's; otherwise as [`Communicator::split`].
    ///
    /// # Cancel safety
    /// As [`Communicator::split`].
    pub fn grid(
        &self,
        dims: &[usize],
        periodic: &[bool],
    ) -> impl Future<Output = Result<(Communicator<T>, Grid)>> + '_ {
        let planned = Grid::new(dims, periodic).and_then(|g| {
            let order = g.placement(self.topology())?;
            let me = order.iter().position(|&r| r == self.rank()).expect("the placement is a permutation");
            Ok((g, me))
        });
        async move {
            let (g, me) = planned.map_err(|e| e.at_rank(self.rank()))?;
            let comm = self.split(Some(0), me as i64).await?.expect("every rank passes colour 0");
            Ok((comm, g))
        }
    }

    fn check_peer(&self, peer: usize, op: OpKind) -> Result<usize> {
        if peer < self.size() {
            Ok(self.group.world_rank(peer))
        } else {
            Err(Error::invalid(format!("rank {peer} out of range for a communicator of {} ranks", self.size()))
                .in_op(op, None)
                .at_rank(self.rank()))
        }
    }

    /// Sends `data` to rank `dst` under `tag`, as `MPI_Isend` followed by its wait.
    /// The message is queued when this method is called, and messages to one rank
    /// with one tag arrive in the order of the calls. `data` is read only within this
    /// call: over a plain TCP connection (tokio) a large message (from
    /// `HCOMM_TCP_LEND` bytes, 64 KiB by default) goes to the socket straight from
    /// `data` when the connection's writer is idle, and whatever is not written by
    /// the time the call returns is copied (over shared memory, into memory the peer
    /// then copies out of itself). For a send without any copy on this side, hand
    /// the bytes over with [`Communicator::send_bytes`]. A small message
    /// over a plain TCP connection (up to `HCOMM_TCP_EAGER` bytes; by default 8 KiB,
    /// or 4 KiB where the host runs more ranks than it has processors) that is queued
    /// rather than written in the call (it comes in a burst, a few microseconds after
    /// the last one written to `dst` with nothing received from `dst` since, or behind messages already
    /// waiting for the connection's writer) completes when its copy
    /// is queued, as an MPI eager send: the writer task writes what waits in one
    /// system call when the executor next runs it (on a current-thread runtime, when
    /// this task next waits).
    ///
    /// # Errors
    /// An invalid-argument error for `dst` out of range; a peer-failed error if the
    /// connection to `dst` is broken; a timeout if the message could not be handed to
    /// the transport (or copied by the peer) within the communicator's timeout. A
    /// connection that breaks after an eager send completed fails the operations
    /// with `dst` that come after it.
    ///
    /// # Cancel safety
    /// The message is queued when this method is called; dropping or leaking the
    /// future does not withdraw it, and `data` is free again as soon as the call
    /// returns (nothing reads it afterwards).
    pub fn send<'a, E: Element>(
        &'a self,
        dst: usize,
        tag: Tag,
        data: &'a [E],
    ) -> impl Future<Output = Result<()>> + 'a {
        let bytes: &'a [u8] = bytemuck::cast_slice(data);
        self.send_via(dst, tag, p2p_signature(E::DTYPE, data.len()), bytes.len(), move |world, h| {
            self.group.transport().send_borrowed(world, h, bytes)
        })
    }

    /// Sends `payload` to rank `dst` under `tag` without copying it: the transport
    /// keeps a reference to the bytes until they are written, so a large message costs
    /// no copy in user space on this side (`Bytes::from(vec)` hands over a `Vec<u8>`
    /// without a copy too). The message is a byte message: [`recv_bytes`] takes it
    /// whole, [`recv`] and [`recv_into`] as `u8`.
    ///
    /// [`recv_bytes`]: Communicator::recv_bytes
    /// [`recv`]: Communicator::recv
    /// [`recv_into`]: Communicator::recv_into
    ///
    /// # Errors
    /// As [`Communicator::send`].
    ///
    /// # Cancel safety
    /// As [`Communicator::send`]: the message is queued when this method is called.
    pub fn send_bytes(&self, dst: usize, tag: Tag, payload: Bytes) -> impl Future<Output = Result<()>> + '_ {
        let len = payload.len();
        self.send_via(dst, tag, p2p_signature(u8::DTYPE, len), len, move |world, h| {
            self.group.transport().send(world, h, payload)
        })
    }

    /// A send of `len` bytes with signature `sig`, which `start` queues to the world
    /// rank it is given under the header it is given (at the call).
    fn send_via<F: Future<Output = Result<()>>>(
        &self,
        dst: usize,
        tag: Tag,
        sig: Signature,
        len: usize,
        start: impl FnOnce(usize, Header) -> F,
    ) -> Sent<F> {
        let start_time = events::Stopwatch::start();
        let me = self.group.world_rank(self.rank());
        let aborted = self.group.aborted().map_or(Ok(()), |e| Err(e.in_op(OpKind::Send, None).at_rank(self.rank())));
        let queued = aborted.and_then(|()| self.check_peer(dst, OpKind::Send)).map(|world| {
            events::message(me as u32, world as u32, OpKind::Send, true, len as u64, Duration::ZERO);
            let h = Header::data(me, self.group.comm_id(), P2P_SEQ, tag, &sig, len);
            (world, self.group.p2p_deadline(OpKind::Send, dst, tag, start(world, h)))
        });
        let (world, op, err) = match queued {
            Ok((world, op)) => (world, Some(op), None),
            Err(e) => (0, None, Some(e)),
        };
        Sent { op, err, me, world, len: len as u64, start: start_time }
    }

    /// Posts a receive; the frame may come with its payload still in the sender's
    /// memory ([`Frame::remote`]), for the caller to copy where it goes.
    fn post_recv(&self, src: usize, tag: Tag) -> Received<'_, T, hcomm_core::RecvFrame> {
        let mailbox = self.group.transport().mailbox();
        self.post_recv_via(src, tag, |key| mailbox.recv_frame(key))
    }

    /// A receive that [`Mailbox::recv_frame_into`] posts, with `dst` offered for the
    /// message to land in ([`hcomm_core::landing`]); hands `dst` back.
    fn post_recv_into<'a>(
        &'a self,
        src: usize,
        tag: Tag,
        dst: &'a mut [u8],
    ) -> Received<'a, T, hcomm_core::RecvFrameInto<'a>> {
        let mailbox = self.group.transport().mailbox();
        self.post_recv_via(src, tag, |key| mailbox.recv_frame_into(key, dst))
    }

    /// Posts the receive `start` makes for the key of (`src`, `tag`), at the call,
    /// under the communicator's deadline, with its statistics, and checks that what
    /// comes is a message.
    fn post_recv_via<F: Future<Output = Result<R>> + Unpin, R: HasFrame>(
        &self,
        src: usize,
        tag: Tag,
        start: impl FnOnce(MatchKey) -> F,
    ) -> Received<'_, T, F> {
        let start_time = events::Stopwatch::start();
        let posted = self.check_peer(src, OpKind::Recv).map(|world| {
            let key = MatchKey { src: world, comm: self.group.comm_id(), seq: P2P_SEQ, tag };
            (world, self.group.p2p_deadline(OpKind::Recv, src, tag, start(key)))
        });
        let (world, op, err) = match posted {
            Ok((world, op)) => (world, Some(op), None),
            Err(e) => (0, None, Some(e)),
        };
        Received { comm: self, src, world, start: start_time, op, err }
    }

    fn recv_error(&self, kind: ErrorKind, src: usize, msg: String) -> Error {
        Error::new(kind, msg).with_peer(src).in_op(OpKind::Recv, None).at_rank(self.rank())
    }

    fn check_dtype<E: Element>(&self, src: usize, h: &Header) -> Result<()> {
        if h.dtype == Some(E::DTYPE) {
            return Ok(());
        }
        let sent = h.dtype.map_or("untyped", |d| d.name());
        Err(self.recv_error(
            ErrorKind::Mismatch,
            src,
            format!("rank {src} sent {} x {sent}, received as {}", h.count, E::DTYPE),
        ))
    }

    /// Receives the next message from rank `src` with `tag`. The receive is posted when
    /// this method is called: receives posted in program order match messages in
    /// sending order.
    ///
    /// # Errors
    /// A mismatch error if the message holds another element type; a peer-failed error
    /// if `src` dies; a timeout if nothing arrives within the communicator's timeout.
    ///
    /// # Cancel safety
    /// Dropping the future withdraws the receive; a message that arrives later goes to
    /// the next receive from `src` with `tag`.
    pub fn recv<E: Element>(&self, src: usize, tag: Tag) -> impl Future<Output = Result<Vec<E>>> + '_ {
        let frame = self.post_recv(src, tag);
        async move {
            let f = frame.await?;
            self.check_dtype::<E>(src, &f.header)?;
            coll::cooperate(f.len()).await;
            let f = self.local(src, f)?;
            coll::to_vec(&f.payload).map_err(|e| e.with_peer(src).in_op(OpKind::Recv, None).at_rank(self.rank()))
        }
    }

    /// Receives the next message from rank `src` with `tag` into `buf`, which must have
    /// exactly the message's length.
    ///
    /// # Errors
    /// As [`Communicator::recv`], and a mismatch error if the lengths differ.
    ///
    /// Over a plain TCP connection a message of `HCOMM_TCP_LAND` bytes or more
    /// (512 KiB by default; `0`: never) for which this receive waits lands in `buf`:
    /// the future reads it from the socket into `buf` itself while it is polled,
    /// instead of copying it out of a buffer the connection's reader filled.
    ///
    /// # Cancel safety
    /// As [`Communicator::recv`], except that a message that began to land in `buf`
    /// belongs to this receive: dropping the future then loses it, and `buf` holds
    /// part of it. `buf` may be written while the future is polled; on an error, its
    /// contents are unspecified.
    pub fn recv_into<'a, E: Element>(
        &'a self,
        src: usize,
        tag: Tag,
        buf: &'a mut [E],
    ) -> impl Future<Output = Result<()>> + 'a {
        let count = buf.len();
        let frame = self.post_recv_into(src, tag, bytemuck::cast_slice_mut(buf));
        async move {
            let (f, buf) = frame.await?;
            self.check_dtype::<E>(src, &f.header)?;
            if f.header.count != count as u64 {
                return Err(self.recv_error(
                    ErrorKind::Mismatch,
                    src,
                    format!("rank {src} sent {} elements into a buffer of {count}", f.header.count),
                ));
            }
            coll::cooperate(buf.len()).await;
            let copied = match &f.remote {
                // Lent by a shared-memory peer: one copy, from its memory into `buf`;
                // landed in `buf` over TCP: what was read elsewhere, copied in.
                Some(r) => r.read_into(buf),
                None => coll::copy_in(buf, &f.payload),
            };
            copied.map_err(|e| e.with_peer(src).in_op(OpKind::Recv, None).at_rank(self.rank()))
        }
    }

    /// `f` with its payload here (read out of the sender's memory if it was lent).
    fn local(&self, src: usize, f: Frame) -> Result<Frame> {
        f.into_local().map_err(|e| e.with_peer(src).in_op(OpKind::Recv, None).at_rank(self.rank()))
    }

    /// Receives the next message from rank `src` with `tag` as the bytes the transport
    /// received it into, without copying them (whatever its element type; the bytes
    /// are in native byte order). Large messages arrive in memory from the buffer
    /// pool, which goes back to the pool when the last clone of the `Bytes` is
    /// dropped.
    ///
    /// # Errors
    /// As [`Communicator::recv`], without the element-type check.
    ///
    /// # Cancel safety
    /// As [`Communicator::recv`].
    pub fn recv_bytes(&self, src: usize, tag: Tag) -> impl Future<Output = Result<Bytes>> + '_ {
        let frame = self.post_recv(src, tag);
        async move { Ok(self.local(src, frame.await?)?.payload) }
    }

    /// Sends `data` to `dst` and receives from `src` at once (the exchange step of
    /// halo swaps and shifts).
    ///
    /// # Errors
    /// As [`Communicator::send`] and [`Communicator::recv`].
    ///
    /// # Cancel safety
    /// As [`Communicator::send`] and [`Communicator::recv`].
    pub fn sendrecv<'a, E: Element>(
        &'a self,
        dst: usize,
        send_tag: Tag,
        data: &'a [E],
        src: usize,
        recv_tag: Tag,
    ) -> impl Future<Output = Result<Vec<E>>> + 'a {
        let recv = self.recv::<E>(src, recv_tag);
        let send = self.send(dst, send_tag, data);
        async move { futures::try_join!(send, recv).map(|(_, v)| v) }
    }
}

impl<T: LocalTransport> Communicator<T> {
    /// Keeps `store` alive with this communicator (a fresh one, not yet shared).
    pub(crate) fn with_store(mut self, store: StoreServer) -> Communicator<T> {
        match Arc::get_mut(&mut self.keep) {
            Some(k) => k.store = Some(store),
            None => self.keep = Arc::new(Keep { store: Some(store) }),
        }
        self
    }
}

/// Rooted collectives, exchanges and scans. Every method here is a collective: each
/// rank calls it, in the same order relative to the other collectives. Each one's
/// errors are those of [`Communicator::all_reduce`] (invalid arguments, mismatched
/// arguments across ranks, peer failure, timeout, abort) plus the buffer-length rules
/// it states. Under the default deferred argument check ([`coll::ArgCheck`]), a rank
/// whose part ended before its neighbour's signature arrived (a broadcast's root, a
/// gather's leaves) returns `Ok`, and learns of a mismatch in its next collective or
/// from [`Communicator::settle_checks`]. Each one's cancel safety is that of [`Communicator::all_reduce`]:
/// dropping the future leaves the output buffers partly written and aborts the
/// operation on every rank, and later operations are unaffected.
impl<T: LocalTransport> Communicator<T> {
    /// Sends `buf` from `root` to every rank (binomial tree; a pipelined chain for
    /// large messages). Where the adaptive selection decides (see
    /// [`coll::adapt`]), the root, whose part ends once its data is sent, gets
    /// fewer than two epochs of that size's calls (32-256) ahead of the slowest
    /// rank's calls: an epoch's first call waits for every rank's timings, posted at
    /// their first call of the epoch before.
    ///
    /// # Errors
    /// See the impl block; also a root out of range.
    ///
    /// # Cancel safety
    /// See the impl block.
    pub fn broadcast<'a, E: Element>(&'a self, buf: &'a mut [E], root: usize) -> impl Future<Output = Result<()>> + 'a {
        match self.group.plan(std::mem::size_of_val(buf), false, None) {
            coll::AlgoPlan::Now(algo) => Either::Left(self.broadcast_with(buf, root, algo)),
            coll::AlgoPlan::Adaptive(ticket) => {
                let count = buf.len() as u64;
                let sig = move |algo: coll::BcastAlgo| {
                    coll::rooted_signature::<E>(OpKind::Broadcast, count, None, root, algo as u8)
                };
                Either::Right(adaptive_now(&self.group, ticket, sig, move |ctx, algo| {
                    traced_broadcast(ctx, buf, root, algo)
                }))
            }
        }
    }

    /// [`Communicator::broadcast`] on an owned buffer, for a future that must be
    /// `'static` (to hand to `tokio::spawn`): the buffer comes back with the root's
    /// data. Numbered when this method is called, like every collective, so spawned
    /// tasks may start in any order. The library owns the buffer while the future
    /// lives: a leaked future leaks it, and nothing else is ever read or written.
    ///
    /// # Errors
    /// As [`Communicator::broadcast`].
    ///
    /// # Cancel safety
    /// As [`Communicator::broadcast`]; the buffer is dropped with the future. A
    /// future dropped before it was first polled aborts the operation on every rank
    /// too.
    pub fn broadcast_owned<E: Element>(
        self: &Arc<Self>,
        mut buf: Vec<E>,
        root: usize,
    ) -> impl Future<Output = Result<Vec<E>>> + 'static
    where
        T: 'static,
    {
        let plan = self.group.plan(std::mem::size_of_val(&buf[..]), false, None);
        let count = buf.len() as u64;
        let sig_for =
            move |algo: coll::BcastAlgo| coll::rooted_signature::<E>(OpKind::Broadcast, count, None, root, algo as u8);
        let first = match &plan {
            coll::AlgoPlan::Now(algo) => *algo,
            coll::AlgoPlan::Adaptive(ticket) => ticket.first(),
        };
        let ticket = Reserved { comm: self.clone(), seq: self.group.reserve(), sig: Some(sig_for(first)) };
        async move {
            let mut ticket = ticket;
            let sig = ticket.sig.take().expect("a ticket starts once");
            let group = &ticket.comm.group;
            match plan {
                coll::AlgoPlan::Adaptive(adapt) => {
                    let op = group.unstarted(ticket.seq, sig);
                    let b: &mut [E] = &mut buf;
                    adaptive(op, adapt, sig_for, move |ctx, algo| traced_broadcast(ctx, b, root, algo))
                        .await
                        .map(|()| buf)
                }
                coll::AlgoPlan::Now(algo) => {
                    traced_broadcast(group.begin_reserved(ticket.seq, sig), &mut buf, root, algo).await.map(|()| buf)
                }
            }
        }
    }

    /// [`Communicator::broadcast`] with a chosen algorithm.
    ///
    /// # Errors
    /// See the impl block; also a root out of range.
    ///
    /// # Cancel safety
    /// See the impl block.
    pub fn broadcast_with<'a, E: Element>(
        &'a self,
        buf: &'a mut [E],
        root: usize,
        algo: coll::BcastAlgo,
    ) -> impl Future<Output = Result<()>> + 'a {
        let ctx =
            self.group.begin(coll::rooted_signature::<E>(OpKind::Broadcast, buf.len() as u64, None, root, algo as u8));
        traced_broadcast(ctx, buf, root, algo)
    }

    /// Reduces every rank's `buf` element-wise into `buf` at `root` (binomial tree);
    /// the other ranks' buffers are left as they were.
    ///
    /// # Errors
    /// See the impl block; also a root out of range.
    ///
    /// # Cancel safety
    /// See the impl block.
    pub fn reduce<'a, E: Element>(
        &'a self,
        buf: &'a mut [E],
        op: ReduceOp,
        root: usize,
    ) -> impl Future<Output = Result<()>> + 'a {
        let ctx = self.group.begin(coll::rooted_signature::<E>(OpKind::Reduce, buf.len() as u64, Some(op), root, 0));
        let span = tracing::debug_span!("reduce", seq = ctx.seq(), count = buf.len(), dtype = %E::DTYPE, %op, root, algo = "binomial");
        coll::reduce(ctx, buf, op, root).instrument(span)
    }

    /// Gathers every rank's `send` (equal lengths) into `recv` at `root`, rank by
    /// rank; `recv` must hold `size() * send.len()` elements at the root and is unused
    /// elsewhere.
    ///
    /// # Errors
    /// See the impl block; also a root out of range or a wrong `recv` length.
    ///
    /// # Cancel safety
    /// See the impl block.
    pub fn gather<'a, E: Element>(
        &'a self,
        send: &'a [E],
        recv: &'a mut [E],
        root: usize,
    ) -> impl Future<Output = Result<()>> + 'a {
        let ctx = self.group.begin(coll::rooted_signature::<E>(OpKind::Gather, send.len() as u64, None, root, 0));
        let counts = vec![send.len(); self.size()];
        let span = tracing::debug_span!("gather", seq = ctx.seq(), count = send.len(), dtype = %E::DTYPE, root, algo = "linear");
        async move { coll::gatherv(ctx, send, recv, &counts, root).await }.instrument(span)
    }

    /// Gathers rank `g`'s `send` (`counts[g]` elements) into block `g` of `recv` at
    /// `root`. Every rank passes the same `counts`.
    ///
    /// # Errors
    /// See the impl block; also counts that disagree across ranks or with the buffers.
    ///
    /// # Cancel safety
    /// See the impl block.
    pub fn gatherv<'a, E: Element>(
        &'a self,
        send: &'a [E],
        recv: &'a mut [E],
        counts: &'a [usize],
        root: usize,
    ) -> impl Future<Output = Result<()>> + 'a {
        let ctx = self.group.begin(coll::v_signature::<E>(OpKind::GatherV, counts, None, Some(root)));
        let span = tracing::debug_span!("gatherv", seq = ctx.seq(), dtype = %E::DTYPE, root, algo = "linear");
        coll::gatherv(ctx, send, recv, counts, root).instrument(span)
    }

    /// Sends block `g` of `send` (at `root`: `size() * recv.len()` elements) to rank
    /// `g`'s `recv`.
    ///
    /// # Errors
    /// See the impl block; also a root out of range or a wrong `send` length at the
    /// root.
    ///
    /// # Cancel safety
    /// See the impl block.
    pub fn scatter<'a, E: Element>(
        &'a self,
        send: &'a [E],
        recv: &'a mut [E],
        root: usize,
    ) -> impl Future<Output = Result<()>> + 'a {
        let ctx = self.group.begin(coll::rooted_signature::<E>(OpKind::Scatter, recv.len() as u64, None, root, 0));
        let counts = vec![recv.len(); self.size()];
        let span = tracing::debug_span!("scatter", seq = ctx.seq(), count = recv.len(), dtype = %E::DTYPE, root, algo = "linear");
        async move { coll::scatterv(ctx, send, recv, &counts, root).await }.instrument(span)
    }

    /// Sends block `g` of `send` (`counts[g]` elements) from `root` to rank `g`'s
    /// `recv`. Every rank passes the same `counts`.
    ///
    /// # Errors
    /// See the impl block; also counts that disagree across ranks or with the buffers.
    ///
    /// # Cancel safety
    /// See the impl block.
    pub fn scatterv<'a, E: Element>(
        &'a self,
        send: &'a [E],
        counts: &'a [usize],
        recv: &'a mut [E],
        root: usize,
    ) -> impl Future<Output = Result<()>> + 'a {
        let ctx = self.group.begin(coll::v_signature::<E>(OpKind::ScatterV, counts, None, Some(root)));
        let span = tracing::debug_span!("scatterv", seq = ctx.seq(), dtype = %E::DTYPE, root, algo = "linear");
        coll::scatterv(ctx, send, recv, counts, root).instrument(span)
    }

    /// Reduces every rank's `send` (`size() * recv.len()` elements) element-wise and
    /// leaves block `r` of the result in rank `r`'s `recv`, by the algorithm the
    /// tuning chooses for the block size (ring or recursive halving).
    ///
    /// # Errors
    /// See the impl block; also a wrong `send` length.
    ///
    /// # Cancel safety
    /// See the impl block.
    pub fn reduce_scatter<'a, E: Element>(
        &'a self,
        send: &'a [E],
        recv: &'a mut [E],
        op: ReduceOp,
    ) -> impl Future<Output = Result<()>> + 'a {
        match self.group.plan(std::mem::size_of_val(recv), E::DTYPE.is_float(), None) {
            coll::AlgoPlan::Now(algo) => Either::Left(self.reduce_scatter_with(send, recv, op, algo)),
            coll::AlgoPlan::Adaptive(ticket) => {
                let count = recv.len();
                let sig = move |algo| coll::reduce_scatter_signature::<E>(count, None, op, algo);
                Either::Right(adaptive_now(&self.group, ticket, sig, move |ctx, algo| {
                    traced_reduce_scatter(ctx, send, recv, op, algo)
                }))
            }
        }
    }

    /// [`Communicator::reduce_scatter`] with a chosen algorithm. Every rank must
    /// choose the same.
    ///
    /// # Errors
    /// As [`Communicator::reduce_scatter`].
    ///
    /// # Cancel safety
    /// See the impl block.
    pub fn reduce_scatter_with<'a, E: Element>(
        &'a self,
        send: &'a [E],
        recv: &'a mut [E],
        op: ReduceOp,
        algo: coll::ReduceScatterAlgo,
    ) -> impl Future<Output = Result<()>> + 'a {
        let ctx = self.group.begin(coll::reduce_scatter_signature::<E>(recv.len(), None, op, algo));
        traced_reduce_scatter(ctx, send, recv, op, algo)
    }

    /// [`Communicator::reduce_scatter`] with per-rank block sizes: block `g` has
    /// `counts[g]` elements. Every rank passes the same `counts`.
    ///
    /// # Errors
    /// See the impl block; also counts that disagree across ranks or with the buffers.
    ///
    /// # Cancel safety
    /// See the impl block.
    pub fn reduce_scatter_v<'a, E: Element>(
        &'a self,
        send: &'a [E],
        recv: &'a mut [E],
        counts: &'a [usize],
        op: ReduceOp,
    ) -> impl Future<Output = Result<()>> + 'a {
        let algo = self.group.reduce_scatter_algo(mean_bytes::<E>(counts));
        self.reduce_scatter_v_with(send, recv, counts, op, algo)
    }

    /// [`Communicator::reduce_scatter_v`] with a chosen algorithm. Every rank must
    /// choose the same.
    ///
    /// # Errors
    /// As [`Communicator::reduce_scatter_v`].
    ///
    /// # Cancel safety
    /// See the impl block.
    pub fn reduce_scatter_v_with<'a, E: Element>(
        &'a self,
        send: &'a [E],
        recv: &'a mut [E],
        counts: &'a [usize],
        op: ReduceOp,
        algo: coll::ReduceScatterAlgo,
    ) -> impl Future<Output = Result<()>> + 'a {
        let ctx = self.group.begin(coll::reduce_scatter_signature::<E>(0, Some(counts), op, algo));
        let span =
            tracing::debug_span!("reduce_scatter_v", seq = ctx.seq(), dtype = %E::DTYPE, %op, algo = algo.name());
        coll::reduce_scatter(ctx, send, recv, counts, op, algo).instrument(span)
    }

    /// Every rank sends block `g` of `send` to rank `g`, and receives rank `g`'s
    /// block for it into block `g` of `recv`; both buffers hold `size()` equal blocks
    /// (pairwise exchange).
    ///
    /// # Errors
    /// See the impl block; also buffers whose lengths differ or are not a multiple of
    /// `size()`.
    ///
    /// # Cancel safety
    /// See the impl block.
    pub fn all_to_all<'a, E: Element>(
        &'a self,
        send: &'a [E],
        recv: &'a mut [E],
    ) -> impl Future<Output = Result<()>> + 'a {
        let block = send.len() / self.size();
        match self.group.plan(block * std::mem::size_of::<E>(), false, None) {
            coll::AlgoPlan::Now(algo) => Either::Left(self.all_to_all_with(send, recv, algo)),
            coll::AlgoPlan::Adaptive(ticket) => {
                let sig = move |algo| alltoall_signature::<E>(block, algo);
                Either::Right(adaptive_now(&self.group, ticket, sig, move |ctx, algo| {
                    traced_all_to_all(ctx, send, recv, algo)
                }))
            }
        }
    }

    /// [`Communicator::all_to_all`] with a chosen algorithm. Every rank must choose
    /// the same.
    ///
    /// # Errors
    /// As [`Communicator::all_to_all`].
    ///
    /// # Cancel safety
    /// As [`Communicator::all_to_all`].
    pub fn all_to_all_with<'a, E: Element>(
        &'a self,
        send: &'a [E],
        recv: &'a mut [E],
        algo: coll::AlltoallAlgo,
    ) -> impl Future<Output = Result<()>> + 'a {
        let ctx = self.group.begin(alltoall_signature::<E>(send.len() / self.size(), algo));
        traced_all_to_all(ctx, send, recv, algo)
    }

    /// [`Communicator::all_to_all`] with per-peer block sizes: block `g` of `send`
    /// has `send_counts[g]` elements, block `g` of `recv` has `recv_counts[g]` (which
    /// must equal what rank `g` sends here).
    ///
    /// # Errors
    /// See the impl block; also counts that disagree with the buffers, or with what
    /// the peer sends (a mismatch error).
    ///
    /// # Cancel safety
    /// See the impl block.
    pub fn all_to_all_v<'a, E: Element>(
        &'a self,
        send: &'a [E],
        send_counts: &'a [usize],
        recv: &'a mut [E],
        recv_counts: &'a [usize],
    ) -> impl Future<Output = Result<()>> + 'a {
        let ctx = self.group.begin(Signature {
            op: OpKind::AllToAllV,
            dtype: Some(E::DTYPE),
            reduce: None,
            count: 0,
            root: None,
            algo: 0,
        });
        let span = tracing::debug_span!("alltoallv", seq = ctx.seq(), dtype = %E::DTYPE, algo = "pairwise");
        coll::pairwise_alltoallv(ctx, send, send_counts, recv, recv_counts).instrument(span)
    }

    /// [`Communicator::all_gather`] with per-rank lengths: block `g` of `recv`
    /// (`counts[g]` elements) receives rank `g`'s `send`. Every rank passes the same
    /// `counts`. Runs the ring or recursive doubling, as the tuning chooses for the
    /// mean block size (a choice of Bruck runs the ring: Bruck is for equal blocks).
    ///
    /// # Errors
    /// See the impl block; also counts that disagree across ranks or with the buffers.
    ///
    /// # Cancel safety
    /// See the impl block.
    pub fn all_gather_v<'a, E: Element>(
        &'a self,
        send: &'a [E],
        recv: &'a mut [E],
        counts: &'a [usize],
    ) -> impl Future<Output = Result<()>> + 'a {
        let algo = self.group.allgather_algo(mean_bytes::<E>(counts));
        self.all_gather_v_with(send, recv, counts, algo)
    }

    /// [`Communicator::all_gather_v`] with a chosen algorithm (`Bruck` runs the ring).
    /// Every rank must choose the same.
    ///
    /// # Errors
    /// As [`Communicator::all_gather_v`].
    ///
    /// # Cancel safety
    /// See the impl block.
    pub fn all_gather_v_with<'a, E: Element>(
        &'a self,
        send: &'a [E],
        recv: &'a mut [E],
        counts: &'a [usize],
        algo: coll::AllgatherAlgo,
    ) -> impl Future<Output = Result<()>> + 'a {
        let algo = match algo {
            coll::AllgatherAlgo::RecursiveDoubling => coll::AllgatherAlgo::RecursiveDoubling,
            coll::AllgatherAlgo::Ring | coll::AllgatherAlgo::Bruck => coll::AllgatherAlgo::Ring,
        };
        let mut sig = coll::v_signature::<E>(OpKind::AllGatherV, counts, None, None);
        sig.algo = algo as u8;
        traced_allgatherv(self.group.begin(sig), send, recv, counts, algo)
    }

    /// Inclusive prefix reduction: rank `r`'s `buf` becomes `x_0 op … op x_r`
    /// (recursive doubling). `Avg` averages over ranks `0..=r`.
    ///
    /// # Errors
    /// See the impl block.
    ///
    /// # Cancel safety
    /// See the impl block.
    pub fn scan<'a, E: Element>(&'a self, buf: &'a mut [E], op: ReduceOp) -> impl Future<Output = Result<()>> + 'a {
        self.prefix(buf, op, false)
    }

    /// Exclusive prefix reduction: rank `r`'s `buf` becomes `x_0 op … op x_{r-1}`;
    /// rank 0's is left as it was (as `MPI_Exscan` leaves it undefined).
    ///
    /// # Errors
    /// See the impl block.
    ///
    /// # Cancel safety
    /// See the impl block.
    pub fn exscan<'a, E: Element>(&'a self, buf: &'a mut [E], op: ReduceOp) -> impl Future<Output = Result<()>> + 'a {
        self.prefix(buf, op, true)
    }

    fn prefix<'a, E: Element>(
        &'a self,
        buf: &'a mut [E],
        op: ReduceOp,
        exclusive: bool,
    ) -> impl Future<Output = Result<()>> + 'a {
        let kind = if exclusive { OpKind::ExScan } else { OpKind::Scan };
        let ctx = self.group.begin(Signature {
            op: kind,
            dtype: Some(E::DTYPE),
            reduce: Some(op),
            count: buf.len() as u64,
            root: None,
            algo: 0,
        });
        let span = tracing::debug_span!("scan", seq = ctx.seq(), exclusive, count = buf.len(), dtype = %E::DTYPE, %op, algo = "recursive_doubling");
        coll::scan(ctx, buf, op, exclusive).instrument(span)
    }
}

impl<T: LocalTransport> Drop for Communicator<T> {
    /// A world communicator hands its rank's statistics (`HCOMM_STATS`) to their
    /// file or to standard error.
    fn drop(&mut self) {
        if self.group.comm_id() == 0 {
            crate::stats::flush(self.group.world_rank(self.group.rank()) as u32);
        }
    }
}

/// A collective whose algorithm the adaptive selection chooses when it runs
/// ([`coll::adapt`]): numbered at its call (`op`, unstarted), it waits, if need be,
/// for the agreement that decides its window, starts with the signature `sig` gives
/// for the algorithm, runs `run` and keeps its time.
async fn adaptive<'g, T, A, Fut>(
    op: coll::Unstarted<'g, T>,
    ticket: coll::AdaptTicket<A>,
    sig: impl FnOnce(A) -> Signature,
    run: impl FnOnce(coll::OpCtx<'g, T>, A) -> Fut,
) -> Result<()>
where
    T: LocalTransport,
    A: coll::AlgoFamily,
    Fut: Future<Output = Result<()>>,
{
    let group = op.group();
    let choice = match group.adapt_choose(&ticket).await {
        Ok(c) => c,
        Err(e) => return op.start(None).finish(Err(e)),
    };
    let ctx = op.start(Some(sig(choice.algo)));
    let start = std::time::Instant::now();
    run(ctx, choice.algo).await?;
    group.adapt_record(&ticket, &choice, start.elapsed());
    Ok(())
}

/// [`adaptive`] for a call numbered now, on `group`: the automatic call of a family
/// whose signature `sig` gives for each algorithm.
fn adaptive_now<'g, T, A, Fut>(
    group: &'g Group<T>,
    ticket: coll::AdaptTicket<A>,
    sig: impl Fn(A) -> Signature,
    run: impl FnOnce(coll::OpCtx<'g, T>, A) -> Fut,
) -> impl Future<Output = Result<()>>
where
    T: LocalTransport,
    A: coll::AlgoFamily,
    Fut: Future<Output = Result<()>>,
{
    let op = group.unstarted(group.reserve(), sig(ticket.first()));
    adaptive(op, ticket, sig, run)
}

/// [`adaptive`] for an allreduce.
async fn adaptive_all_reduce<T: LocalTransport, E: Element>(
    op: coll::Unstarted<'_, T>,
    ticket: coll::AdaptTicket<coll::AllreduceAlgo>,
    buf: &mut [E],
    reduce: ReduceOp,
) -> Result<()> {
    let count = buf.len();
    adaptive(
        op,
        ticket,
        |algo| coll::allreduce_signature::<E>(count, reduce, algo),
        |ctx, algo| traced_all_reduce(ctx, buf, reduce, algo),
    )
    .await
}

/// The allreduce of `ctx` by `algo`, in its `tracing` span (whichever way its
/// algorithm was chosen).
fn traced_all_reduce<'a, T: LocalTransport, E: Element>(
    ctx: coll::OpCtx<'a, T>,
    buf: &'a mut [E],
    op: ReduceOp,
    algo: coll::AllreduceAlgo,
) -> impl Future<Output = Result<()>> + 'a {
    let span = tracing::debug_span!("allreduce", seq = ctx.seq(), count = buf.len(), dtype = %E::DTYPE, op = %op, algo = algo.name());
    coll::allreduce(ctx, buf, op, algo).instrument(span)
}

/// The allgather of `ctx` by `algo`, in its `tracing` span.
pub(crate) fn traced_allgatherv<'a, T: LocalTransport, E: Element>(
    ctx: coll::OpCtx<'a, T>,
    send: &'a [E],
    recv: &'a mut [E],
    counts: &'a [usize],
    algo: coll::AllgatherAlgo,
) -> impl Future<Output = Result<()>> + 'a {
    let span = tracing::debug_span!("allgatherv", seq = ctx.seq(), dtype = %E::DTYPE, algo = algo.name());
    coll::allgatherv(ctx, send, recv, counts, algo).instrument(span)
}

pub(crate) fn traced_all_gather<'a, T: LocalTransport, E: Element>(
    ctx: coll::OpCtx<'a, T>,
    send: &'a [E],
    recv: &'a mut [E],
    algo: coll::AllgatherAlgo,
) -> impl Future<Output = Result<()>> + 'a {
    let span =
        tracing::debug_span!("allgather", seq = ctx.seq(), count = send.len(), dtype = %E::DTYPE, algo = algo.name());
    coll::allgather(ctx, send, recv, algo).instrument(span)
}

/// The reduce-scatter of `ctx` (equal blocks of `recv.len()`, one per rank) by
/// `algo`, in its `tracing` span.
fn traced_reduce_scatter<'a, T: LocalTransport, E: Element>(
    ctx: coll::OpCtx<'a, T>,
    send: &'a [E],
    recv: &'a mut [E],
    op: ReduceOp,
    algo: coll::ReduceScatterAlgo,
) -> impl Future<Output = Result<()>> + 'a {
    let counts = vec![recv.len(); ctx.group().size()];
    let span = tracing::debug_span!("reduce_scatter", seq = ctx.seq(), count = recv.len(), dtype = %E::DTYPE, %op, algo = algo.name());
    async move { coll::reduce_scatter(ctx, send, recv, &counts, op, algo).await }.instrument(span)
}

/// The broadcast of `ctx` from `root` by `algo`, in its `tracing` span.
pub(crate) fn traced_broadcast<'a, T: LocalTransport, E: Element>(
    ctx: coll::OpCtx<'a, T>,
    buf: &'a mut [E],
    root: usize,
    algo: coll::BcastAlgo,
) -> impl Future<Output = Result<()>> + 'a {
    let span = tracing::debug_span!("broadcast", seq = ctx.seq(), count = buf.len(), dtype = %E::DTYPE, root, algo = algo.name());
    coll::broadcast(ctx, buf, root, algo).instrument(span)
}

/// An alltoall's signature: blocks of `block` elements by `algo`.
fn alltoall_signature<E: Element>(block: usize, algo: coll::AlltoallAlgo) -> Signature {
    Signature {
        op: OpKind::AllToAll,
        dtype: Some(E::DTYPE),
        reduce: None,
        count: block as u64,
        root: None,
        algo: algo as u8,
    }
}

/// The alltoall of `ctx` (`send` and `recv` in equal blocks, one per rank) by
/// `algo`, in its `tracing` span.
fn traced_all_to_all<'a, T: LocalTransport, E: Element>(
    ctx: coll::OpCtx<'a, T>,
    send: &'a [E],
    recv: &'a mut [E],
    algo: coll::AlltoallAlgo,
) -> impl Future<Output = Result<()>> + 'a {
    let n = ctx.group().size();
    let block = send.len() / n;
    let span = tracing::debug_span!("alltoall", seq = ctx.seq(), block, dtype = %E::DTYPE, algo = algo.name());
    let shape_ok = send.len() == recv.len() && send.len().is_multiple_of(n);
    async move {
        if !shape_ok {
            let e = Error::invalid(format!(
                "alltoall buffers of {} and {} elements are not {n} equal blocks each",
                send.len(),
                recv.len()
            ));
            return ctx.finish(Err(e));
        }
        match algo {
            coll::AlltoallAlgo::Pairwise => {
                let counts = vec![block; n];
                coll::pairwise_alltoallv(ctx, send, &counts, recv, &counts).await
            }
            coll::AlltoallAlgo::Bruck => coll::bruck_alltoall(ctx, send, recv, block).await,
        }
    }
    .instrument(span)
}

/// A collective numbered at its call but not started yet. Dropped unstarted, it
/// starts and drops the operation, which tells the peers it was cancelled.
struct Reserved<T: LocalTransport> {
    comm: Arc<Communicator<T>>,
    seq: u64,
    sig: Option<Signature>,
}

impl<T: LocalTransport> Drop for Reserved<T> {
    fn drop(&mut self) {
        if let Some(sig) = self.sig.take() {
            drop(self.comm.group.begin_reserved(self.seq, sig));
        }
    }
}

/// Emits the event of a finished point-to-point operation.
fn p2p_done(me: usize, op: OpKind, peer: usize, bytes: u64, start: events::Stopwatch, ok: bool) {
    events::op_done(events::OpDone {
        rank: me as u32,
        op,
        seq: P2P_SEQ,
        algo: "direct",
        bytes,
        elapsed: start.elapsed(),
        peer: Some(peer as u32),
        ok,
    });
}

/// Mean bytes per rank of a counts vector of `E`.
fn mean_bytes<E: Element>(counts: &[usize]) -> usize {
    std::mem::size_of::<E>() * counts.iter().sum::<usize>() / counts.len().max(1)
}

/// The signature of a point-to-point message of `count` elements of `dtype`.
fn p2p_signature(dtype: DType, count: usize) -> Signature {
    Signature { op: OpKind::Send, dtype: Some(dtype), reduce: None, count: count as u64, root: None, algo: 0 }
}

pin_project_lite::pin_project! {
    /// The future of a point-to-point send ([`Communicator::send`],
    /// [`Communicator::send_bytes`]): the transport's send under the deadline, and its
    /// statistics when it ends. A named type, so that the transport's future is held
    /// once (an `async` block kept it twice, and a `send` future was 744 bytes).
    struct Sent<F> {
        #[pin]
        op: Option<coll::P2pDeadline<F>>,
        // Why the send failed at the call (`op` is `None`).
        err: Option<Error>,
        me: usize,
        world: usize,
        len: u64,
        start: events::Stopwatch,
    }
}

impl<F: Future<Output = Result<()>>> Future for Sent<F> {
    type Output = Result<()>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<()>> {
        let this = self.project();
        let Some(op) = this.op.as_pin_mut() else {
            return std::task::Poll::Ready(Err(this.err.take().expect("a send polled after it completed")));
        };
        let r = std::task::ready!(op.poll(cx));
        p2p_done(*this.me, OpKind::Send, *this.world, *this.len, *this.start, r.is_ok());
        std::task::Poll::Ready(r)
    }
}

/// What a receive's future yields that holds its frame.
trait HasFrame {
    fn frame(&self) -> &Frame;
}

impl HasFrame for Frame {
    fn frame(&self) -> &Frame {
        self
    }
}

impl HasFrame for (Frame, &mut [u8]) {
    fn frame(&self) -> &Frame {
        &self.0
    }
}

/// The future of a posted point-to-point receive ([`Communicator::post_recv_via`]):
/// the mailbox's receive under the deadline, its statistics, and the check that
/// what came is a message. A named type for the reason [`Sent`] is one.
struct Received<'a, T: LocalTransport, F> {
    comm: &'a Communicator<T>,
    src: usize,
    world: usize,
    start: events::Stopwatch,
    op: Option<coll::P2pDeadline<F>>,
    // Why the receive failed at the call (`op` is `None`).
    err: Option<Error>,
}

impl<T: LocalTransport, F: Future<Output = Result<R>> + Unpin, R: HasFrame> Future for Received<'_, T, F> {
    type Output = Result<R>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<R>> {
        let this = &mut *self;
        let Some(op) = this.op.as_mut() else {
            return std::task::Poll::Ready(Err(this.err.take().expect("a receive polled after it completed")));
        };
        let r = std::task::ready!(std::pin::Pin::new(op).poll(cx));
        let (comm, src, world) = (this.comm, this.src, this.world);
        let me = comm.group.world_rank(comm.rank());
        let len = r.as_ref().map_or(0, |f| f.frame().len() as u64);
        if r.is_ok() {
            events::message(me as u32, world as u32, OpKind::Recv, false, len, this.start.elapsed());
        }
        p2p_done(me, OpKind::Recv, world, len, this.start, r.is_ok());
        let got = r?;
        let frame = got.frame();
        if frame.header.op != OpKind::Send || frame.header.dtype.is_none() {
            return std::task::Poll::Ready(Err(comm.recv_error(
                ErrorKind::Protocol,
                src,
                format!("rank {src} sent a {} frame as a message", frame.header.op),
            )));
        }
        std::task::Poll::Ready(Ok(got))
    }
}
