//! The adaptive algorithm selection: where the measured table
//! ([`Measured`]) has alternatives close to its choice, the ranks keep timing them
//! while the job runs and switch together when one gets ahead. It serves every
//! family the table chooses by size ([`AlgoFamily`]): the allreduce, the broadcast,
//! the allgather, the reduce-scatter and the alltoall.
//!
//! Why: on ranks that share processors, the algorithms' times drift over a job, so
//! a table fixed at tuning time goes stale (the measurements behind this module's
//! constants are in `docs/tuning-rules.md`; they come from 4 ranks sharing 2
//! processors only).
//!
//! How, for the calls of one family and one *class* (the measured size nearest to
//! theirs), counted in call order on every rank alike:
//! - The calls go in windows of [`WINDOW`]. In each, the last two may run one of the
//!   candidates that is not the window's incumbent, the others run the incumbent
//!   (which, and how often: [`NEAR`], [`FAR_EVERY`]). Only the times of a window's
//!   last call and third last are kept (per rank, the last [`samples_kept`] per algorithm,
//!   scaled to the class's size), and only if the call before ran the same
//!   algorithm, so the incumbent and the alternatives are timed alike.
//! - The windows go in epochs of 1 to [`MAX_EPOCH`] ([`epoch_windows`]). At the
//!   first call of each epoch from the second on, every rank sends its medians to
//!   every other rank (one number per candidate, posted lazily at the call: nothing
//!   waits for them), an *agreement*.
//!   Its result, the slowest rank's median per algorithm, is the same on every rank.
//! - The incumbent of epoch `e` (from 2 on) is that of `e - 1`, unless the
//!   agreement made at epoch `e - 1`'s start has another candidate [`SWITCH`] times
//!   faster (then the fastest; [`LEAVE`] times to leave the table's choice) and the
//!   agreement before it named the same one: one agreement's lead only *proposes*
//!   a switch. Epochs 0 and 1 take the table's choice. The same agreement tells
//!   which alternatives epoch `e`'s windows time.
//!
//! So every rank runs the same algorithm at the same call without any rank waiting
//! for a decision: a call of epoch `e` needs the agreement made a whole epoch
//! before, whose messages left with the ranks' next writes after that call. Cancel safety: the
//! agreements' messages are posted, and their receives held, by the communicator,
//! not by a call's future, so dropping a call loses nothing another call needs.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures::FutureExt;
use futures::future::Shared;
use hcomm_core::keys::ADAPT_SEQ;
use hcomm_core::{DType, Error, ErrorKind, Header, LocalTransport, MatchKey, OpKind, ReduceOp, Result, Signature};
use parking_lot::Mutex;

use crate::{AllgatherAlgo, AllreduceAlgo, AlltoallAlgo, BcastAlgo, Group, Measured, ReduceScatterAlgo, Tuning};

/// A family's part of the measured table: its choice by size, and its alternatives
/// at the sizes where any came close.
pub type Tables<'m, A> = (&'m [(usize, A)], &'m [(usize, Vec<A>)]);

/// An algorithm family the adaptive selection chooses in: where the measured table
/// keeps its choices and alternatives, and which calls adapt.
pub trait AlgoFamily: Copy + Eq + std::hash::Hash + std::fmt::Debug + Into<u8> + Send + Sync + 'static {
    /// The collective's name, in logs and errors.
    const FAMILY: &'static str;
    /// The smallest call (bytes as the family's table counts them: the whole
    /// buffer for the allreduce, one rank's block for the others) the selection
    /// adapts.
    const ADAPT_MIN_BYTES: usize;
    /// Whether the collective reduces: then reproducible float calls do not adapt
    /// (their order of reduction stays the same from call to call).
    const REDUCES: bool;

    /// The algorithm's name.
    fn algo_name(self) -> &'static str;

    /// The bytes a call of `bytes` (as the table counts them) moves on `n` ranks:
    /// the buffer, or every rank's block.
    fn moved(bytes: usize, n: usize) -> usize {
        if Self::BLOCKS { bytes.saturating_mul(n) } else { bytes }
    }

    /// Whether the table's sizes are one rank's block.
    const BLOCKS: bool;

    /// The measured table's choices of this family, and the alternatives.
    fn tables(m: &Measured) -> Tables<'_, Self>;

    /// The algorithm the tuning forces for every call (`HCOMM_ALGO_...`), if any.
    fn forced(t: &Tuning) -> Option<Self>;

    /// The algorithm a call of `bytes` runs where the selection does not adapt: the
    /// one asked for, else the group's choice.
    fn chosen<T: LocalTransport>(g: &Group<T>, bytes: usize, float: bool, asked: Option<Self>) -> Self;
}

impl AlgoFamily for AllreduceAlgo {
    const FAMILY: &'static str = "allreduce";
    const ADAPT_MIN_BYTES: usize = ADAPT_MIN_BYTES;
    const REDUCES: bool = true;
    const BLOCKS: bool = false;

    fn algo_name(self) -> &'static str {
        self.name()
    }

    fn tables(m: &Measured) -> Tables<'_, Self> {
        (&m.allreduce, &m.allreduce_alternatives)
    }

    fn forced(t: &Tuning) -> Option<Self> {
        t.allreduce
    }

    fn chosen<T: LocalTransport>(g: &Group<T>, bytes: usize, float: bool, asked: Option<Self>) -> Self {
        g.allreduce_algo(bytes, float, asked)
    }
}

/// [`AlgoFamily`] for a family chosen by size alone (all but the allreduce): its
/// floor, whether it reduces and counts blocks, its fields of [`Measured`] and
/// [`Tuning`], and [`Group`]'s choice.
macro_rules! family {
    ($algo:ty, $name:literal, $floor:expr, reduces: $reduces:literal, blocks: $blocks:literal,
     $table:ident, $alternatives:ident, $forced:ident, $chosen:ident) => {
        impl AlgoFamily for $algo {
            const FAMILY: &'static str = $name;
            const ADAPT_MIN_BYTES: usize = $floor;
            const REDUCES: bool = $reduces;
            const BLOCKS: bool = $blocks;

            fn algo_name(self) -> &'static str {
                self.name()
            }

            fn tables(m: &Measured) -> Tables<'_, Self> {
                (&m.$table, &m.$alternatives)
            }

            fn forced(t: &Tuning) -> Option<Self> {
                t.$forced
            }

            fn chosen<T: LocalTransport>(g: &Group<T>, bytes: usize, _float: bool, asked: Option<Self>) -> Self {
                asked.unwrap_or_else(|| g.$chosen(bytes))
            }
        }
    };
}

