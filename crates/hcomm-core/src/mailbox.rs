//! Matching of incoming frames to the operations that wait for them.
//!
//! Transports [`deliver`](Mailbox::deliver) complete messages (reassembled from their
//! fragments); operations [`recv`](Mailbox::recv) by [`MatchKey`]. A message that
//! arrives before its receive is posted waits in the mailbox ("unexpected message"); a
//! receive posted first waits for the message. Messages with the same key are matched
//! in arrival order, which is the sender's order on an ordered transport (MPI's
//! non-overtaking rule).
//!
//! The mailbox also carries failures to every waiter they concern: a failed peer fails
//! every receive from that peer, an aborted operation fails every receive of that
//! operation (including receives posted later), and closing fails everything.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::Rank;
use crate::error::{Error, ErrorKind, Result};
use crate::landing::Landing;
use crate::wire::{FrameKind, Header};

/// A complete message: its (first fragment's) header and the whole payload, which is
/// either here (`payload`) or still in the sender's memory (`remote`, from a
/// shared-memory peer that lends large messages instead of copying them through the
/// ring; `payload` is then empty).
#[derive(Debug, Clone)]
pub struct Frame {
    pub header: Header,
    pub payload: Bytes,
    pub remote: Option<Arc<dyn RemotePayload>>,
}

/// A message payload that is still in the sending process's memory: the receiver
/// copies it out once, straight into its destination. Dropping the last reference
/// tells the sender it may let the memory go.
pub trait RemotePayload: Send + Sync + std::fmt::Debug {
    /// The payload's length in bytes.
    fn len(&self) -> usize;

    /// Whether the payload is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the whole payload into `dst`, which must be exactly
    /// [`len`](RemotePayload::len) bytes long.
    ///
    /// # Errors
    /// An invalid-argument error for a `dst` of another length; a peer-failed error
    /// naming the sender if its memory could not be read (the process died, or closed
    /// its side before the copy was done). `dst` is then partly written.
    fn read_into(&self, dst: &mut [u8]) -> Result<()>;

    /// Copies the whole payload into a new buffer from the [`pool`](crate::pool).
    ///
    /// # Errors
    /// As [`RemotePayload::read_into`].
    fn read(&self) -> Result<Bytes>;
}

impl Frame {
    /// A frame whose payload is here.
    pub fn new(header: Header, payload: Bytes) -> Frame {
        Frame { header, payload, remote: None }
    }

    /// A frame whose payload is still in the sender's memory.
    pub fn lent(header: Header, remote: Arc<dyn RemotePayload>) -> Frame {
        Frame { header, payload: Bytes::new(), remote: Some(remote) }
    }

    /// The payload's length, wherever it is.
    pub fn len(&self) -> usize {
        self.remote.as_ref().map_or(self.payload.len(), |r| r.len())
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The same frame with its payload here: a remote payload is copied into a
    /// buffer from the [`pool`](crate::pool) (and its sender told it may let go).
    ///
    /// # Errors
    /// As [`RemotePayload::read_into`].
    pub fn into_local(self) -> Result<Frame> {
        match self.remote {
            Some(remote) => Ok(Frame::new(self.header, remote.read()?)),
            None => Ok(self),
        }
    }
}

/// What a receive matches on. Point-to-point messages use
/// [`P2P_SEQ`](crate::keys::P2P_SEQ); collectives use their sequence number and a tag
/// of their own ([`crate::keys`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MatchKey {
    /// World rank of the sender.
    pub src: Rank,
    pub comm: u64,
    pub seq: u64,
    pub tag: u32,
}

impl MatchKey {
    /// The key a frame header matches.
    pub fn of(h: &Header) -> MatchKey {
        MatchKey { src: h.src as Rank, comm: h.comm, seq: h.seq, tag: h.tag }
    }
}

enum Slot {
    Arrived(Fifo<Frame>),
    Waiting(Fifo<Waiter>),
}

/// A posted receive: where its message goes, and the buffer it offers, if any, for
/// the message to land in ([`crate::landing`]).
struct Waiter {
    tx: oneshot::Sender<Result<Frame>>,
    landing: Option<Arc<Landing>>,
}

/// A first-in first-out queue that holds a lone element inline: nearly every slot holds
/// one waiting receive or one early message, for which a `VecDeque` would allocate on
/// the path of every small message.
enum Fifo<T> {
    Empty,
    One(T),
    Many(VecDeque<T>),
}

impl<T> Fifo<T> {
    fn one(x: T) -> Fifo<T> {
        Fifo::One(x)
    }

    fn push_back(&mut self, x: T) {
        match std::mem::replace(self, Fifo::Empty) {
            Fifo::Empty => *self = Fifo::One(x),
            Fifo::One(a) => *self = Fifo::Many(VecDeque::from([a, x])),
            Fifo::Many(mut q) => {
                q.push_back(x);
                *self = Fifo::Many(q);
            }
        }
    }

    fn pop_front(&mut self) -> Option<T> {
        match self {
            Fifo::Empty => None,
            Fifo::One(_) => match std::mem::replace(self, Fifo::Empty) {
                Fifo::One(a) => Some(a),
                _ => unreachable!("matched One"),
            },
            Fifo::Many(q) => q.pop_front(),
        }
    }

    fn front(&self) -> Option<&T> {
        match self {
            Fifo::Empty => None,
            Fifo::One(a) => Some(a),
            Fifo::Many(q) => q.front(),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Fifo::Empty => true,
            Fifo::One(_) => false,
            Fifo::Many(q) => q.is_empty(),
        }
    }

    fn retain(&mut self, keep: impl FnMut(&T) -> bool) {
        match self {
            Fifo::Empty => {}
            Fifo::One(a) => {
                let mut keep = keep;
                if !keep(a) {
                    *self = Fifo::Empty;
                }
            }
            Fifo::Many(q) => q.retain(keep),
        }
    }

