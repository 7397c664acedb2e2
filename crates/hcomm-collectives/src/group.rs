//! A group of ranks over a transport, and the context of one operation on it.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use hcomm_core::events;
use hcomm_core::keys::{COMM_ABORT_SEQ, FIRST_OP_SEQ, RECORDS_SEQ};
use hcomm_core::mailbox::encode_abort;
use hcomm_core::{
    Element, Error, ErrorKind, FrameKind, Header, LocalTransport, MatchKey, OpKind, Rank, Result, Signature, Tag,
};
use hcomm_topology::Topology;

use crate::adapt::{Adapt, AdaptChoice, AdaptTicket, AlgoFamily, Contest};
use crate::allreduce::{AllreduceAlgo, HierPlan, Layout, Tuning};
use crate::checks::Checks;
use crate::{AllgatherAlgo, AlltoallAlgo, BcastAlgo, ReduceScatterAlgo};
use hcomm_core::wire::{RECORD_LEN, encode_record};
use parking_lot::Mutex;
use tokio::time::Instant;

/// The ranks of one communicator over a shared transport: the world, or a subset
/// made by a split. Group ranks are `0..size`; the transport speaks world ranks.
#[derive(Debug)]
pub struct Group<T> {
    transport: Arc<T>,
    comm: u64,
    members: Arc<[Rank]>,
    me: usize,
    topology: Topology,
    /// Ring order, this rank's hierarchical plan and the layout the selection sees:
    /// from the topology, or flat when the tuning says so.
    ring: Arc<[usize]>,
    hier: Arc<HierPlan>,
    layout: Arc<Layout>,
    next_seq: AtomicU64,
    /// Shrinks called on this group so far.
    shrinks: AtomicU64,
    /// The deadline of operations (saturated at [`hcomm_core::NEVER`]) and their
    /// stall threshold, which change through a shared reference; an operation takes
    /// them when it starts.
    timeout: SharedDuration,
    stall_warn: SharedDuration,
    tuning: Tuning,
    /// The algorithms chosen lately, by collective and size: see [`ChoiceMemo`].
    memo: Memos,
    /// The deferred argument checks ([`ArgCheck::Deferred`](crate::ArgCheck::Deferred)).
    checks: Checks,
    /// The adaptive selection ([`crate::adapt`]).
    adapt: Adapt,
}

/// How a collective of a family the adaptive selection serves chooses its
/// algorithm ([`Group::plan`]).
#[derive(Debug, Clone, Copy)]
pub enum AlgoPlan<A> {
    /// This algorithm, known at the call.
    Now(A),
    /// The adaptive selection's, known when the call runs
    /// ([`Group::adapt_choose`]).
    Adaptive(AdaptTicket<A>),
}

/// The last selections of one collective, by message size and float-ness, in a few
/// slots picked by size: the selection (the cost model, with its `log2`s, over every
/// candidate and link level) is a visible share of a small operation's time, and
/// applications repeat their sizes. Emptied
/// whenever the tuning or the layout changes. Each slot packs
/// `bytes << 8 | float << 7 | 1 << 6 | code`.
#[derive(Debug, Default)]
struct ChoiceMemo([AtomicU64; 8]);

impl ChoiceMemo {
    fn key(bytes: usize, float: bool) -> Option<(usize, u64)> {
        let b = u64::try_from(bytes).ok().filter(|&b| b < 1 << 56)?;
        let slot = ((b << 1 | u64::from(float)).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 61) as usize;
        Some((slot, b << 8 | u64::from(float) << 7 | 1 << 6))
    }

    fn get(&self, bytes: usize, float: bool) -> Option<u8> {
        let (slot, key) = Self::key(bytes, float)?;
        let v = self.0[slot].load(Ordering::Relaxed);
        (v & !0x3f == key).then_some((v & 0x3f) as u8)
    }

    fn put(&self, bytes: usize, float: bool, code: u8) {
        if let Some((slot, key)) = Self::key(bytes, float) {
            self.0[slot].store(key | u64::from(code & 0x3f), Ordering::Relaxed);
        }
    }

    fn clear(&self) {
        self.0.iter().for_each(|s| s.store(0, Ordering::Relaxed));
    }

    /// The memorized choice for `bytes`, or `choose`'s (memorized). `all` lists the
    /// algorithms, to turn a code back into one.
    fn get_or<A: Copy + Into<u8>>(&self, all: &[A], bytes: usize, float: bool, choose: impl FnOnce() -> A) -> A {
        if let Some(code) = self.get(bytes, float)
            && let Some(&a) = all.iter().find(|a| (**a).into() == code)
        {
            return a;
        }
        let a = choose();
        self.put(bytes, float, a.into());
        a
    }
}

/// One [`ChoiceMemo`] per collective whose algorithm is selected.
#[derive(Debug, Default)]
struct Memos {
    allreduce: ChoiceMemo,
    broadcast: ChoiceMemo,
    allgather: ChoiceMemo,
    reduce_scatter: ChoiceMemo,
    alltoall: ChoiceMemo,
}

impl Memos {
    fn clear(&self) {
        for m in [&self.allreduce, &self.broadcast, &self.allgather, &self.reduce_scatter, &self.alltoall] {
            m.clear();
        }
    }
}

/// Default of the stall report's threshold (`HCOMM_STALL_WARN`).
pub const DEFAULT_STALL_WARN: Duration = Duration::from_secs(5);

impl<T: LocalTransport> Group<T> {
    /// The group of every rank of `transport`, with communicator id `comm`.
    pub fn world(transport: Arc<T>, comm: u64, topology: Topology, timeout: Duration) -> Result<Group<T>> {
        let size = transport.size();
        if size > hcomm_core::keys::MAX_RANKS {
            return Err(Error::invalid(format!(
                "{size} ranks: a communicator has at most {}",
                hcomm_core::keys::MAX_RANKS
            )));
        }
        if topology.size() != size {
            return Err(Error::invalid(format!("topology of {} ranks for a transport of {size}", topology.size())));
        }
        let me = transport.rank();
        Ok(Group::build(transport, comm, (0..size).collect(), me, topology, timeout))
    }

    fn build(
        transport: Arc<T>,
        comm: u64,
        members: Vec<Rank>,
        me: usize,
        topology: Topology,
        timeout: Duration,
    ) -> Group<T> {
        hcomm_core::op::name_algorithms(crate::signature_algo);
        let tuning = Tuning::for_transport(transport.name());
        let n = members.len();
        let mut g = Group {
            transport,
            comm,
            members: members.into(),
            me,
            topology,
            ring: (0..n).collect(),
            hier: Arc::default(),
            layout: Arc::new(Layout::flat(n)),
            next_seq: AtomicU64::new(FIRST_OP_SEQ),
            shrinks: AtomicU64::new(0),
            timeout: SharedDuration::new(Some(hcomm_core::saturate(Some(timeout)))),
            stall_warn: SharedDuration::new(Some(DEFAULT_STALL_WARN)),
            tuning,
            memo: Memos::default(),
            checks: Checks::default(),
            adapt: Adapt::default(),
        };
        g.lay_out();
        g
    }