family!(AllgatherAlgo, "allgather", ADAPT_MIN_BLOCK, reduces: false, blocks: true,
    allgather, allgather_alternatives, allgather, allgather_algo);
family!(ReduceScatterAlgo, "reduce_scatter", ADAPT_MIN_BLOCK, reduces: true, blocks: true,
    reduce_scatter, reduce_scatter_alternatives, reduce_scatter, reduce_scatter_algo);
family!(BcastAlgo, "broadcast", ADAPT_MIN_BYTES, reduces: false, blocks: false,
    broadcast, broadcast_alternatives, broadcast, bcast_algo);
family!(AlltoallAlgo, "alltoall", ADAPT_MIN_BLOCK, reduces: false, blocks: true,
    alltoall, alltoall_alternatives, alltoall, alltoall_algo);

/// Calls of a class per window: the last two may time an alternative.
pub const WINDOW: u64 = 16;

/// The most windows per epoch. The first call of an epoch posts this rank's timings
/// (8 bytes per candidate) to every other rank, for the epoch after it. Posted
/// lazily, they leave with the next data to that peer or after the transport's
/// delay, a millisecond or two for a peer the algorithm in use does not send to.
/// An epoch must outlast that delay, or its calls wait for the agreement; sent at
/// once instead, each costs a system call and a wake-up at the peer.
pub const MAX_EPOCH: u64 = 8;

/// Bytes a rank's calls of a class move in an epoch, at least (but for
/// [`MAX_EPOCH`]): a proxy for its length, known alike on every rank. At memory
/// speeds 8 MiB last a few milliseconds, longer than the timings' delay. Large calls
/// get epochs of one window, and decide as soon as a window is timed, since a job
/// makes few of them.
pub const EPOCH_BYTES: usize = 8 << 20;

/// Windows per epoch for a class whose calls move `moved` bytes each (the whole
/// buffer for the allreduce, every rank's block for the others).
pub fn epoch_windows(moved: usize) -> u64 {
    ((EPOCH_BYTES / moved.max(1)) as u64 / WINDOW).clamp(1, MAX_EPOCH)
}

/// The smallest allreduce or broadcast (bytes) the selection adapts.
pub const ADAPT_MIN_BYTES: usize = 64 << 10;

/// The smallest block (bytes per rank) of an allgather, a reduce-scatter or an
/// alltoall the selection adapts. Below it the algorithms are within the calls'
/// noise, and adapting only adds switches.
pub const ADAPT_MIN_BLOCK: usize = 4 << 10;

/// The most timings kept per rank and algorithm in a class (those of classes of
/// [`MAX_EPOCH`]-window epochs: see [`samples_kept`]): the median of the kept ones
/// is what the rank sends. An alternative gets one per window it is timed in, the
/// incumbent one or two. Small calls on crowded ranks scatter about as widely as
/// their median, so a median of few timings moves from epoch to epoch and the
/// selection would switch on that noise.
pub const SAMPLES: usize = 21;

/// The fewest timings kept per rank and algorithm (classes of one-window epochs).
pub const FEW_SAMPLES: usize = 7;

/// Timings kept per rank and algorithm in a class of `epoch`-window epochs: three
/// per window of an epoch, from [`FEW_SAMPLES`] to [`SAMPLES`]. Long epochs are
/// those of small calls, whose times scatter most, and where more timings were
/// measured to help. A longer memory costs where an algorithm's time changes:
/// a far alternative gets one timing per [`FAR_EVERY`] windows, and its median moves
/// only once half of its kept timings are new.
pub fn samples_kept(epoch: u64) -> usize {
    usize::try_from(3 * epoch).unwrap_or(SAMPLES).clamp(FEW_SAMPLES, SAMPLES)
}

/// Timings an algorithm needs before its median is sent: with fewer, the others
/// read it as not timed (and time it again if it is near), so that one lucky timing
/// cannot switch the selection.
pub const MIN_SAMPLES: usize = 3;

/// The most algorithms a class weighs: every allreduce the selection chooses from
/// (the other families have fewer).
pub const MAX_CANDIDATES: usize = 5;

/// An alternative whose agreed time is within this factor of the incumbent's (or
/// not known yet) is *near*, and timed in turn with the other near ones, in every
/// window; a farther one only every [`FAR_EVERY`] windows, since timing a clearly
/// slower alternative in every window costs more than the selection can win.
pub const NEAR: f64 = 1.15;

/// How often (in windows) a far alternative is timed: two calls in 512. The first
/// call of an algorithm after a streak of another is slow (links it alone uses have
/// been idle), so each such timing costs several of the incumbent's calls.
pub const FAR_EVERY: u64 = 32;

/// What a window runs: the incumbent, and the alternative its last two calls run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Plan {
    incumbent: u8,
    /// `NONE` for none.
    explore: u8,
}

impl Plan {
    const NONE: u8 = u8::MAX;

    /// Window `w`'s plan, from its incumbent and the times agreed before it (`None`
    /// in epochs 0 and 1, which time the others in turn by slot). An alternative
    /// not timed yet is near.
    fn new(w: u64, incumbent: usize, times: Option<&[u64]>, k: usize) -> Plan {
        let others = (0..k).filter(|&j| j != incumbent);
        let explore = match times {
            None => others.clone().nth((w % (k as u64 - 1)) as usize),
            Some(t) => {
                let near = |j: usize| t[j] == 0 || t[j] as f64 <= t[incumbent] as f64 * NEAR;
                let far = |j: usize| t[j] > 0 && t[j] as f64 > t[incumbent] as f64 * NEAR;
                let near: Vec<usize> = others.clone().filter(|&j| near(j)).collect();
                let far: Vec<usize> = others.filter(|&j| far(j)).collect();
                if !far.is_empty() && w.is_multiple_of(FAR_EVERY) {
                    Some(far[((w / FAR_EVERY) % far.len() as u64) as usize])
                } else if near.is_empty() {
                    None
                } else {
                    Some(near[(w % near.len() as u64) as usize])
                }
            }
        };
        Plan { incumbent: incumbent as u8, explore: explore.map_or(Plan::NONE, |j| j as u8) }
    }
}

