//! TCP transports: one type, [`StreamTransport`], over two I/O backends that share the
//! framing code in [`crate::framing`]:
//!
//! - tokio sockets ([`StreamTransport::tokio`]), whose futures are `Send`;
//! - io_uring through tokio-uring ([`StreamTransport::uring`], feature `uring`), whose
//!   tasks run on tokio-uring's thread-local runtime.
//!
//! Each peer connection has a writer task and a reader task, spawned on the caller's
//! runtime (no thread of ours). A send queues its message for the writer and waits
//! until the writer has handed its last fragment to the kernel; the reader reassembles
//! messages and delivers them to the mailbox. A broken connection, a protocol
//! violation or an unannounced EOF fails the peer in the mailbox, so that every receive
//! from it fails with a peer-failed error naming it.
//!
//! A dead process closes its sockets, which its peers notice at once. A hung process, a
//! host that went down or a cut network path closes nothing: for those, idle links
//! carry heartbeat frames and a watchdog task fails a peer from which nothing arrived
//! for [`StreamOptions::peer_timeout`] (0.6 s by default, so that a failure is known
//! within a second).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use hcomm_core::keys::RECORDS_SEQ;
use hcomm_core::wire::FrameKind;
use hcomm_core::{Error, ErrorKind, Frame, Header, Mailbox, OpKind, Rank, Result, Transport};
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;

use crate::bundle::{self, Bundle, BundleStats, BundleWriter};
use crate::framing::{Assembler, Outgoing, WriteQueue};
use crate::shm::{ShmOptions, ShmPair};
use crate::tcp::TcpSock;
use hcomm_core::landing::Landing;

/// Tuning of the stream transports.
#[derive(Debug, Clone)]
pub struct StreamOptions {
    /// Largest fragment written at once; larger messages are split and interleaved
    /// with other traffic to the same peer.
    pub fragment: usize,
    /// A peer from which nothing (data or heartbeat) arrives for this long is failed:
    /// every pending and later receive from it fails with a peer-failed error naming
    /// it. Idle links carry a heartbeat every quarter of it. `None` turns heartbeats
    /// and the check off (a dead process is still noticed at once, by its closed
    /// sockets; a hung process or a cut path then only by operation deadlines).
    ///
    /// Heartbeats to plain TCP (tokio or io_uring) and shared-memory peers come from
    /// a small thread of the process as well as from the writer tasks (see
    /// `start_beacon`), so a rank whose executor is busy computing still beats. Over
    /// TLS or several connections per peer they come from the writer tasks only: there a rank that
    /// blocks every thread of its executor for longer than this looks dead to its
    /// peers. This rank's own pauses are harmless: the check skips a round in which
    /// it was itself late.
    pub peer_timeout: Option<Duration>,
    /// Shared-memory links (see [`crate::shm`]): ring size, spin before parking.
    pub shm: ShmOptions,
    /// How long a receive from a shared-memory or plain TCP peer keeps reading the
    /// ring or socket inside the polls of its future before it returns `Pending`
    /// (`HCOMM_RECV_SPIN_US`). The awaiting future then takes a reply that comes
    /// within the spin itself, on its own thread: on a multi-thread runtime the
    /// alternative is the reader task taking it on another worker and waking this
    /// one, a wake-up across threads that costs more than a short round trip. The
    /// default is about what that wake-up costs (the classic bound for spinning
    /// before blocking: never more than twice the better choice). It gives the
    /// executor its turn while this rank has messages queued for its writer tasks.
    /// Zero: no spin.
    pub recv_spin: Duration,
    /// How long a tokio TCP reader with nothing to read keeps trying (yielding to the
    /// executor's other tasks between tries) before it waits for the socket to become
    /// readable. A process that waits in `epoll_wait` takes tens of microseconds to
    /// wake on a busy or virtual machine; a reply that comes within the spin is read
    /// at once. Zero waits at once (no polling at all when idle). MPI libraries poll
    /// for the same reason. Not used by the io_uring backend.
    pub tcp_spin: Duration,
    /// Whether a spinning tokio TCP reader also gives the processor to the other
    /// processes between tries (`sched_yield`), as MPI libraries do when ranks
    /// outnumber cores (OpenMPI's `mpi_yield_when_idle`): the rank it waits for then
    /// runs at once instead of after this one's time slice. `hcomm`'s bootstrap turns
    /// it on where this host runs more ranks than it has cores (`HCOMM_SPIN_YIELD`).
    pub spin_yield: bool,
    /// With several connections per peer ([`PeerLink::Bundle`]): the least time a
    /// link holding unacknowledged data may go without the peer reporting new bytes
    /// on it (while another link still moves data) before it is suspected and its
    /// segments move to the other links (the limit also grows with the measured round
    /// trip; see [`crate::bundle`]).
    pub link_stall: Duration,
    /// Messages of this many bytes and more that [`Transport::send_borrowed`] sends to
    /// a peer over a plain tokio TCP connection are written to the socket from the
    /// caller's slice in the call, as one frame (up to the wire's largest, 16 MiB),
    /// whatever [`StreamOptions::tcp_direct`] says, when the connection's writer task
    /// holds nothing; only what the kernel does not take then is copied, for the
    /// writer (the slice is borrowed for the call only: a future may be leaked).
    /// Otherwise, and over io_uring, TLS or several connections per peer, the
    /// message is copied at the call. Zero: always copied.
    pub tcp_lend: usize,
    /// Messages of this many bytes and more (and at least
    /// [`hcomm_core::landing::LANDING_MIN`], 64 KiB), received over a plain tokio
    /// TCP connection by a receive into a buffer of their length posted before they
    /// come, *land* there: the receive reads the message's bytes from the socket into
    /// its buffer itself, instead of copying them out of a pooled buffer the
    /// connection's reader filled ([`hcomm_core::landing`]). Zero: nothing lands. Not
    /// used by io_uring, TLS, several connections per peer, or shared memory; only
    /// with [`StreamOptions::tcp_spin`] on (also where ranks outnumber cores, where it yields to other processes).
    /// Default `DEFAULT_TCP_LAND` (512 KiB), where the copy saved outweighs the receive's
    /// own reads (`docs/tuning-rules.md`).
    pub tcp_land: usize,
    /// Data messages of at most this many bytes to a peer over a plain tokio TCP
    /// connection are written to the socket by the sending task itself, in its call,
    /// when the connection's writer task has nothing queued (else they are queued
    /// behind it, as before). This saves the hand-over to the writer task (a channel,
    /// a wake-up, a task switch) on the latency path. A write the kernel takes only
    /// in part leaves the rest to the writer task, ahead of anything queued later.
    /// Zero: every message goes through the writer task. Not used by io_uring, TLS,
    /// several connections per peer, or shared memory (which writes small messages
    /// into its ring directly by its own means).
    ///
    /// Large slices ([`StreamOptions::tcp_lend`]) go the same way, whatever this
    /// size, when it is not zero: header and payload in one `writev(2)` from the
    /// caller's slice, and a copy of what the kernel does not take to the writer.
    pub tcp_direct: usize,
    /// Data messages of at most this many bytes (and not more than `tcp_direct`)
    /// to a plain tokio TCP peer that are queued for the writer task rather than
    /// written in the call complete their sends at once, while fewer than 32
    /// (`EAGER_BACKLOG`) messages wait for that peer's writer (the queue holds its
    /// own copy of each). Such a message is queued when it comes in a burst (within
    /// `BURST_GAP` of the last direct write to the peer, with nothing heard from it
    /// since, whether or not that send was awaited) or behind messages already waiting for
    /// the writer, which gathers them into one write. The writer task runs when the
    /// executor next runs it: on a current-thread runtime, at the sending task's
    /// next wait. As MPI's eager sends, a completed send means the buffer may be
    /// reused, not that the bytes left the process; a connection that breaks after
    /// that fails the operations that come after. It pays where a root sends
    /// faster than its peers receive (bursts of broadcasts); exchanges are not
    /// bursts and are unaffected. Zero: off (`HCOMM_TCP_EAGER`; measurements in
    /// `docs/tuning-rules.md`).
    pub tcp_eager: usize,
}

/// On a current-thread runtime, a send that comes within this long of the end of
/// the last direct write to the same peer, while the future of that write has not
/// been awaited yet, is queued instead ([`StreamOptions::tcp_direct`]): a window of small sends made before any
/// is awaited then goes out in the writer task's few large writes, not one system
/// call each. A lone message, one sent after a reply came, and one sent after the
/// last was awaited are written directly, since a hand-over to the writer costs
/// more than the system call it would share.
/// A message small enough to be sent eagerly ([`StreamOptions::tcp_eager`]) is
/// queued within this long even after the last send was awaited, unless something
/// came from the peer since: its send then completes without the hand-over.
///
/// The gap is a few times one small `writev`, so that a root sending in a loop stays
/// inside it while an exchange's round trip does not (rule and measurements:
/// `docs/tuning-rules.md`).
const BURST_GAP: Duration = Duration::from_micros(4);

/// How many messages may wait for a peer's writer task while sends to that peer
/// still complete at once ([`StreamOptions::tcp_eager`]); past that, a send waits
/// for its hand-over to the writer as other queued sends do, which also makes a
/// sending task that never waits otherwise give the writer its turn.
pub const EAGER_BACKLOG: usize = 32;

/// Default of [`StreamOptions::tcp_eager`] (`HCOMM_TCP_EAGER`): the size below
/// which the eager copy costs less than waiting for the hand-over.
pub const DEFAULT_TCP_EAGER: usize = 8 << 10;

/// [`StreamOptions::tcp_eager`] where ranks outnumber processors (the bootstrap's
/// choice when `HCOMM_TCP_EAGER` is not set): there the root's queued copies and
/// the writer's larger gathered writes compete with the receivers for the
/// processors.
pub const CROWDED_TCP_EAGER: usize = 4 << 10;

/// How long a frame posted lazily ([`Transport::post_lazy`]) waits for a write to
/// its peer to take it along before its writer task sends it alone (tokio's timer
/// rounds it up to its millisecond tick).
const LAZY_DELAY: Duration = Duration::from_micros(500);

/// Largest payload a lazy frame of signature records grows to by taking in the
/// records posted after it ([`Transport::post_lazy`]).
const LAZY_RUN_MAX: usize = 64 << 10;

/// A lazy frame of signature records this long is sent without waiting for
/// [`LAZY_DELAY`]: a broadcast's root posts a record per operation, about one a
/// microsecond, and the rank that receives them holds every operation that has not
/// met its record (up to `MAX_UNCHECKED` of the collectives, where the root then
/// waits).
const LAZY_RUN_FLUSH: usize = 4 << 10;

/// Default of [`StreamOptions::tcp_direct`] (`HCOMM_TCP_DIRECT`).
pub const DEFAULT_TCP_DIRECT: usize = 64 << 10;

/// Default of [`StreamOptions::tcp_lend`] (`HCOMM_TCP_LEND`).
pub const DEFAULT_TCP_LEND: usize = 64 << 10;

/// Default of [`StreamOptions::tcp_land`] (`HCOMM_TCP_LAND`).
pub const DEFAULT_TCP_LAND: usize = 512 << 10;

/// Default of [`StreamOptions::link_stall`] (`HCOMM_LINK_STALL_US`).
pub const DEFAULT_LINK_STALL: Duration = Duration::from_millis(40);

/// Default of [`StreamOptions::recv_spin`] (`HCOMM_RECV_SPIN_US`).
pub const DEFAULT_RECV_SPIN: Duration = Duration::from_micros(50);

/// Default of [`StreamOptions::tcp_spin`] (`HCOMM_TCP_SPIN_US`).
pub const DEFAULT_TCP_SPIN: Duration = Duration::from_micros(100);

/// How a transport reaches one peer: a TCP connection (`S`: a tokio or a std socket,
/// as the backend takes), several TCP connections used as one stream with striping and
/// failover ([`crate::bundle`], `HCOMM_LINKS`), or shared-memory rings with the
/// connection as doorbell.
#[derive(Debug)]
pub enum PeerLink<S> {
    Tcp(S),
    Bundle(Vec<S>),
    Shm(ShmPair, tokio::net::TcpStream),
    /// A TCP connection under TLS (feature `tls`; driven by tokio under either
    /// backend).
    #[cfg(feature = "tls")]
    Tls(Box<tokio_rustls::TlsStream<tokio::net::TcpStream>>),
}

/// Default of [`StreamOptions::peer_timeout`] (`HCOMM_PEER_TIMEOUT`).
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_millis(600);

impl Default for StreamOptions {
    fn default() -> StreamOptions {
        StreamOptions {
            fragment: 512 << 10,
            peer_timeout: Some(DEFAULT_PEER_TIMEOUT),
            shm: ShmOptions::default(),
            recv_spin: DEFAULT_RECV_SPIN,
            tcp_spin: DEFAULT_TCP_SPIN,
            spin_yield: false,
            link_stall: DEFAULT_LINK_STALL,
            tcp_lend: DEFAULT_TCP_LEND,
            tcp_land: DEFAULT_TCP_LAND,
            tcp_direct: DEFAULT_TCP_DIRECT,
            tcp_eager: DEFAULT_TCP_EAGER,
        }
    }
}

