//! The deferred argument checks of a group ([`ArgCheck::Deferred`]).
//!
//! Every operation that runs with them sends the next rank (around the group) a
//! record of its sequence number and signature, and this rank compares the previous
//! rank's record of the same operation with its own signature. The records are
//! posted lazily ([`LocalTransport::post_lazy`]) as signature record frames
//! ([`RECORDS_SEQ`]), which a transport that holds small frames back merges: over
//! TCP, the records of a broadcast root's last few hundred operations travel in one
//! frame, since a frame per record costs as much writing, reading and matching as
//! the data's own.
//!
//! The previous rank's records all come under one key, and this rank keeps one
//! receive posted for them. They are matched here: with an operation still waiting
//! for its data, which fails at once on a difference; or with an operation that
//! returned before its record came, whose difference fails the next collective
//! ([`Checks::late_error`]).
//!
//! Failures: a rank posts its record when the operation is called (`agreed`), before
//! anything can fail it here. An operation that fails or is dropped here has the
//! previous rank's record dropped when it comes ([`Checks::forget`]); a returned
//! operation that was aborted (here or elsewhere) no longer waits for its record,
//! which the rank that gave up on it may never have sent, unless another rank
//! aborted it for a mismatch (see [`MISMATCH_RECORD_WAIT`]); and what is
//! [`STALE_AFTER`] operations overdue is dropped.
//!
//! [`ArgCheck::Deferred`]: crate::ArgCheck::Deferred

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use hcomm_core::keys::RECORDS_SEQ;
use hcomm_core::mailbox::RecvFrame;
use hcomm_core::wire::{WireError, records};
use hcomm_core::{Error, ErrorKind, LocalTransport, MatchKey, OpKind, Result, Signature};
use parking_lot::Mutex;

use crate::group::Group;

/// Records of the previous rank, and operations forgotten here, this many operations
/// older than one being checked are dropped: they belong to operations that will
/// never look for them (dropped here before their first poll, so that this rank sent
/// no record and forgot nothing; or forgotten after a failure, with the record
/// never sent); and this rank's returned operations whose records are that overdue
/// are given up. An operation in flight here while 65 536 later ones are checked
/// loses its check (it then passes).
const STALE_AFTER: u64 = 1 << 16;

/// How often a wait for the previous rank's records ([`Checks::settle`]) looks for
/// aborted operations among those it waits for.
const ABORT_LOOK: Duration = Duration::from_millis(20);

/// How long a returned operation that another rank aborted for a mismatch still
/// waits for the previous rank's record, which then decides this rank's check as
/// usual. Every rank posts its record when it calls an operation, so the record of
/// an operation that met a mismatch is on its way; giving up at the abort (as for
/// other aborts, where the rank that gave up may never have sent it) made the rank
/// at fault miss its own mismatch whenever the finder's abort came before the
/// record (once in 30-45 runs of a 4-rank test over TCP). Taking the abort's error
/// as this rank's instead would not do: a rank reports a late mismatch by failing
/// its next collective, whose abort is of the same kind, and every rank with that
/// one unchecked would report it again in turn. The wait is bounded for the rare
/// operation that was also dropped, before its first poll, on the previous rank
/// (whose abort, coming second, is not kept), and so has no record coming.
const MISMATCH_RECORD_WAIT: Duration = Duration::from_secs(2);

/// The checks of one group.
#[derive(Debug, Default)]
pub(crate) struct Checks {
    state: Mutex<State>,
    /// Operations that returned unchecked, plus one for a mismatch not reported yet:
    /// read without the lock by every operation.
    open: AtomicUsize,
    /// Wakes every task that waits for a record (the receive holds one waker).
    wake: Arc<WakeAll>,
    /// The mailbox's [`changes`](hcomm_core::Mailbox::changes) when `late_error`
    /// last looked and found nothing: no record can have come while it reads the
    /// same, and every collective asks (a root with records outstanding took the
    /// lock each time otherwise).
    late_seen: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    /// This rank's operations that returned before the previous rank's record came.
    mine: VecDeque<(u64, Signature)>,
    /// The previous rank's records that no operation here has looked for yet. As
    /// many as the previous rank runs ahead, which the transports' buffers bound.
    theirs: VecDeque<(u64, Signature)>,
    /// Operations that failed or were cancelled here before their record came: it
    /// is dropped when it does.
    forgotten: VecDeque<u64>,
    /// A mismatch found after its operation returned here, for the next collective.
    found: Option<Error>,
    /// The receive of the previous rank's next frame of records.
    recv: Option<RecvFrame>,
    /// No more records can come (the previous rank failed, the communicator closed
    /// or was aborted): open checks are given up, as a failed check's receive was.
    ended: bool,
    /// The mailbox's [`op_aborts`](hcomm_core::Mailbox::op_aborts) when `mine` was
    /// last rid of aborted operations.
    aborts_seen: u64,
    /// Returned operations in `mine` that another rank aborted for a mismatch, and
    /// since when this rank knows: they wait [`MISMATCH_RECORD_WAIT`] for their
    /// record.
    mismatch_aborted: Vec<(u64, Instant)>,
}