    /// Derives the ring, the hierarchical plan and the layout from the topology and
    /// the tuning's `topology_aware`.
    fn lay_out(&mut self) {
        self.memo.clear();
        let n = self.size();
        let ring: Vec<usize> = if self.tuning.topology_aware { self.topology.ring_order() } else { (0..n).collect() };
        if self.tuning.topology_aware {
            self.hier = Arc::new(HierPlan::new(&self.topology, &ring, self.me));
            self.layout = Arc::new(Layout::new(&self.topology, &ring));
        } else {
            // One flat ring in rank order: no stages.
            self.hier = Arc::new(HierPlan { stages: Vec::new(), top: ring.clone() });
            self.layout = Arc::new(Layout::flat(n));
        }
        self.ring = ring.into();
    }

    /// Replaces the topology (same ranks, racks or hosts learnt later) and derives
    /// the ring, plan and layout again. Every rank must set the same.
    ///
    /// # Errors
    /// An invalid-argument error for a topology of another size.
    pub fn set_topology(&mut self, topology: Topology) -> Result<()> {
        if topology.size() != self.size() {
            return Err(Error::invalid(format!(
                "topology of {} ranks for a group of {}",
                topology.size(),
                self.size()
            )));
        }
        self.topology = topology;
        self.lay_out();
        Ok(())
    }

    /// Ring order of the group's ranks.
    pub fn ring(&self) -> &[usize] {
        &self.ring
    }

    /// This rank's part in a hierarchical allreduce.
    pub fn hier_plan(&self) -> &HierPlan {
        &self.hier
    }

    /// What the algorithm selection knows of this group's topology.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The allreduce algorithm for `bytes` (see [`Tuning::allreduce_algo_on`]).
    pub fn allreduce_algo(&self, bytes: usize, float: bool, asked: Option<AllreduceAlgo>) -> AllreduceAlgo {
        let choose = || self.tuning.allreduce_algo_on(&self.layout, self.size(), bytes, float, asked);
        if asked.is_some() {
            return choose();
        }
        self.memo.allreduce.get_or(&AllreduceAlgo::ALL, bytes, float, choose)
    }

    /// How a collective of family `A` of `bytes` (as the family's table counts
    /// them; floats: `float`) chooses its algorithm, called when the operation is:
    /// the one asked for, else the group's choice ([`Group::allreduce_algo`] and the
    /// others), except where the adaptive selection decides ([`Tuning::adaptive`]:
    /// not asked for an algorithm, none forced, not a reproducible float reduction,
    /// at least [`AlgoFamily::ADAPT_MIN_BYTES`], and alternatives in the measured
    /// table at the nearest size). That call is numbered in its class now, so call
    /// this once per operation, in call order.
    pub fn plan<A: AlgoFamily>(&self, bytes: usize, float: bool, asked: Option<A>) -> AlgoPlan<A> {
        match self.adaptive_class::<A>(bytes, float).filter(|_| asked.is_none()) {
            Some(class) => AlgoPlan::Adaptive(self.adapt.ticket(self, class, bytes)),
            None => AlgoPlan::Now(A::chosen(self, bytes, float, asked)),
        }
    }

    /// The adaptive selection's class of a call of `bytes` not asked for an
    /// algorithm, if it decides there (see [`Group::plan`]).
    fn adaptive_class<A: AlgoFamily>(&self, bytes: usize, float: bool) -> Option<Contest<A>> {
        let t = &self.tuning;
        let adapts = bytes >= A::ADAPT_MIN_BYTES
            && t.adaptive
            && A::forced(t).is_none()
            && !(A::REDUCES && t.reproducible && float);
        adapts.then(|| t.measured.contest(self.size(), bytes)).flatten()
    }

    /// The algorithm the adaptive selection runs for the call of `ticket`, once the
    /// ranks' timings a window before have come (normally long before).
    ///
    /// # Errors
    /// A peer's failure, the group's abort, or a timeout naming the rank whose timings
    /// did not come within the group's timeout; a protocol error for a malformed
    /// message.
    ///
    /// # Cancel safety
    /// Cancel safe: what the selection waits for is held by the group.
    pub async fn adapt_choose<A: AlgoFamily>(&self, ticket: &AdaptTicket<A>) -> Result<AdaptChoice<A>> {
        self.adapt.choose(ticket).await
    }

    /// Keeps the time `took` of the call of `ticket`, which ran `choice` and
    /// succeeded (call it for successful calls only).
    pub fn adapt_record<A: AlgoFamily>(&self, ticket: &AdaptTicket<A>, choice: &AdaptChoice<A>, took: Duration) {
        self.adapt.record(ticket, choice, took);
    }

    /// The algorithm a call of family `A` of `bytes` would run now, as
    /// [`Group::plan`] decides but without numbering a call: where the adaptive
    /// selection decides, its incumbent (a window's last two calls may run
    /// another).
    pub fn algo_now<A: AlgoFamily>(&self, bytes: usize, float: bool) -> A {
        match self.adaptive_class::<A>(bytes, float) {
            Some(class) => self.adapt.current(&class),
            None => A::chosen(self, bytes, float, None),
        }
    }

    /// The broadcast algorithm for `bytes` (see [`Tuning::bcast_algo`]).
    pub fn bcast_algo(&self, bytes: usize) -> BcastAlgo {
        self.memo.broadcast.get_or(&BcastAlgo::ALL, bytes, false, || self.tuning.bcast_algo(self.size(), bytes, None))
    }

    /// The allgather algorithm for `bytes` per rank (see [`Tuning::allgather_algo`]).
    pub fn allgather_algo(&self, bytes: usize) -> AllgatherAlgo {
        self.memo
            .allgather
            .get_or(&AllgatherAlgo::ALL, bytes, false, || self.tuning.allgather_algo(self.size(), bytes, None))
    }

    /// The reduce-scatter algorithm for blocks of `bytes` (see
    /// [`Tuning::reduce_scatter_algo`]).
    pub fn reduce_scatter_algo(&self, bytes: usize) -> ReduceScatterAlgo {
        self.memo
            .reduce_scatter
            .get_or(&ReduceScatterAlgo::ALL, bytes, false, || self.tuning.reduce_scatter_algo(self.size(), bytes, None))
    }