/// How much faster the other algorithm must be, as agreed, for the ranks to switch:
/// a margin against switching back and forth on noise.
pub const SWITCH: f64 = 1.06;

/// How much faster another algorithm must be, as agreed, for the ranks to leave the
/// table's choice (the tuner's head-to-head duels chose it, which counts for it).
/// Medians of noisy timings that happen to favour an alternative are what a switch
/// is made of, so the table's choice is left only on a lead larger than that noise;
/// by less, staying is within that margin of the best.
pub const LEAVE: f64 = 1.10;

/// Medians as agreed, per candidate (nanoseconds; 0 for no timing).
type Times = [u64; MAX_CANDIDATES];

type Agreement = Shared<Pin<Box<dyn Future<Output = Result<Times>> + Send>>>;

/// A class of the selection: a measured size and its candidates, the table's
/// choice first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Contest<A> {
    bytes: usize,
    algos: [A; MAX_CANDIDATES],
    len: u8,
}

/// A class's key among every family's: the family, the size and the candidates'
/// wire codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    family: &'static str,
    bytes: usize,
    codes: [u8; MAX_CANDIDATES],
}

impl<A: AlgoFamily> Contest<A> {
    /// The class of measured size `bytes` with `choice` and the `others` after it
    /// (those beyond [`MAX_CANDIDATES`], and repeats, are left out). `None` without
    /// another.
    pub fn new(bytes: usize, choice: A, others: &[A]) -> Option<Contest<A>> {
        let mut c = Contest { bytes, algos: [choice; MAX_CANDIDATES], len: 1 };
        for &a in others {
            if usize::from(c.len) < MAX_CANDIDATES && !c.candidates().contains(&a) {
                c.algos[usize::from(c.len)] = a;
                c.len += 1;
            }
        }
        (c.len > 1).then_some(c)
    }

    /// The candidates, the table's choice first.
    pub fn candidates(&self) -> &[A] {
        &self.algos[..usize::from(self.len)]
    }

    /// The class's key (the codes past the candidates repeat the first).
    fn key(&self) -> Key {
        Key { family: A::FAMILY, bytes: self.bytes, codes: self.algos.map(Into::into) }
    }

    /// The measured size.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// What a call of the adaptive selection takes from its call to its run: its class
/// and its number in it.
#[derive(Debug, Clone, Copy)]
pub struct AdaptTicket<A> {
    class: Contest<A>,
    call: u64,
    bytes: usize,
}

impl<A: Copy> AdaptTicket<A> {
    /// The table's choice for this call's class (a placeholder for the signature of
    /// a call that fails before it runs).
    pub fn first(&self) -> A {
        self.class.algos[0]
    }
}

/// The algorithm a call runs, and whether its time is kept.
#[derive(Debug, Clone, Copy)]
pub struct AdaptChoice<A> {
    pub algo: A,
    slot: usize,
    keep: bool,
}

/// The adaptive selection's state of one group.
#[derive(Default)]
pub(crate) struct Adapt {
    state: Mutex<State>,
}

impl std::fmt::Debug for Adapt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Adapt").field("classes", &self.state.lock().classes.len()).finish()
    }
}

#[derive(Default)]
struct State {
    /// By class (a later table with other candidates at a size starts a class of
    /// its own; every rank changes tables at the same call, so the classes stay
    /// alike).
    classes: HashMap<Key, Class>,
    /// The number of the next agreement (its messages' tag), over all classes.
    next_tag: u32,
}

struct Class {
    calls: u64,
    /// Kept timings (nanoseconds, scaled to the class's size) per slot: the
    /// candidates' order.
    samples: Vec<VecDeque<u64>>,
    /// The plan of each window decided so far (two bytes per window: 16 calls).
    decided: Vec<Plan>,
    /// The agreements not yet used, oldest first (one per epoch from the second).
    agreements: VecDeque<Agreement>,
    /// The times the epoch of the last window decided was decided by.
    agreed: Times,
    /// Windows per epoch ([`epoch_windows`]).
    epoch: u64,
    /// The slot the last agreement would have switched to, if it was not the
    /// incumbent: the next agreement must name it too ([`Class::decide`]).
    proposed: Option<usize>,
}

impl Class {
    fn new(k: usize, epoch: u64) -> Class {
        Class {
            calls: 0,
            samples: vec![VecDeque::new(); k],
            decided: Vec::new(),
            agreements: VecDeque::new(),
            agreed: [0; MAX_CANDIDATES],
            epoch,
            proposed: None,
        }
    }

    /// The number of candidates.
    fn k(&self) -> usize {
        self.samples.len()
    }

    /// This rank's median per slot (0 where fewer than [`MIN_SAMPLES`] are kept).
    fn medians(&self) -> Times {
        let mut out = [0; MAX_CANDIDATES];
        for (m, s) in out.iter_mut().zip(&self.samples) {
            let mut v: Vec<u64> = s.iter().copied().collect();
            v.sort_unstable();
            *m = if v.len() < MIN_SAMPLES { 0 } else { v[v.len() / 2] };
        }
        out
    }

    /// Decides windows up to `w`, in order: `Ok` when done, else the agreement to
    /// wait for (or the error it ended with).
    fn decide<A: AlgoFamily>(&mut self, w: u64, class: &Contest<A>) -> std::result::Result<(), Step> {
        while self.decided.len() as u64 <= w {
            let v = self.decided.len() as u64;
            let k = self.k();
            let Some(prev) = self.decided.last().map(|p| usize::from(p.incumbent)).filter(|_| v >= 2 * self.epoch)
            else {
                self.decided.push(Plan::new(v, 0, None, k));
                continue;
            };
            if !v.is_multiple_of(self.epoch) {
                self.decided.push(Plan::new(v, prev, Some(&self.agreed[..k]), k));
                continue;
            }
            // The agreement made at the epoch before's start: ticketed before any
            // call of this epoch.
            let a = self.agreements.front().expect("an epoch's agreement is made before the next epoch");
            match a.peek() {
                None => return Err(Step::Wait(a.clone())),
                Some(Err(e)) => return Err(Step::Failed(e.clone())),
                Some(Ok(times)) => {
                    // A switch takes two agreements in a row that name it: the first
                    // only proposes it.
                    let want = incumbent(prev, &times[..k]);
                    let next = if want != prev && self.proposed == Some(want) { want } else { prev };
                    self.proposed = (want != next).then_some(want);
                    if next != prev {
                        tracing::debug!(
                            target: "hcomm::adapt",
                            family = A::FAMILY,
                            bytes = class.bytes,
                            window = v,
                            from = class.algos[prev].algo_name(),
                            to = class.algos[next].algo_name(),
                            algos = ?class.candidates(),
                            times_us = ?times[..k].iter().map(|&t| t as f64 / 1e3).collect::<Vec<_>>(),
                            "algorithm selection switched"
                        );
                    }
                    self.agreed = *times;
                    self.decided.push(Plan::new(v, next, Some(&times[..k]), k));
                    self.agreements.pop_front();
                }
            }
        }
        Ok(())
    }