/// `shm` when every peer is reached through shared memory, else `backend`.
fn name_of<S>(links: &[Option<PeerLink<S>>], backend: &'static str) -> &'static str {
    let mut peers = links.iter().flatten().peekable();
    if peers.peek().is_some() && peers.all(|l| matches!(l, PeerLink::Shm(..))) { "shm" } else { backend }
}

/// The tasks that serve one peer: those that read (stopped at once when the transport
/// closes) and the others (writers, which end after the close frame).
#[derive(Debug, Default, Clone)]
struct PeerTasks {
    readers: Vec<AbortHandle>,
    others: Vec<AbortHandle>,
}

/// Milliseconds of a monotonic clock, from the kernel's coarse clock where there is one:
/// the readers note the time of every read with it, and the precise clock (a `rdtsc`
/// and a conversion, tens of nanoseconds on a virtual machine) took a visible share of
/// a small message's path. It moves in the kernel's ticks (a few milliseconds at
/// most), which the peer timeout, hundreds of milliseconds, does not feel.
#[cfg(target_os = "linux")]
fn coarse_ms() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid timespec for the kernel (vDSO) to fill.
    #[allow(unsafe_code)]
    let r = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut t) };
    debug_assert_eq!(r, 0, "CLOCK_MONOTONIC_COARSE exists on every Linux since 2.6.32");
    t.tv_sec as u64 * 1000 + t.tv_nsec as u64 / 1_000_000
}

#[cfg(not(target_os = "linux"))]
fn coarse_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed().as_millis() as u64
}

/// When each peer was last heard from, and the tasks that serve it.
#[derive(Debug)]
pub(crate) struct Links {
    pub(crate) mailbox: Arc<Mailbox>,
    /// [`coarse_ms`] when the links were made.
    epoch: u64,
    /// Milliseconds since `epoch` of the last bytes read from each peer.
    heard: Vec<AtomicU64>,
    /// Per peer, messages handed to its writer task and not yet written: a receive
    /// that reads its own message spins only while its writer has nothing to send
    /// ([`TcpInbox::drain`]).
    pub(crate) unwritten: Vec<std::sync::atomic::AtomicUsize>,
    /// Per peer: held while a message is counted in `unwritten` and handed to the
    /// writer, and while a sending task writes to the socket directly
    /// ([`StreamOptions::tcp_direct`]), which it does only when `unwritten` is zero:
    /// so a direct write never interleaves with the writer task's bytes, and a
    /// message queued before it never goes after it. The vector is a direct write's
    /// scratch space (the lazy frames it takes along).
    pub(crate) wire: Vec<Mutex<Vec<u8>>>,
    /// Per peer: small frames posted lazily ([`Transport::post_lazy`]), each with
    /// its `src` set, to go out with the next write to that peer (the writer task's,
    /// or a direct one) or after [`LAZY_DELAY`]. Signature record frames
    /// ([`RECORDS_SEQ`]) with the key of the last frame in the list join it.
    lazy: Vec<Mutex<Vec<(Header, BytesMut)>>>,
    /// Per peer: notified when its lazy frames were none, so that its writer task
    /// starts the delay.
    lazy_posted: Vec<tokio::sync::Notify>,
    /// Per peer: notified when a frame of records in its lazy list reached
    /// [`LAZY_RUN_FLUSH`] bytes, so that its writer task sends them without waiting
    /// for the delay.
    lazy_full: Vec<tokio::sync::Notify>,
    tasks: Mutex<Vec<PeerTasks>>,
    /// Per peer: its bundle, if it is reached over several connections (for the
    /// watchdog's report of a silent peer).
    bundles: Mutex<Vec<Option<std::sync::Weak<Bundle>>>>,
    closed: AtomicBool,
    /// The readers were stopped (the transport closed): nothing more is received.
    pub(crate) readers_stopped: AtomicBool,
    /// Messages that landed in their receive's buffer (TCP).
    pub(crate) landed: Arc<crate::framing::LandStats>,
    /// Per peer: its reader has stopped (its close frame came, or the connection
    /// ended) and its writer has stopped (our close frame is written, or the
    /// connection failed). An orderly shutdown waits for both.
    pub(crate) reader_done: Vec<AtomicBool>,
    writer_done: Vec<AtomicBool>,
    /// Woken whenever a reader or writer stops.
    stopped: tokio::sync::Notify,
    /// Per peer, when the last direct write to it ended (nanoseconds since the
    /// transport's epoch, written under the peer's wire lock), or 0 once the future
    /// of that send was awaited: see [`BURST_GAP`].
    direct_end: Vec<AtomicU64>,
    /// As `direct_end`, but kept when the send is awaited, and 0 once something
    /// came from the peer: see [`StreamOptions::tcp_eager`].
    eager_end: Vec<AtomicU64>,
    /// Per peer: a data message to it was written or queued since a receive last
    /// read its socket in a first poll (`TcpInbox::poll_first`).
    sent: Vec<AtomicBool>,
    /// Reads of a socket by receives in their first poll, and those that got bytes.
    first_reads: (AtomicU64, AtomicU64),
}

impl Links {
    pub(crate) fn new(mailbox: Arc<Mailbox>, size: usize) -> Links {
        let rank = mailbox.rank();
        Links {
            mailbox,
            epoch: coarse_ms(),
            heard: (0..size).map(|_| AtomicU64::new(0)).collect(),
            unwritten: (0..size).map(|_| std::sync::atomic::AtomicUsize::new(0)).collect(),
            wire: (0..size).map(|_| Mutex::new(Vec::new())).collect(),
            lazy: (0..size).map(|_| Mutex::new(Vec::new())).collect(),
            lazy_posted: (0..size).map(|_| tokio::sync::Notify::new()).collect(),
            lazy_full: (0..size).map(|_| tokio::sync::Notify::new()).collect(),
            tasks: Mutex::new(vec![PeerTasks::default(); size]),
            bundles: Mutex::new(vec![None; size]),
            closed: AtomicBool::new(false),
            readers_stopped: AtomicBool::new(false),
            landed: Arc::default(),
            reader_done: (0..size).map(|p| AtomicBool::new(p == rank)).collect(),
            writer_done: (0..size).map(|p| AtomicBool::new(p == rank)).collect(),
            stopped: tokio::sync::Notify::new(),
            direct_end: (0..size).map(|_| AtomicU64::new(0)).collect(),
            eager_end: (0..size).map(|_| AtomicU64::new(0)).collect(),
            sent: (0..size).map(|_| AtomicBool::new(false)).collect(),
            first_reads: (AtomicU64::new(0), AtomicU64::new(0)),
        }
    }

    fn now_ms(&self) -> u64 {
        coarse_ms().saturating_sub(self.epoch)
    }

    /// The frames posted lazily to `peer` so far, taken to be written.
    fn take_lazy(&self, peer: Rank) -> Vec<(Header, BytesMut)> {
        std::mem::take(&mut *self.lazy[peer].lock())
    }

    /// Appends the frames posted lazily to `peer` to `out`, each encoded whole (see
    /// [`make_whole`]), and empties their list, which keeps its memory (as `out`, the
    /// wire lock's buffer, does: a broadcast's root paid two allocations per
    /// operation for its argument check's frame).
    fn encode_lazy(&self, peer: Rank, out: &mut Vec<u8>) {
        for (mut h, payload) in self.lazy[peer].lock().drain(..) {
            make_whole(&mut h, payload.len());
            out.extend_from_slice(&h.encode());
            out.extend_from_slice(&payload);
        }
    }

    /// How long nothing has been read from `peer`.
    pub(crate) fn silence(&self, peer: Rank) -> Duration {
        Duration::from_millis(self.now_ms().saturating_sub(self.heard[peer].load(Ordering::Relaxed)))
    }

    pub(crate) fn heard_from(&self, peer: Rank) {
        self.heard[peer].store(self.now_ms(), Ordering::Relaxed);
        if let Some(end) = self.eager_end.get(peer) {
            end.store(0, Ordering::Relaxed);
        }
    }

    pub(crate) fn mark(&self, flags: &[AtomicBool], peer: Rank) {
        flags[peer].store(true, Ordering::Release);
        self.stopped.notify_waiters();
    }

    /// The peers whose reader or writer still runs.
    fn unfinished(&self) -> Vec<Rank> {
        (0..self.heard.len())
            .filter(|&p| !self.reader_done[p].load(Ordering::Acquire) || !self.writer_done[p].load(Ordering::Acquire))
            .collect()
    }

    /// Stops serving `peer` (its sockets close when both tasks are gone); an orderly
    /// shutdown no longer waits for it.
    fn drop_peer(&self, peer: Rank) {
        let tasks = std::mem::take(&mut self.tasks.lock()[peer]);
        for h in tasks.readers.iter().chain(&tasks.others) {
            h.abort();
        }
        self.reader_done[peer].store(true, Ordering::Release);
        self.mark(&self.writer_done, peer);
    }
}

/// Fails every peer not heard from within `timeout`, until the transport is closed
/// and done with every peer.
///
/// Silence only counts while this rank's own I/O was moving: a rank whose executor
/// did not run its readers (a task that blocked the thread, a descheduled process)
/// must not blame its peers for bytes it never read. Each round first awaits `probe`,
/// a no-op round trip through the rank's I/O driver (nothing for tokio, whose readiness
/// events are handled even while tasks stay runnable; a NOP submission for io_uring,
/// whose submissions tokio-uring flushes only when the thread parks). A round that
/// comes back later than twice its tick marks a local stall, and a peer's silence is
/// measured from the later of its last bytes and the last local stall. A healthy rank
/// therefore fails a silent peer between `timeout` and `timeout` plus one tick after
/// its last bytes.
async fn watchdog<P, F>(links: Arc<Links>, me: Rank, timeout: Duration, probe: P)
where
    P: Fn() -> F,
    F: Future<Output = ()>,
{
    let timeout = timeout.min(hcomm_core::NEVER);
    let tick = (timeout / 8).max(Duration::from_millis(5));
    let mut last = tokio::time::Instant::now();
    let mut stalled_ms = links.now_ms();
    let mut failed = vec![false; links.heard.len()];
    failed[me] = true;
    loop {
        tokio::time::sleep(tick).await;
        probe().await;
        // Through an orderly shutdown too, until every peer is done with: a rank
        // that learnt of a hung peer's failure from another rank (an abort, a
        // shrink) and then finalizes waits for that peer's reader and writer, which
        // only this stops (measured: 1 run in 4 of `hung_rank_shm` timed out so).
        if links.readers_stopped.load(Ordering::Acquire)
            || (links.closed.load(Ordering::Acquire) && links.unfinished().is_empty())
        {
            return;
        }
        let now = tokio::time::Instant::now();
        let late = now - last > tick * 2;
        last = now;
        if late {
            // This rank's executor or I/O driver lagged: the readers may not have run.
            stalled_ms = links.now_ms();
            continue;
        }
        let now_ms = links.now_ms();
        for (peer, done) in failed.iter_mut().enumerate() {
            if *done {
                continue;
            }
            let since = links.heard[peer].load(Ordering::Relaxed).max(stalled_ms);
            let silent = Duration::from_millis(now_ms.saturating_sub(since));
            if silent > timeout {
                *done = true;
                // Its reader stopped: its close frame came (our writer may still owe
                // it ours) or its connection ended, and either failed it already.
                if links.reader_done[peer].load(Ordering::Acquire) {
                    continue;
                }
                // Failed already when this rank learnt of it otherwise (a peer's
                // abort, a shrink's agreement); dropped all the same: only this stops
                // the reader and writer of a peer that hangs, which an orderly
                // shutdown waits for.
                if links.mailbox.peer_failure(peer).is_none() {
                    let err = Error::new(
                        ErrorKind::PeerFailed,
                        format!(
                            "nothing from rank {peer}, not even a heartbeat, for {} ms (peer timeout {} ms): its \
                             process is stopped or hangs, or its host or network path is down (a rank that is only \
                             busy computing still beats)",
                            silent.as_millis(),
                            timeout.as_millis()
                        ),
                    )
                    .with_peer(peer)
                    .at_rank(me);
                    let bundle = links.bundles.lock()[peer].as_ref().and_then(|b| b.upgrade()).map(|b| b.describe());
                    tracing::warn!(
                        rank = me,
                        peer,
                        silent_ms = silent.as_millis() as u64,
                        links = bundle.as_deref().unwrap_or("one"),
                        "peer silent: failing it"
                    );
                    links.mailbox.fail_peer(peer, err);
                }
                links.drop_peer(peer);
            }
        }
    }
}