    /// The alltoall algorithm for blocks of `bytes` (see [`Tuning::alltoall_algo`]).
    pub fn alltoall_algo(&self, bytes: usize) -> AlltoallAlgo {
        self.memo
            .alltoall
            .get_or(&AlltoallAlgo::ALL, bytes, false, || self.tuning.alltoall_algo(self.size(), bytes, None))
    }

    /// The group of `members` (group ranks of `self`, in the new rank order) with
    /// communicator id `comm`; `None` if this rank is not among them.
    pub fn subgroup(&self, comm: u64, members: &[usize]) -> Option<Group<T>> {
        let me = members.iter().position(|&m| m == self.me)?;
        let world: Vec<Rank> = members.iter().map(|&m| self.members[m]).collect();
        let mut g =
            Group::build(self.transport.clone(), comm, world, me, self.topology.subset(members), self.deadline_now());
        g.set_stall_warn(self.stall_warn());
        g.set_tuning(self.tuning.clone());
        Some(g)
    }

    /// This rank's index in the group.
    pub fn rank(&self) -> usize {
        self.me
    }

    /// Number of ranks in the group.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// The communicator id carried by every frame of this group.
    pub fn comm_id(&self) -> u64 {
        self.comm
    }

    /// World rank of group rank `r`.
    pub fn world_rank(&self, r: usize) -> Rank {
        self.members[r]
    }

    pub fn transport(&self) -> &Arc<T> {
        &self.transport
    }

    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Default deadline of each operation; `None` for never.
    pub fn timeout(&self) -> Option<Duration> {
        let t = self.deadline_now();
        (t < hcomm_core::NEVER).then_some(t)
    }

    /// The deadline of an operation starting now, [`hcomm_core::NEVER`] for none.
    fn deadline_now(&self) -> Duration {
        self.timeout.get().unwrap_or(hcomm_core::NEVER)
    }

    /// Sets the deadline of operations started from now on: a duration, or `None`
    /// for never (as is anything longer than [`hcomm_core::NEVER`]). Operations
    /// already started keep theirs.
    pub fn set_timeout(&self, timeout: impl Into<Option<Duration>>) {
        self.timeout.set(Some(hcomm_core::saturate(timeout.into())));
    }

    /// After how long a waiting operation reports its stall (again after twice,
    /// four times … that long); `None` for never.
    pub fn stall_warn(&self) -> Option<Duration> {
        self.stall_warn.get()
    }

    /// Sets the stall threshold of operations started from now on (`None`: no
    /// reports).
    pub fn set_stall_warn(&self, after: Option<Duration>) {
        self.stall_warn.set(after.filter(|&d| d < hcomm_core::NEVER));
    }

    /// How this group chooses algorithms.
    pub fn tuning(&self) -> &Tuning {
        &self.tuning
    }

    pub fn set_tuning(&mut self, tuning: Tuning) {
        self.memo.clear();
        let relay = tuning.topology_aware != self.tuning.topology_aware;
        self.tuning = tuning;
        if relay {
            self.lay_out();
        }
    }

    /// Number of collectives started so far.
    pub fn collectives_started(&self) -> u64 {
        self.next_seq.load(Ordering::Relaxed) - 1
    }

    /// Starts a collective: takes the next sequence number *now*, so that ranks match
    /// collectives by the order of the calls, whatever order their futures are polled
    /// in.
    pub fn begin(&self, sig: Signature) -> OpCtx<'_, T> {
        OpCtx::new(self, self.reserve(), sig)
    }

    /// Takes the next sequence number now, for an operation that starts later with
    /// [`Group::begin_reserved`] (an operation handed to another task). If it never
    /// starts, call [`Group::begin_reserved`] and drop the context, so that peers
    /// are told it was cancelled.
    pub fn reserve(&self) -> u64 {
        self.next_seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Starts the operation whose sequence number [`Group::reserve`] took. The
    /// deadline counts from now.
    pub fn begin_reserved(&self, seq: u64, sig: Signature) -> OpCtx<'_, T> {
        OpCtx::new(self, seq, sig)
    }

    /// [`Group::begin_reserved`] deferred: the operation `seq` starts when
    /// [`Unstarted::start`] is called, or, if the guard is dropped first, starts
    /// with `sig` and is dropped, which tells the peers it was cancelled.
    pub fn unstarted(&self, seq: u64, sig: Signature) -> Unstarted<'_, T> {
        Unstarted { g: self, seq, sig: Some(sig) }
    }

    /// Bad arguments found before a collective starts still take its sequence number
    /// and abort it on every rank, so that no rank waits for this one.
    pub fn reject(&self, sig: Signature, err: Error) -> Error {
        self.begin(sig).finish::<()>(Err(err)).unwrap_err()
    }

    /// Aborts the group on every rank: every pending and later operation of it, here
    /// and at the peers, fails with an aborted error that carries `reason` and names
    /// this rank. Returns that error. Frames to the peers are queued at once.
    pub fn abort(&self, reason: &str) -> Error {
        abort_comm(&*self.transport, self.comm, &self.members, self.world_rank(self.me), reason)
    }

    /// After failures: the surviving ranks agree on which members failed and return
    /// the group of the others, in the same order. Every surviving rank must call it.
    /// The new group has a communicator id of its own.
    ///
    /// The agreement: the lowest-ranked member not known to have failed coordinates;
    /// every other survivor sends it the members it knows to have failed; it waits
    /// for every member it does not know to have failed (learning of more failures as
    /// its receives fail), and sends back the union. A member whose coordinator fails
    /// moves on to the next one. Its messages use a communicator id of their own, so
    /// shrink works on an aborted group.
    ///
    /// # Errors
    /// A timeout naming the ranks that did not answer within the group's deadline; a
    /// peer-failed error if the others counted this rank as failed; a protocol error
    /// for a malformed message.
    ///
    /// # Cancel safety
    /// Dropping the future leaves this rank out of the agreement: the others then
    /// wait for it until their deadline. Each call takes the next shrink number, so
    /// call it again on every surviving rank to retry.
    pub async fn shrink(&self) -> Result<Group<T>> {
        let round = self.shrinks.fetch_add(1, Ordering::Relaxed) + 1;
        let start = Instant::now();
        let failed = crate::shrink::agree(self, round, start + self.deadline_now())
            .await
            .map_err(|e| e.in_op(OpKind::Shrink, Some(round)).at_rank(self.me))?;
        let survivors: Vec<usize> = (0..self.size()).filter(|&r| !failed[r]).collect();
        let gone: Vec<usize> = (0..self.size()).filter(|&r| failed[r]).collect();
        let comm = crate::shrink::comm_id(self.comm, round, &failed);
        tracing::info!(rank = self.me, round, failed = ?gone, size = survivors.len(), elapsed_ms = start.elapsed().as_millis() as u64, "shrunk");
        Ok(self.subgroup(comm, &survivors).expect("the agreement keeps this rank"))
    }

    /// The rank whose argument check records this rank receives: the previous one
    /// around the group (each rank sends its records to the next).
    pub(crate) fn check_prev(&self) -> usize {
        (self.me + self.size() - 1) % self.size()
    }

    /// Looks at the argument checks of finished operations whose records have
    /// arrived since ([`ArgCheck::Deferred`](crate::ArgCheck::Deferred)), without
    /// waiting: the first mismatch found, as an error of the operation it belongs
    /// to (once). Such an operation is also aborted on every rank still in it.
    /// Every collective asks before it starts, and fails with that error.
    pub fn late_error(&self) -> Option<Error> {
        self.checks.late_error(self)
    }

    /// Whether more than `keep` finished operations wait for their argument check.
    pub(crate) fn checks_over(&self, keep: usize) -> bool {
        self.checks.over(keep)
    }

    /// Waits until at most `keep` finished operations wait for their argument check,
    /// then returns [`Group::late_error`]'s error if there is one. Dropping the
    /// future changes nothing: the checks stay for later.
    ///
    /// # Errors
    /// A mismatch found by a check, as an error of the operation it belongs to.
    pub async fn settle_checks(&self, keep: usize) -> Result<()> {
        self.checks.settle(self, keep).await
    }

    /// Aborts operation `seq` (of kind `op`) here and, once, on every other rank.
    pub(crate) fn abort_op(&self, seq: u64, op: OpKind, err: &Error) {
        let t = &self.transport;
        if !t.mailbox().abort_op(self.comm, seq, err.clone()) {
            return;
        }
        let payload = encode_abort(err);
        let me = self.world_rank(self.me);
        for (i, &peer) in self.members.iter().enumerate() {
            if i != self.me {
                let h = Header::control(FrameKind::Abort, op, me, self.comm, seq, payload.len());
                t.post(peer, h, payload.clone());
            }
        }
    }

    /// Why the group was aborted, if it was.
    pub fn aborted(&self) -> Option<Error> {
        self.transport.mailbox().comm_aborted(self.comm)
    }

    /// Applies the group's deadline to a point-to-point operation: its errors (and the
    /// timeout) name the operation and this rank, and the timeout `peer` too. While it
    /// waits it reports its stall as collectives do ([`Group::stall_warn`], unless
    /// polled inside [`quiet`]).
    pub fn p2p_deadline<F>(&self, op: OpKind, peer: usize, tag: Tag, fut: F) -> P2pDeadline<F> {
        P2pDeadline {
            fut,
            timer: None,
            timeout: self.deadline_now(),
            stall_warn: self.stall_warn(),
            op,
            peer,
            tag,
            me: self.me,
        }
    }
}