    /// Whether the time of call `call` (its window decided) is kept: the window's
    /// last call and its third last, each if the call before ran the same
    /// algorithm. So the alternative's time is that of its second call in a row,
    /// and the incumbent's of calls placed alike. Keeping every call of the
    /// incumbent's biased the comparison wherever other work ran between a class's
    /// calls: a first call after other work is slowed by it, and the alternative
    /// would look faster than the incumbent for that reason alone.
    fn kept(&self, call: u64) -> bool {
        let offset = call % WINDOW;
        (offset == WINDOW - 1 || offset == WINDOW - 3) && self.slot(call - 1) == self.slot(call)
    }

    /// The slot call `call` runs, once its window is decided.
    fn slot(&self, call: u64) -> usize {
        let p = self.decided[(call / WINDOW) as usize];
        if call % WINDOW < WINDOW - 2 || p.explore == Plan::NONE {
            usize::from(p.incumbent)
        } else {
            usize::from(p.explore)
        }
    }
}

enum Step {
    Wait(Agreement),
    Failed(Error),
}

/// The incumbent after `prev`, given the agreed times per slot (0: none): the
/// fastest, if [`SWITCH`] times faster than `prev` ([`LEAVE`] times where `prev` is
/// slot 0, the table's choice). `Class::decide` switches to it only when two
/// agreements in a row name it, since agreed medians move between epochs (most of
/// all the first, made of epoch 0's timings alone) and a switch on one agreement is
/// often undone by the next.
pub fn incumbent(prev: usize, times: &[u64]) -> usize {
    let best = (0..times.len()).filter(|&j| times[j] > 0).min_by_key(|&j| times[j]);
    let margin = if prev == 0 { LEAVE } else { SWITCH };
    match best {
        Some(b) if times[prev] > 0 && (times[b] as f64) * margin < times[prev] as f64 => b,
        _ => prev,
    }
}

impl Adapt {
    /// Numbers a call of `class` (see [`crate::Measured::contest`]) of `bytes`, at
    /// its call; at the first call of an epoch from the second on, posts this rank's
    /// timings to every other rank and registers the receives of theirs.
    pub(crate) fn ticket<T: LocalTransport, A: AlgoFamily>(
        &self,
        g: &Group<T>,
        class: Contest<A>,
        bytes: usize,
    ) -> AdaptTicket<A> {
        let mut guard = self.state.lock();
        let s = &mut *guard;
        let c = s
            .classes
            .entry(class.key())
            .or_insert_with(|| Class::new(class.candidates().len(), epoch_windows(A::moved(class.bytes, g.size()))));
        let call = c.calls;
        c.calls += 1;
        if call > 0 && call.is_multiple_of(WINDOW * c.epoch) {
            c.agreements.push_back(agreement(g, A::FAMILY, s.next_tag, c.medians(), c.k()));
            s.next_tag = s.next_tag.wrapping_add(1);
        }
        AdaptTicket { class, call, bytes }
    }

    /// The algorithm call `t` runs: waits, if need be, for the agreement that
    /// decides its window.
    ///
    /// # Errors
    /// The agreement's: a peer's failure, the communicator's abort, a timeout naming
    /// the rank whose timings did not come, a protocol error for a malformed message.
    pub(crate) async fn choose<A: AlgoFamily>(&self, t: &AdaptTicket<A>) -> Result<AdaptChoice<A>> {
        loop {
            let wait = {
                let mut s = self.state.lock();
                let c = s.classes.get_mut(&t.class.key()).expect("a ticket's class stays");
                match c.decide(t.call / WINDOW, &t.class) {
                    Ok(()) => {
                        let slot = c.slot(t.call);
                        let keep = c.kept(t.call);
                        return Ok(AdaptChoice { algo: t.class.algos[slot], slot, keep });
                    }
                    Err(Step::Failed(e)) => return Err(e),
                    Err(Step::Wait(a)) => a,
                }
            };
            // The outcome is read back through `peek` in `decide`.
            let _ = wait.await;
        }
    }

    /// Keeps the time of call `t` (which ran `choice` and succeeded), if it is one
    /// to keep.
    pub(crate) fn record<A: AlgoFamily>(&self, t: &AdaptTicket<A>, choice: &AdaptChoice<A>, took: Duration) {
        if !choice.keep || t.bytes == 0 {
            return;
        }
        let scaled = (took.as_nanos() * t.class.bytes as u128 / t.bytes as u128).min(u64::MAX as u128) as u64;
        tracing::trace!(
            target: "hcomm::adapt",
            family = A::FAMILY,
            bytes = t.class.bytes,
            call = t.call,
            algo = choice.algo.algo_name(),
            us = scaled as f64 / 1e3,
            "timing kept"
        );
        let mut s = self.state.lock();
        if let Some(c) = s.classes.get_mut(&t.class.key()) {
            let q = &mut c.samples[choice.slot];
            if q.len() >= samples_kept(c.epoch) {
                q.pop_front();
            }
            q.push_back(scaled.max(1));
        }
    }

    /// The incumbent algorithm of `class` now (the table's choice before any
    /// decision).
    pub(crate) fn current<A: AlgoFamily>(&self, class: &Contest<A>) -> A {
        let s = self.state.lock();
        let slot = s.classes.get(&class.key()).and_then(|c| c.decided.last()).map_or(0, |p| p.incumbent);
        class.algos[usize::from(slot)]
    }
}