/// A mismatch to abort on every rank once the lock is released.
type Abort = (u64, OpKind, Error);

impl Checks {
    /// Operation `seq` (signature `sig`) has done its work: its check, if the
    /// previous rank's record is here (a mismatch error for the operation itself),
    /// or else kept to be matched when the record comes.
    pub(crate) fn defer<T: LocalTransport>(&self, g: &Group<T>, seq: u64, sig: Signature) -> Result<()> {
        self.with(g, None, |s| {
            if let Some(theirs) = s.take_theirs(seq) {
                return same(g, &sig, theirs);
            }
            if !s.ended {
                s.mine.push_back((seq, sig));
            }
            Ok(())
        })
    }

    /// For operation `seq` (signature `sig`) while it waits: `Ready` once the
    /// previous rank's record came (with a mismatch error if it differs) or can no
    /// longer come; `Pending` with `cx` woken when a record arrives.
    pub(crate) fn poll_one<T: LocalTransport>(
        &self,
        g: &Group<T>,
        seq: u64,
        sig: &Signature,
        cx: &Context<'_>,
    ) -> Poll<Result<()>> {
        self.with(g, Some(cx), |s| match s.take_theirs(seq) {
            Some(theirs) => Poll::Ready(same(g, sig, theirs)),
            None if s.ended => Poll::Ready(Ok(())),
            None => Poll::Pending,
        })
    }

    /// Operation `seq` failed or was cancelled here before its check: the previous
    /// rank's record of it is not wanted.
    pub(crate) fn forget<T: LocalTransport>(&self, g: &Group<T>, seq: u64) {
        self.with(g, None, |s| {
            if s.take_theirs(seq).is_none() && !s.ended {
                s.forgotten.push_back(seq);
            }
        });
    }

    /// The mismatch found after its operation had returned, if any (once), looking
    /// at the records that came since without waiting.
    pub(crate) fn late_error<T: LocalTransport>(&self, g: &Group<T>) -> Option<Error> {
        if self.open.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let changes = g.transport().mailbox().changes();
        if self.late_seen.load(Ordering::Relaxed) == changes {
            return None;
        }
        let found = self.with(g, None, |s| s.found.take());
        if found.is_none() {
            self.late_seen.store(changes, Ordering::Relaxed);
        }
        found
    }

    /// Whether more than `keep` operations wait for their check.
    pub(crate) fn over(&self, keep: usize) -> bool {
        self.open.load(Ordering::Relaxed) > keep
    }

    /// Waits until at most `keep` operations wait for their check, or a mismatch was
    /// found (its error). It looks again every [`ABORT_LOOK`] for aborted operations,
    /// whose records may never come.
    pub(crate) async fn settle<T: LocalTransport>(&self, g: &Group<T>, keep: usize) -> Result<()> {
        loop {
            let step = std::future::poll_fn(|cx| {
                self.with(g, Some(cx), |s| match s.found.take() {
                    Some(e) => Poll::Ready(Err(e)),
                    None if s.mine.len() <= keep || s.ended => Poll::Ready(Ok(())),
                    None => Poll::Pending,
                })
            });
            if let Ok(r) = tokio::time::timeout(ABORT_LOOK, step).await {
                return r;
            }
        }
    }

    /// Runs `f` on the state, under the lock, after taking in the records that came
    /// (registering `cx` to be woken by the next, if given), and returns what `f`
    /// returns. Mismatches found among the records that came are aborted on every
    /// rank once the lock is released.
    fn with<T: LocalTransport, R>(&self, g: &Group<T>, cx: Option<&Context<'_>>, f: impl FnOnce(&mut State) -> R) -> R {
        let mut aborts = Vec::new();
        let out = {
            let mut s = self.state.lock();
            if let Some(cx) = cx {
                self.wake.add(cx.waker());
            }
            self.take_in(g, &mut s, cx.is_some(), &mut aborts);
            // An operation aborted (cancelled or failed somewhere) after it returned
            // here needs no check, and the rank that gave up on it may never have sent
            // its record (it was dropped before its first poll, say); one aborted for
            // a mismatch waits a while longer (see `MISMATCH_RECORD_WAIT`).
            let m = g.transport().mailbox();
            let seen = m.op_aborts();
            if seen != s.aborts_seen || !s.mismatch_aborted.is_empty() {
                s.aborts_seen = seen;
                let now = Instant::now();
                let State { mine, mismatch_aborted: waiting, .. } = &mut *s;
                mine.retain(|&(seq, _)| match m.aborted(g.comm_id(), seq) {
                    None => true,
                    Some(e) if e.is_mismatch() => {
                        let since = match waiting.iter().find(|w| w.0 == seq) {
                            Some(w) => w.1,
                            None => {
                                waiting.push((seq, now));
                                now
                            }
                        };
                        now.duration_since(since) < MISMATCH_RECORD_WAIT
                    }
                    Some(_) => false,
                });
                waiting.retain(|w| mine.iter().any(|m| m.0 == w.0));
            }
            let out = f(&mut s);
            self.open.store(s.mine.len() + usize::from(s.found.is_some()), Ordering::Relaxed);
            out
        };
        for (seq, op, e) in aborts {
            g.abort_op(seq, op, &e);
        }
        out
    }