/// Aborts communicator `comm` of `members` (world ranks) on every one of them, as
/// [`Group::abort`] does, from rank `me` (a world rank among them): for code that
/// holds the transport but not the group.
pub fn abort_comm<T: LocalTransport + ?Sized>(
    transport: &T,
    comm: u64,
    members: &[Rank],
    me: Rank,
    reason: &str,
) -> Error {
    let err = Error::new(ErrorKind::Aborted, format!("communicator aborted by rank {me}: {reason}")).with_peer(me);
    let mailbox = transport.mailbox();
    if mailbox.abort_comm(comm, err.clone()) {
        let payload = encode_abort(&err);
        for &peer in members.iter().filter(|&&p| p != me) {
            let h = Header::control(FrameKind::Abort, OpKind::Barrier, me, comm, COMM_ABORT_SEQ, payload.len());
            transport.post(peer, h, payload.clone());
        }
    }
    mailbox.comm_aborted(comm).unwrap_or(err)
}

thread_local! {
    /// Whether this thread is polling inside [`quiet`].
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The deadline of the [`deadline`] this thread is polling inside, if any
    /// ([`hcomm_core::NEVER`] for none).
    static DEADLINE: std::cell::Cell<Option<Duration>> = const { std::cell::Cell::new(None) };
}

/// Sets a thread-local for the duration of a poll, and puts the old value back after
/// it, however the poll ends.
fn poll_with<T: Copy + 'static, R>(
    key: &'static std::thread::LocalKey<std::cell::Cell<T>>,
    value: T,
    poll: impl FnOnce() -> R,
) -> R {
    struct Restore<T: Copy + 'static>(&'static std::thread::LocalKey<std::cell::Cell<T>>, T);
    impl<T: Copy + 'static> Drop for Restore<T> {
        fn drop(&mut self) {
            self.0.with(|c| c.set(self.1));
        }
    }
    let _restore = Restore(key, key.with(|c| c.replace(value)));
    poll()
}

pin_project_lite::pin_project! {
    /// The future [`quiet`] returns.
    #[derive(Debug)]
    pub struct Quiet<F> {
        #[pin]
        fut: F,
    }
}

impl<F: Future> Future for Quiet<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<F::Output> {
        poll_with(&QUIET, true, || self.project().fut.poll(cx))
    }
}

/// Runs `fut` (an operation, or a future that awaits several) without stall reports:
/// for a wait that is idle by design, such as a service's receive of its next
/// command. Deadlines still apply (set them per communicator, `None` for never).
/// The operations started in `fut` take this from their first wait.
pub fn quiet<F: Future>(fut: F) -> Quiet<F> {
    Quiet { fut }
}

pin_project_lite::pin_project! {
    /// The future [`deadline`] returns.
    #[derive(Debug)]
    pub struct Deadline<F> {
        #[pin]
        fut: F,
        timeout: Duration,
    }
}

impl<F: Future> Future for Deadline<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        poll_with(&DEADLINE, Some(*this.timeout), || this.fut.poll(cx))
    }
}

/// Runs `fut` (an operation, or a future that awaits several) with `timeout` as the
/// deadline of the operations in it, in place of their communicator's: a duration
/// counted from each operation's call, or `None` for never. As with [`quiet`], an
/// operation takes it at its first wait; one done in its first poll never waits.
/// An operation that misses it fails with a timeout error naming it, and is
/// aborted on every rank, as at its communicator's deadline.
pub fn deadline<F: Future>(timeout: impl Into<Option<Duration>>, fut: F) -> Deadline<F> {
    Deadline { fut, timeout: hcomm_core::saturate(timeout.into()) }
}