    /// Takes every element out, first first.
    fn take_all(&mut self) -> impl Iterator<Item = T> {
        let mut all = std::mem::replace(self, Fifo::Empty);
        std::iter::from_fn(move || all.pop_front())
    }
}

/// The hash of the matching table: a multiply-rotate over the key's four words
/// (SipHash, the standard one, took a visible share of a small message's path; the
/// keys come from the job's own authenticated ranks, so flooding is not a concern).
#[derive(Default, Clone, Copy)]
struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

#[derive(Default)]
struct Inner {
    slots: HashMap<MatchKey, Slot, std::hash::BuildHasherDefault<KeyHasher>>,
    failed_peers: HashMap<Rank, Error>,
    aborted: HashMap<(u64, u64), Error>,
    /// Communicators aborted as a whole.
    aborted_comms: HashMap<u64, Error>,
    closed: Option<Error>,
    /// The first failure that began at another rank, which this rank's close frames
    /// pass on so that a failure travelling from rank to rank keeps its origin.
    first_failure: Option<Error>,
    /// Landings claimed by a link and not complete yet: failures reach them here, as
    /// they reach waiting receives through `slots`.
    claimed: Vec<(MatchKey, std::sync::Weak<Landing>)>,
}

/// The matching table of one rank. Shared by the transport (which delivers) and every
/// communicator on that transport (which receive).
pub struct Mailbox {
    rank: Rank,
    inner: Mutex<Inner>,
    /// Whether `Inner::aborted_comms` holds anything (checked without the lock).
    any_comm_aborted: AtomicBool,
    /// Whether `Inner::failed_peers` holds anything (every send asks; no lock until a
    /// peer has failed).
    any_peer_failed: AtomicBool,
    /// Set by a transport whose links a receive can poll itself (shared memory).
    progress: OnceLock<Arc<Progress>>,
    /// Counts the changes that can give a receive its outcome: see [`Mailbox::changes`].
    changes: AtomicU64,
    /// Counts the operations aborted: see [`Mailbox::op_aborts`].
    op_aborts: AtomicU64,
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Progress").field("spin", &self.spin).finish_non_exhaustive()
    }
}

/// How a waiting receive can move its peer's link itself instead of waiting for the
/// transport's reader task to be scheduled: see [`Mailbox::set_progress`].
pub struct Progress {
    /// The link to the given peer, if it is one the receiving task can poll; `None`:
    /// nothing to poll, no spinning for it.
    pub link: Box<dyn Fn(Rank) -> Option<Arc<dyn PollLink>> + Send + Sync>,
    /// How long a receive from such a peer keeps polling inside one `poll` of its
    /// future before it returns `Pending`: a spin that holds the thread, so that a
    /// reply that comes soon is taken without a wake-up of this task from another
    /// thread (zero: none; the receive then polls once per wake-up).
    pub spin: Duration,
    /// Whether this rank has work queued for its own tasks (a writer task holding a
    /// message): a receive then stops spinning and returns `Pending`, since a task it
    /// woke may wait for this thread (tokio runs a task woken from a worker on that
    /// worker next, and no other worker takes it), and the peer may wait for it.
    pub busy: Box<dyn Fn() -> bool + Send + Sync>,
    /// Whether a spinning receive gives the processor to other processes between
    /// tries (`sched_yield`), where ranks outnumber processors and the peer it waits
    /// for may need this one.
    pub yield_os: bool,
}

/// A link that a receive can poll: see [`Progress`].
pub trait PollLink: Send + Sync {
    /// Delivers to the mailbox what has arrived, unless someone else is reading the
    /// link right now; `false` once the link has ended.
    fn poll(&self) -> bool;

    /// As [`PollLink::poll`], for the receive that offered `landing`: bytes of its
    /// message (once the link has claimed the landing) are read straight into `dst`,
    /// its buffer, borrowed for this call only ([`crate::landing`]). By default, a link
    /// that claims no landings just polls.
    fn poll_into(&self, landing: &Landing, dst: &mut [u8]) -> bool {
        let _ = (landing, dst);
        self.poll()
    }

    /// Whether a receive may keep polling this link inside one poll of its future for
    /// [`Progress::spin`] (a link whose news comes only through the executor's I/O
    /// driver gains nothing from it).
    fn spins(&self) -> bool {
        true
    }

    /// A receive starts polling the link in a loop (a spin): news that only the
    /// spinning receive needs should not also wake another thread. Undone by
    /// [`PollLink::release`] when the spin ends.
    fn hold(&self) {}

    /// The spin that called [`PollLink::hold`] ended.
    fn release(&self) {}

    /// A receive that polled the link waits to be woken: whoever reads the link
    /// next must deliver at once. Undone by [`PollLink::unparked`].
    fn parked(&self) {}

    /// A receive counted by [`PollLink::parked`] is polled again, or went away.
    fn unparked(&self) {}

    /// Whether a spinning receive may go on polling after a poll that brought it
    /// nothing (a link can tell when nothing the receive may read can come before
    /// some other task has run). Asked after every poll of a spin.
    fn spin_more(&self) -> bool {
        true
    }

    /// As [`PollLink::poll`], in the first poll of a receive that offered no landing
    /// (a link may read more eagerly there, once per receive, than in later polls).
    fn poll_first(&self) -> bool {
        self.poll()
    }
}

impl std::fmt::Debug for Mailbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = self.inner.lock();
        f.debug_struct("Mailbox")
            .field("rank", &self.rank)
            .field("slots", &i.slots.len())
            .field("failed_peers", &i.failed_peers.keys().collect::<Vec<_>>())
            .field("aborted", &i.aborted.len())
            .field("closed", &i.closed.is_some())
            .finish()
    }
}

const NO_PEER: u32 = u32::MAX;

/// Tells a receive's landing that the receive is gone, when its future is dropped (or
/// done).
#[derive(Debug)]
struct OwnerGuard(Arc<Landing>);