/// A peer's connection as the liveness beacon reaches it ([`start_beacon`]).
enum Beat {
    Tcp(std::sync::Weak<TcpInbox>),
    Shm(std::sync::Weak<crate::shm::ShmOut>),
    /// An io_uring connection, through a duplicate of its socket that its writer
    /// task keeps alive (the beacon's reference is weak, so the duplicate closes with
    /// the writer and never keeps a connection open).
    #[cfg(all(feature = "uring", target_os = "linux"))]
    Uring(std::sync::Weak<std::net::TcpStream>),
}

/// Starts this process's liveness beacon for the peers in `beats`: an OS thread that
/// only writes a heartbeat frame to each of them every quarter of `timeout`, when
/// nothing is being written to it, so that peers hear from this rank even while its
/// executor is busy (a long computation on a current-thread runtime). It moves no
/// data and drives nothing, so it is no progress thread; a stopped process (SIGSTOP)
/// stops it too, and is still failed by its peers after `timeout`. Ends when the
/// transport goes away or closes. Connections over TLS or several links per peer
/// get their heartbeats from their writer tasks only: a TLS record needs the
/// session its writer task owns, and a bundle's links carry numbered fragments.
fn start_beacon(links: std::sync::Weak<Links>, rank: Rank, beats: Vec<(Rank, Beat)>, timeout: Duration) {
    if beats.is_empty() {
        return;
    }
    let every = (timeout.min(hcomm_core::NEVER) / 4).max(Duration::from_millis(1));
    let spawned = std::thread::Builder::new().name(format!("hcomm-beacon-{rank}")).spawn(move || {
        let mut frame = Header::control(FrameKind::Heartbeat, OpKind::Bootstrap, rank, 0, 0, 0);
        make_whole(&mut frame, 0);
        let frame = frame.encode();
        loop {
            std::thread::sleep(every);
            let Some(links) = links.upgrade() else { return };
            if links.readers_stopped.load(Ordering::Acquire) {
                return;
            }
            for (peer, beat) in &beats {
                match beat {
                    Beat::Tcp(inbox) => {
                        if let Some(inbox) = inbox.upgrade() {
                            beat_socket(
                                &links,
                                *peer,
                                &frame,
                                |f| inbox.sock.try_write_vectored(f),
                                || inbox.sock.shutdown_both(),
                            );
                        }
                    }
                    #[cfg(all(feature = "uring", target_os = "linux"))]
                    Beat::Uring(sock) => {
                        if let Some(sock) = sock.upgrade() {
                            beat_socket(
                                &links,
                                *peer,
                                &frame,
                                |f| send_now(&sock, f),
                                || {
                                    let _ = sock.shutdown(std::net::Shutdown::Both);
                                },
                            );
                        }
                    }
                    Beat::Shm(out) => {
                        if let Some(out) = out.upgrade() {
                            out.try_beat(&frame);
                        }
                    }
                }
            }
        }
    });
    if let Err(e) = spawned {
        tracing::warn!(rank, error = %e, "no liveness beacon: heartbeats come from the writer tasks only");
    }
}