/// The deadline of an operation that starts waiting now: `configured`, unless
/// polled inside [`deadline`].
fn timeout_now(configured: Duration) -> Duration {
    DEADLINE.with(std::cell::Cell::get).unwrap_or(configured)
}

/// The stall threshold of an operation that starts waiting now: `configured`, unless
/// polled inside [`quiet`].
fn stall_warn_now(configured: Option<Duration>) -> Option<Duration> {
    if QUIET.with(std::cell::Cell::get) { None } else { configured }
}

pin_project_lite::pin_project! {
    /// The future [`Group::p2p_deadline`] returns. A named type of a few words around
    /// the operation's own future (no `async` block: those kept the operation's
    /// future twice); the timer is armed, on the heap, only when the operation is
    /// not ready at its first poll (a message already there, a send written straight
    /// into a shared-memory ring, a receive whose polling found its message).
    #[derive(Debug)]
    pub struct P2pDeadline<F> {
        #[pin]
        fut: F,
        timer: Option<Pin<Box<P2pTimer>>>,
        timeout: Duration,
        stall_warn: Option<Duration>,
        op: OpKind,
        peer: usize,
        tag: Tag,
        me: usize,
    }
}

pin_project_lite::pin_project! {
    /// The timer of a waiting point-to-point operation: the next stall report, or the
    /// deadline.
    #[derive(Debug)]
    struct P2pTimer {
        #[pin]
        sleep: tokio::time::Sleep,
        start: Instant,
        // The wait after which the next stall report is due; `None`: no more reports.
        warn_after: Option<Duration>,
    }
}

impl P2pTimer {
    /// When the timer fires next, and whether that is a stall report.
    fn next(start: Instant, warn_after: Option<Duration>, timeout: Duration) -> (Instant, bool) {
        let deadline = start + timeout;
        match warn_after.map(|d| start + d).filter(|&t| t < deadline) {
            Some(t) => (t, true),
            None => (deadline, false),
        }
    }
}

impl<F: Future<Output = Result<R>>, R> Future for P2pDeadline<F> {
    type Output = Result<R>;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<R>> {
        use std::task::Poll;
        let this = self.project();
        let (op, me) = (*this.op, *this.me);
        if let Poll::Ready(r) = this.fut.poll(cx) {
            return Poll::Ready(r.map_err(|e| e.in_op(op, None).at_rank(me)));
        }
        if this.timer.is_none() {
            *this.timeout = timeout_now(*this.timeout);
        }
        let timeout = *this.timeout;
        let timer = this.timer.get_or_insert_with(|| {
            let start = Instant::now();
            let warn_after = stall_warn_now(*this.stall_warn);
            let (at, _) = P2pTimer::next(start, warn_after, timeout);
            Box::pin(P2pTimer { sleep: tokio::time::sleep_until(at), start, warn_after })
        });
        loop {
            let mut t = timer.as_mut().project();
            if t.sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let (_, warning) = P2pTimer::next(*t.start, *t.warn_after, timeout);
            if !warning {
                return Poll::Ready(Err(Error::new(
                    ErrorKind::Timeout,
                    format!("no matching message within {timeout:?}"),
                )
                .with_peer(*this.peer)
                .in_op(op, None)
                .at_rank(me)));
            }
            report_p2p_stall(me, op, *this.peer, *this.tag, t.start.elapsed());
            *t.warn_after = t.warn_after.map(|d| d.saturating_mul(2));
            let (at, _) = P2pTimer::next(*t.start, *t.warn_after, timeout);
            t.sleep.as_mut().reset(at);
        }
    }
}

/// Logs that a point-to-point operation still waits, as [`OpCtx`]'s stall report
/// does for collectives: a `tracing` warning (target `hcomm::stall`), or a line on
/// standard error when no subscriber is installed.
fn report_p2p_stall(me: usize, op: OpKind, peer: usize, tag: Tag, waited: Duration) {
    let waited = waited.as_secs_f64();
    let (dir, what) = match op {
        OpKind::Send => ("to", "the transport has not taken the message yet"),
        _ => ("from", "no matching message has arrived"),
    };
    if tracing::dispatcher::has_been_set() {
        tracing::warn!(target: "hcomm::stall", rank = me, %op, peer, tag, waited_s = waited, "rank {me}: {op} {dir} rank {peer} (tag {tag}) stalled for {waited:.1} s: {what}");
    } else {
        eprintln!("hcomm: rank {me}: {op} {dir} rank {peer} (tag {tag}) stalled for {waited:.1} s: {what}");
    }
}

/// The context of one collective: its sequence number, signature and deadline, the
/// sends and receives it makes, and the ranks it still waits for.
///
/// Finish it with [`OpCtx::finish`]. Dropped unfinished (its future cancelled), it
/// aborts the operation on every rank, so that peers fail it at once with an aborted
/// error instead of waiting for their deadline; later operations are unaffected.
#[derive(Debug)]
pub struct OpCtx<'g, T: LocalTransport> {
    g: &'g Group<T>,
    seq: u64,
    sig: Signature,
    /// The group's deadline and stall threshold when the operation began.
    timeout: Duration,
    stall_warn: Option<Duration>,
    /// When the operation started: at `begin` if its event is listened to, else when
    /// it first had to wait (an operation done in its first poll, as a broadcast's
    /// root, never reads the clock).
    start: OnceLock<Instant>,
    waiting: Mutex<BTreeMap<usize, usize>>,
    /// Bytes this rank sent and received in the operation.
    moved: AtomicU64,
    done: AtomicBool,
    /// This rank posted its argument check record and has not yet matched the
    /// previous rank's, nor handed the check to the group (`ArgCheck::Deferred`): an
    /// operation that fails or is dropped so tells the group to drop that record.
    check_open: AtomicBool,
}

impl<'g, T: LocalTransport> OpCtx<'g, T> {
    fn new(g: &'g Group<T>, seq: u64, sig: Signature) -> OpCtx<'g, T> {
        let start = OnceLock::new();
        if events::op_listened() {
            let _ = start.set(Instant::now());
        }
        OpCtx {
            g,
            seq,
            sig,
            timeout: g.deadline_now(),
            stall_warn: g.stall_warn(),
            start,
            waiting: Mutex::new(BTreeMap::new()),
            moved: AtomicU64::new(0),
            done: AtomicBool::new(false),
            check_open: AtomicBool::new(false),
        }
    }

    pub fn group(&self) -> &'g Group<T> {
        self.g
    }

    /// When the operation started (see the field), read from the clock now if not yet.
    fn started(&self) -> Instant {
        *self.start.get_or_init(Instant::now)
    }