impl Drop for OwnerGuard {
    fn drop(&mut self) {
        self.0.drop_owner();
    }
}

/// A posted receive: the future [`Mailbox::recv_frame`] returns. A named type with a
/// few words of state (not an `async` block), since every point-to-point receive and
/// every step of a collective holds one, and awaiting moves it.
#[derive(Debug)]
pub struct RecvFrame {
    posted: Posted,
    src: Rank,
    rank: Rank,
    progress: Option<Arc<Progress>>,
    /// The landing this receive offered, if any ([`RecvFrame::poll_into`]).
    owner: Option<OwnerGuard>,
    /// Not polled yet ([`PollLink::poll_first`]).
    first: bool,
    /// Whether its polls may spin ([`Progress::spin`]).
    spin: bool,
    /// When its spin ends, once it began.
    spin_end: Option<Instant>,
    /// The link it told it waits, until it is polled again or dropped.
    parked_on: Option<ParkedOn>,
}

/// A receive's wait, as its link knows it ([`PollLink::parked`]); dropping it tells
/// the link the wait is over ([`PollLink::unparked`]).
struct ParkedOn(Arc<dyn PollLink>);

impl ParkedOn {
    fn new(link: Arc<dyn PollLink>) -> ParkedOn {
        link.parked();
        ParkedOn(link)
    }
}

impl Drop for ParkedOn {
    fn drop(&mut self) {
        self.0.unparked();
    }
}

impl std::fmt::Debug for ParkedOn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ParkedOn")
    }
}

/// Where a [`RecvFrame`] stands.
#[derive(Debug)]
enum Posted {
    /// Its outcome was known at the post.
    Ready(Result<Frame>),
    /// It waits for the mailbox (or a link it polls) to send its outcome.
    Waiting(oneshot::Receiver<Result<Frame>>),
    /// The outcome was returned.
    Done,
}

impl From<std::result::Result<Result<Frame>, oneshot::Receiver<Result<Frame>>>> for Posted {
    fn from(p: std::result::Result<Result<Frame>, oneshot::Receiver<Result<Frame>>>) -> Posted {
        p.map_or_else(Posted::Waiting, Posted::Ready)
    }
}

impl RecvFrame {
    /// Polls the receive; `dst` is the buffer it offered as a landing
    /// ([`Mailbox::recv_frame_into`]), which a link may read into during this call.
    ///
    /// # Panics
    /// If polled again after it returned `Ready`.
    pub fn poll_into(&mut self, cx: &mut std::task::Context<'_>, dst: &mut [u8]) -> Poll<Result<Frame>> {
        let rx = match &mut self.posted {
            Posted::Waiting(rx) => rx,
            posted => match std::mem::replace(posted, Posted::Done) {
                Posted::Ready(r) => return Poll::Ready(r),
                _ => panic!("a receive polled after it completed"),
            },
        };
        let rank = self.rank;
        let closed = || dropped_while_waiting(rank);
        // The link first, and the waker registered only if that brought nothing: a
        // message the poll itself reads is taken without a wake-up of this task (which
        // registering first would cost).
        let mut yielding = false;
        self.parked_on = None;
        if let Some(p) = &self.progress {
            let deadline = self.spin.then_some(&mut self.spin_end);
            let polled = match &self.owner {
                Some(OwnerGuard(l)) => poll_link(p, self.src, rx, deadline, |link| link.poll_into(l, dst)),
                None if self.first => {
                    let mut first = true;
                    poll_link(p, self.src, rx, deadline, |link| match std::mem::take(&mut first) {
                        true => link.poll_first(),
                        false => link.poll(),
                    })
                }
                None => poll_link(p, self.src, rx, deadline, |link| link.poll()),
            };
            self.first = false;
            match polled {
                Polled::Done(r) => {
                    self.posted = Posted::Done;
                    return Poll::Ready(r.unwrap_or_else(|_| Err(closed())));
                }
                Polled::Yield => yielding = true,
                Polled::Wait(link) => self.parked_on = link.map(ParkedOn::new),
            }
        }
        if let Some(OwnerGuard(l)) = &self.owner {
            l.set_waker(cx.waker());
        }
        match Pin::new(rx).poll(cx) {
            Poll::Ready(r) => {
                self.posted = Posted::Done;
                Poll::Ready(r.unwrap_or_else(|_| Err(closed())))
            }
            Poll::Pending => {
                if yielding {
                    // Polled again once the executor has run what this rank queued
                    // (a writer task, most often), within the same spin.
                    cx.waker().wake_by_ref();
                }
                Poll::Pending
            }
        }
    }
}

/// The error of a receive whose mailbox went away while it waited.
fn dropped_while_waiting(rank: Rank) -> Error {
    Error::new(ErrorKind::Closed, "mailbox dropped while a receive waited").at_rank(rank)
}

impl RecvFrame {
    /// The receive, made not to read its link in its first poll
    /// ([`PollLink::poll_first`]) and never to spin: for a message not expected soon
    /// (an argument check's, which comes lazily), where that read would only cost a
    /// system call and a spin would only hold the thread.
    pub fn passive(mut self) -> RecvFrame {
        self.first = false;
        self.spin = false;
        self
    }

    /// The outcome if the mailbox already has it, without polling a link or
    /// registering a waker; `None` while it waits.
    ///
    /// # Panics
    /// If called again after it returned `Some`, or after a poll returned `Ready`.
    pub fn try_take(&mut self) -> Option<Result<Frame>> {
        let rank = self.rank;
        let r = match &mut self.posted {
            Posted::Waiting(rx) => match rx.try_recv() {
                Ok(r) => r,
                Err(oneshot::error::TryRecvError::Empty) => return None,
                Err(oneshot::error::TryRecvError::Closed) => Err(dropped_while_waiting(rank)),
            },
            posted => match std::mem::replace(posted, Posted::Done) {
                Posted::Ready(r) => return Some(r),
                _ => panic!("a receive taken after it completed"),
            },
        };
        self.posted = Posted::Done;
        Some(r)
    }
}