    /// Takes in every frame of records that came, matching them with this rank's
    /// returned operations. `wait`: leave the receive registered to wake
    /// [`Checks::wake`].
    fn take_in<T: LocalTransport>(&self, g: &Group<T>, s: &mut State, wait: bool, aborts: &mut Vec<Abort>) {
        while !s.ended {
            let recv = s.recv.get_or_insert_with(|| {
                let key = MatchKey {
                    src: g.world_rank(g.check_prev()),
                    comm: g.comm_id(),
                    seq: RECORDS_SEQ,
                    tag: crate::RECORDS_TAG,
                };
                g.transport().mailbox().recv_frame(key).passive()
            });
            let got = if wait {
                let waker = Waker::from(self.wake.clone());
                match Pin::new(recv).poll(&mut Context::from_waker(&waker)) {
                    Poll::Ready(r) => r,
                    Poll::Pending => return,
                }
            } else {
                match recv.try_take() {
                    Some(r) => r,
                    None => return,
                }
            };
            s.recv = None;
            let bad = |e: WireError| {
                Error::new(ErrorKind::Protocol, format!("argument check records: {e}")).with_peer(g.check_prev())
            };
            let taken = got.and_then(|f| {
                for r in records(&f.payload).map_err(bad)? {
                    let (seq, theirs) = r.map_err(bad)?;
                    s.match_theirs(g, seq, theirs, aborts);
                }
                Ok(())
            });
            if let Err(e) = taken {
                s.ended = true;
                s.mine.clear();
                s.forgotten.clear();
                // A malformed frame is this rank's to report; a failure (of the peer,
                // the communicator) shows in the operations it concerns.
                if e.kind() == ErrorKind::Protocol {
                    s.found.get_or_insert(e.at_rank(g.rank()));
                }
            }
        }
    }
}

impl State {
    /// The previous rank's record of operation `seq`, taken out, if it came; records
    /// and forgotten operations long before it are dropped ([`STALE_AFTER`]).
    fn take_theirs(&mut self, seq: u64) -> Option<Signature> {
        let stale = |s: u64| s.saturating_add(STALE_AFTER) < seq;
        while self.theirs.front().is_some_and(|&(s, _)| stale(s)) {
            self.theirs.pop_front();
        }
        while self.forgotten.front().is_some_and(|&s| stale(s)) {
            self.forgotten.pop_front();
        }
        let i = self.theirs.iter().position(|&(s, _)| s == seq)?;
        self.theirs.remove(i).map(|(_, sig)| sig)
    }

    /// The previous rank's record of operation `seq`: compared with this rank's if
    /// that returned already, else kept for the operation. Returned operations whose
    /// records are long overdue ([`STALE_AFTER`]) are given up.
    fn match_theirs<T: LocalTransport>(&mut self, g: &Group<T>, seq: u64, theirs: Signature, aborts: &mut Vec<Abort>) {
        while self.mine.front().is_some_and(|&(s, _)| s.saturating_add(STALE_AFTER) < seq) {
            self.mine.pop_front();
        }
        match self.mine.iter().position(|&(s, _)| s == seq) {
            Some(i) => {
                let (_, ours) = self.mine.remove(i).expect("found above");
                if let Some(a) = mismatch(g, seq, &ours, theirs) {
                    self.found.get_or_insert_with(|| a.2.clone());
                    aborts.push(a);
                }
            }
            None => match self.forgotten.iter().position(|&s| s == seq) {
                Some(i) => {
                    self.forgotten.remove(i);
                }
                None => self.theirs.push_back((seq, theirs)),
            },
        }
    }
}

/// A mismatch error if the previous rank's signature `theirs` differs from `ours`.
fn same<T: LocalTransport>(g: &Group<T>, ours: &Signature, theirs: Signature) -> Result<()> {
    crate::group::same_signature(ours, g.check_prev(), theirs)
}

/// The abort of operation `seq`, which returned here, if the previous rank's
/// signature `theirs` differs from this rank's, `ours`.
fn mismatch<T: LocalTransport>(g: &Group<T>, seq: u64, ours: &Signature, theirs: Signature) -> Option<Abort> {
    let e = same(g, ours, theirs).err()?.in_op(ours.op, Some(seq)).at_rank(g.rank());
    Some((seq, ours.op, e.note("found after this rank's call had returned")))
}

/// A waker that wakes every task registered with it: the records' receive holds
/// one waker, and several operations (and `settle_checks`) may wait for records.
#[derive(Debug, Default)]
struct WakeAll(Mutex<Vec<Waker>>);

impl WakeAll {
    fn add(&self, w: &Waker) {
        let mut list = self.0.lock();
        if !list.iter().any(|x| x.will_wake(w)) {
            list.push(w.clone());
        }
    }
}

impl Wake for WakeAll {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let list = std::mem::take(&mut *self.0.lock());
        list.into_iter().for_each(Waker::wake);
    }
}