    pub fn seq(&self) -> u64 {
        self.seq
    }

    pub fn signature(&self) -> &Signature {
        &self.sig
    }

    pub fn rank(&self) -> usize {
        self.g.me
    }

    pub fn size(&self) -> usize {
        self.g.size()
    }

    /// Ring order of the group's ranks (rack- and host-contiguous unless topology
    /// awareness is off).
    pub fn ring(&self) -> &'g [usize] {
        &self.g.ring
    }

    /// The order of a tree or chain rooted at `root`: `order[v]` is the group rank at
    /// virtual rank `v`, the root at 0 ([`Topology::tree_order`]); rank order rotated
    /// to the root when topology awareness is off.
    pub fn tree_order(&self, root: usize) -> Vec<usize> {
        if self.g.tuning.topology_aware {
            self.g.topology.tree_order(&self.g.ring, root)
        } else {
            let n = self.size();
            (0..n).map(|v| (root + v) % n).collect()
        }
    }

    /// A payload holding `data`, in memory the transport sends cheaply.
    pub fn payload<E: Element>(&self, data: &[E]) -> Bytes {
        self.g.transport.payload_from(bytemuck::cast_slice(data))
    }

    /// Sends `payload` to group rank `to` under `tag`.
    pub fn send(&self, to: usize, tag: u32, payload: Bytes) -> impl Future<Output = Result<()>> + use<'g, T> {
        let g = self.g;
        let (to, fut) = self.start_send(to, tag, payload.len(), move |to, h| g.transport.send(to, h, payload));
        sent(to, fut)
    }

    /// Sends `data` to group rank `to` under `tag`, reading it only within this call
    /// ([`LocalTransport::send_borrowed`]: written straight to the link where it can
    /// be, the rest copied), as [`OpCtx::send`] of a [`payload`](OpCtx::payload) would
    /// otherwise copy it all.
    pub fn send_slice<'a, E: Element>(
        &'a self,
        to: usize,
        tag: u32,
        data: &'a [E],
    ) -> impl Future<Output = Result<()>> + 'a {
        let bytes: &'a [u8] = bytemuck::cast_slice(data);
        let g = self.g;
        let (to, fut) = self.start_send(to, tag, bytes.len(), move |to, h| g.transport.send_borrowed(to, h, bytes));
        sent(to, fut)
    }

    /// A send of `len` bytes to group rank `to` under `tag`, which `start` queues to the
    /// world rank and under the header it is given (at the call; not at all if the
    /// communicator was aborted as a whole). Returns the world rank and the send.
    fn start_send<F>(
        &self,
        to: usize,
        tag: u32,
        len: usize,
        start: impl FnOnce(usize, Header) -> F,
    ) -> (usize, Result<F>) {
        let me = self.g.world_rank(self.g.me);
        let to = self.g.world_rank(to);
        // A communicator aborted as a whole sends nothing more.
        let fut = match self.g.aborted() {
            Some(e) => Err(e),
            None => {
                let h = Header::data(me, self.g.comm, self.seq, tag, &self.sig, len);
                self.moved.fetch_add(len as u64, Ordering::Relaxed);
                events::message(me as u32, to as u32, self.sig.op, true, len as u64, Duration::ZERO);
                Ok(start(to, h))
            }
        };
        (to, fut)
    }

    /// Receives the payload group rank `from` sent under `tag`. The receive is posted
    /// when this method is called. Fails with a mismatch error if the sender's
    /// signature differs from ours.
    pub fn recv(&self, from: usize, tag: u32) -> impl Future<Output = Result<Bytes>> + '_ {
        let frame = self.recv_frame(from, tag);
        async move { Ok(frame.await?.into_local().map_err(|e| e.with_peer(from))?.payload) }
    }

    /// [`OpCtx::recv`] straight into `dst`, which must have the message's length: a
    /// payload a shared-memory peer lent is copied out of its memory into `dst`, once.
    /// Hands `dst` back, filled (so that a receive posted ahead can forward it).
    pub fn recv_into<'a, E: Element>(
        &'a self,
        from: usize,
        tag: u32,
        dst: &'a mut [E],
    ) -> impl Future<Output = Result<&'a mut [E]>> + 'a {
        let mailbox = self.g.transport.mailbox().clone();
        let bytes: &'a mut [u8] = bytemuck::cast_slice_mut(dst);
        let frame = self.recv_frame_via(from, tag, move |key| mailbox.recv_frame_into(key, bytes), |(f, _)| f);
        async move {
            let (f, bytes) = frame.await?;
            crate::elem::cooperate(bytes.len()).await;
            match &f.remote {
                // Lent by a shared-memory peer (copied out of its memory), or landed in
                // `dst` over TCP (what was read elsewhere copied in).
                Some(r) if hcomm_core::RemotePayload::len(&**r) == bytes.len() => {
                    r.read_into(bytes).map_err(|e| e.with_peer(from))?;
                }
                _ => {
                    let f = f.into_local().map_err(|e| e.with_peer(from))?;
                    crate::elem::copy_in::<u8>(bytes, &f.payload).map_err(|e| e.with_peer(from))?;
                }
            }
            bytemuck::try_cast_slice_mut(bytes)
                .map_err(|e| Error::new(ErrorKind::InvalidArgument, format!("receive buffer: {e}")))
        }
    }

    /// The frame group rank `from` sent under `tag` (its payload may still be in the
    /// sender's memory), its signature checked.
    fn recv_frame(&self, from: usize, tag: u32) -> impl Future<Output = Result<hcomm_core::Frame>> + '_ {
        let mailbox = self.g.transport.mailbox().clone();
        self.recv_frame_via(from, tag, move |key| mailbox.recv_frame(key), |f| f)
    }

    /// The receive `start` posts (at the call) for the key of (`from`, `tag`) in this
    /// operation, counted as waited for until it completes, with `frame` of its
    /// result checked against this rank's signature.
    fn recv_frame_via<'a, R: 'a, F: Future<Output = Result<R>> + 'a>(
        &'a self,
        from: usize,
        tag: u32,
        start: impl FnOnce(MatchKey) -> F,
        frame_of: impl Fn(&R) -> &hcomm_core::Frame + 'a,
    ) -> impl Future<Output = Result<R>> + 'a {
        let src = self.g.world_rank(from);
        let key = MatchKey { src, comm: self.g.comm, seq: self.seq, tag };
        let fut = start(key);
        *self.waiting.lock().entry(from).or_insert(0) += 1;
        let posted = events::Stopwatch::start();
        async move {
            // A failed receive leaves its entry: this rank is still waiting for `from`.
            let got = fut.await?;
            let frame = frame_of(&got);
            let len = frame.len() as u64;
            self.moved.fetch_add(len, Ordering::Relaxed);
            let me = self.g.world_rank(self.g.me) as u32;
            events::message(me, src as u32, self.sig.op, false, len, posted.elapsed());
            {
                let mut w = self.waiting.lock();
                if let Some(c) = w.get_mut(&from) {
                    *c -= 1;
                    if *c == 0 {
                        w.remove(&from);
                    }
                }
            }
            same_signature(&self.sig, from, frame.header.signature())?;
            Ok(got)
        }
    }

    /// Posts this rank's argument check record (this operation's number and
    /// signature) to group rank `to` under `tag`, lazily
    /// ([`LocalTransport::post_lazy`]), in a signature record frame that a
    /// transport may merge with the records posted before it
    /// ([`RECORDS_SEQ`]); not at all if the communicator was aborted.
    pub(crate) fn post_check_lazy(&self, to: usize, tag: u32) {
        if self.g.aborted().is_none() {
            self.check_open.store(true, Ordering::Relaxed);
            let record = encode_record(self.seq, &self.sig);
            let h = Header::data(self.g.world_rank(self.g.me), self.g.comm, RECORDS_SEQ, tag, &self.sig, RECORD_LEN);
            self.g.transport.post_lazy(self.g.world_rank(to), h, &record);
        }
    }

    /// Whether this rank posted its argument check record and has neither matched
    /// the previous rank's nor handed the check to the group yet.
    pub(crate) fn check_pending(&self) -> bool {
        self.check_open.load(Ordering::Relaxed)
    }

    /// The argument check of this operation while it waits
    /// ([`ArgCheck::Deferred`](crate::ArgCheck::Deferred)): `Ready` when the previous
    /// rank's record came (a mismatch error if it differs) or can no longer come,
    /// `Pending` with `cx` woken when records arrive.
    pub(crate) fn poll_check(&self, cx: &std::task::Context<'_>) -> Poll<Result<()>> {
        let r = self.g.checks.poll_one(self.g, self.seq, &self.sig, cx);
        if r.is_ready() {
            self.check_open.store(false, Ordering::Relaxed);
        }
        r
    }

    /// The argument check of this operation, whose work is done: done now if the
    /// previous rank's record is here, else handed to the group for when it comes.
    ///
    /// # Errors
    /// A mismatch with the previous rank's record.
    pub(crate) fn defer_check(&self) -> Result<()> {
        self.check_open.store(false, Ordering::Relaxed);
        self.g.checks.defer(self.g, self.seq, self.sig)
    }

    /// An operation that fails or is dropped before its check: the previous rank's
    /// record of it is dropped when it comes.
    fn close_check(&self) {
        if self.check_open.swap(false, Ordering::Relaxed) {
            self.g.checks.forget(self.g, self.seq);
        }
    }

    /// Runs the body of the operation (which borrows this context) under the
    /// operation's deadline; pass the result to [`OpCtx::finish`]. While it waits
    /// past the group's stall threshold (and again at twice, four times … that), it
    /// reports the stall: see [`OpCtx::stall_report`].
    ///
    /// A large body is better passed pinned where it is made (`pin!(body)`): an
    /// `async fn` keeps its arguments twice (as captured and as the locals they move
    /// to), and the operation's future, copied as it is returned and awaited, grows
    /// by as much (the rooted collectives' checked body is three times larger
    /// unpinned, and copying it shows in a small broadcast root's time).
    pub async fn deadline<R>(&self, body: impl Future<Output = Result<R>>) -> Result<R> {
        // A mismatch an earlier operation's deferred argument check found fails this
        // one (see `ArgCheck::Deferred`).
        if let Some(e) = self.g.late_error() {
            return Err(e);
        }
        let mut body = std::pin::pin!(body);
        // The timer is made when the body first waits: an operation done in its first
        // poll (a broadcast's root, a send handed to the socket) needs none, and
        // making one (the clock, the runtime's handle, the timer entry) shows in
        // such a root's time per operation. It is armed for the next stall
        // report (`warning`) or else for the deadline.
        let mut timer = std::pin::pin!(None::<tokio::time::Sleep>);
        let mut warn_after = stall_warn_now(self.stall_warn);
        let mut timeout = self.timeout;
        let mut warning = false;
        std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = body.as_mut().poll(cx) {
                return Poll::Ready(r.map_err(|e| self.with_waiting(e)));
            }
            loop {
                if timer.is_none() {
                    let start = self.started();
                    timeout = timeout_now(timeout);
                    let deadline = start + timeout;
                    let warn_at = warn_after.map(|d| start + d).filter(|&t| t < deadline);
                    warning = warn_at.is_some();
                    timer.set(Some(tokio::time::sleep_until(warn_at.unwrap_or(deadline))));
                }
                let armed = timer.as_mut().as_pin_mut().expect("armed above");
                if armed.poll(cx).is_pending() {
                    return Poll::Pending;
                }
                if !warning {
                    return Poll::Ready(Err(self.timeout_error(timeout)));
                }
                self.report_stall();
                warn_after = warn_after.map(|d| d.saturating_mul(2));
                timer.set(None);
            }
        })
        .await
    }

    /// What this operation waits for, as the stall report and the timeout error say
    /// it: the ranks whose part has not arrived, or the transport.
    pub fn stall_report(&self) -> String {
        let missing: Vec<String> = self.waiting.lock().keys().map(|r| r.to_string()).collect();
        if missing.is_empty() {
            String::from("waiting to hand data to the transport")
        } else {
            format!("ranks [{}] have not sent their part", missing.join(", "))
        }
    }

    /// Logs the stall as a `tracing` warning (target `hcomm::stall`); to standard
    /// error when no `tracing` subscriber is installed, so that it is never lost.
    fn report_stall(&self) {
        let waited = self.started().elapsed().as_secs_f64();
        let what = self.stall_report();
        let rank = self.g.me;
        if tracing::dispatcher::has_been_set() {
            tracing::warn!(target: "hcomm::stall", rank, op = %self.sig.op, seq = self.seq, waited_s = waited, "rank {rank}: {} #{} stalled for {waited:.1} s: {what}", self.sig.op, self.seq);
        } else {
            eprintln!(
                "hcomm: rank {rank}: {} #{} ({}) stalled for {waited:.1} s: {what}",
                self.sig.op, self.seq, self.sig
            );
        }
    }

    /// A failure that came from elsewhere (an abort, a dead peer) says which ranks
    /// this rank was still waiting for, so that a chain of waiting ranks leads to the
    /// one that never came.
    fn with_waiting(&self, e: Error) -> Error {
        let waiting: Vec<String> = self.waiting.lock().keys().map(|r| r.to_string()).collect();
        match e.kind() {
            ErrorKind::Aborted | ErrorKind::Timeout | ErrorKind::PeerFailed if !waiting.is_empty() => {
                e.note(format!("this rank was still waiting for ranks [{}]", waiting.join(", ")))
            }
            _ => e,
        }
    }

    fn timeout_error(&self, timeout: Duration) -> Error {
        Error::new(ErrorKind::Timeout, format!("not finished within {timeout:?}: {}", self.stall_report()))
    }

    /// Ends the operation. An error gets this operation's context and aborts the
    /// operation on every other rank (once).
    pub fn finish<R>(self, r: Result<R>) -> Result<R> {
        self.done.store(true, Ordering::Release);
        if r.is_err() {
            self.close_check();
        }
        self.report_done(r.is_ok());
        r.map_err(|e| {
            let e = e.in_op(self.sig.op, Some(self.seq)).at_rank(self.g.me);
            self.abort_peers(&e);
            e
        })
    }

    /// Emits the operation's event (see `hcomm_core::events`).
    fn report_done(&self, ok: bool) {
        if !events::op_listened() {
            return;
        }
        let s = &self.sig;
        let bytes = match (s.op, s.dtype) {
            (
                OpKind::AllGatherV | OpKind::GatherV | OpKind::ScatterV | OpKind::ReduceScatterV | OpKind::AllToAllV,
                _,
            )
            | (_, None) => self.moved.load(Ordering::Relaxed),
            (_, Some(d)) => s.count * d.size() as u64,
        };
        events::op_done(events::OpDone {
            rank: self.g.world_rank(self.g.me) as u32,
            op: s.op,
            seq: self.seq,
            algo: crate::algo_name(s.op, s.algo),
            bytes,
            elapsed: self.started().elapsed(),
            peer: None,
            ok,
        });
    }

    fn abort_peers(&self, err: &Error) {
        self.g.abort_op(self.seq, self.sig.op, err);
    }
}