/// Posts the first `k` of `mine` (timings of a class of `family`) to every other
/// rank of `g` under `tag` (`k` little-endian `u64`) and returns the agreement: the
/// element-wise maximum of every rank's, once all came, within the group's timeout
/// from now.
fn agreement<T: LocalTransport>(g: &Group<T>, family: &'static str, tag: u32, mine: Times, k: usize) -> Agreement {
    let len = 8 * k;
    let sig = Signature {
        op: OpKind::AllReduce,
        dtype: Some(DType::U64),
        reduce: Some(ReduceOp::Max),
        count: k as u64,
        root: None,
        algo: 0,
    };
    let msg: Vec<u8> = mine[..k].iter().flat_map(|t| t.to_le_bytes()).collect();
    let me = g.world_rank(g.rank());
    let mailbox = g.transport().mailbox().clone();
    let mut recvs = Vec::with_capacity(g.size().saturating_sub(1));
    let h = Header::data(me, g.comm_id(), ADAPT_SEQ, tag, &sig, len);
    for r in (0..g.size()).filter(|&r| r != g.rank()) {
        let peer = g.world_rank(r);
        // Lazily: the frame goes out with the next write to `peer` (or within a
        // millisecond). Posted at once, it waits in the writer task's queue, and
        // the data writes behind it then go through that task too instead of
        // straight to the socket.
        g.transport().post_lazy(peer, h, &msg);
        let key = MatchKey { src: peer, comm: g.comm_id(), seq: ADAPT_SEQ, tag };
        recvs.push((r, peer, mailbox.recv(key)));
    }
    let timeout = hcomm_core::saturate(g.timeout());
    let deadline = tokio::time::Instant::now() + timeout;
    let fut = async move {
        let mut agreed = mine;
        for (r, peer, recv) in recvs {
            let frame = match tokio::time::timeout_at(deadline, recv).await {
                Ok(f) => f?,
                Err(_) => {
                    return Err(Error::new(
                        ErrorKind::Timeout,
                        format!("rank {r} did not send its {family} timings (agreement {tag}) within {timeout:?}"),
                    )
                    .with_peer(peer));
                }
            };
            let p = &frame.payload;
            if p.len() != len {
                return Err(Error::new(
                    ErrorKind::Protocol,
                    format!("rank {r}'s {family} timings (agreement {tag}) are {} bytes, not {len}", p.len()),
                )
                .with_peer(peer));
            }
            for (t, v) in agreed.iter_mut().zip(p.chunks_exact(8)) {
                *t = (*t).max(u64::from_le_bytes(v.try_into().expect("8 bytes")));
            }
        }
        Ok(agreed)
    };
    let boxed: Pin<Box<dyn Future<Output = Result<Times>> + Send>> = Box::pin(fut);
    boxed.shared()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use hcomm_topology::{Placement, Topology};
    use hcomm_transport::MemTransport;

    use super::*;
    use crate::AlgoPlan;

    /// An allreduce class of [`MAX_EPOCH`]-window epochs.
    const CLASS: usize = 64 << 10;
    const EPOCH: u64 = MAX_EPOCH;
    const FIRST: AllreduceAlgo = AllreduceAlgo::Tree;
    const SECOND: AllreduceAlgo = AllreduceAlgo::Ring;

    /// `n` groups over the in-process transport whose table has `FIRST` and
    /// `others` contending at `CLASS` bytes.
    fn groups_with(n: usize, timeout: Duration, others: &[AllreduceAlgo]) -> Vec<Group<MemTransport>> {
        let topo = Topology::from_placements(&vec![Placement::on_host("h"); n]);
        MemTransport::group(n)
            .into_iter()
            .map(|t| {
                let mut g = Group::world(Arc::new(t), 0, topo.clone(), timeout).unwrap();
                let mut tuning = g.tuning().clone();
                tuning.measured = Measured {
                    ranks: n,
                    allreduce: vec![(8, AllreduceAlgo::RecursiveDoubling), (CLASS, FIRST)],
                    allreduce_alternatives: vec![(CLASS, others.to_vec())],
                    ..Measured::default()
                };
                g.set_tuning(tuning);
                g
            })
            .collect()
    }

    /// `n` groups where `FIRST` and `SECOND` contend.
    fn groups(n: usize, timeout: Duration) -> Vec<Group<MemTransport>> {
        groups_with(n, timeout, &[SECOND])
    }

    fn ticket(g: &Group<MemTransport>, bytes: usize) -> AdaptTicket<AllreduceAlgo> {
        match g.plan(bytes, true, None) {
            AlgoPlan::Adaptive(t) => t,
            AlgoPlan::Now(a) => panic!("{bytes} bytes: not adaptive, {a}"),
        }
    }

    /// Makes call after call on every rank, each rank "taking" `took(rank, algo)`;
    /// returns the algorithm of each call (the same on every rank, checked).
    async fn drive(
        gs: &[Group<MemTransport>],
        calls: u64,
        took: impl Fn(usize, AllreduceAlgo) -> Duration,
    ) -> Vec<AllreduceAlgo> {
        let mut ran = Vec::new();
        for _ in 0..calls {
            let ts: Vec<AdaptTicket<AllreduceAlgo>> = gs.iter().map(|g| ticket(g, CLASS)).collect();
            let cs = futures::future::join_all(gs.iter().zip(&ts).map(|(g, t)| g.adapt_choose(t))).await;
            let cs: Vec<AdaptChoice<AllreduceAlgo>> = cs.into_iter().map(Result::unwrap).collect();
            assert!(cs.iter().all(|c| c.algo == cs[0].algo), "ranks chose apart: {cs:?}");
            for (r, ((g, t), c)) in gs.iter().zip(&ts).zip(&cs).enumerate() {
                g.adapt_record(t, c, took(r, c.algo));
            }
            ran.push(cs[0].algo);
        }
        ran
    }

    fn ms(x: u64) -> Duration {
        Duration::from_millis(x)
    }

    #[test]
    fn the_incumbent_changes_only_for_a_clear_lead_of_known_times() {
        assert_eq!(incumbent(0, &[100, 90]), 1);
        assert_eq!(incumbent(0, &[100, 98]), 0, "within the margin");
        assert_eq!(incumbent(1, &[90, 100]), 0);
        assert_eq!(incumbent(1, &[99, 100]), 1);
        assert_eq!(incumbent(0, &[100, 0]), 0, "no time of the other");
        assert_eq!(incumbent(0, &[0, 50]), 0, "no time of the incumbent");
        // Of three, the fastest, if clearly ahead of the incumbent.
        assert_eq!(incumbent(0, &[100, 95, 80]), 2);
        assert_eq!(incumbent(2, &[100, 95, 80]), 2);
        assert_eq!(incumbent(1, &[100, 95, 0]), 1);
        assert_eq!(incumbent(1, &[93, 95, 0]), 1, "within the margin");
        // Leaving the table's choice (slot 0) takes a wider lead than coming back.
        assert_eq!(incumbent(0, &[100, 92]), 0, "within the margin to leave the table");
        assert_eq!(incumbent(0, &[100, 90, 95]), 1);
        assert_eq!(incumbent(1, &[93, 100]), 0);
        assert_eq!(incumbent(2, &[100, 105, 108]), 0);
    }

    /// One agreement's lead only proposes a switch; the next must name the same
    /// algorithm for it to happen.
    #[test]
    fn a_switch_takes_two_agreements_in_a_row() {
        let class = Contest::new(CLASS, FIRST, &[SECOND, AllreduceAlgo::Rabenseifner]).unwrap();
        let mut c = Class::new(3, 1);
        for t in [
            [100, 80, 0],  // window 2: proposes slot 1
            [100, 100, 0], // window 3: no lead; the proposal lapses
            [100, 80, 0],  // window 4: proposes slot 1 again
            [100, 95, 80], // window 5: proposes slot 2 instead
            [100, 80, 0],  // window 6: slot 1 again, proposed anew
            [100, 80, 0],  // window 7: confirmed: slot 1
            [80, 100, 0],  // window 8: back to slot 0 proposed
            [100, 100, 0], // window 9: lapses
        ] {
            let mut times = [0; MAX_CANDIDATES];
            times[..3].copy_from_slice(&t);
            let a: Pin<Box<dyn Future<Output = Result<Times>> + Send>> = Box::pin(std::future::ready(Ok(times)));
            let a = a.shared();
            futures::executor::block_on(a.clone()).unwrap();
            c.agreements.push_back(a);
        }
        assert!(c.decide(9, &class).is_ok());
        let incumbents: Vec<u8> = c.decided.iter().map(|p| p.incumbent).collect();
        assert_eq!(incumbents, [0, 0, 0, 0, 0, 0, 0, 1, 1, 1]);
        assert_eq!(c.proposed, None);
    }

    #[test]
    fn two_calls_per_window_time_the_alternative_and_calls_placed_alike_are_kept() {
        let mut c = Class::new(2, 1);
        // Windows 0 and 1 as at the start; window 2 switched to slot 1, with slot 0
        // near; window 3 times nothing.
        let w2 = Plan::new(2, 1, Some(&[110, 100]), 2);
        let w3 = Plan { incumbent: 1, explore: Plan::NONE };
        c.decided = vec![Plan::new(0, 0, None, 2), Plan::new(1, 0, None, 2), w2, w3];
        let slots: Vec<usize> = (0..3 * WINDOW).map(|k| c.slot(k)).collect();
        for w in 0..3 {
            let inc = usize::from(c.decided[w as usize].incumbent);
            for o in 0..WINDOW {
                let want = if o >= WINDOW - 2 { 1 - inc } else { inc };
                assert_eq!(slots[(w * WINDOW + o) as usize], want, "window {w} offset {o}");
            }
        }
        assert!((3 * WINDOW..4 * WINDOW).all(|k| c.slot(k) == 1));
        // Kept: the third last call of each window (the incumbent's) and the last
        // (the alternative's, or the incumbent's where none is timed).
        let w = WINDOW;
        let kept: Vec<(u64, usize)> = (1..4 * w).filter(|&k| c.kept(k)).map(|k| (k, c.slot(k))).collect();
        let want = [(w - 3, 0), (w - 1, 1), (2 * w - 3, 0), (2 * w - 1, 1), (3 * w - 3, 1), (3 * w - 1, 0)];
        assert_eq!(kept[..6], want);
        assert_eq!(kept[6..], [(4 * w - 3, 1), (4 * w - 1, 1)]);
    }

    #[test]
    fn far_alternatives_are_timed_rarely_and_unknown_ones_are_near() {
        let explore = |w: u64, inc: usize, t: &[u64]| {
            let p = Plan::new(w, inc, Some(t), t.len());
            (p.explore != Plan::NONE).then_some(usize::from(p.explore))
        };
        let f = FAR_EVERY;
        // Slot 1 near (1.1x), slot 2 far (3x): 2 in windows f, 2f...; 1 otherwise.
        assert_eq!(explore(f, 0, &[100, 110, 300]), Some(2));
        assert_eq!(explore(f + 1, 0, &[100, 110, 300]), Some(1));
        assert_eq!(explore(2 * f, 0, &[100, 110, 300]), Some(2));
        // Nothing near: nothing timed outside those windows.
        assert_eq!(explore(3, 0, &[100, 300]), None);
        assert_eq!(explore(f, 0, &[100, 300]), Some(1));
        // Two far ones take turns in those windows.
        assert_eq!(explore(f, 0, &[100, 300, 400]), Some(2));
        assert_eq!(explore(2 * f, 0, &[100, 300, 400]), Some(1));
        // Not timed yet: near.
        assert_eq!(explore(3, 0, &[100, 0]), Some(1));
        assert_eq!(explore(3, 0, &[100, 300, 0]), Some(2));
        // The first epochs time the others in turn.
        assert_eq!(Plan::new(1, 0, None, 3).explore, 2);
    }

    #[test]
    fn medians_are_per_slot_and_zero_without_enough_timings() {
        let mut c = Class::new(2, 1);
        c.samples[0].extend([5, 1, 9]);
        assert_eq!(c.medians(), [5, 0, 0, 0, 0]);
        c.samples[1].extend([4, 8]);
        assert_eq!(c.medians(), [5, 0, 0, 0, 0], "two timings are not enough");
        c.samples[1].push_back(6);
        assert_eq!(c.medians(), [5, 6, 0, 0, 0]);
    }

    #[test]
    fn with_three_candidates_the_others_take_turns() {
        let mut c = Class::new(3, 1);
        let near = Some(&[100u64, 100, 100][..]);
        c.decided = (0..4).map(|w| Plan::new(w, if w < 2 { 0 } else { 2 }, near.filter(|_| w >= 2), 3)).collect();
        let alt = |w: u64| c.slot(w * WINDOW + WINDOW - 1);
        // Window 0: the first of the others (1); window 1: the second (2); window 2
        // (incumbent 2): the first of 0 and 1 (1)... in turn by the window number.
        assert_eq!([alt(0), alt(1), alt(2), alt(3)], [1, 2, 0, 1]);
        assert_eq!(c.slot(2 * WINDOW), 2);
        let k = Contest::new(8, FIRST, &[SECOND, FIRST, SECOND, AllreduceAlgo::Rabenseifner]).unwrap();
        assert_eq!(k.candidates(), [FIRST, SECOND, AllreduceAlgo::Rabenseifner]);
        assert!(Contest::new(8, FIRST, &[FIRST]).is_none());
    }

    #[test]
    fn epochs_last_about_eight_mebibytes() {
        assert_eq!(epoch_windows(64 << 10), 8, "64 KiB allreduces");
        assert_eq!(epoch_windows(256 << 10), 2);
        assert_eq!(epoch_windows(1 << 20), 1);
        assert_eq!(epoch_windows(64 << 20), 1);
        assert_eq!(epoch_windows(0), MAX_EPOCH);
        assert_eq!(epoch_windows(AllgatherAlgo::moved(4 << 10, 4)), 8, "4 KiB blocks on 4 ranks");
        assert_eq!(epoch_windows(AllgatherAlgo::moved(32 << 10, 4)), 4);
        assert_eq!(epoch_windows(ReduceScatterAlgo::moved(128 << 10, 4)), 1);
        assert_eq!(AllreduceAlgo::moved(128 << 10, 4), 128 << 10);
        // Timings kept: three per window of an epoch, 7 to 21.
        assert_eq!(samples_kept(MAX_EPOCH), SAMPLES);
        assert_eq!(samples_kept(4), 12);
        assert_eq!(samples_kept(1), FEW_SAMPLES);
    }

    #[test]
    fn each_family_adapts_on_its_own_from_its_own_floor() {
        let mut g = groups(1, Duration::from_secs(1)).remove(0);
        let mut t = g.tuning().clone();
        t.measured.allgather = vec![(CLASS, AllgatherAlgo::Ring)];
        t.measured.allgather_alternatives = vec![(CLASS, vec![AllgatherAlgo::Bruck])];
        t.measured.reduce_scatter = vec![(CLASS, ReduceScatterAlgo::Ring)];
        t.measured.reduce_scatter_alternatives = vec![(CLASS, vec![ReduceScatterAlgo::RecursiveHalving])];
        t.measured.broadcast = vec![(CLASS, BcastAlgo::Binomial)];
        t.measured.broadcast_alternatives = vec![(CLASS, vec![BcastAlgo::Chain])];
        t.measured.alltoall = vec![(CLASS, AlltoallAlgo::Pairwise)];
        t.measured.alltoall_alternatives = vec![(CLASS, vec![AlltoallAlgo::Bruck])];
        g.set_tuning(t.clone());
        fn call<A>(p: AlgoPlan<A>) -> Option<u64> {
            match p {
                AlgoPlan::Adaptive(t) => Some(t.call),
                AlgoPlan::Now(_) => None,
            }
        }
        // Counted per family: calls of one size in three families.
        assert_eq!(call(g.plan::<AllreduceAlgo>(CLASS, true, None)), Some(0));
        assert_eq!(call(g.plan::<AllgatherAlgo>(CLASS, true, None)), Some(0));
        assert_eq!(call(g.plan::<AllgatherAlgo>(CLASS, true, None)), Some(1));
        assert_eq!(call(g.plan::<ReduceScatterAlgo>(CLASS, true, None)), Some(0));
        assert_eq!(call(g.plan::<AllreduceAlgo>(CLASS, true, None)), Some(1));
        assert_eq!(call(g.plan::<BcastAlgo>(CLASS, false, None)), Some(0));
        assert_eq!(call(g.plan::<AlltoallAlgo>(CLASS, false, None)), Some(0));
        assert_eq!(call(g.plan::<BcastAlgo>(CLASS, false, None)), Some(1));
        // The blocks' floor is below the whole buffers'.
        assert_eq!(call(g.plan::<AllgatherAlgo>(ADAPT_MIN_BLOCK, false, None)), Some(2));
        assert_eq!(call(g.plan::<AllgatherAlgo>(ADAPT_MIN_BLOCK - 4, false, None)), None);
        assert_eq!(call(g.plan::<AlltoallAlgo>(ADAPT_MIN_BLOCK, false, None)), Some(1));
        assert_eq!(call(g.plan::<AllreduceAlgo>(ADAPT_MIN_BLOCK, false, None)), None);
        assert_eq!(call(g.plan::<BcastAlgo>(ADAPT_MIN_BLOCK, false, None)), None);
        // Reproducible: float reductions keep one algorithm, the allgather adapts.
        t.reproducible = true;
        g.set_tuning(t.clone());
        assert!(matches!(g.plan::<ReduceScatterAlgo>(CLASS, true, None), AlgoPlan::Now(ReduceScatterAlgo::Ring)));
        assert!(call(g.plan::<ReduceScatterAlgo>(CLASS, false, None)).is_some());
        assert!(call(g.plan::<AllgatherAlgo>(CLASS, true, None)).is_some());
        // Forced by the tuning: not adaptive.
        t.allgather = Some(AllgatherAlgo::Bruck);
        g.set_tuning(t);
        assert!(matches!(g.plan::<AllgatherAlgo>(CLASS, false, None), AlgoPlan::Now(AllgatherAlgo::Bruck)));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn every_rank_switches_at_the_same_call_by_the_slowest_ranks_times() {
        let gs = groups(3, Duration::from_secs(10));
        // The table's choice is faster on ranks 1 and 2 but not on rank 0: by the
        // slowest rank's times (3 ms against 2), the runner-up leads.
        let e = EPOCH as usize;
        let ran = drive(&gs, (3 * EPOCH + 2) * WINDOW, |r, a| {
            if a == SECOND {
                ms(2)
            } else if r == 0 {
                ms(3)
            } else {
                ms(1)
            }
        })
        .await;
        // Epochs 0 and 1 time the runner-up in every window; the agreement made at
        // epoch 1's start (with its timings of epoch 0) proposes the switch at epoch
        // 2's, which times the runner-up still; the next agreement confirms it for
        // epoch 3, where the table's choice, 1.5x behind, is far: not timed.
        let w = WINDOW as usize;
        for (k, a) in ran.iter().enumerate() {
            let (window, offset) = (k / w, k % w);
            let want = if window >= 3 * e || offset >= w - 2 { SECOND } else { FIRST };
            assert_eq!(*a, want, "call {k}");
        }
        assert!(gs.iter().all(|g| g.algo_now::<AllreduceAlgo>(CLASS, true) == SECOND));
        // Other sizes of the class share it; below 64 KiB and forced calls do not adapt.
        assert!(matches!(gs[0].plan::<AllreduceAlgo>(CLASS * 3 / 2, true, None), AlgoPlan::Adaptive(_)));
        assert!(matches!(gs[0].plan::<AllreduceAlgo>(ADAPT_MIN_BYTES - 4, true, None), AlgoPlan::Now(_)));
        assert!(matches!(gs[0].plan(CLASS, true, Some(FIRST)), AlgoPlan::Now(FIRST)));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_selection_switches_back_and_ignores_small_leads() {
        let gs = groups(2, Duration::from_secs(10));
        // Ahead by 2% only: timed in every window, never taken.
        let ran =
            drive(&gs, 4 * EPOCH * WINDOW, |_, a| if a == SECOND { Duration::from_micros(980) } else { ms(1) }).await;
        assert!(ran.iter().zip(0..).all(|(a, k)| (*a == SECOND) == (k % WINDOW >= WINDOW - 2)), "{ran:?}");
        // The runner-up clearly ahead, then clearly behind again: the medians move
        // once more than half of the kept timings are new (one per window each), the
        // agreement of the epoch after proposes the switch and the next confirms it.
        let settle = (samples_kept(EPOCH) as u64 / 2 + 1).div_ceil(EPOCH) + 3;
        drive(&gs, settle * EPOCH * WINDOW, |_, a| if a == SECOND { ms(1) } else { ms(2) }).await;
        assert_eq!(gs[0].algo_now::<AllreduceAlgo>(CLASS, true), SECOND);
        // Back: the incumbent's median moves first, then the old one's, far until
        // then and timed again once near.
        let ran = drive(&gs, 2 * settle * EPOCH * WINDOW, |_, a| if a == SECOND { ms(2) } else { ms(1) }).await;
        assert_eq!(gs[0].algo_now::<AllreduceAlgo>(CLASS, true), FIRST);
        assert_eq!(ran[ran.len() - 3], FIRST);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_third_candidate_is_timed_in_turn_and_taken_when_fastest() {
        let third = AllreduceAlgo::Rabenseifner;
        let gs = groups_with(2, Duration::from_secs(10), &[SECOND, third]);
        let ran = drive(&gs, (3 * EPOCH + 1) * WINDOW, |_, a| {
            if a == third {
                ms(1)
            } else if a == SECOND {
                ms(3)
            } else {
                ms(2)
            }
        })
        .await;
        // Epochs 0 and 1 time the second and the third in turn; epoch 2's agreement
        // proposes the third, and times it alone (the second, 1.5x behind, is far);
        // epoch 3 takes it, and the others, 2x and 3x behind, are far.
        let (w, e) = (WINDOW as usize, EPOCH as usize);
        let alt = |window: usize| ran[window * w + w - 1];
        assert_eq!([alt(0), alt(1), alt(2), alt(3)], [SECOND, third, SECOND, third]);
        assert!((2 * e..3 * e).all(|window| alt(window) == third));
        assert!(ran[..3 * e * w].iter().step_by(w).all(|a| *a == FIRST));
        assert!(ran[3 * e * w..].iter().all(|a| *a == third));
        assert_eq!(gs[1].algo_now::<AllreduceAlgo>(CLASS, true), third);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_rank_that_stops_calling_fails_the_others_at_their_deadline() {
        let gs = groups(2, Duration::from_millis(300));
        drive(&gs, WINDOW, |_, _| ms(1)).await;
        // Rank 1 makes no more calls: the agreement rank 0 makes at epoch 1's start
        // lacks its timings, and rank 0's first call of epoch 2 waits for it until
        // the deadline.
        for _ in WINDOW..2 * EPOCH * WINDOW {
            let t = ticket(&gs[0], CLASS);
            gs[0].adapt_choose(&t).await.unwrap();
        }
        let t = ticket(&gs[0], CLASS);
        let e = gs[0].adapt_choose(&t).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
        assert!(e.to_string().contains("rank 1"), "{e}");
        // Every later call of the class gets the same error, at once.
        let t = ticket(&gs[0], CLASS);
        assert_eq!(gs[0].adapt_choose(&t).await.unwrap_err().kind(), ErrorKind::Timeout);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_dropped_choice_loses_nothing_the_next_call_needs() {
        // Rank 0 runs ahead: its first call of epoch 2 needs the timings rank 1
        // sends at its own first call of epoch 1; that choice is polled before,
        // dropped, and asked again once rank 1 has caught up.
        let gs1 = groups(2, Duration::from_secs(10));
        let epoch = EPOCH * WINDOW;
        for _ in 0..epoch {
            let _ = ticket(&gs1[0], CLASS);
        }
        let t0: Vec<AdaptTicket<AllreduceAlgo>> = (0..epoch).map(|_| ticket(&gs1[0], CLASS)).collect();
        let mut fut = Box::pin(gs1[0].adapt_choose(&t0[0]));
        // Epoch 1's first call takes the table's choice without waiting.
        assert!(futures::poll!(fut.as_mut()).is_ready());
        drop(fut);
        let later = ticket(&gs1[0], CLASS); // the first of epoch 2: needs epoch 1's agreement
        let mut fut = Box::pin(gs1[0].adapt_choose(&later));
        assert!(futures::poll!(fut.as_mut()).is_pending(), "rank 1's timings are not sent yet");
        drop(fut);
        // Rank 1 catches up; rank 0's call, polled anew, gets its answer.
        for _ in 0..=epoch {
            let _ = ticket(&gs1[1], CLASS);
        }
        let c = gs1[0].adapt_choose(&later).await.unwrap();
        assert_eq!(c.algo, FIRST);
    }
}