impl Future for RecvFrame {
    type Output = Result<Frame>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Result<Frame>> {
        // No landing was offered: nothing is read into `dst`.
        self.poll_into(cx, &mut [])
    }
}

/// The future [`Mailbox::recv_frame_into`] returns: the frame, and the buffer back.
#[derive(Debug)]
pub struct RecvFrameInto<'a> {
    frame: RecvFrame,
    dst: Option<&'a mut [u8]>,
}

impl<'a> Future for RecvFrameInto<'a> {
    type Output = Result<(Frame, &'a mut [u8])>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let dst = this.dst.as_deref_mut().expect("a receive polled after it completed");
        match this.frame.poll_into(cx, dst) {
            Poll::Ready(r) => {
                let dst = this.dst.take().expect("checked above");
                Poll::Ready(r.map(|f| (f, dst)))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// What [`poll_link`] found.
enum Polled {
    /// The receive's outcome (`Err(())`: the mailbox went away).
    Done(std::result::Result<Result<Frame>, ()>),
    /// Nothing yet, and no more spinning: wait to be woken (by the reader of this
    /// link, if there is one to tell).
    Wait(Option<Arc<dyn PollLink>>),
    /// Nothing yet, and this rank has work queued for its other tasks: give the
    /// thread back to the executor for a moment, and poll again soon.
    Yield,
}

/// Polls `src`'s link (see [`Progress`]) until `rx` holds the message or the spin is
/// over. The spin's end is `deadline`, set at the first spin of the receive, so that
/// a receive that yields (see [`Polled::Yield`]) spins no longer in all than one
/// that does not. The waker `rx` registered stays registered.
fn poll_link(
    p: &Progress,
    src: Rank,
    rx: &mut oneshot::Receiver<Result<Frame>>,
    deadline: Option<&mut Option<Instant>>,
    mut poll: impl FnMut(&dyn PollLink) -> bool,
) -> Polled {
    let check = |rx: &mut oneshot::Receiver<Result<Frame>>| match rx.try_recv() {
        Ok(r) => Some(Ok(r)),
        Err(oneshot::error::TryRecvError::Empty) => None,
        Err(oneshot::error::TryRecvError::Closed) => Some(Err(())),
    };
    let done_or = |r: Option<std::result::Result<Result<Frame>, ()>>, other: Polled| r.map_or(other, Polled::Done);
    if let Some(r) = check(rx) {
        return Polled::Done(r);
    }
    let Some(link) = (p.link)(src) else { return Polled::Wait(None) };
    if !poll(&*link) {
        return done_or(check(rx), Polled::Wait(None));
    }
    if let Some(r) = check(rx) {
        return Polled::Done(r);
    }
    let Some(deadline) = deadline.filter(|_| !p.spin.is_zero() && link.spins()) else {
        return Polled::Wait(Some(link));
    };
    let end = *deadline.get_or_insert_with(|| Instant::now() + p.spin);
    if Instant::now() >= end {
        return Polled::Wait(Some(link));
    }
    if (p.busy)() {
        return Polled::Yield;
    }
    let spun = {
        let _held = Held::new(&*link);
        spin_link(p, &*link, rx, end, &mut poll)
    };
    match spun {
        Spun::Done(r) => Polled::Done(r),
        Spun::Yield => Polled::Yield,
        Spun::Wait => Polled::Wait(Some(link)),
        Spun::Ended => done_or(check(rx), Polled::Wait(None)),
    }
}

/// How a receive's spin on its link ended ([`spin_link`]).
enum Spun {
    Done(std::result::Result<Result<Frame>, ()>),
    Yield,
    Wait,
    /// The link ended.
    Ended,
}

/// The spin of [`poll_link`], until `end`.
fn spin_link(
    p: &Progress,
    link: &dyn PollLink,
    rx: &mut oneshot::Receiver<Result<Frame>>,
    end: Instant,
    mut poll: impl FnMut(&dyn PollLink) -> bool,
) -> Spun {
    // One `pause` per try (it lets the line the peer writes move without a pipeline
    // flush); the clock and the queued work only every 64 tries while the link's
    // polls are cheap (a ring's), so that a reply that comes sooner reads neither,
    // and every try once a poll took a while (a system call, or a read of a large
    // message's bytes).
    let mut batch = 64;
    let mut since = Instant::now();
    for tries in 1u32.. {
        if p.yield_os {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
        if !poll(link) {
            return Spun::Ended;
        }
        match rx.try_recv() {
            Ok(r) => return Spun::Done(Ok(r)),
            Err(oneshot::error::TryRecvError::Closed) => return Spun::Done(Err(())),
            Err(oneshot::error::TryRecvError::Empty) => {}
        }
        if !link.spin_more() {
            return Spun::Wait;
        }
        if tries % batch == 0 {
            let now = Instant::now();
            if now >= end {
                return Spun::Wait;
            }
            if (p.busy)() {
                return Spun::Yield;
            }
            if now - since > CHEAP_POLLS {
                batch = 1;
            }
            since = now;
        }
    }
    unreachable!("the loop returns")
}

/// What 64 polls of a link may take for the spin to keep reading the clock only once
/// per 64 polls: a ring's polls take nanoseconds; a socket's, a system call each.
const CHEAP_POLLS: Duration = Duration::from_micros(2);

/// A link held by a spinning receive ([`PollLink::hold`]) until dropped.
struct Held<'a>(&'a dyn PollLink);

impl<'a> Held<'a> {
    fn new(link: &'a dyn PollLink) -> Held<'a> {
        link.hold();
        Held(link)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// Decodes an abort frame's payload: an error-kind byte, the peer the error names
/// (`u32::MAX`: none; little-endian) and a UTF-8 reason.
pub fn decode_abort(payload: &[u8]) -> (ErrorKind, Option<Rank>, String) {
    if payload.len() < 5 {
        return (ErrorKind::Aborted, None, String::from("no reason given"));
    }
    let peer = u32::from_le_bytes([payload[1], payload[2], payload[3], payload[4]]);
    let peer = (peer != NO_PEER).then_some(peer as Rank);
    (ErrorKind::from_code(payload[0]), peer, String::from_utf8_lossy(&payload[5..]).into_owned())
}

/// Encodes an abort frame's payload; the rank it names is where the error began, if
/// known, else its peer.
pub fn encode_abort(err: &Error) -> Bytes {
    let msg = err.to_string();
    let mut v = Vec::with_capacity(5 + msg.len());
    v.push(err.kind() as u8);
    v.extend_from_slice(&err.origin().or(err.peer()).map_or(NO_PEER, |p| p as u32).to_le_bytes());
    v.extend_from_slice(msg.as_bytes());
    Bytes::from(v)
}

impl Mailbox {
    /// An empty mailbox for `rank` (used in error messages).
    pub fn new(rank: Rank) -> Mailbox {
        Mailbox {
            rank,
            inner: Mutex::new(Inner::default()),
            any_comm_aborted: AtomicBool::new(false),
            any_peer_failed: AtomicBool::new(false),
            progress: OnceLock::new(),
            changes: AtomicU64::new(0),
            op_aborts: AtomicU64::new(0),
        }
    }

    /// Lets waiting receives poll the transport's links themselves (once per wake-up,
    /// and for `progress.spin` if not zero). Set once, by the transport; later calls
    /// are ignored.
    pub fn set_progress(&self, progress: Progress) {
        let _ = self.progress.set(Arc::new(progress));
    }

    /// The rank this mailbox belongs to.
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// Hands a complete message to the mailbox. Data frames go to their receiver (or
    /// wait for it); abort frames abort their operation; close frames mark the sender
    /// as gone.
    pub fn deliver(&self, frame: Frame) {
        let h = frame.header;
        match h.kind {
            FrameKind::Abort => {
                // The error names the peer the aborting rank's error named (a failed
                // rank, say), or else the aborting rank.
                let (kind, peer, reason) = decode_abort(&frame.payload);
                let origin = peer.unwrap_or(h.src as Rank);
                if h.seq == crate::keys::COMM_ABORT_SEQ {
                    let err = Error::new(kind, reason).with_peer(origin).with_origin(origin);
                    self.abort_comm(h.comm, err);
                    return;
                }
                let err = Error::new(kind, format!("aborted by rank {}: {reason}", h.src))
                    .with_peer(origin)
                    .with_origin(origin)
                    .in_op(h.op, Some(h.seq));
                self.abort_op(h.comm, h.seq, err);
            }
            FrameKind::Close => {
                let src = h.src as Rank;
                // A close after a failure elsewhere carries that failure (see
                // `close_payload`): the error then names where it began.
                let err = if frame.payload.is_empty() {
                    Error::new(ErrorKind::PeerFailed, "peer closed its communicator")
                } else {
                    let (_, origin, reason) = decode_abort(&frame.payload);
                    Error::new(
                        ErrorKind::PeerFailed,
                        format!("rank {src} closed its communicator after a failure: {reason}"),
                    )
                    .with_origin(origin.unwrap_or(src))
                };
                self.fail_peer(src, err.with_peer(src));
            }
            FrameKind::Data => self.deliver_data(frame),
            // Liveness only: the transport that received it has noted the traffic.
            FrameKind::Heartbeat => {}
            // The shared-memory transport turns these into lent data frames and
            // releases; other transports refuse them as protocol errors.
            FrameKind::Pull | FrameKind::Release => {
                tracing::debug!(kind = ?h.kind, src = h.src, "transport-level frame reached the mailbox; dropped");
            }
        }
    }

    fn deliver_data(&self, frame: Frame) {
        let key = MatchKey::of(&frame.header);
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        self.changed();
        let Some(frame) = Self::to_waiter(inner, key, frame) else { return };
        match inner.slots.entry(key).or_insert_with(|| Slot::Arrived(Fifo::Empty)) {
            Slot::Arrived(q) => q.push_back(frame),
            Slot::Waiting(_) => unreachable!("waiting slots were drained above"),
        }
    }

    /// A number that changes (under the lock, before the change) whenever a frame
    /// arrives or a failure or abort is recorded: whatever can give a receive its
    /// outcome. A caller that looked for outcomes ([`Mailbox::take_now`],
    /// `RecvFrame::try_take`) after reading it need not look again while it reads
    /// the same: the collectives' deferred argument checks look once per operation
    /// otherwise, which took a broadcast's root the mailbox lock and a lookup each
    /// time for messages that come once a millisecond.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    fn changed(&self) {
        self.changes.fetch_add(1, Ordering::AcqRel);
    }

    /// The frame back if no live receive waits for `key` (`None`: taken, or dropped
    /// because its operation was aborted).
    fn to_waiter(inner: &mut Inner, key: MatchKey, mut frame: Frame) -> Option<Frame> {
        if inner.aborted.contains_key(&(key.comm, key.seq)) || inner.aborted_comms.contains_key(&key.comm) {
            return None;
        }
        if let Some(Slot::Waiting(waiters)) = inner.slots.get_mut(&key) {
            while let Some(Waiter { tx, .. }) = waiters.pop_front() {
                match tx.send(Ok(frame)) {
                    Ok(()) => {
                        if waiters.is_empty() {
                            inner.slots.remove(&key);
                        }
                        return None;
                    }
                    // That receive was cancelled: offer the frame to the next one.
                    Err(Ok(f)) => frame = f,
                    Err(Err(_)) => unreachable!("only Ok values are sent here"),
                }
            }
            inner.slots.remove(&key);
        }
        Some(frame)
    }

    /// Waits for the next message matching `key`. The wait is registered when this
    /// function is called, not when the future is first polled, so that receives
    /// posted in program order match in program order.
    ///
    /// # Errors
    /// The peer's failure, the operation's abort, or the mailbox's closing, whichever
    /// is known first.
    ///
    /// # Cancel safety
    /// Dropping the future before it completes withdraws the receive: a message that
    /// arrives later goes to the next receive with the same key, or waits for one.
    /// A message already handed to this receive when it is dropped is lost, so cancel
    /// only receives whose operation is abandoned.
    pub fn recv(&self, key: MatchKey) -> impl Future<Output = Result<Frame>> + Send + 'static {
        let frame = self.recv_frame(key);
        async move { frame.await?.into_local() }
    }

    /// As [`Mailbox::recv`], but a payload still in the sender's memory stays there
    /// ([`Frame::remote`]): the receiver copies it out itself, straight to where it
    /// goes ([`RemotePayload::read_into`]).
    ///
    /// # Errors
    /// As [`Mailbox::recv`].
    ///
    /// # Cancel safety
    /// As [`Mailbox::recv`].
    pub fn recv_frame(&self, key: MatchKey) -> RecvFrame {
        RecvFrame {
            posted: self.post(key, None).into(),
            src: key.src,
            rank: self.rank,
            progress: self.progress.get().cloned(),
            owner: None,
            first: true,
            spin: true,
            spin_end: None,
            parked_on: None,
        }
    }

    /// As [`Mailbox::recv_frame`], for a receive into `dst`, which must have the
    /// message's length: a receive into a buffer of [`LANDING_MIN`] bytes or more
    /// offers it as a landing ([`crate::landing`]), so that a link that can may read
    /// the message straight into it, in this future's polls. Whatever the frame, its
    /// payload then goes into `dst` as usual: a landed message's
    /// [`read_into`](RemotePayload::read_into) (of the same `dst`) fills in the
    /// parts read elsewhere.
    ///
    /// # Errors
    /// As [`Mailbox::recv`].
    ///
    /// # Cancel safety
    /// As [`Mailbox::recv`]. A message that began to land in `dst` belongs to this
    /// receive: dropping the future loses it, and `dst` holds part of it.
    ///
    /// [`LANDING_MIN`]: crate::landing::LANDING_MIN
    pub fn recv_frame_into<'a>(&self, key: MatchKey, dst: &'a mut [u8]) -> RecvFrameInto<'a> {
        let progress = self.progress.get().cloned();
        // Only a link a receive can poll ever claims a landing.
        let landing =
            (dst.len() >= crate::landing::LANDING_MIN && progress.is_some()).then(|| Arc::new(Landing::new(dst.len())));
        let posted = self.post(key, landing.clone());
        let frame = RecvFrame {
            posted: posted.into(),
            src: key.src,
            rank: self.rank,
            progress,
            owner: landing.map(OwnerGuard),
            first: true,
            spin: true,
            spin_end: None,
            parked_on: None,
        };
        RecvFrameInto { frame, dst: Some(dst) }
    }

    /// The outcome a receive for `key` would have at once (its message, if it
    /// arrived, taken out of the mailbox; or the error that fails it), without
    /// posting one: `None` if it would wait. For a message looked for later and not
    /// waited on, such as an argument check's.
    pub fn take_now(&self, key: &MatchKey) -> Option<Result<Frame>> {
        Self::outcome_now(&mut self.inner.lock(), key)
    }

    /// What [`Mailbox::post`] returns without waiting, if anything.
    fn outcome_now(inner: &mut Inner, key: &MatchKey) -> Option<Result<Frame>> {
        if let Some(e) = inner.aborted_comms.get(&key.comm).or_else(|| inner.aborted.get(&(key.comm, key.seq))) {
            return Some(Err(e.clone()));
        }
        if let Some(Slot::Arrived(q)) = inner.slots.get_mut(key) {
            let f = q.pop_front().expect("arrived slots are never empty");
            if q.is_empty() {
                inner.slots.remove(key);
            }
            return Some(Ok(f));
        }
        inner.closed.as_ref().or_else(|| inner.failed_peers.get(&key.src)).map(|e| Err(e.clone()))
    }

    #[allow(clippy::type_complexity)]
    fn post(
        &self,
        key: MatchKey,
        landing: Option<Arc<Landing>>,
    ) -> std::result::Result<Result<Frame>, oneshot::Receiver<Result<Frame>>> {
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        if let Some(r) = Self::outcome_now(inner, &key) {
            return Ok(r);
        }
        let (tx, rx) = oneshot::channel();
        let waiter = Waiter { tx, landing };
        match inner.slots.entry(key) {
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(Slot::Waiting(Fifo::one(waiter)));
            }
            std::collections::hash_map::Entry::Occupied(mut o) => match o.get_mut() {
                Slot::Waiting(w) => {
                    w.retain(|t| !t.tx.is_closed());
                    w.push_back(waiter);
                }
                Slot::Arrived(_) => unreachable!("handled above"),
            },
        }
        Err(rx)
    }

    /// Fails every present and future receive from `peer` with `err`, except messages
    /// that already arrived, which stay deliverable.
    pub fn fail_peer(&self, peer: Rank, err: Error) {
        let origin = err.origin().or(err.peer()).unwrap_or(peer);
        let err = err.with_origin(origin);
        let mut inner = self.inner.lock();
        if inner.failed_peers.contains_key(&peer) {
            return;
        }
        self.note_failure(&mut inner, &err);
        self.changed();
        inner.failed_peers.insert(peer, err.clone());
        self.any_peer_failed.store(true, Ordering::Release);
        Self::fail_waiters(&mut inner, |k| k.src == peer, &err);
    }

    /// Aborts operation `seq` of communicator `comm`: every present and future receive
    /// of it fails with `err`, and its unclaimed messages are dropped. Returns `false`
    /// if it was aborted already.
    pub fn abort_op(&self, comm: u64, seq: u64, err: Error) -> bool {
        let mut inner = self.inner.lock();
        if inner.aborted.contains_key(&(comm, seq)) {
            return false;
        }
        self.note_failure(&mut inner, &err);
        self.changed();
        self.op_aborts.fetch_add(1, Ordering::AcqRel);
        inner.aborted.insert((comm, seq), err.clone());
        inner.slots.retain(|k, s| !(k.comm == comm && k.seq == seq && matches!(s, Slot::Arrived(_))));
        Self::fail_waiters(&mut inner, |k| k.comm == comm && k.seq == seq, &err);
        true
    }

    /// Aborts communicator `comm` as a whole: every present and future receive on it
    /// fails with `err`, and its unclaimed messages are dropped. Returns `false` if it
    /// was aborted already.
    pub fn abort_comm(&self, comm: u64, err: Error) -> bool {
        let mut inner = self.inner.lock();
        if inner.aborted_comms.contains_key(&comm) {
            return false;
        }
        self.note_failure(&mut inner, &err);
        self.changed();
        inner.aborted_comms.insert(comm, err.clone());
        self.any_comm_aborted.store(true, Ordering::Release);
        inner.slots.retain(|k, s| !(k.comm == comm && matches!(s, Slot::Arrived(_))));
        Self::fail_waiters(&mut inner, |k| k.comm == comm, &err);
        true
    }

    /// Whether communicator `comm` was aborted as a whole, and why.
    pub fn comm_aborted(&self, comm: u64) -> Option<Error> {
        // Every send asks: no lock until some communicator was aborted.
        if !self.any_comm_aborted.load(Ordering::Acquire) {
            return None;
        }
        self.inner.lock().aborted_comms.get(&comm).cloned()
    }

    /// How many operations were aborted so far ([`Mailbox::abort_op`]), for a caller
    /// that keeps state about operations and looks at their aborts only when this
    /// changes. It is counted under the lock [`Mailbox::aborted`] takes, so an abort
    /// counted is an abort `aborted` reports.
    pub fn op_aborts(&self) -> u64 {
        self.op_aborts.load(Ordering::Acquire)
    }

    /// Whether operation `seq` of `comm` was aborted, and why.
    pub fn aborted(&self, comm: u64, seq: u64) -> Option<Error> {
        self.inner.lock().aborted.get(&(comm, seq)).cloned()
    }

    /// The error a peer failed with, if it failed.
    pub fn peer_failure(&self, peer: Rank) -> Option<Error> {
        if !self.any_peer_failed.load(Ordering::Acquire) {
            return None;
        }
        self.inner.lock().failed_peers.get(&peer).cloned()
    }

    /// Keeps `err` as the failure to pass on if it is the first that began at another
    /// rank.
    fn note_failure(&self, inner: &mut Inner, err: &Error) {
        if inner.first_failure.is_none() && err.origin().is_some_and(|o| o != self.rank) {
            inner.first_failure = Some(err.clone());
        }
    }

    /// The payload of this rank's close frames: empty, or the first failure that began
    /// at another rank, so that a peer that fails because this rank closed names that
    /// rank as the origin rather than this one.
    pub fn close_payload(&self) -> Bytes {
        self.inner.lock().first_failure.as_ref().map(encode_abort).unwrap_or_default()
    }

    /// Fails everything, now and later, with `err`.
    pub fn close(&self, err: Error) {
        let mut inner = self.inner.lock();
        self.changed();
        if inner.closed.is_none() {
            inner.closed = Some(err.clone());
        }
        Self::fail_waiters(&mut inner, |_| true, &err);
    }

    fn fail_waiters(inner: &mut Inner, pick: impl Fn(&MatchKey) -> bool, err: &Error) {
        inner.slots.retain(|k, slot| match slot {
            Slot::Waiting(w) if pick(k) => {
                for w in w.take_all() {
                    let _ = w.tx.send(Err(err.clone()));
                }
                false
            }
            _ => true,
        });
        inner.claimed.retain(|(k, landing)| match landing.upgrade() {
            Some(l) if pick(k) => {
                l.fail(err.clone());
                false
            }
            Some(_) => true,
            None => false,
        });
    }

    /// Whether a receive waits for `key` (the first in line not dropped).
    pub fn awaited(&self, key: &MatchKey) -> bool {
        match self.inner.lock().slots.get(key) {
            Some(Slot::Waiting(waiters)) => waiters.front().is_some_and(|w| !w.tx.is_closed()),
            _ => false,
        }
    }

    /// The landing of the first receive waiting for `key`, if it offered one for a
    /// message of exactly `len` bytes: the receive is taken out of the mailbox's
    /// matching (the message with `key` whose first fragment the caller, a link, has
    /// just read is this receive's), and the link completes or fails it through the
    /// landing ([`crate::landing`]). `None`: no such receive (the message is
    /// delivered as usual).
    pub fn claim(&self, key: &MatchKey, len: usize) -> Option<Arc<Landing>> {
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        if inner.aborted.contains_key(&(key.comm, key.seq)) || inner.aborted_comms.contains_key(&key.comm) {
            return None;
        }
        let Some(Slot::Waiting(waiters)) = inner.slots.get_mut(key) else { return None };
        waiters.retain(|w| !w.tx.is_closed());
        let fits = match waiters.front() {
            Some(Waiter { landing: Some(l), .. }) => l.len() == len,
            _ => false,
        };
        if !fits {
            if waiters.is_empty() {
                inner.slots.remove(key);
            }
            return None;
        }
        let w = waiters.pop_front().expect("checked above");
        if waiters.is_empty() {
            inner.slots.remove(key);
        }
        let landing = w.landing.expect("checked above");
        if !landing.claim(w.tx) {
            return None;
        }
        inner.claimed.retain(|(_, l)| l.strong_count() > 0);
        inner.claimed.push((*key, Arc::downgrade(&landing)));
        Some(landing)
    }

    /// Number of keys with unclaimed messages or waiting receives (for tests and
    /// diagnostics).
    pub fn pending(&self) -> usize {
        self.inner.lock().slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::{OpKind, Signature};

    fn frame(src: Rank, seq: u64, tag: u32, byte: u8) -> Frame {
        let h = Header::data(src, 1, seq, tag, &Signature::bare(OpKind::Send, 1), 1);
        Frame::new(h, Bytes::from(vec![byte]))
    }

    fn key(src: Rank, seq: u64, tag: u32) -> MatchKey {
        MatchKey { src, comm: 1, seq, tag }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn unexpected_then_posted_in_order() {
        let m = Mailbox::new(0);
        m.deliver(frame(1, 0, 5, 1));
        m.deliver(frame(1, 0, 5, 2));
        assert_eq!(m.recv(key(1, 0, 5)).await.unwrap().payload[0], 1);
        assert_eq!(m.recv(key(1, 0, 5)).await.unwrap().payload[0], 2);
        assert_eq!(m.pending(), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn posted_then_delivered_skips_cancelled() {
        let m = Mailbox::new(0);
        let cancelled = m.recv(key(1, 0, 5));
        let live = m.recv(key(1, 0, 5));
        drop(cancelled);
        m.deliver(frame(1, 0, 5, 9));
        assert_eq!(live.await.unwrap().payload[0], 9);
        assert_eq!(m.pending(), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn failures_reach_waiters_and_later_receives() {
        let m = Mailbox::new(0);
        let w = m.recv(key(2, 3, 0));
        let other = m.recv(key(1, 3, 0));
        m.deliver(frame(2, 4, 0, 7));
        m.fail_peer(2, Error::new(ErrorKind::PeerFailed, "gone").with_peer(2));
        assert!(w.await.unwrap_err().is_peer_failed());
        // Already-arrived messages stay deliverable.
        assert_eq!(m.recv(key(2, 4, 0)).await.unwrap().payload[0], 7);
        assert!(m.recv(key(2, 5, 0)).await.unwrap_err().is_peer_failed());

        let abort = Header::control(FrameKind::Abort, OpKind::AllReduce, 1, 1, 3, 0);
        m.deliver(Frame::new(abort, encode_abort(&Error::new(ErrorKind::Mismatch, "len"))));
        let e = other.await.unwrap_err();
        assert!(e.is_mismatch(), "{e}");
        assert_eq!(e.peer(), Some(1));
        assert!(m.recv(key(1, 3, 1)).await.unwrap_err().is_mismatch());
        // Frames of an aborted operation are dropped.
        m.deliver(frame(1, 3, 2, 0));
        assert_eq!(m.pending(), 0);
    }

    /// `changes` moves with every arrival, failure and abort (what can end a
    /// receive), and not with posting a receive or looking for a message.
    #[test]
    fn changes_count_what_can_end_a_receive_and_not_the_looks() {
        let m = Mailbox::new(0);
        let mut last = m.changes();
        let mut changed = |m: &Mailbox, what: &str| {
            let now = m.changes();
            assert_ne!(now, last, "{what} did not change the count");
            last = now;
            now
        };
        m.deliver(frame(1, 0, 5, 1));
        let seen = changed(&m, "an unexpected frame");
        let mut waiting = m.recv_frame(key(1, 1, 5));
        assert_eq!(m.changes(), seen, "posting a receive changed the count");
        assert!(waiting.try_take().is_none());
        m.deliver(frame(1, 1, 5, 2));
        let seen = changed(&m, "a frame for a waiting receive");
        assert_eq!(waiting.try_take().unwrap().unwrap().payload[0], 2);
        assert!(m.take_now(&key(1, 0, 5)).is_some());
        assert!(m.take_now(&key(1, 0, 5)).is_none());
        assert_eq!(m.changes(), seen, "looking changed the count");
        m.abort_op(7, 3, Error::new(ErrorKind::Aborted, "x"));
        changed(&m, "an aborted operation");
        m.abort_comm(8, Error::new(ErrorKind::Aborted, "x"));
        changed(&m, "an aborted communicator");
        m.fail_peer(2, Error::new(ErrorKind::PeerFailed, "gone"));
        changed(&m, "a failed peer");
        m.close(Error::new(ErrorKind::Closed, "closed"));
        changed(&m, "closing");
    }

    /// `take_now` takes an arrived message without posting a receive, in order,
    /// says nothing (and posts nothing) for one not arrived, and reports what fails
    /// a receive: an aborted operation, a failed peer.
    #[test]
    fn take_now_takes_what_arrived_and_posts_nothing() {
        let m = Mailbox::new(0);
        assert!(m.take_now(&key(1, 0, 5)).is_none());
        assert_eq!(m.pending(), 0, "a look posted a receive");
        m.deliver(frame(1, 0, 5, 1));
        m.deliver(frame(1, 0, 5, 2));
        assert_eq!(m.take_now(&key(1, 0, 5)).unwrap().unwrap().payload[0], 1);
        assert_eq!(m.take_now(&key(1, 0, 5)).unwrap().unwrap().payload[0], 2);
        assert!(m.take_now(&key(1, 0, 5)).is_none());
        assert_eq!(m.pending(), 0);
        // Delivered while nobody waits, then taken.
        m.deliver(frame(1, 1, 5, 3));
        assert_eq!(m.take_now(&key(1, 1, 5)).unwrap().unwrap().payload[0], 3);
        let abort = Header::control(FrameKind::Abort, OpKind::AllReduce, 1, 1, 2, 0);
        m.deliver(Frame::new(abort, encode_abort(&Error::new(ErrorKind::Mismatch, "len"))));
        assert!(m.take_now(&key(1, 2, 5)).unwrap().unwrap_err().is_mismatch());
        m.fail_peer(3, Error::new(ErrorKind::PeerFailed, "gone").with_peer(3));
        assert!(m.take_now(&key(3, 0, 5)).unwrap().unwrap_err().is_peer_failed());
    }
}