impl<T: LocalTransport> Drop for OpCtx<'_, T> {
    fn drop(&mut self) {
        if !self.done.load(Ordering::Acquire) {
            self.close_check();
            let e = Error::new(ErrorKind::Aborted, "the operation was cancelled (its future was dropped)")
                .in_op(self.sig.op, Some(self.seq))
                .at_rank(self.g.me);
            tracing::debug!(seq = self.seq, op = %self.sig.op, "cancelled");
            self.report_done(false);
            self.abort_peers(&e);
        }
    }
}

/// An operation numbered but not started ([`Group::unstarted`]).
#[derive(Debug)]
pub struct Unstarted<'g, T: LocalTransport> {
    g: &'g Group<T>,
    seq: u64,
    sig: Option<Signature>,
}

impl<'g, T: LocalTransport> Unstarted<'g, T> {
    /// The group the operation is in.
    pub fn group(&self) -> &'g Group<T> {
        self.g
    }

    /// Starts the operation with `sig` (`None`: the placeholder given to
    /// [`Group::unstarted`]).
    pub fn start(mut self, sig: Option<Signature>) -> OpCtx<'g, T> {
        let placeholder = self.sig.take().expect("an operation starts once");
        self.g.begin_reserved(self.seq, sig.unwrap_or(placeholder))
    }
}