/// Writes heartbeat `frame` to a single-socket TCP peer with `write` (which must not
/// block) if nothing is being written to it (the same rule as direct writes: under
/// the wire lock, with the writer idle); `cut` ends a connection left with part of a
/// frame.
fn beat_socket(
    links: &Links,
    peer: Rank,
    frame: &[u8],
    write: impl FnOnce(&[std::io::IoSlice<'_>]) -> std::io::Result<usize>,
    cut: impl FnOnce(),
) {
    let Some(_wire) = links.wire[peer].try_lock() else { return };
    if links.unwritten[peer].load(Ordering::Relaxed) != 0 {
        return;
    }
    match write(&[std::io::IoSlice::new(frame)]) {
        Ok(n) if n == frame.len() => {}
        // The socket is full (the peer reads nothing) or broken: the watchdogs and
        // the writer task deal with that.
        Ok(0) | Err(_) => {}
        // A few bytes of a frame and no room for the rest: the stream cannot go on
        // (the kernel takes small writes whole unless its buffer is full to the byte).
        Ok(_) => cut(),
    }
}

/// Sends `parts` on `sock` without blocking, whatever the socket's own mode (an
/// io_uring socket may be in blocking mode, and its mode is shared with every
/// duplicate of it, so it is not changed).
#[cfg(all(feature = "uring", target_os = "linux"))]
fn send_now(sock: &std::net::TcpStream, parts: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
    let [part] = parts else { return Err(std::io::Error::other("one part at a time")) };
    // MSG_NOSIGNAL: a broken connection is an error here, not a SIGPIPE.
    socket2::SockRef::from(sock).send_with_flags(part, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
}

/// A TCP transport over a full mesh of connections. See the module documentation.
#[derive(Debug)]
pub struct StreamTransport {
    rank: Rank,
    size: usize,
    name: &'static str,
    mailbox: Arc<Mailbox>,
    links: Vec<Option<mpsc::UnboundedSender<Outgoing>>>,
    shared: Arc<Links>,
    /// The peers reached over several connections.
    bundles: Vec<Option<Arc<Bundle>>>,
    /// The peers reached over TLS.
    encrypted: Vec<bool>,
    /// The peers reached over shared memory: small sends write into the ring
    /// themselves when its writer task is idle.
    direct: Vec<Option<Arc<crate::shm::ShmOut>>>,
    /// The peers reached over a plain tokio TCP connection whose small data messages
    /// the sending task writes to the socket itself ([`StreamOptions::tcp_direct`]):
    /// their receiving sides, which hold the socket open.
    tcp_direct: Vec<Option<Arc<TcpInbox>>>,
    /// [`StreamOptions::tcp_direct`].
    tcp_direct_max: usize,
    /// [`StreamOptions::tcp_eager`], capped at `tcp_direct_max`.
    tcp_eager_max: usize,
    /// Whether sends in a burst are queued for the writer task ([`BURST_GAP`]):
    /// on a current-thread runtime only, where the hand-over is a task switch. On a
    /// multi-thread runtime it wakes a parked worker, which costs more than the
    /// system calls that gathering saves.
    gather_bursts: bool,
    /// Sends completed at once under [`StreamOptions::tcp_eager`].
    eager_sends: AtomicU64,
    epoch: std::time::Instant,
    /// Messages written directly: whole, and begun (the rest left to the writer).
    direct_writes: (AtomicU64, AtomicU64),
    /// Per peer, the least message [`Transport::send_borrowed`] writes from the
    /// caller's slice in its own polls (`usize::MAX`: none; see
    /// [`StreamOptions::tcp_lend`]).
    lend_min: Vec<usize>,
    /// Sends of large slices ([`StreamOptions::tcp_lend`]), and those of them that
    /// were copied in whole or in part (the kernel did not take them whole at the
    /// call).
    loans: (AtomicU64, AtomicU64),
}

fn broken(peer: Rank, what: &str, e: std::io::Error) -> Error {
    Error::new(ErrorKind::PeerFailed, format!("connection to rank {peer} broke while {what}"))
        .with_peer(peer)
        .with_source(e)
}

pub(crate) fn unannounced_eof(peer: Rank) -> Error {
    Error::new(
        ErrorKind::PeerFailed,
        format!("rank {peer} closed the connection without a close frame (did the process die?)"),
    )
    .with_peer(peer)
}

/// Delivers every complete message in `asm`. `Ok(true)` once the peer's close frame
/// has been delivered.
///
/// # Errors
/// A protocol error for what breaks the framing, and for the frames only
/// shared-memory links carry (lent messages and their releases).
pub(crate) fn deliver_all(asm: &mut Assembler, mailbox: &Mailbox) -> Result<bool> {
    while let Some(f) = asm.next_frame()? {
        if matches!(f.header.kind, FrameKind::Pull | FrameKind::Release) {
            return Err(Error::new(
                ErrorKind::Protocol,
                format!("a {:?} frame arrived on a link that is not shared memory", f.header.kind),
            ));
        }
        let close = f.header.kind == FrameKind::Close;
        mailbox.deliver(f);
        if close {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Moves newly queued messages into `q`; `true` once the close frame is queued (no
/// message after it is sent).
fn gather(q: &mut WriteQueue, first: Outgoing, rx: &mut mpsc::UnboundedReceiver<Outgoing>) -> bool {
    let mut closing = first.header.kind == FrameKind::Close;
    q.push(first);
    while !closing {
        match rx.try_recv() {
            Ok(o) => {
                closing = o.header.kind == FrameKind::Close;
                q.push(o);
            }
            Err(_) => break,
        }
    }
    closing
}

/// Moves the frames posted lazily to `peer` into the writer's queue, counted as
/// unwritten (under the wire lock, as every message handed to the writer); `false`
/// if there were none. Under the same lock it first moves in what waits in `rx`
/// (unless `closing`): the rest of a frame that a sending task began writing directly
/// may be there, and nothing may go to the socket before it, these frames least of
/// all.
fn take_lazy(
    links: &Links,
    peer: Rank,
    q: &mut WriteQueue,
    rx: &mut mpsc::UnboundedReceiver<Outgoing>,
    closing: &mut bool,
) -> bool {
    // The wire lock only when there is something to take: a direct write that finds
    // it held goes to the writer instead.
    if links.lazy[peer].lock().is_empty() {
        return false;
    }
    let _wire = links.wire[peer].lock();
    if !*closing && let Ok(o) = rx.try_recv() {
        *closing = gather(q, o, rx);
    }
    let frames = links.take_lazy(peer);
    if frames.is_empty() {
        return false;
    }
    links.unwritten[peer].fetch_add(frames.len(), Ordering::Relaxed);
    for (h, payload) in frames {
        q.push(Outgoing::new(h, payload.freeze(), None));
    }
    true
}

/// Makes `h` the header of one whole frame of `len` bytes, numbered apart from the
/// writer task's messages (whose frames never interleave with it), as direct writes
/// send them.
fn make_whole(h: &mut Header, len: usize) {
    h.msg_id = u64::MAX;
    h.msg_len = len as u64;
    h.offset = 0;
    h.frag_len = len as u32;
}

fn fail_queue(q: &mut WriteQueue, rx: &mut mpsc::UnboundedReceiver<Outgoing>, err: &Error) {
    q.fail_all(err);
    rx.close();
    while let Ok(o) = rx.try_recv() {
        if let Some(tx) = o.done {
            let _ = tx.send(Err(err.clone()));
        }
    }
}

impl StreamTransport {
    fn new(
        rank: Rank,
        size: usize,
        name: &'static str,
    ) -> (StreamTransport, Vec<Option<mpsc::UnboundedReceiver<Outgoing>>>) {
        let mut links = Vec::with_capacity(size);
        let mut rxs = Vec::with_capacity(size);
        for peer in 0..size {
            if peer == rank {
                links.push(None);
                rxs.push(None);
            } else {
                let (tx, rx) = mpsc::unbounded_channel();
                links.push(Some(tx));
                rxs.push(Some(rx));
            }
        }
        let mailbox = Arc::new(Mailbox::new(rank));
        let shared = Arc::new(Links::new(mailbox.clone(), size));
        let t = StreamTransport {
            rank,
            size,
            name,
            mailbox,
            links,
            shared,
            bundles: vec![None; size],
            encrypted: vec![false; size],
            direct: vec![None; size],
            tcp_direct: vec![None; size],
            tcp_direct_max: 0,
            tcp_eager_max: 0,
            gather_bursts: true,
            eager_sends: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
            direct_writes: (AtomicU64::new(0), AtomicU64::new(0)),
            lend_min: vec![usize::MAX; size],
            loans: (AtomicU64::new(0), AtomicU64::new(0)),
        };
        (t, rxs)
    }

    /// A transport over tokio sockets: `streams[p]` is the connection to rank `p`
    /// (`None` at `rank`), as [`crate::connect_mesh`] returns them. Spawns one reader and
    /// one writer task per peer with `tokio::spawn`, so it must be called inside a
    /// tokio runtime.
    pub fn tokio(rank: Rank, streams: Vec<Option<tokio::net::TcpStream>>, opts: &StreamOptions) -> StreamTransport {
        StreamTransport::tokio_links(rank, streams.into_iter().map(|s| s.map(PeerLink::Tcp)).collect(), opts)
    }

    /// As [`StreamTransport::tokio`], with a shared-memory link to the peers that
    /// have one (from [`crate::shm::negotiate`]).
    pub fn tokio_links(
        rank: Rank,
        links: Vec<Option<PeerLink<tokio::net::TcpStream>>>,
        opts: &StreamOptions,
    ) -> StreamTransport {
        let (mut t, rxs) = StreamTransport::new(rank, links.len(), name_of(&links, "tcp"));
        t.gather_bursts =
            tokio::runtime::Handle::current().runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread;
        let heartbeat = opts.peer_timeout.map(|d| d / 4);
        let mut inboxes = vec![None; links.len()];
        let mut polled: Vec<Option<std::sync::Weak<dyn hcomm_core::mailbox::PollLink>>> = vec![None; links.len()];
        let mut beats = Vec::new();
        for (peer, (link, rx)) in links.into_iter().zip(rxs).enumerate() {
            let (Some(link), Some(rx)) = (link, rx) else { continue };
            let tasks = match link {
                PeerLink::Tcp(s) => {
                    if opts.tcp_lend > 0 {
                        t.lend_min[peer] = opts.tcp_lend;
                    }
                    let sock = match crate::tcp::TcpSock::new(s) {
                        Ok(sock) => Arc::new(sock),
                        Err(e) => {
                            t.mailbox.fail_peer(peer, broken(peer, "setting up the connection", e));
                            continue;
                        }
                    };
                    let inbox = Arc::new(TcpInbox::new(sock.clone(), peer, t.shared.clone(), opts));
                    if opts.tcp_direct > 0 {
                        t.tcp_direct[peer] = Some(inbox.clone());
                        t.tcp_direct_max = opts.tcp_direct;
                        t.tcp_eager_max = opts.tcp_eager.min(opts.tcp_direct);
                    }
                    polled[peer] = Some(Arc::downgrade(&inbox) as std::sync::Weak<dyn hcomm_core::mailbox::PollLink>);
                    beats.push((peer, Beat::Tcp(Arc::downgrade(&inbox))));
                    // Where receives spin on the socket themselves on a multi-thread
                    // runtime, a reader spinning on another worker between messages
                    // races them for each message, and each message it wins costs a
                    // wake-up of the receive's thread. On a current-thread runtime the
                    // two take turns on one thread and cannot race.
                    let between = !on_multi_thread_runtime() || opts.recv_spin.is_zero();
                    let r = tokio::spawn(tcp_read_task(inbox, opts.tcp_spin, between, opts.spin_yield));
                    let wr = tokio_io::TcpWrite(sock);
                    let w = tokio::spawn(write_loop(wr, rx, peer, t.shared.clone(), opts.fragment, heartbeat));
                    PeerTasks { readers: vec![r.abort_handle()], others: vec![w.abort_handle()] }
                }
                PeerLink::Bundle(streams) => {
                    let b = t.bundle(peer, &streams, opts);
                    let mut tasks = PeerTasks::default();
                    for (i, s) in streams.into_iter().enumerate() {
                        let (rd, wr) = s.into_split();
                        let rd = tokio_io::TcpRead { half: rd, spin: opts.tcp_spin, yield_os: opts.spin_yield };
                        tasks.readers.push(tokio::spawn(bundle::link_reader(b.clone(), i, rd)).abort_handle());
                        let w = tokio::spawn(bundle::link_writer(b.clone(), i, wr)).abort_handle();
                        b.add_writer(w.clone());
                        tasks.others.push(w);
                    }
                    tasks.readers.push(tokio::spawn(bundle::monitor(b.clone())).abort_handle());
                    let wl = write_loop(BundleWriter(b), rx, peer, t.shared.clone(), opts.fragment, heartbeat);
                    tasks.others.push(tokio::spawn(wl).abort_handle());
                    tasks
                }
                #[cfg(feature = "tls")]
                PeerLink::Tls(s) => t.spawn_tls(peer, *s, rx, opts.fragment, heartbeat),
                PeerLink::Shm(pair, s) => {
                    let sp = t.shm_link(peer, pair, s, opts, &mut inboxes);
                    beats.push((peer, Beat::Shm(Arc::downgrade(&sp.out))));
                    // As over TCP (above): where receives spin on the ring themselves
                    // on a multi-thread runtime, the reader does not spin beside them.
                    let spin = if on_multi_thread_runtime() && !opts.recv_spin.is_zero() {
                        Duration::ZERO
                    } else {
                        opts.shm.spin
                    };
                    let r = tokio::spawn(crate::shm::read_task(sp.inbox, spin));
                    let w = tokio::spawn(write_loop(sp.writer, rx, peer, t.shared.clone(), opts.fragment, heartbeat));
                    let b = tokio::spawn(sp.doorbell);
                    PeerTasks { readers: vec![r.abort_handle()], others: vec![w.abort_handle(), b.abort_handle()] }
                }
            };
            t.shared.tasks.lock()[peer] = tasks;
        }
        t.poll_links(inboxes, polled, opts);
        if let Some(timeout) = opts.peer_timeout {
            tokio::spawn(watchdog(t.shared.clone(), rank, timeout, || async {}));
            start_beacon(Arc::downgrade(&t.shared), rank, beats, timeout);
        }
        t
    }

    /// A transport over io_uring (tokio-uring): like [`StreamTransport::tokio`] but the
    /// sockets are driven by io_uring submissions. Must be called inside
    /// `tokio_uring::start`; the tasks are spawned with `tokio_uring::spawn`.
    #[cfg(all(feature = "uring", target_os = "linux"))]
    pub fn uring(rank: Rank, streams: Vec<Option<std::net::TcpStream>>, opts: &StreamOptions) -> StreamTransport {
        StreamTransport::uring_links(rank, streams.into_iter().map(|s| s.map(PeerLink::Tcp)).collect(), opts)
    }

    /// As [`StreamTransport::uring`], with a shared-memory link to the peers that
    /// have one (their doorbell connections stay tokio sockets).
    #[cfg(all(feature = "uring", target_os = "linux"))]
    pub fn uring_links(
        rank: Rank,
        links: Vec<Option<PeerLink<std::net::TcpStream>>>,
        opts: &StreamOptions,
    ) -> StreamTransport {
        let (mut t, rxs) = StreamTransport::new(rank, links.len(), name_of(&links, "uring"));
        let heartbeat = opts.peer_timeout.map(|d| d / 4);
        let mut inboxes = vec![None; links.len()];
        let mut beats = Vec::new();
        for (peer, (link, rx)) in links.into_iter().zip(rxs).enumerate() {
            let (Some(link), Some(rx)) = (link, rx) else { continue };
            let tasks = match link {
                PeerLink::Tcp(s) => {
                    // The beacon's way to this socket, alive while the writer is.
                    let beat = match s.try_clone() {
                        Ok(dup) => Some(Arc::new(dup)),
                        Err(e) => {
                            tracing::warn!(peer, error = %e, "no beacon for this connection: heartbeats come from its writer only");
                            None
                        }
                    };
                    if let Some(b) = &beat {
                        beats.push((peer, Beat::Uring(Arc::downgrade(b))));
                    }
                    let s = std::rc::Rc::new(tokio_uring::net::TcpStream::from_std(s));
                    let r = tokio_uring::spawn(read_loop(uring_io::UringLink(s.clone()), peer, t.shared.clone()));
                    let wl = write_loop(uring_io::UringLink(s), rx, peer, t.shared.clone(), opts.fragment, heartbeat);
                    let w = tokio_uring::spawn(async move {
                        let _beat = beat;
                        wl.await
                    });
                    PeerTasks { readers: vec![r.abort_handle()], others: vec![w.abort_handle()] }
                }
                PeerLink::Bundle(streams) => {
                    let b = t.bundle(peer, &streams, opts);
                    let mut tasks = PeerTasks::default();
                    for (i, s) in streams.into_iter().enumerate() {
                        let s = std::rc::Rc::new(tokio_uring::net::TcpStream::from_std(s));
                        let r = tokio_uring::spawn(bundle::link_reader(b.clone(), i, uring_io::UringLink(s.clone())));
                        tasks.readers.push(r.abort_handle());
                        let w = tokio_uring::spawn(bundle::link_writer(b.clone(), i, uring_io::UringLink(s)));
                        b.add_writer(w.abort_handle());
                        tasks.others.push(w.abort_handle());
                    }
                    tasks.readers.push(tokio_uring::spawn(bundle::monitor(b.clone())).abort_handle());
                    let wl = write_loop(BundleWriter(b), rx, peer, t.shared.clone(), opts.fragment, heartbeat);
                    tasks.others.push(tokio_uring::spawn(wl).abort_handle());
                    tasks
                }
                #[cfg(feature = "tls")]
                PeerLink::Tls(s) => t.spawn_tls(peer, *s, rx, opts.fragment, heartbeat),
                PeerLink::Shm(pair, s) => {
                    let sp = t.shm_link(peer, pair, s, opts, &mut inboxes);
                    beats.push((peer, Beat::Shm(Arc::downgrade(&sp.out))));
                    let r = tokio_uring::spawn(crate::shm::read_task(sp.inbox, opts.shm.spin));
                    let w =
                        tokio_uring::spawn(write_loop(sp.writer, rx, peer, t.shared.clone(), opts.fragment, heartbeat));
                    let b = tokio_uring::spawn(sp.doorbell);
                    PeerTasks { readers: vec![r.abort_handle()], others: vec![w.abort_handle(), b.abort_handle()] }
                }
            };
            t.shared.tasks.lock()[peer] = tasks;
        }
        let size = t.size;
        t.poll_links(inboxes, vec![None; size], opts);
        if let Some(timeout) = opts.peer_timeout {
            tokio_uring::spawn(watchdog(t.shared.clone(), rank, timeout, || async {
                // An error here (no submission slot) only skips the probe.
                let _ = tokio_uring::no_op().await;
            }));
            start_beacon(Arc::downgrade(&t.shared), rank, beats, timeout);
        }
        t
    }

    /// Queues a message for `peer`'s writer task, or, if `direct` and the peer is
    /// reached over shared memory with an idle writer, writes it into the ring at
    /// once. With `want_done`, a queued message comes with the receiver of its
    /// hand-over; `Ok(None)`: nothing to wait for (written already, or not asked).
    fn enqueue(
        &self,
        peer: Rank,
        mut header: Header,
        payload: Bytes,
        want_done: bool,
        direct: bool,
    ) -> Result<Option<oneshot::Receiver<Result<()>>>> {
        if peer >= self.size {
            return Err(Error::invalid(format!("peer rank {peer} out of range for {} ranks", self.size)));
        }
        header.src = self.rank as u32;
        if self.links[peer].is_none() {
            // To ourselves: straight into the mailbox.
            header.msg_len = payload.len() as u64;
            self.mailbox.deliver(Frame::new(header, payload));
            return Ok(None);
        };
        // A close frame still goes to a peer that closed first (it waits for ours to
        // finish its shutdown); the writer of a broken link is gone and refuses it.
        if header.kind != FrameKind::Close
            && let Some(e) = self.mailbox.peer_failure(peer)
        {
            return Err(e);
        }
        if direct
            && header.kind == FrameKind::Data
            && let Some(done) = self.write_direct(peer, header, &payload, want_done, false)
        {
            return done;
        }
        let want_done = want_done && !self.eager(peer, &header, payload.len());
        match &self.direct[peer] {
            Some(out) => {
                let mut queued = Ok(None);
                // Data messages (a large one becomes a pull frame in the ring, its
                // payload lent to the peer).
                let direct = direct && matches!(header.kind, FrameKind::Data | FrameKind::Pull);
                out.send(header, payload, direct, |h, p| queued = self.queue(peer, h, p, want_done));
                queued
            }
            None => self.queue(peer, header, payload, want_done),
        }
    }

    /// Writes data message `header` (its `src` set) with payload `data` to the plain
    /// TCP connection to `peer` in this call, if [`StreamOptions::tcp_direct`] allows
    /// it and the writer task holds nothing: `Some(Ok(None))` once the kernel has it
    /// all; if it took only part, a copy of the rest is queued to the writer task
    /// (ahead of anything queued later, with the receiver of its hand-over if
    /// `want_done`). `None`: nothing was written, the caller queues the message. A
    /// `large` message ([`StreamOptions::tcp_lend`]) may be as large as a frame may
    /// be, and is never held back as part of a burst.
    fn write_direct(
        &self,
        peer: Rank,
        mut header: Header,
        data: &[u8],
        want_done: bool,
        large: bool,
    ) -> Option<Result<Option<oneshot::Receiver<Result<()>>>>> {
        let inbox = self.tcp_direct.get(peer)?.as_ref()?;
        if hcomm_core::transport::gathering() {
            return None;
        }
        let len = data.len();
        let most = if large { hcomm_core::wire::MAX_FRAGMENT as usize } else { self.tcp_direct_max };
        if len > most || self.shared.unwritten[peer].load(Ordering::Relaxed) != 0 {
            return None;
        }
        let mut wire = self.shared.wire[peer].try_lock()?;
        if self.shared.unwritten[peer].load(Ordering::Relaxed) != 0 || self.mailbox.peer_failure(peer).is_some() {
            return None;
        }
        // The clock only if the last direct write is not awaited yet (0 once it is),
        // or, for a message small enough to be sent eagerly, nothing came from the
        // peer since. A large message is never gathered: its payload is written alone.
        let ends = if len <= self.tcp_eager_max { &self.shared.eager_end } else { &self.shared.direct_end };
        let last = ends[peer].load(Ordering::Relaxed);
        if !large
            && self.gather_bursts
            && last != 0
            && (self.epoch.elapsed().as_nanos() as u64).saturating_sub(last) < BURST_GAP.as_nanos() as u64
        {
            // A burst: the writer task gathers it into few system calls.
            return None;
        }
        // One whole frame, numbered apart from the writer's messages (whose frames
        // never interleave with it: the writer holds nothing); the frames posted
        // lazily to this peer go first, in the same system call.
        make_whole(&mut header, len);
        let head = header.encode();
        wire.clear();
        if wire.capacity() > 64 << 10 {
            *wire = Vec::new();
        }
        self.shared.encode_lazy(peer, &mut wire);
        let lazy = &wire[..];
        let parts = [std::io::IoSlice::new(lazy), std::io::IoSlice::new(&head), std::io::IoSlice::new(data)];
        self.shared.sent[peer].store(true, Ordering::Relaxed);
        let n = inbox.sock.try_write_vectored(&parts);
        let end = self.epoch.elapsed().as_nanos().max(1) as u64;
        self.shared.direct_end[peer].store(end, Ordering::Relaxed);
        self.shared.eager_end[peer].store(end, Ordering::Relaxed);
        let total = lazy.len() + head.len() + len;
        let n = match n {
            Ok(n) if n == total => {
                self.direct_writes.0.fetch_add(1, Ordering::Relaxed);
                return Some(Ok(None));
            }
            Ok(n) => n,
            // Full, or broken (the reader and writer report that): the writer's turn.
            Err(_) if lazy.is_empty() => return None,
            Err(_) => 0,
        };
        let (tx, rx) = match want_done {
            true => {
                let (tx, rx) = oneshot::channel();
                (Some(tx), Some(rx))
            }
            false => (None, None),
        };
        // What is left is copied: `data` is borrowed for this call only.
        let parts: &[&[u8]] = &[lazy, &head[..], data];
        let mut rest = BytesMut::with_capacity(parts.iter().map(|p| p.len()).sum::<usize>().saturating_sub(n));
        let mut skip = n;
        for part in parts {
            let from = skip.min(part.len());
            rest.extend_from_slice(&part[from..]);
            skip -= from;
        }
        let rest = Outgoing::rest(header, rest.freeze(), tx);
        self.direct_writes.1.fetch_add(1, Ordering::Relaxed);
        // Still under the wire lock: nothing can be queued before the rest.
        self.shared.unwritten[peer].fetch_add(1, Ordering::Relaxed);
        let link = self.links[peer].as_ref().expect("a TCP peer has a writer");
        if link.send(rest).is_err() {
            self.shared.unwritten[peer].fetch_sub(1, Ordering::Relaxed);
            // The writer is gone mid-frame: the connection is of no more use.
            return Some(Err(self.mailbox.peer_failure(peer).unwrap_or_else(|| {
                Error::new(ErrorKind::Closed, "transport closed while a message was being sent")
                    .at_rank(self.rank)
                    .with_peer(peer)
            })));
        }
        Some(Ok(rx))
    }

    /// Whether a data message of `len` bytes to `peer` that is to be queued (not
    /// written in the call) completes its send at once ([`StreamOptions::tcp_eager`]):
    /// its bytes are the queue's own, the peer is a plain TCP one, and fewer than
    /// [`EAGER_BACKLOG`] messages wait for its writer task. Counted if so.
    fn eager(&self, peer: Rank, header: &Header, len: usize) -> bool {
        let eager = header.kind == FrameKind::Data
            && len <= self.tcp_eager_max
            && self.tcp_direct.get(peer).is_some_and(Option::is_some)
            && self.shared.unwritten[peer].load(Ordering::Relaxed) < EAGER_BACKLOG;
        if eager {
            self.eager_sends.fetch_add(1, Ordering::Relaxed);
        }
        eager
    }

    /// Hands a message to `peer`'s writer task; with `want_done`, with the receiver of
    /// its hand-over to the kernel (or the ring).
    fn queue(
        &self,
        peer: Rank,
        header: Header,
        payload: Bytes,
        want_done: bool,
    ) -> Result<Option<oneshot::Receiver<Result<()>>>> {
        self.queue_outgoing(peer, Outgoing::new(header, payload, None), want_done)
    }

    /// [`queue`](Self::queue) for a message already made up (a lent one, say).
    fn queue_outgoing(
        &self,
        peer: Rank,
        mut message: Outgoing,
        want_done: bool,
    ) -> Result<Option<oneshot::Receiver<Result<()>>>> {
        let closed = || {
            self.mailbox
                .peer_failure(peer)
                .unwrap_or_else(|| Error::new(ErrorKind::Closed, "transport closed").at_rank(self.rank).with_peer(peer))
        };
        let link = self.links.get(peer).and_then(Option::as_ref).ok_or_else(closed)?;
        let rx = want_done.then(|| {
            let (tx, rx) = oneshot::channel();
            message.done = Some(tx);
            rx
        });
        if message.header.kind == FrameKind::Data {
            self.shared.sent[peer].store(true, Ordering::Relaxed);
        }
        let _wire = self.shared.wire[peer].lock();
        self.shared.unwritten[peer].fetch_add(1, Ordering::Relaxed);
        link.send(message).map_err(|_| {
            self.shared.unwritten[peer].fetch_sub(1, Ordering::Relaxed);
            closed()
        })?;
        Ok(rx)
    }

    /// Waits for the hand-over of a message [`enqueue`](Self::enqueue) or
    /// [`queue`](Self::queue) queued (nothing, if it was written already).
    fn handed_over(
        &self,
        peer: Rank,
        queued: Result<Option<oneshot::Receiver<Result<()>>>>,
    ) -> impl Future<Output = Result<()>> + Send + use<> {
        let rank = self.rank;
        let shared = self.shared.clone();
        async move {
            let Some(rx) = queued? else {
                // Written already (or needing no writer): its sender awaits it, so a
                // send that comes next follows it rather than joining it in a burst.
                if let Some(end) = shared.direct_end.get(peer) {
                    end.store(0, Ordering::Relaxed);
                }
                return Ok(());
            };
            // The writer went away with the message: its peer failed (the watchdog
            // stopped it) or the transport closed.
            rx.await.unwrap_or_else(|_| {
                Err(shared.mailbox.peer_failure(peer).unwrap_or_else(|| {
                    Error::new(ErrorKind::Closed, "transport closed before the message was sent")
                        .at_rank(rank)
                        .with_peer(peer)
                }))
            })
        }
    }

    /// Spreads a shared-memory pair with `peer` into its parts, keeps its sending
    /// half for direct sends and its receiving half for receives that poll.
    fn shm_link(
        &mut self,
        peer: Rank,
        pair: ShmPair,
        stream: tokio::net::TcpStream,
        opts: &StreamOptions,
        inboxes: &mut [Option<std::sync::Weak<crate::shm::ShmInbox>>],
    ) -> crate::shm::Split {
        let queue = self.links[peer].as_ref().expect("a peer other than this rank has a queue").downgrade();
        let sp = crate::shm::split(pair, stream, opts.shm.spin, (self.rank, peer), self.shared.clone(), queue);
        self.direct[peer] = Some(sp.out.clone());
        inboxes[peer] = Some(Arc::downgrade(&sp.inbox));
        sp
    }

    /// Lets waiting receives from shared-memory peers (`inboxes`) and plain tokio TCP
    /// peers (`polled`) read the link themselves ([`hcomm_core::mailbox::Progress`]),
    /// which spares the hand-over from the reader task when the receiving task is
    /// polled first, and lets a large message land in its receive's buffer
    /// ([`hcomm_core::landing`], TCP).
    fn poll_links(
        &self,
        inboxes: Vec<Option<std::sync::Weak<crate::shm::ShmInbox>>>,
        mut polled: Vec<Option<std::sync::Weak<dyn hcomm_core::mailbox::PollLink>>>,
        opts: &StreamOptions,
    ) {
        for (p, shm) in polled.iter_mut().zip(inboxes) {
            if let Some(w) = shm {
                *p = Some(w);
            }
        }
        if polled.iter().all(Option::is_none) {
            return;
        }
        // Weak: the mailbox must not keep the links (which hold it) alive.
        let link =
            move |src: Rank| -> Option<Arc<dyn hcomm_core::mailbox::PollLink>> { polled.get(src)?.as_ref()?.upgrade() };
        let shared = Arc::downgrade(&self.shared);
        let busy = move || shared.upgrade().is_some_and(|l| l.unwritten.iter().any(|u| u.load(Ordering::Relaxed) != 0));
        self.mailbox.set_progress(hcomm_core::mailbox::Progress {
            link: Box::new(link),
            spin: opts.recv_spin,
            busy: Box::new(busy),
            yield_os: opts.spin_yield,
        });
    }
    /// [`Transport::send_borrowed`] to a peer whose connection does not take loans
    /// of its own. A small message goes to the ring or the socket straight from
    /// `data`, in this call, when nothing is queued before it; anything else is
    /// copied into a payload the transport owns, which a shared-memory peer may then
    /// copy out of this process's memory itself ([`crate::shm`]).
    fn send_borrowed_shm_or_copy(
        &self,
        peer: Rank,
        mut header: Header,
        data: &[u8],
    ) -> impl Future<Output = Result<()>> + Send + use<> {
        header.src = self.rank as u32;
        let out = self.direct.get(peer).and_then(Option::as_ref);
        let queued = match out {
            Some(out) if !out.lends(data.len()) && self.mailbox.peer_failure(peer).is_none() => {
                let mut queued = Ok(None);
                out.send_slice(header, data, |h| {
                    queued = self.queue(peer, h, self.payload_from(data), true);
                });
                queued
            }
            // A small message over plain TCP goes to the socket straight from `data`
            // when nothing is queued before it (tried once: the copy is queued
            // without another try).
            None if self.tcp_direct.get(peer).is_some_and(Option::is_some) => {
                let written =
                    (header.kind == FrameKind::Data).then(|| self.write_direct(peer, header, data, true, false));
                written.flatten().unwrap_or_else(|| self.enqueue(peer, header, self.payload_from(data), true, false))
            }
            _ => self.enqueue(peer, header, self.payload_from(data), true, true),
        };
        self.handed_over(peer, queued)
    }

    /// [`Transport::send_borrowed`] of a large slice over a plain tokio TCP connection
    /// ([`StreamOptions::tcp_lend`]): written from the slice in this call, as one
    /// frame, when the connection's writer task holds nothing; what the kernel does
    /// not take then, or the whole message if the writer is busy, is copied for the
    /// writer.
    fn send_large_tcp(
        &self,
        peer: Rank,
        mut header: Header,
        data: &[u8],
    ) -> impl Future<Output = Result<()>> + Send + use<> {
        header.src = self.rank as u32;
        let queued = match self.mailbox.peer_failure(peer) {
            Some(e) => Err(e),
            None => {
                self.loans.0.fetch_add(1, Ordering::Relaxed);
                let written = self.write_direct(peer, header, data, true, true);
                if !matches!(written, Some(Ok(None))) {
                    self.loans.1.fetch_add(1, Ordering::Relaxed);
                }
                written.unwrap_or_else(|| self.enqueue(peer, header, self.payload_from(data), true, false))
            }
        };
        self.handed_over(peer, queued)
    }
}

impl Transport for StreamTransport {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn name(&self) -> &'static str {
        self.name
    }

    fn mailbox(&self) -> &Arc<Mailbox> {
        &self.mailbox
    }

    fn send(&self, peer: Rank, header: Header, payload: Bytes) -> impl Future<Output = Result<()>> + Send {
        self.handed_over(peer, self.enqueue(peer, header, payload, true, true))
    }

    /// Over a plain tokio TCP connection, a large message goes to the socket straight
    /// from `data` in the call when the writer is idle, and what the kernel does not
    /// take is copied ([`StreamOptions::tcp_lend`]). Anything else is copied at the
    /// call, into memory a shared-memory peer may then read itself ([`crate::shm`]).
    /// Either way, `data` is not touched after the call.
    fn send_borrowed(&self, peer: Rank, header: Header, data: &[u8]) -> impl Future<Output = Result<()>> + Send {
        use futures::future::Either;
        match self.lend_min.get(peer) {
            Some(&min) if data.len() >= min => Either::Left(self.send_large_tcp(peer, header, data)),
            _ => Either::Right(self.send_borrowed_shm_or_copy(peer, header, data)),
        }
    }

    fn post(&self, peer: Rank, header: Header, payload: Bytes) {
        let _ = self.enqueue(peer, header, payload, false, false);
    }

    /// Over TCP, the frame waits in the peer's lazy list until the next write to
    /// that peer takes it along (a direct write in the same system call), or until
    /// its writer task's delay (`LAZY_DELAY`) is over. Over shared memory it goes
    /// into the ring in this call when the writer task holds nothing: handing it to
    /// the writer task would wake that task for every collective, and make the
    /// operation's own data wait behind it. To ourselves and to peers over several
    /// connections, it is posted at once.
    fn post_lazy(&self, peer: Rank, mut header: Header, payload: &[u8]) {
        if self.direct.get(peer).is_some_and(Option::is_some) {
            let _ = self.enqueue(peer, header, Bytes::copy_from_slice(payload), false, true);
            return;
        }
        if peer >= self.size || self.links[peer].is_none() {
            return self.post(peer, header, Bytes::copy_from_slice(payload));
        }
        if self.mailbox.peer_failure(peer).is_some() {
            return;
        }
        header.src = self.rank as u32;
        let mut lazy = self.shared.lazy[peer].lock();
        // A run of signature records joins the last frame if it is one of the same
        // key: a broadcast's root posts one record per operation, and one frame of a
        // hundred records costs the writer and the reader one frame's work.
        if let Some((last, run)) = lazy.last_mut()
            && header.seq == RECORDS_SEQ
            && header.kind == FrameKind::Data
            && (last.seq, last.kind, last.comm, last.tag) == (header.seq, header.kind, header.comm, header.tag)
            && run.len() + payload.len() <= LAZY_RUN_MAX
        {
            let before = run.len();
            run.extend_from_slice(payload);
            last.msg_len = run.len() as u64;
            if before < LAZY_RUN_FLUSH && run.len() >= LAZY_RUN_FLUSH {
                self.shared.lazy_full[peer].notify_one();
            }
            return;
        }
        // Room for a few dozen records to join it.
        let mut run = BytesMut::with_capacity(if header.seq == RECORDS_SEQ { 1 << 10 } else { payload.len() });
        run.extend_from_slice(payload);
        lazy.push((header, run));
        if lazy.len() == 1 {
            self.shared.lazy_posted[peer].notify_one();
        }
    }

    fn close(&self) {
        if self.post_closes() {
            self.stop_readers();
        }
    }

    async fn shutdown(&self, deadline: Duration) -> Result<()> {
        self.post_closes();
        let shared = &self.shared;
        let all_done = async {
            loop {
                let stopped = shared.stopped.notified();
                tokio::pin!(stopped);
                stopped.as_mut().enable();
                if shared.unfinished().is_empty() {
                    return;
                }
                stopped.await;
            }
        };
        let waited = tokio::time::timeout(deadline, all_done).await;
        self.stop_readers();
        match waited {
            Ok(()) => Ok(()),
            Err(_) => Err(Error::new(
                ErrorKind::Timeout,
                format!(
                    "shutdown: ranks {:?} had not closed (or this rank had not written everything to them) after {} ms",
                    shared.unfinished(),
                    deadline.as_millis()
                ),
            )
            .at_rank(self.rank)),
        }
    }
}

impl StreamTransport {
    /// Reader and writer of a TLS connection, as tokio tasks (the TLS stream is a tokio
    /// one under either backend).
    #[cfg(feature = "tls")]
    fn spawn_tls(
        &mut self,
        peer: Rank,
        s: tokio_rustls::TlsStream<tokio::net::TcpStream>,
        rx: mpsc::UnboundedReceiver<Outgoing>,
        fragment: usize,
        heartbeat: Option<Duration>,
    ) -> PeerTasks {
        self.encrypted[peer] = true;
        let (rd, wr) = tokio::io::split(s);
        let r = tokio::spawn(read_loop(tls_io::Read(rd), peer, self.shared.clone()));
        let w = tokio::spawn(write_loop(tls_io::Write(wr), rx, peer, self.shared.clone(), fragment, heartbeat));
        PeerTasks { readers: vec![r.abort_handle()], others: vec![w.abort_handle()] }
    }

    /// The bundle of `streams` to `peer`, registered for [`StreamTransport::link_stats`].
    fn bundle<S: std::os::fd::AsFd>(&mut self, peer: Rank, streams: &[S], opts: &StreamOptions) -> Arc<Bundle> {
        // Duplicates of the sockets, for `break_link` only; without them (out of
        // descriptors) that test hook reports an error and nothing else changes.
        let fds = streams.iter().map(|s| s.as_fd().try_clone_to_owned()).collect::<std::io::Result<Vec<_>>>();
        let b =
            Arc::new(Bundle::new(peer, streams.len(), self.shared.clone(), opts.link_stall, fds.unwrap_or_default()));
        self.bundles[peer] = Some(b.clone());
        self.shared.bundles.lock()[peer] = Some(Arc::downgrade(&b));
        b
    }

    /// How many large slices [`Transport::send_borrowed`] sent to TCP peers
    /// ([`StreamOptions::tcp_lend`]), and how many of them were copied in whole or in
    /// part (the writer was busy, or the kernel did not take all of it at the call).
    pub fn tcp_loans(&self) -> (u64, u64) {
        (self.loans.0.load(Ordering::Relaxed), self.loans.1.load(Ordering::Relaxed))
    }

    /// Data messages the sending task wrote to a plain TCP connection itself
    /// ([`StreamOptions::tcp_direct`], and lent messages of up to 1 MiB): how
    /// many went whole, and how many the kernel took only in part (their rest went
    /// through the writer task).
    pub fn tcp_direct_writes(&self) -> (u64, u64) {
        (self.direct_writes.0.load(Ordering::Relaxed), self.direct_writes.1.load(Ordering::Relaxed))
    }

    /// Sends that completed when their message was queued, without waiting for the
    /// writer task ([`StreamOptions::tcp_eager`]).
    pub fn tcp_eager_sends(&self) -> u64 {
        self.eager_sends.load(Ordering::Relaxed)
    }

    /// Receives that read their plain TCP connection themselves in their first poll,
    /// after a send to the same peer (see `PollLink::poll_first`): how many, and how
    /// many of them found bytes there.
    pub fn tcp_first_reads(&self) -> (u64, u64) {
        (self.shared.first_reads.0.load(Ordering::Relaxed), self.shared.first_reads.1.load(Ordering::Relaxed))
    }

    /// Messages that landed in their receive's buffer over TCP
    /// ([`StreamOptions::tcp_land`]): how many, how many of their bytes the receives
    /// read into their buffers themselves, and how many the connections' readers read
    /// first (which the receives then copied in).
    pub fn tcp_landed(&self) -> (u64, u64, u64) {
        let s = &self.shared.landed;
        (s.messages.load(Ordering::Relaxed), s.own_bytes.load(Ordering::Relaxed), s.piece_bytes.load(Ordering::Relaxed))
    }

    /// Whether the connection to `peer` is encrypted (TLS, `HCOMM_TLS=1`).
    pub fn is_encrypted(&self, peer: Rank) -> bool {
        self.encrypted.get(peer).copied().unwrap_or(false)
    }

    /// What the bundle of connections to `peer` has seen (failovers, resent bytes,
    /// longest stall), if this transport reaches it over several connections
    /// (`HCOMM_LINKS`).
    pub fn link_stats(&self, peer: Rank) -> Option<BundleStats> {
        self.bundles.get(peer)?.as_ref().map(|b| b.stats())
    }

    /// What went by single copy to and from `peer` (messages lent and copied out of
    /// the other's memory), and how many messages lent to it are not yet released, if
    /// this transport reaches it over shared memory.
    pub fn shm_stats(&self, peer: Rank) -> Option<(crate::shm::ShmStats, usize)> {
        let out = self.direct.get(peer)?.as_ref()?;
        Some((out.stats(), out.lent_now()))
    }

    /// Breaks connection `link` of the bundle to `peer` (both directions), as a failed
    /// cable would; for failover tests.
    ///
    /// # Errors
    /// The peer has no such connection, or the socket refused.
    #[doc(hidden)]
    pub fn break_link(&self, peer: Rank, link: usize) -> std::io::Result<()> {
        match self.bundles.get(peer) {
            Some(Some(b)) => b.break_link(link),
            _ => Err(std::io::Error::other(format!("rank {peer} is not reached over several connections"))),
        }
    }

    /// Queues a close frame to every peer, once; `true` the first time.
    fn post_closes(&self) -> bool {
        if self.shared.closed.swap(true, Ordering::AcqRel) {
            return false;
        }
        let why = self.mailbox.close_payload();
        for peer in (0..self.size).filter(|&p| p != self.rank) {
            self.post(
                peer,
                Header::control(FrameKind::Close, OpKind::Bootstrap, self.rank, 0, 0, why.len()),
                why.clone(),
            );
        }
        true
    }

    /// Readers stop now; writers once they have written the close frame. Pending and
    /// later receives fail with a closed error.
    fn stop_readers(&self) {
        self.shared.readers_stopped.store(true, Ordering::Release);
        for tasks in self.shared.tasks.lock().iter_mut() {
            for r in tasks.readers.drain(..) {
                r.abort();
            }
        }
        self.mailbox.close(Error::new(ErrorKind::Closed, "communicator closed").at_rank(self.rank));
    }
}

impl Drop for StreamTransport {
    fn drop(&mut self) {
        self.close();
    }
}

/// The receiving I/O a backend provides to the shared read loop. Buffers are passed
/// by value and handed back, as io_uring needs.
pub(crate) trait ReadLink {
    /// Reads more bytes, at most `limit`, appending them to `buf` (within its spare
    /// capacity, which is never empty).
    async fn read(&mut self, buf: BytesMut, limit: usize) -> (std::io::Result<usize>, BytesMut);
}

/// The sending I/O a backend provides to the shared write loop.
pub(crate) trait WriteLink {
    /// Writes all of `batch`, then all of `big`; hands `batch` back.
    async fn write(&mut self, batch: BytesMut, big: Option<Bytes>) -> (std::io::Result<()>, BytesMut);
    /// Ends the sending direction.
    async fn finish(&mut self);
    /// `messages` queued messages were written completely (by the last `write`).
    fn written(&mut self, _messages: usize) {}
    /// A heartbeat of the writer's own is about to be queued.
    fn heartbeat(&mut self) {}
    /// The write loop has ended.
    fn stopped(&mut self) {}
}

/// Reads frames from one peer into the mailbox until the peer closes or fails (the
/// io_uring and TLS backends; plain TCP reads through its bundle).
#[cfg(any(all(feature = "uring", target_os = "linux"), feature = "tls"))]
async fn read_loop<L: ReadLink>(mut link: L, peer: Rank, links: Arc<Links>) {
    let mailbox = &links.mailbox;
    let mut asm = Assembler::new(peer);
    links.heard_from(peer);
    let err = loop {
        match deliver_all(&mut asm, mailbox) {
            Ok(true) => return links.mark(&links.reader_done, peer),
            Ok(false) => {}
            Err(e) => break e.with_peer(peer),
        }
        let (buf, limit) = asm.read_target();
        let (res, buf) = link.read(buf, limit).await;
        asm.filled(buf);
        match res {
            Ok(0) => break unannounced_eof(peer),
            Ok(_) => links.heard_from(peer),
            Err(e) => break broken(peer, "receiving", e),
        }
    };
    tracing::debug!(peer, error = %err, "reader stopped");
    mailbox.fail_peer(peer, err);
    links.mark(&links.reader_done, peer);
}

/// Writes the messages queued for one peer until the close frame is written, the
/// transport is dropped, or the connection fails.
async fn write_loop<L: WriteLink>(
    mut link: L,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    peer: Rank,
    links: Arc<Links>,
    fragment: usize,
    heartbeat: Option<Duration>,
) {
    let mut q = WriteQueue::new(fragment);
    let mut batch = BytesMut::with_capacity(256 << 10);
    let mut closing = false;
    // When the frames posted lazily are due, if some wait.
    let mut lazy_due: Option<tokio::time::Instant> = None;
    loop {
        if q.is_idle() {
            if closing {
                break;
            }
            let heartbeat_due = async {
                match heartbeat {
                    Some(every) => tokio::time::sleep(every).await,
                    None => std::future::pending().await,
                }
            };
            let next = tokio::select! {
                biased;
                next = rx.recv() => next,
                () = links.lazy_posted[peer].notified(), if lazy_due.is_none() => {
                    lazy_due = Some(tokio::time::Instant::now() + LAZY_DELAY);
                    continue;
                }
                () = links.lazy_full[peer].notified() => {
                    lazy_due = None;
                    if !take_lazy(&links, peer, &mut q, &mut rx, &mut closing) {
                        continue;
                    }
                    None
                }
                () = tokio::time::sleep_until(lazy_due.unwrap_or_else(tokio::time::Instant::now)), if lazy_due.is_some() => {
                    lazy_due = None;
                    if !take_lazy(&links, peer, &mut q, &mut rx, &mut closing) {
                        // A direct write took them along.
                        continue;
                    }
                    None
                }
                // Idle for a heartbeat period: tell the peer this rank is alive.
                () = heartbeat_due => Some({
                    // Counted under the wire lock: no direct write is under way
                    // or starts while the writer holds a message.
                    let _wire = links.wire[peer].lock();
                    links.unwritten[peer].fetch_add(1, Ordering::Relaxed);
                    link.heartbeat();
                    Outgoing::new(
                        Header::control(FrameKind::Heartbeat, OpKind::Bootstrap, links.mailbox.rank(), 0, 0, 0),
                        Bytes::new(),
                        None,
                    )
                }),
            };
            match next {
                Some(o) => closing = gather(&mut q, o, &mut rx),
                None if !q.is_idle() => {}
                None => break,
            }
        } else if !closing && let Ok(o) = rx.try_recv() {
            closing = gather(&mut q, o, &mut rx);
        }
        // Whatever was posted lazily goes along.
        if take_lazy(&links, peer, &mut q, &mut rx, &mut closing) {
            lazy_due = None;
        }
        let big = q.fill(&mut batch);
        let (res, b) = link.write(batch, big).await;
        batch = b;
        batch.clear();
        if let Err(e) = res {
            let err = broken(peer, "sending", e);
            fail_queue(&mut q, &mut rx, &err);
            links.mailbox.fail_peer(peer, err);
            link.stopped();
            return links.mark(&links.writer_done, peer);
        }
        let n = q.written();
        links.unwritten[peer].fetch_sub(n, Ordering::Relaxed);
        link.written(n);
    }
    link.stopped();
    link.finish().await;
    links.mark(&links.writer_done, peer);
}

mod tokio_io {
    use super::*;
    use bytes::BufMut;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

    /// The reading half of a tokio TCP connection, with its spin
    /// ([`StreamOptions::tcp_spin`]).
    pub(super) struct TcpRead {
        pub half: OwnedReadHalf,
        pub spin: Duration,
        /// [`StreamOptions::spin_yield`].
        pub yield_os: bool,
    }

    impl ReadLink for TcpRead {
        async fn read(&mut self, mut buf: BytesMut, limit: usize) -> (std::io::Result<usize>, BytesMut) {
            if !self.spin.is_zero() {
                let start = std::time::Instant::now();
                loop {
                    match self.half.try_read_buf(&mut (&mut buf).limit(limit)) {
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        res => {
                            // A read that never waits never yields: under a steady
                            // inflow the reader would keep the thread, and this
                            // rank's writers (its heartbeats among them) would starve
                            // until the peer judged it hung. Take part in tokio's
                            // cooperative budget as an awaited read does.
                            tokio::task::consume_budget().await;
                            return (res, buf);
                        }
                    }
                    if start.elapsed() >= self.spin {
                        break;
                    }
                    if self.yield_os {
                        std::thread::yield_now();
                    }
                    tokio::task::yield_now().await;
                }
            }
            let res = self.half.read_buf(&mut (&mut buf).limit(limit)).await;
            (res, buf)
        }
    }

    /// The writing side of a plain TCP connection ([`crate::tcp`]).
    pub(super) struct TcpWrite(pub Arc<crate::tcp::TcpSock>);

    impl WriteLink for TcpWrite {
        async fn write(&mut self, batch: BytesMut, big: Option<Bytes>) -> (std::io::Result<()>, BytesMut) {
            let mut res = self.0.write_all(&batch).await;
            if let (Ok(()), Some(b)) = (&res, big) {
                res = self.0.write_all(&b).await;
            }
            (res, batch)
        }
        async fn finish(&mut self) {
            self.0.shutdown_write();
        }
    }

    impl WriteLink for OwnedWriteHalf {
        async fn write(&mut self, batch: BytesMut, big: Option<Bytes>) -> (std::io::Result<()>, BytesMut) {
            let mut res = self.write_all(&batch).await;
            if let (Ok(()), Some(b)) = (&res, big) {
                res = self.write_all(&b).await;
            }
            (res, batch)
        }
        async fn finish(&mut self) {
            let _ = self.shutdown().await;
        }
    }
}

#[cfg(all(feature = "uring", target_os = "linux"))]
mod uring_io {
    use super::*;
    use tokio_uring::buf::BoundedBuf;
    use tokio_uring::net::TcpStream;

    /// Both directions share one socket: the reader and the writer task each hold it.
    pub(super) struct UringLink(pub std::rc::Rc<TcpStream>);

    impl ReadLink for UringLink {
        async fn read(&mut self, buf: BytesMut, limit: usize) -> (std::io::Result<usize>, BytesMut) {
            // tokio-uring reads at the start of the buffer it is given: hand it the
            // spare capacity only (up to the limit), so that bytes already received
            // stay in place.
            let (len, cap) = (buf.len(), buf.capacity());
            let (res, slice) = self.0.read(buf.slice(len..cap.min(len.saturating_add(limit)))).await;
            (res, slice.into_inner())
        }
    }

    impl WriteLink for UringLink {
        async fn write(&mut self, batch: BytesMut, big: Option<Bytes>) -> (std::io::Result<()>, BytesMut) {
            let (mut res, batch) = if batch.is_empty() { (Ok(()), batch) } else { self.0.write_all(batch).await };
            if let (Ok(()), Some(big)) = (&res, big) {
                res = self.0.write_all(big).await.0;
            }
            (res, batch)
        }
        async fn finish(&mut self) {
            let _ = self.0.shutdown(std::net::Shutdown::Write);
        }
    }
}

#[cfg(feature = "tls")]
mod tls_io {
    use super::*;
    use bytes::BufMut;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
    use tokio_rustls::TlsStream;

    type Tls = TlsStream<tokio::net::TcpStream>;

    pub(super) struct Read(pub ReadHalf<Tls>);
    pub(super) struct Write(pub WriteHalf<Tls>);

    impl ReadLink for Read {
        async fn read(&mut self, mut buf: BytesMut, limit: usize) -> (std::io::Result<usize>, BytesMut) {
            let res = self.0.read_buf(&mut (&mut buf).limit(limit)).await;
            (res, buf)
        }
    }

    impl WriteLink for Write {
        async fn write(&mut self, batch: BytesMut, big: Option<Bytes>) -> (std::io::Result<()>, BytesMut) {
            let mut res = self.0.write_all(&batch).await;
            if let (Ok(()), Some(b)) = (&res, big) {
                res = self.0.write_all(&b).await;
            }
            // TLS holds records back until flushed.
            if res.is_ok() {
                res = self.0.flush().await;
            }
            (res, batch)
        }
        async fn finish(&mut self) {
            let _ = self.0.shutdown().await;
        }
    }
}

/// How long a TCP link's reader leaves the bytes of a landing message to its receive
/// ([`hcomm_core::landing::Landing::offer_turn`]) before it reads them itself: a
/// receive woken on another thread takes tens of microseconds to come.
const TURN_PATIENCE: Duration = Duration::from_micros(200);

/// How long after a large message's first header a TCP link's reader leaves the rest
/// of it in the socket, if no receive waited for it with a buffer of its length, for
/// such a receive to be posted ([`Assembler::claim_late`]) and the bytes to land in
/// it, instead of reading them into a pooled buffer the receive copies out of later.
/// A root running ahead sends the next message's header a few microseconds before
/// its receive is posted; the patience is a few cross-thread wake-ups.
const LAND_PATIENCE: Duration = Duration::from_micros(200);

/// [`LAND_PATIENCE`] where ranks outnumber the processors
/// ([`StreamOptions::spin_yield`]): a receive is posted by a task of a process that
/// often does not run for a millisecond or more (a scheduler's time slice). A
/// message behind a large one whose receive is not posted waits up to this long, or
/// longer for a larger message ([`LAND_PATIENCE_PER_MIB`]).
const LAND_PATIENCE_CROWDED: Duration = Duration::from_millis(2);

/// Where ranks outnumber the processors, a large message's receive may be posted
/// later still: the relay of a binomial broadcast posts the next one only once it has
/// forwarded the last, and forwarding takes time in proportion to the message. So the
/// reader leaves a message's bytes in the socket for this long per MiB of it, if that
/// is more than [`LAND_PATIENCE_CROWDED`], up to [`LAND_PATIENCE_MOST`]: a message
/// behind it waits about as long as the large one takes to move at 1 GB/s, a
/// conservative memory-copy speed (measurements: `docs/tuning-rules.md`).
const LAND_PATIENCE_PER_MIB: Duration = Duration::from_millis(1);

/// The most a reader leaves a message's bytes in the socket for its receive
/// ([`LAND_PATIENCE_PER_MIB`]).
const LAND_PATIENCE_MOST: Duration = Duration::from_millis(100);

/// How long a reader leaves the bytes of a large message of `len` bytes in the socket
/// for its receive to be posted: [`LAND_PATIENCE`], or where ranks outnumber the
/// processors ([`StreamOptions::spin_yield`]) [`LAND_PATIENCE_CROWDED`] or
/// [`LAND_PATIENCE_PER_MIB`] of it, whichever is more, up to [`LAND_PATIENCE_MOST`].
fn land_patience(crowded: bool, len: u64) -> Duration {
    if !crowded {
        return LAND_PATIENCE;
    }
    let per = LAND_PATIENCE_PER_MIB.saturating_mul(u32::try_from(len >> 20).unwrap_or(u32::MAX));
    per.clamp(LAND_PATIENCE_CROWDED, LAND_PATIENCE_MOST)
}

/// How long a receive reading its own message's bytes keeps trying, without progress,
/// before it leaves the socket to the reader task ([`recv_spinning`]).
const OWNER_SPIN: Duration = Duration::from_micros(50);

/// Reads into `dst` what the socket holds; while it finds nothing, tries again for up
/// to `spin` (holding the thread, as a blocking MPI receive does).
#[allow(unsafe_code)] // recv(2) into a buffer we hold mutably
fn recv_spinning(sock: &TcpSock, dst: &mut [u8], spin: Duration) -> std::io::Result<usize> {
    let mut start = None;
    loop {
        // SAFETY: `dst` is a live, exclusively borrowed buffer of `dst.len()` bytes.
        match unsafe { sock.recv(dst.as_mut_ptr(), dst.len(), 0) } {
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    && start.get_or_insert_with(std::time::Instant::now).elapsed() < spin =>
            {
                std::hint::spin_loop();
            }
            r => return r,
        }
    }
}

/// Reads into `buf`'s spare capacity, at most `limit` bytes, what the socket holds.
#[allow(unsafe_code)] // recv(2) into spare capacity, then the length set to what it wrote
fn recv_spare(sock: &TcpSock, buf: &mut BytesMut, limit: usize) -> std::io::Result<usize> {
    let spare = buf.spare_capacity_mut();
    let n = spare.len().min(limit);
    // SAFETY: `spare` is writable memory of at least `n` bytes owned by `buf`.
    let got = unsafe { sock.recv(spare.as_mut_ptr().cast(), n, 0) }?;
    // SAFETY: recv(2) initialised the first `got` bytes of the spare capacity.
    unsafe { buf.set_len(buf.len() + got) };
    Ok(got)
}

/// Reads per [`TcpInbox::drain`] of a receive before it returns (and checks whether
/// its message came).
const DRAIN_READS: usize = 32;

/// Reads per [`TcpInbox::drain`] of the reader task, which then yields: each yield
/// lets a current-thread runtime poll its driver, and so fire timers (the heartbeat
/// writers') and wake on I/O. Under a steady inflow the driver was otherwise polled
/// only every 61 task polls, each of up to 32 reads of up to 512 KiB into freshly
/// mapped pages: hundreds of milliseconds without a heartbeat, and peers failed this
/// rank as hung (`hcomm-bench --ranks 4 --ops bw` at 16 MiB, 4 ranks on 2 cores).
const READER_READS: usize = 8;

/// What a [`TcpInbox::drain`] did.
#[derive(Debug, PartialEq, Eq)]
enum Drained {
    /// Read something, in this many reads.
    Some(usize),
    /// Nothing to read now, or someone else holds the parser.
    Nothing,
    /// The next bytes are a landing message's, left to its receive for a while.
    Turn,
    /// The link has ended (the mailbox knows).
    Ended,
}

/// The receiving side of a plain tokio TCP connection, shared by its reader task and
/// by the receives that read it themselves ([`PollLink`]): a receive into a buffer
/// whose message lands there ([`hcomm_core::landing`]) reads the message's bytes from
/// the socket straight into it.
///
/// [`PollLink`]: hcomm_core::mailbox::PollLink
pub(crate) struct TcpInbox {
    /// The connection; direct writes go through it too.
    sock: Arc<TcpSock>,
    peer: Rank,
    links: Arc<Links>,
    asm: Mutex<Assembler>,
    ended: AtomicBool,
    /// How long a receive reading its own message spins ([`OWNER_SPIN`], or less).
    owner_spin: Duration,
    /// Whether ranks outnumber the processors here ([`StreamOptions::spin_yield`]):
    /// a reader waits longer for a large message's receive ([`land_patience`]), and a
    /// receive never reads the socket in its first poll
    /// ([`PollLink::poll_first`](hcomm_core::mailbox::PollLink::poll_first)).
    crowded: bool,
    /// Whether large messages land in their receive's buffer
    /// ([`StreamOptions::tcp_land`]); if not, receives never read the socket.
    land: bool,
    /// Whether the last drain by a receive stopped at another message's body, which
    /// only its own receive or the reader task reads.
    blocked: AtomicBool,
    /// Whether the last receive that read the socket stopped at a body that does not
    /// land, which the reader task reads: the reader then spins between messages
    /// ([`tcp_read_task`]).
    blocked_by_reader: AtomicBool,
}

impl std::fmt::Debug for TcpInbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpInbox").field("peer", &self.peer).finish_non_exhaustive()
    }
}

impl TcpInbox {
    /// With `opts.tcp_land`, large messages may land in their receive's buffer, if
    /// the TCP spin is on (`opts.tcp_spin` not zero): a
    /// receive reading its own message spins no longer than the reader does, and one
    /// that cannot spin gains nothing (the reader reads nearly all of its message)
    /// but its reads (a window of 64 receives of 16 MiB, 4 ranks on 2 cores, kept a
    /// rank from sending heartbeats past the peer timeout once in three sweeps).
    pub(crate) fn new(sock: Arc<TcpSock>, peer: Rank, links: Arc<Links>, opts: &StreamOptions) -> TcpInbox {
        let land = opts.tcp_land > 0 && !opts.tcp_spin.is_zero();
        let asm = Mutex::new(
            match land {
                true => Assembler::landing(peer, links.mailbox.clone(), links.landed.clone(), opts.tcp_land),
                false => Assembler::new(peer),
            }
            .header_alone(!opts.spin_yield),
        );
        let owner_spin = opts.tcp_spin.min(OWNER_SPIN);
        let crowded = opts.spin_yield;
        TcpInbox {
            sock,
            peer,
            links,
            asm,
            ended: AtomicBool::new(false),
            owner_spin,
            crowded,
            land,
            blocked: AtomicBool::new(false),
            blocked_by_reader: AtomicBool::new(false),
        }
    }

    /// Reads what the socket holds (without waiting) and delivers the whole messages,
    /// unless someone else holds the parser. With `owner`, the caller is the receive
    /// that offered that landing: bytes of its message go straight into its buffer.
    /// With `inline`, the caller is a receive without a landing, in its first poll
    /// ([`PollLink::poll_first`](hcomm_core::mailbox::PollLink::poll_first)). Either
    /// reads as a receive does: the socket directly (tokio's readiness is not
    /// consulted), never the body of another message.
    fn drain(&self, mut owner: Option<(&Landing, &mut [u8])>, max_reads: usize, inline: bool) -> Drained {
        if self.ended.load(Ordering::Acquire) || self.links.readers_stopped.load(Ordering::Acquire) {
            return Drained::Ended;
        }
        let Some(mut asm) = self.asm.try_lock() else { return Drained::Nothing };
        self.blocked.store(false, Ordering::Relaxed);
        let mut reads = 0;
        let mut turn = false;
        for _ in 0..max_reads {
            if let Some(ended) = self.deliver(&mut asm) {
                return ended;
            }
            // A receive posted after its message's first header came: the rest of
            // the message lands in its buffer (the owner's own, perhaps).
            asm.claim_late();
            let mine = owner.as_ref().and_then(|(l, _)| asm.owner_target(l));
            let is_owner = owner.is_some() || inline;
            // A short read that emptied the socket (see below): nothing more to read.
            let mut short = false;
            let res = match (mine, owner.as_mut()) {
                (Some((at, len)), Some((l, dst))) => {
                    // Spin only while this rank has nothing queued for the peer: on a
                    // current-thread runtime the spin holds off the writer task, and a
                    // peer waiting for our data would wait out the spin.
                    // Nor while the receive spins around this call already
                    // (`PollLink::hold`), which then checks its own clock.
                    let idle = self.links.unwritten[self.peer].load(Ordering::Relaxed) == 0;
                    let spin = if idle && !self.sock.is_held() { self.owner_spin } else { Duration::ZERO };
                    let dst = &mut dst[at..at + len];
                    let r = recv_spinning(&self.sock, dst, spin);
                    if let Ok(n @ 1..) = r {
                        asm.owner_filled(n);
                    }
                    // The turn is over either way (bytes read, or none there): the
                    // reader's next offer wakes this receive again.
                    l.turn_taken();
                    r
                }
                // A receive reads its own message's bytes, and headers and small frames
                // on the way to them, never another message's body: that is the
                // reader task's work, and a window of receives joined in one task,
                // each reading on the others' behalf in its first poll, held that task
                // for up to a gigabyte of reads.
                _ if is_owner && asm.in_body() => {
                    // Nothing this receive can read until that message is read: no
                    // point in spinning for it (see `PollLink::spin_more`).
                    self.blocked.store(true, Ordering::Relaxed);
                    self.blocked_by_reader.store(asm.landed_target().is_none(), Ordering::Relaxed);
                    break;
                }
                _ => {
                    // Another receive's message: its bytes are worth a short wait for
                    // it to read them itself (into its buffer, one copy less), if it
                    // will spin for them (see below); otherwise the turn would only
                    // cost two task switches.
                    if let Some(l) = asm.landed_target()
                        && !self.owner_spin.is_zero()
                        && self.links.unwritten[self.peer].load(Ordering::Relaxed) == 0
                        && self.sock.has_bytes()
                        && l.offer_turn(TURN_PATIENCE)
                    {
                        turn = true;
                        break;
                    }
                    // A large message whose receive is not posted yet: its bytes
                    // stay in the socket a while, so that they land when it comes
                    // instead of being read here and copied again.
                    if !is_owner
                        && !self.owner_spin.is_zero()
                        && asm.awaits_receive(|len| land_patience(self.crowded, len))
                    {
                        turn = true;
                        break;
                    }
                    let at_rest = asm.at_rest();
                    let (mut buf, limit) = asm.read_target();
                    let asked = limit.min(buf.capacity() - buf.len());
                    let r = recv_spare(&self.sock, &mut buf, limit);
                    // A short read (fewer bytes than asked) made while no message was
                    // partly received emptied the socket: no `recv(2)` that would only
                    // say so. In the middle of a message the next bytes are on their way.
                    short = at_rest && r.as_ref().is_ok_and(|&n| n > 0 && n < asked);
                    asm.filled(buf);
                    r
                }
            };
            match res {
                Ok(0) => return self.end(&mut asm, Some(unannounced_eof(self.peer))),
                Ok(_) => {
                    reads += 1;
                    self.links.heard_from(self.peer);
                    if short {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return self.end(&mut asm, Some(broken(self.peer, "receiving", e))),
            }
        }
        if let Some(ended) = self.deliver(&mut asm) {
            return ended;
        }
        if (owner.is_some() || inline) && reads > 0 && !self.blocked.load(Ordering::Relaxed) {
            // A receive read its message itself: the reader is not needed for it.
            self.blocked_by_reader.store(false, Ordering::Relaxed);
        }
        match (reads, turn) {
            (1.., _) => Drained::Some(reads),
            (0, true) => Drained::Turn,
            (0, false) => Drained::Nothing,
        }
    }

    /// Delivers the whole messages parsed so far; `Some(Ended)` if the link ended
    /// (the peer's close frame, or a protocol error).
    fn deliver(&self, asm: &mut Assembler) -> Option<Drained> {
        match deliver_all(asm, &self.links.mailbox) {
            Ok(false) => None,
            Ok(true) => Some(self.end(asm, None)),
            Err(e) => Some(self.end(asm, Some(e.with_peer(self.peer)))),
        }
    }

    /// The link ended: with an error, the peer fails (and receives whose messages were
    /// landing with it); with none, its close frame came.
    fn end(&self, asm: &mut Assembler, err: Option<Error>) -> Drained {
        if self.ended.swap(true, Ordering::AcqRel) {
            return Drained::Ended;
        }
        let err = err
            .unwrap_or_else(|| Error::new(ErrorKind::PeerFailed, "peer closed its communicator").with_peer(self.peer));
        asm.fail_landed(&err);
        tracing::debug!(peer = self.peer, error = %err, "reader stopped");
        self.links.mailbox.fail_peer(self.peer, err);
        self.links.mark(&self.links.reader_done, self.peer);
        Drained::Ended
    }
}

impl hcomm_core::mailbox::PollLink for TcpInbox {
    /// Reads what the socket holds, as a receive does (never another message's body).
    fn poll(&self) -> bool {
        self.drain(None, DRAIN_READS, true) != Drained::Ended
    }

    fn hold(&self) {
        self.sock.hold();
    }

    /// The socket lingers unarmed only while the reader task has nothing to read
    /// for the receives: bodies they do not read would otherwise wait for its timer.
    fn release(&self) {
        self.sock.release(!self.blocked_by_reader.load(Ordering::Relaxed));
    }

    fn parked(&self) {
        self.sock.park_rx();
    }

    fn unparked(&self) {
        self.sock.unpark_rx();
    }

    /// Not while the next bytes are another message's body: this receive cannot read
    /// them, and spinning would only hold the thread the reader task (or that
    /// message's receive) needs.
    fn spin_more(&self) -> bool {
        !self.blocked.load(Ordering::Relaxed)
    }

    fn poll_first(&self) -> bool {
        if !self.crowded && self.links.sent[self.peer].swap(false, Ordering::Relaxed) {
            let d = self.drain(None, DRAIN_READS, true);
            self.links.first_reads.0.fetch_add(1, Ordering::Relaxed);
            if matches!(d, Drained::Some(_)) {
                self.links.first_reads.1.fetch_add(1, Ordering::Relaxed);
            }
            return d != Drained::Ended;
        }
        !self.ended.load(Ordering::Acquire)
    }

    fn poll_into(&self, landing: &Landing, dst: &mut [u8]) -> bool {
        if !self.land {
            return self.poll();
        }
        self.drain(Some((landing, dst)), DRAIN_READS, false) != Drained::Ended
    }
}

/// Whether the calling task runs on a multi-thread tokio runtime.
fn on_multi_thread_runtime() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// The reader task of a plain tokio TCP connection: drains it whenever it has data,
/// trying again for `spin` (yielding to the executor's other tasks) before it waits for
/// the socket, until the link ends. Unless `between`, it spins only while a message is
/// partly read (the rest of it is on its way) or while the receives wait for it to
/// read bodies they do not read themselves ([`TcpInbox::drain`]), and otherwise waits
/// for the socket at once, leaving the next message to the receive that spins for it.
async fn tcp_read_task(inbox: Arc<TcpInbox>, spin: Duration, between: bool, yield_os: bool) {
    inbox.links.heard_from(inbox.peer);
    let mut idle_since: Option<std::time::Instant> = None;
    loop {
        match inbox.drain(None, READER_READS, false) {
            Drained::Ended => return,
            Drained::Some(_) => {
                idle_since = None;
                // A socket that always has data never makes this task wait: yield, so
                // that the executor's other tasks run and its driver is polled (see
                // `READER_READS`).
                tokio::task::yield_now().await;
            }
            // A receive reads its own message, or holds the parser, or may come for
            // the message next in the socket: let it.
            Drained::Turn => {
                if yield_os {
                    std::thread::yield_now();
                }
                tokio::task::yield_now().await
            }
            Drained::Nothing if inbox.asm.is_locked() => tokio::task::yield_now().await,
            Drained::Nothing => {
                let since = *idle_since.get_or_insert_with(std::time::Instant::now);
                let wanted = between
                    || inbox.blocked_by_reader.load(Ordering::Relaxed)
                    || inbox.asm.try_lock().is_none_or(|a| !a.at_rest());
                if since.elapsed() < spin && wanted {
                    if yield_os {
                        std::thread::yield_now();
                    }
                    tokio::task::yield_now().await;
                } else if let Err(e) = inbox.sock.readable().await {
                    inbox.end(&mut inbox.asm.lock(), Some(broken(inbox.peer, "receiving", e)));
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crowded_reader_waits_a_millisecond_per_mib_for_a_receive_within_bounds() {
        const MIB: u64 = 1 << 20;
        for len in [0, MIB, 64 * MIB, u64::MAX] {
            assert_eq!(land_patience(false, len), LAND_PATIENCE, "{len}");
        }
        assert_eq!(land_patience(true, 512 << 10), LAND_PATIENCE_CROWDED);
        assert_eq!(land_patience(true, 2 * MIB), LAND_PATIENCE_CROWDED);
        assert_eq!(land_patience(true, 3 * MIB), Duration::from_millis(3));
        assert_eq!(land_patience(true, 64 * MIB + 1), Duration::from_millis(64));
        assert_eq!(land_patience(true, 1 << 30), LAND_PATIENCE_MOST);
        assert_eq!(land_patience(true, u64::MAX), LAND_PATIENCE_MOST);
    }
}