impl<T: LocalTransport> Drop for Unstarted<'_, T> {
    fn drop(&mut self) {
        if let Some(sig) = self.sig.take() {
            drop(self.g.begin_reserved(self.seq, sig));
        }
    }
}

/// A mismatch error if group rank `from`'s signature `theirs` differs from `ours`.
pub(crate) fn same_signature(ours: &Signature, from: usize, theirs: Signature) -> Result<()> {
    if theirs == *ours {
        Ok(())
    } else {
        Err(Error::new(ErrorKind::Mismatch, format!("rank {from} called {theirs}, this rank called {ours}"))
            .with_peer(from))
    }
}

/// The future of a send [`OpCtx::start_send`] started (or could not start), its
/// errors naming the peer. A combinator rather than an `async` block, which kept the
/// `Result` it awaits beside the send's own future and took twice its size (520 bytes
/// over TCP); collectives gather their sends in a vector and join them, and each
/// byte is moved two or three times per send.
fn sent<F: Future<Output = Result<()>>>(to: usize, fut: Result<F>) -> impl Future<Output = Result<()>> {
    use futures::future::{Either, TryFutureExt};
    match fut {
        Ok(f) => Either::Left(f.map_err(move |e| e.with_peer(to))),
        Err(e) => Either::Right(std::future::ready(Err(e))),
    }
}

/// A duration set and read through a shared reference (`None` stored as `u64::MAX`
/// nanoseconds; durations up to [`hcomm_core::NEVER`] fit).
#[derive(Debug)]
struct SharedDuration(AtomicU64);

impl SharedDuration {
    fn new(d: Option<Duration>) -> SharedDuration {
        let s = SharedDuration(AtomicU64::new(u64::MAX));
        s.set(d);
        s
    }

    fn get(&self) -> Option<Duration> {
        match self.0.load(Ordering::Relaxed) {
            u64::MAX => None,
            n => Some(Duration::from_nanos(n)),
        }
    }

    fn set(&self, d: Option<Duration>) {
        let n = d.map_or(u64::MAX, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX - 1).min(u64::MAX - 1));
        self.0.store(n, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::ChoiceMemo;

    #[test]
    fn the_choice_memo_keeps_sizes_and_floatness_apart() {
        let m = ChoiceMemo::default();
        assert_eq!(m.get(8, true), None);
        m.put(8, true, 2);
        assert_eq!(m.get(8, true), Some(2));
        assert_eq!(m.get(8, false), None);
        m.put(8, false, 3);
        assert_eq!((m.get(8, true), m.get(8, false)), (Some(2), Some(3)));
        // Sizes that share a slot replace each other; neither is ever taken for the other.
        let (slot, _) = ChoiceMemo::key(8, true).unwrap();
        let other = (9..100_000).find(|&b| ChoiceMemo::key(b, true).unwrap().0 == slot).unwrap();
        m.put(other, true, 4);
        assert_eq!((m.get(8, true), m.get(other, true)), (None, Some(4)));
        // Zero bytes is a size like the others; sizes past 2^56 are not kept.
        m.put(0, true, 1);
        assert_eq!(m.get(0, true), Some(1));
        m.put(1 << 57, true, 1);
        assert_eq!(m.get(1 << 57, true), None);
        m.clear();
        assert_eq!((m.get(0, true), m.get(other, true), m.get(8, false)), (None, None, None));
    }
}
