//! Several TCP connections to one peer used as one ordered, reliable stream
//! (`HCOMM_LINKS`): striping, per-segment acknowledgements, and failover.
//!
//! The stream transport's write loop produces one byte stream per peer (its frames);
//! with a bundle, that stream is cut into *segments* that carry their offset in it.
//! Each segment goes to the connection (link) with the least unacknowledged data, so
//! a large message is striped over every link. The receiver puts segments back in
//! order (dropping duplicates), feeds the frame assembler, and acknowledges the
//! contiguous prefix it holds, on every link, at least every [`ACK_TICK`]; an
//! acknowledgement also reports how many bytes arrived on each link.
//!
//! The sender keeps every segment until it is acknowledged (the bytes are reference
//! counted: no copy). A link with bytes in transit (taken by its writer, not yet
//! reported by the peer) on which the peer has reported no new bytes for longer than
//! the stall limit, while another link shows the peer still receiving (it reported
//! bytes within the limit, or it has nothing in transit while the peer is still
//! heard: a receiver whose prefix a hole holds back repeats its acknowledgement every
//! `HOLE_ACK`), is suspected: every segment it holds is queued again, at the front,
//! on the other links, so the holes fill first. A link that breaks (an error, or an end of stream
//! before the peer's close frame) has its segments moved the same way. When every
//! link is silent, the peer itself is slow or gone and nothing moves: the peer
//! watchdog judges that. A suspected link gets no new data until the peer reports
//! bytes arriving on it again. The peer fails only when no link is left. The
//! application sees no loss, duplicate or reordering: the receiver accepts each
//! offset once, in order.
//!
//! Adaptation: segment size and the unacknowledged bytes allowed per link follow the
//! measured throughput (from acknowledgements) and round-trip time (from segments
//! sent once): a link may hold its share of 8 ms of throughput, or of two of the
//! shortest round trips if longer, between [`MIN_CAP`] and [`MAX_CAP`] (acknowledgements
//! queue behind data going the other way, so the bound also keeps them prompt);
//! segments carry about a millisecond of throughput, between 64 KiB and 1 MiB. The stall limit is three round trips plus three
//! acknowledgement ticks, at least [`crate::StreamOptions::link_stall`].
//!
//! Segment header, 16 bytes: kind (1 data, 2 acknowledgement, 3 probe), three zero
//! bytes, length (u32 LE), offset (u64 LE; for an acknowledgement, the contiguous
//! prefix received; zero otherwise). An acknowledgement's payload is one u64 LE per
//! link: bytes received on it. A probe has none; the peer answers it with an
//! acknowledgement on every link. A sender probes, on its links with nothing in
//! transit, when a link is silent and the peer has not been heard from: without an
//! answer it cannot tell a cut path from a quiet peer (both sides' last messages may
//! all have gone into the cut link). Anything else, a segment over 4 MiB, or one further ahead than 256 MiB of the
//! first missing byte, is a protocol error that fails the peer (the connections are
//! authenticated, so it means a bug or corruption, not a stranger).

use std::collections::{BTreeMap, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use hcomm_core::wire::FrameKind;
use hcomm_core::{Error, ErrorKind, Rank, Result};
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::task::AbortHandle;

use crate::framing::{Assembler, push};
use crate::stream::{Links, ReadLink, WriteLink};

pub(crate) const SEG_HEADER: usize = 16;
const KIND_DATA: u8 = 1;
const KIND_ACK: u8 = 2;
const KIND_PROBE: u8 = 3;
/// Largest data segment accepted.
const MAX_SEG: usize = 4 << 20;
/// How far ahead of the first missing byte a segment may start.
const MAX_AHEAD: u64 = 256 << 20;
/// How often owed acknowledgements go out, and stalls are checked, while anything is
/// outstanding.
pub const ACK_TICK: Duration = Duration::from_millis(2);
/// Bounds of the unacknowledged bytes one link may hold.
pub const MIN_CAP: usize = 256 << 10;
pub const MAX_CAP: usize = 16 << 20;
/// Busy time over which throughput is measured.
const METER_WINDOW: Duration = Duration::from_millis(10);
/// The time's worth of throughput a link may hold unacknowledged (see [`cap`]).
const QUEUE_TIME: Duration = Duration::from_millis(8);
const MIN_CHUNK: usize = 64 << 10;
const MAX_CHUNK: usize = 1 << 20;
/// Segments up to this size are copied into the link's write batch.
const COPY_LIMIT: usize = 16 << 10;
/// How many failovers [`BundleStats::failover_log`] keeps.
pub const FAILOVER_LOG: usize = 64;
/// How long an orderly finish waits for the peer's acknowledgements.
const LINGER: Duration = Duration::from_secs(2);
/// How often the acknowledgement is repeated while a hole holds the prefix back.
const HOLE_ACK: Duration = Duration::from_millis(10);

/// What a bundle has seen of its links.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BundleStats {
    /// Connections to the peer.
    pub links: usize,
    /// Links still alive (not broken).
    pub alive: usize,
    /// Times a stalled or broken link's segments were moved to the other links.
    pub failovers: u64,
    /// Bytes sent again after a failover.
    pub resent_bytes: u64,
    /// Longest time data waited with no acknowledgement progress, whatever the cause
    /// (a peer whose executor was busy computing counts too).
    pub max_gap: Duration,
    /// Longest of those waits that a failover ended: from the last progress before
    /// the link stalled or broke to the first after its data moved (detection, resend
    /// and round trip).
    pub max_failover_gap: Duration,
    /// The last failovers (at most [`FAILOVER_LOG`]): when progress came back, by the
    /// system clock (comparable across processes), and how long it had stopped.
    pub failover_log: Vec<(std::time::SystemTime, Duration)>,
    /// Bytes received on each link.
    pub received: Vec<u64>,
    /// Current segment size and per-link limit of unacknowledged bytes.
    pub chunk: usize,
    pub cap: usize,
    /// Shortest and smoothed time from handing a segment to the kernel to its
    /// acknowledgement (segments sent once only).
    pub min_rtt: Option<Duration>,
    pub srtt: Option<Duration>,
}

#[derive(Debug)]
struct Seg {
    off: u64,
    data: Bytes,
    link: usize,
    /// When a link handed it to the kernel (`None` while queued).
    sent: Option<Instant>,
    /// Queued more than once: no round-trip sample from it (Karn's rule).
    resent: bool,
}

impl Seg {
    fn end(&self) -> u64 {
        self.off + self.data.len() as u64
    }
}

#[derive(Debug)]
struct LinkState {
    alive: bool,
    suspect: bool,
    queue: VecDeque<(u64, Bytes)>,
    /// Bytes of unacknowledged segments assigned to it.
    inflight: usize,
    /// The peer's count of bytes received on it.
    reported: u64,
    /// Bytes of data segments its writer has taken from its queue (to write, or
    /// being written): once the peer reports as many, the link holds nothing in
    /// transit, whatever it still has unacknowledged.
    taken: u64,
    /// When that count last rose, or the link last went from idle to busy.
    heard_at: Instant,
    ack_due: bool,
    probe_due: bool,
}

impl LinkState {
    fn new() -> LinkState {
        LinkState {
            alive: true,
            suspect: false,
            queue: VecDeque::new(),
            inflight: 0,
            reported: 0,
            taken: 0,
            heard_at: Instant::now(),
            ack_due: false,
            probe_due: false,
        }
    }

    /// Takes `len` more unacknowledged bytes.
    fn assign(&mut self, len: usize, now: Instant) {
        if self.inflight == 0 {
            self.heard_at = now;
        }
        self.inflight += len;
    }

    /// Everything its writer took has arrived, and nothing waits in its queue: its
    /// unacknowledged bytes (if any) wait for a hole elsewhere, not for this link.
    fn delivered(&self) -> bool {
        self.reported >= self.taken && self.queue.is_empty()
    }

    /// Nothing of it is in transit: nothing unacknowledged, or all delivered.
    fn in_transit_none(&self) -> bool {
        self.inflight == 0 || self.delivered()
    }
}

#[derive(Debug)]
struct State {
    link: Vec<LinkState>,
    // Sending.
    next_off: u64,
    acked: u64,
    unacked: VecDeque<Seg>,
    /// The last acknowledgement progress (or when data became outstanding).
    progress_at: Instant,
    /// Stalls are measured from the later of `progress_at` and this (a failover, or a
    /// late tick of this rank's own executor).
    checked_at: Instant,
    min_rtt: Option<Duration>,
    srtt: Option<Duration>,
    /// A failover happened since the last progress.
    failed_over: bool,
    /// When the peer was last probed.
    probed_at: Option<Instant>,
    /// Acknowledged bytes per second of busy time (data outstanding), measured over
    /// at least [`METER_WINDOW`] of it: the busy time and bytes metered so far, and
    /// since when the current busy stretch is counted.
    rate: Option<f64>,
    meter: (Duration, u64),
    busy_from: Instant,
    stats: BundleStats,
    finished: bool,
    // Receiving.
    next: u64,
    ooo: BTreeMap<u64, Bytes>,
    asm: Assembler,
    ack_sent: u64,
    /// When the last acknowledgement was scheduled.
    ack_at: Instant,
    /// Segments arrived since the last acknowledgement was scheduled (its per-link
    /// counts tell the sender which links move, even while a hole holds the prefix).
    rx_dirty: bool,
    close_seen: bool,
    /// Every link ended after the peer's close frame: it reads no more.
    peer_ended: bool,
    failed: bool,
}

/// The links to one peer and their shared state. See the module documentation.
#[derive(Debug)]
pub(crate) struct Bundle {
    peer: Rank,
    links: Arc<Links>,
    st: Mutex<State>,
    /// Per link: work for its writer.
    work: Vec<Notify>,
    /// Acknowledgements came (room in the window, or everything acknowledged).
    room: Notify,
    /// Data became outstanding or an acknowledgement became owed.
    activity: Notify,
    stall_floor: Duration,
    /// A duplicate of each link's socket, to break it on purpose in tests.
    fds: Vec<OwnedFd>,
    /// The link writers, and how many still run.
    tasks: Mutex<Vec<AbortHandle>>,
    writers: AtomicUsize,
    /// Per link, microseconds since `epoch`: when its reader last got bytes, and
    /// when its writer's write in progress began (0: none), for [`Bundle::describe`].
    read_at: Vec<AtomicU64>,
    writing_since: Vec<AtomicU64>,
    epoch: Instant,
    ended: Notify,
}

fn protocol(peer: Rank, msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Protocol, msg).with_peer(peer)
}

fn header(kind: u8, len: usize, off: u64) -> [u8; SEG_HEADER] {
    let mut h = [0u8; SEG_HEADER];
    h[0] = kind;
    h[4..8].copy_from_slice(&(len as u32).to_le_bytes());
    h[8..16].copy_from_slice(&off.to_le_bytes());
    h
}

/// Kind, length and offset of a segment header.
fn parse(h: &[u8], peer: Rank, links: usize) -> Result<(u8, usize, u64)> {
    let len = u32::from_le_bytes(h[4..8].try_into().expect("4 bytes")) as usize;
    let off = u64::from_le_bytes(h[8..16].try_into().expect("8 bytes"));
    match h[0] {
        _ if h[1..4] != [0, 0, 0] => {
            Err(protocol(peer, format!("segment header {:02x?} has reserved bits set", &h[..4])))
        }
        KIND_DATA if len <= MAX_SEG => Ok((KIND_DATA, len, off)),
        KIND_ACK if len == 8 * links => Ok((KIND_ACK, len, off)),
        KIND_PROBE if len == 0 && off == 0 => Ok((KIND_PROBE, 0, 0)),
        k => Err(protocol(peer, format!("segment of kind {k} and length {len} from rank {peer}"))),
    }
}

impl Bundle {
    pub(crate) fn new(peer: Rank, n: usize, links: Arc<Links>, stall_floor: Duration, fds: Vec<OwnedFd>) -> Bundle {
        let now = Instant::now();
        Bundle {
            peer,
            st: Mutex::new(State {
                link: (0..n).map(|_| LinkState::new()).collect(),
                next_off: 0,
                acked: 0,
                unacked: VecDeque::new(),
                progress_at: now,
                checked_at: now,
                min_rtt: None,
                srtt: None,
                rate: None,
                failed_over: false,
                probed_at: None,
                meter: (Duration::ZERO, 0),
                busy_from: now,
                stats: BundleStats { links: n, alive: n, received: vec![0; n], ..BundleStats::default() },
                finished: false,
                next: 0,
                ooo: BTreeMap::new(),
                asm: Assembler::new(peer),
                ack_sent: 0,
                ack_at: now,
                rx_dirty: false,
                close_seen: false,
                peer_ended: false,
                failed: false,
            }),
            links,
            work: (0..n).map(|_| Notify::new()).collect(),
            room: Notify::new(),
            activity: Notify::new(),
            stall_floor,
            fds,
            tasks: Mutex::new(Vec::new()),
            writers: AtomicUsize::new(n),
            read_at: (0..n).map(|_| AtomicU64::new(0)).collect(),
            writing_since: (0..n).map(|_| AtomicU64::new(0)).collect(),
            epoch: now,
            ended: Notify::new(),
        }
    }

    /// Registers a link writer's task.
    pub(crate) fn add_writer(&self, h: AbortHandle) {
        self.tasks.lock().push(h);
    }

    pub(crate) fn stats(&self) -> BundleStats {
        let st = self.st.lock();
        let mut s = st.stats.clone();
        s.alive = st.link.iter().filter(|l| l.alive).count();
        s.chunk = chunk(&st);
        s.cap = cap(&st);
        (s.min_rtt, s.srtt) = (st.min_rtt, st.srtt);
        s
    }

    /// The state of the links, for a report: per link whether it is alive (`+`),
    /// suspected (`?`) or broken (`x`), its unacknowledged bytes, its bytes in
    /// transit and its queued segments; then what was sent and acknowledged, and what
    /// was received in order and out of order.
    pub(crate) fn describe(&self) -> String {
        let st = self.st.lock();
        let now = self.epoch.elapsed().as_micros() as u64;
        let ms = |us: u64| now.saturating_sub(us) / 1000;
        let mut out = String::new();
        for (k, l) in st.link.iter().enumerate() {
            let mark = if !l.alive {
                'x'
            } else if l.suspect {
                '?'
            } else {
                '+'
            };
            out += &format!(
                "link {k}{mark} unacked {} in transit {} queued {}, reported {} ms ago, read {} ms ago",
                l.inflight,
                l.taken.saturating_sub(l.reported),
                l.queue.len(),
                l.heard_at.elapsed().as_millis(),
                ms(self.read_at[k].load(Ordering::Relaxed)),
            );
            match self.writing_since[k].load(Ordering::Relaxed) {
                0 => out += "; ",
                t => out += &format!(", writing for {} ms; ", ms(t)),
            }
        }
        out += &format!(
            "sent {} acked {}; received {} ({} segments ahead), acked {}",
            st.next_off,
            st.acked,
            st.next,
            st.ooo.len(),
            st.ack_sent
        );
        out
    }

    /// Breaks link `i` (both directions), as a failed cable would.
    pub(crate) fn break_link(&self, i: usize) -> std::io::Result<()> {
        let fd = self.fds.get(i).ok_or_else(|| std::io::Error::other(format!("no link {i}")))?;
        socket2::SockRef::from(fd).shutdown(std::net::Shutdown::Both)
    }

    /// Fails the peer: no link is left, or one broke the protocol.
    fn fail(&self, st: &mut State, err: Error) {
        if st.failed {
            return;
        }
        st.failed = true;
        for l in &mut st.link {
            l.queue.clear();
        }
        tracing::debug!(peer = self.peer, error = %err, "bundle failed");
        self.links.mailbox.fail_peer(self.peer, err);
        self.links.mark(&self.links.reader_done, self.peer);
        self.wake_all();
    }

    fn wake_all(&self) {
        for w in &self.work {
            w.notify_one();
        }
        self.room.notify_waiters();
        self.activity.notify_one();
    }

    /// Queues `data` for the peer, segment by segment, as the window allows.
    async fn push(&self, mut data: Bytes) -> Result<()> {
        while !data.is_empty() {
            loop {
                let room = self.room.notified();
                tokio::pin!(room);
                room.as_mut().enable();
                {
                    let mut st = self.st.lock();
                    if st.failed {
                        return Err(self.links.mailbox.peer_failure(self.peer).unwrap_or_else(|| {
                            Error::new(ErrorKind::PeerFailed, "every link to the peer broke").with_peer(self.peer)
                        }));
                    }
                    let cap = cap(&st);
                    let target = choose(&st.link, None, Some(cap));
                    if let Some(i) = target {
                        let piece = data.split_to(data.len().min(chunk(&st)));
                        let now = Instant::now();
                        if st.unacked.is_empty() {
                            st.progress_at = now;
                            st.checked_at = now;
                            // Throughput is measured over busy time only.
                            st.busy_from = now;
                            self.activity.notify_one();
                        }
                        let off = st.next_off;
                        st.next_off += piece.len() as u64;
                        st.link[i].assign(piece.len(), now);
                        st.link[i].queue.push_back((off, piece.clone()));
                        st.unacked.push_back(Seg { off, data: piece, link: i, sent: None, resent: false });
                        drop(st);
                        self.work[i].notify_one();
                        break;
                    }
                }
                room.await;
            }
        }
        Ok(())
    }

    /// Moves every unacknowledged segment of link `from` to the other links, at the
    /// front of their queues. `false` if no other link is alive.
    fn reassign(st: &mut State, from: usize) -> bool {
        st.link[from].queue.clear();
        let moving: Vec<usize> = (0..st.unacked.len()).filter(|&k| st.unacked[k].link == from).collect();
        if moving.is_empty() {
            return true;
        }
        if choose(&st.link, Some(from), None).is_none() {
            return false;
        }
        // Back to front, each at the front of its new queue: the lowest offsets go first.
        let now = Instant::now();
        for &k in moving.iter().rev() {
            let to = choose(&st.link, Some(from), None).expect("checked above");
            let seg = &mut st.unacked[k];
            let len = seg.data.len();
            seg.link = to;
            seg.sent = None;
            seg.resent = true;
            let item = (seg.off, seg.data.clone());
            st.link[from].inflight -= len;
            st.link[to].assign(len, now);
            st.link[to].queue.push_front(item);
            st.stats.resent_bytes += len as u64;
        }
        st.stats.failovers += 1;
        st.failed_over = true;
        true
    }

    /// Link `i` broke (or, `eof`, ended): its segments move to the others; with
    /// none left, the peer fails. A peer ends its links only once it has our close
    /// frame and has acknowledged everything (see [`Bundle::finish`]): an end after
    /// its own close frame is orderly.
    fn link_down(&self, i: usize, err: Error, eof: bool) {
        let mut st = self.st.lock();
        if !st.link[i].alive {
            return;
        }
        st.link[i].alive = false;
        if eof && st.close_seen {
            st.link[i].queue.clear();
            if st.link.iter().all(|l| !l.alive) {
                st.peer_ended = true;
            }
        } else {
            tracing::warn!(peer = self.peer, link = i, error = %err, "link to peer broke");
            if !Self::reassign(&mut st, i) || st.link.iter().all(|l| !l.alive) {
                self.fail(&mut st, err);
            }
        }
        drop(st);
        self.wake_all();
    }

    /// A data segment arrived on link `i`.
    fn on_data(&self, i: usize, off: u64, data: Bytes) -> Result<()> {
        let mut st = self.st.lock();
        st.stats.received[i] += data.len() as u64;
        if !st.rx_dirty {
            st.rx_dirty = true;
            self.activity.notify_one();
        }
        let end = off + data.len() as u64;
        if end <= st.next || data.is_empty() {
            return Ok(()); // a duplicate (sent again after a failover)
        }
        if off > st.next {
            if off - st.next > MAX_AHEAD {
                return Err(protocol(
                    self.peer,
                    format!("segment at {off} is more than {MAX_AHEAD} bytes ahead of {}", st.next),
                ));
            }
            st.ooo.entry(off).or_insert(data);
            return Ok(());
        }
        let mut frames = Vec::new();
        let skip = (st.next - off) as usize;
        push(&mut st.asm, &data[skip..], &mut frames)?;
        st.next = end;
        loop {
            let next = st.next;
            let Some(e) = st.ooo.first_entry().filter(|e| *e.key() <= next) else { break };
            let (o, d) = e.remove_entry();
            let e_end = o + d.len() as u64;
            if e_end > st.next {
                let skip = (st.next - o) as usize;
                push(&mut st.asm, &d[skip..], &mut frames)?;
                st.next = e_end;
            }
        }
        for f in frames {
            let close = f.header.kind == FrameKind::Close;
            self.links.mailbox.deliver(f);
            if close {
                st.close_seen = true;
                self.links.mark(&self.links.reader_done, self.peer);
            }
        }
        let owed = st.next - st.ack_sent;
        if owed >= (cap(&st) / 4) as u64 || st.close_seen {
            self.owe_ack(&mut st);
        } else {
            self.activity.notify_one();
        }
        Ok(())
    }

    /// Schedules an acknowledgement of everything received on every live link.
    fn owe_ack(&self, st: &mut State) {
        st.ack_sent = st.next;
        st.ack_at = Instant::now();
        st.rx_dirty = false;
        for (k, l) in st.link.iter_mut().enumerate() {
            if l.alive && !l.ack_due {
                l.ack_due = true;
                self.work[k].notify_one();
            }
        }
    }

    /// An acknowledgement arrived.
    fn on_ack(&self, cum: u64, reported: &[u8]) -> Result<()> {
        let mut st = self.st.lock();
        if cum > st.next_off {
            return Err(protocol(self.peer, format!("acknowledgement of {cum} bytes, only {} sent", st.next_off)));
        }
        let now = Instant::now();
        for (k, b) in reported.chunks_exact(8).enumerate() {
            let n = u64::from_le_bytes(b.try_into().expect("8 bytes"));
            let l = &mut st.link[k];
            if n > l.reported {
                l.reported = n;
                l.heard_at = now;
                if l.suspect {
                    l.suspect = false;
                    tracing::debug!(peer = self.peer, link = k, "suspected link carries data again");
                }
            }
        }
        if cum <= st.acked {
            return Ok(());
        }
        let newly = cum - st.acked;
        while st.unacked.front().is_some_and(|s| s.end() <= cum) {
            let s = st.unacked.pop_front().expect("checked");
            st.link[s.link].inflight -= s.data.len();
            if let (false, Some(sent)) = (s.resent, s.sent) {
                let rtt = now - sent;
                st.min_rtt = Some(st.min_rtt.map_or(rtt, |m| m.min(rtt)));
                st.srtt = Some(st.srtt.map_or(rtt, |s| (s * 7 + rtt) / 8));
            }
        }
        st.acked = cum;
        let gap = now - st.progress_at;
        st.stats.max_gap = st.stats.max_gap.max(gap);
        if std::mem::take(&mut st.failed_over) {
            st.stats.max_failover_gap = st.stats.max_failover_gap.max(gap);
            if st.stats.failover_log.len() == FAILOVER_LOG {
                st.stats.failover_log.remove(0);
            }
            st.stats.failover_log.push((std::time::SystemTime::now(), gap));
            tracing::debug!(peer = self.peer, gap_ms = gap.as_millis() as u64, "progress again after a failover");
        }
        st.progress_at = now;
        st.checked_at = now;
        let busy = now - st.busy_from;
        st.meter.0 += busy;
        st.meter.1 += newly;
        st.busy_from = now;
        if st.meter.0 >= METER_WINDOW {
            let r = st.meter.1 as f64 / st.meter.0.as_secs_f64();
            st.rate = Some(st.rate.map_or(r, |old| 0.75 * old + 0.25 * r));
            st.meter = (Duration::ZERO, 0);
        }
        drop(st);
        self.room.notify_waiters();
        Ok(())
    }

    /// Segments `offs` were handed to the kernel on link `i`.
    fn written(&self, i: usize, offs: &[u64]) {
        let now = Instant::now();
        let mut st = self.st.lock();
        for &off in offs {
            if let Ok(k) = st.unacked.binary_search_by_key(&off, |s| s.off)
                && st.unacked[k].link == i
            {
                st.unacked[k].sent = Some(now);
            }
        }
    }

    fn stall_limit(&self, st: &State) -> Duration {
        let rtt = st.min_rtt.unwrap_or(Duration::ZERO);
        (rtt * 3 + ACK_TICK * 3).max(self.stall_floor)
    }

    /// One round of the monitor: owed acknowledgements, stalls. Returns whether
    /// anything is outstanding (the monitor ticks) or not (it parks).
    fn tick(&self, late: bool) -> Tick {
        let mut st = self.st.lock();
        if st.failed || (st.finished && st.close_seen && st.acked == st.next_off && st.ack_sent == st.next) {
            return Tick::Done;
        }
        let now = Instant::now();
        if late {
            st.checked_at = now;
        }
        // While a hole holds the prefix back, the acknowledgement is repeated now and
        // then even if nothing arrives: the sender learns that this rank still reads
        // (its links that delivered everything then count as moving, below), and the
        // per-link counts reach it even if the acknowledgement carrying them was lost
        // on a cut link.
        let holding = !st.ooo.is_empty();
        if st.next > st.ack_sent || st.rx_dirty || (holding && now - st.ack_at >= HOLE_ACK) {
            self.owe_ack(&mut st);
        }
        if st.unacked.is_empty() {
            return if holding { Tick::Busy } else { Tick::Idle };
        }
        // A link with bytes in transit (taken by its writer, not reported by the
        // peer) that the peer has reported nothing new from for longer than the
        // limit, while another, unsuspected, link shows that the peer and the network
        // still move data: it reported bytes within the limit, or it has nothing in
        // transit (nothing unacknowledged, or everything it carried arrived and its
        // data waits for the hole on the silent one) and the peer was heard from (on
        // any link) within the limit. When every link is silent, the peer itself is
        // slow or gone (its executor blocked, say): moving data would not help, and
        // the peer watchdog judges that. Suspected links are checked too: they carry
        // data only when no link was trusted.
        //
        // A link that delivered everything is never the silent one, and it counts as
        // moving however long ago its last bytes arrived: with both links full of
        // unacknowledged data behind the hole of a cut one, the healthy one reports
        // nothing new either, and treating it as stalled too kept the data of the cut
        // one where it was (a hang, about 1 run in 3 of the path-cut tests, whenever
        // the cut link's stall was first checked after the healthy one had delivered
        // its last bytes).
        let limit = self.stall_limit(&st);
        let heard = self.links.silence(self.peer) <= limit;
        let since = |l: &LinkState| now - l.heard_at.max(st.checked_at);
        let silent = st
            .link
            .iter()
            .enumerate()
            .filter(|(_, l)| l.alive && l.inflight > 0 && !l.delivered() && since(l) > limit)
            .max_by_key(|(_, l)| since(l))
            .map(|(k, _)| k);
        let Some(from) = silent else { return Tick::Busy };
        let moving_on =
            st.link.iter().enumerate().any(|(k, l)| {
                k != from && l.alive && !l.suspect && (since(l) <= limit || (l.in_transit_none() && heard))
            });
        if !moving_on {
            // The links that could take the data carry nothing to hear back from, and
            // the peer has not been heard: ask it (at most once a stall limit).
            if !heard && st.probed_at.is_none_or(|t| now - t >= limit) {
                let mut probed = false;
                for (k, l) in st.link.iter_mut().enumerate() {
                    if k != from && l.alive && !l.suspect && l.in_transit_none() {
                        l.probe_due = true;
                        self.work[k].notify_one();
                        probed = true;
                    }
                }
                if probed {
                    st.probed_at = Some(now);
                    tracing::debug!(peer = self.peer, link = from, "link silent, peer quiet: probing the others");
                }
            }
            return Tick::Busy;
        }
        tracing::warn!(
            peer = self.peer,
            link = from,
            waited_ms = since(&st.link[from]).as_millis() as u64,
            limit_ms = limit.as_millis() as u64,
            moved = st.link[from].inflight,
            "link stalled: its segments move to the other links"
        );
        st.link[from].suspect = true;
        Self::reassign(&mut st, from);
        drop(st);
        self.wake_all();
        Tick::Busy
    }

    /// An orderly end: waits (at most [`LINGER`]) until the peer has acknowledged
    /// everything and everything it sent is acknowledged, then lets the link writers
    /// end their connections.
    async fn finish(&self) {
        let until = tokio::time::Instant::now() + LINGER;
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let mut st = self.st.lock();
                let received_all = st.close_seen || self.links.readers_stopped.load(Ordering::Acquire);
                if st.failed || st.peer_ended || (st.acked == st.next_off && received_all) {
                    if st.next > st.ack_sent {
                        self.owe_ack(&mut st);
                    }
                    break;
                }
            }
            if tokio::time::timeout_at(until, room).await.is_err() {
                break;
            }
        }
        self.st.lock().finished = true;
        self.wake_all();
        // Each link writer writes what it owes and ends its connection; one stuck on
        // a dead connection (its send buffer full) would never end: stop it.
        let until = tokio::time::Instant::now() + LINGER;
        loop {
            let ended = self.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if self.writers.load(Ordering::Acquire) == 0 {
                return;
            }
            if tokio::time::timeout_at(until, ended).await.is_err() {
                break;
            }
        }
        for h in self.tasks.lock().drain(..) {
            h.abort();
        }
    }
}

enum Tick {
    Done,
    Idle,
    Busy,
}

/// Segment size: about a millisecond of the measured throughput.
fn chunk(st: &State) -> usize {
    match st.rate {
        Some(r) => ((r / 1000.0) as usize).next_power_of_two().clamp(MIN_CHUNK, MAX_CHUNK),
        None => 256 << 10,
    }
}

/// Unacknowledged bytes one link may hold: its share of the throughput over
/// [`QUEUE_TIME`] or two of the shortest round trips seen, whichever is longer. It
/// bounds what waits in the link's socket buffer, and so how long data moved off a
/// failed link waits behind it, and how late an acknowledgement (which queues behind
/// data going the other way) comes. The smoothed round trip is not used: it grows
/// with the very queue the limit builds.
fn cap(st: &State) -> usize {
    let live = st.link.iter().filter(|l| l.alive && !l.suspect).count().max(1);
    match (st.rate, st.min_rtt) {
        (Some(r), Some(rtt)) => {
            let t = QUEUE_TIME.max(rtt * 2).as_secs_f64();
            ((r * t) as usize / live).clamp(MIN_CAP, MAX_CAP)
        }
        _ => 1 << 20,
    }
}

/// The link to put the next segment on: alive, not `except`, unsuspected if any such
/// is, under `cap` if one is given; the least loaded.
fn choose(link: &[LinkState], except: Option<usize>, cap: Option<usize>) -> Option<usize> {
    let usable = |k: usize, l: &LinkState| l.alive && Some(k) != except;
    let trusted = link.iter().enumerate().any(|(k, l)| usable(k, l) && !l.suspect);
    link.iter()
        .enumerate()
        .filter(|&(k, l)| usable(k, l) && (!trusted || !l.suspect))
        .filter(|(_, l)| cap.is_none_or(|c| l.inflight < c))
        .min_by_key(|(_, l)| l.inflight)
        .map(|(k, _)| k)
}

/// The write side of a bundle, for the stream transport's write loop.
pub(crate) struct BundleWriter(pub Arc<Bundle>);

impl WriteLink for BundleWriter {
    async fn write(&mut self, mut batch: BytesMut, big: Option<Bytes>) -> (std::io::Result<()>, BytesMut) {
        let first = batch.split().freeze();
        for part in [Some(first), big].into_iter().flatten() {
            if let Err(e) = self.0.push(part).await {
                return (Err(std::io::Error::other(e.to_string())), batch);
            }
        }
        (Ok(()), batch)
    }

    async fn finish(&mut self) {
        self.0.finish().await;
    }
}

/// Writes link `i`'s segments and acknowledgements until the bundle finishes or the
/// link breaks.
pub(crate) async fn link_writer<W: WriteLink>(b: Arc<Bundle>, i: usize, w: W) {
    struct Ended<'a>(&'a Bundle);
    impl Drop for Ended<'_> {
        fn drop(&mut self) {
            self.0.writers.fetch_sub(1, Ordering::AcqRel);
            self.0.ended.notify_waiters();
        }
    }
    let _ended = Ended(&b);
    write_segments(&b, i, w).await;
}

async fn write_segments<W: WriteLink>(b: &Bundle, i: usize, mut w: W) {
    let mut batch = BytesMut::with_capacity(64 << 10);
    let mut offs = Vec::new();
    loop {
        let mut big = None;
        let mut finish = false;
        loop {
            let work = b.work[i].notified();
            tokio::pin!(work);
            work.as_mut().enable();
            {
                let mut st = b.st.lock();
                if !st.link[i].alive || st.failed {
                    return;
                }
                if std::mem::take(&mut st.link[i].probe_due) {
                    batch.extend_from_slice(&header(KIND_PROBE, 0, 0));
                }
                if st.link[i].ack_due {
                    st.link[i].ack_due = false;
                    let n = st.link.len();
                    batch.extend_from_slice(&header(KIND_ACK, 8 * n, st.ack_sent));
                    for k in 0..n {
                        batch.extend_from_slice(&st.stats.received[k].to_le_bytes());
                    }
                }
                let acked = st.acked;
                while batch.len() < (64 << 10) {
                    let Some((off, data)) = st.link[i].queue.pop_front() else { break };
                    if off + data.len() as u64 <= acked {
                        continue;
                    }
                    batch.extend_from_slice(&header(KIND_DATA, data.len(), off));
                    st.link[i].taken += data.len() as u64;
                    offs.push(off);
                    if data.len() > COPY_LIMIT {
                        big = Some(data);
                        break;
                    }
                    batch.extend_from_slice(&data);
                }
                if batch.is_empty() && st.finished {
                    finish = true;
                }
            }
            if !batch.is_empty() || finish {
                break;
            }
            work.await;
        }
        if finish {
            w.finish().await;
            return;
        }
        b.writing_since[i].store(b.epoch.elapsed().as_micros().max(1) as u64, Ordering::Relaxed);
        let (res, back) = w.write(batch, big).await;
        b.writing_since[i].store(0, Ordering::Relaxed);
        batch = back;
        batch.clear();
        if let Err(e) = res {
            let err = Error::new(ErrorKind::PeerFailed, format!("link {i} to rank {} broke while sending", b.peer))
                .with_peer(b.peer)
                .with_source(e);
            return b.link_down(i, err, false);
        }
        b.written(i, &offs);
        offs.clear();
    }
}

/// Reads link `i`'s segments until it ends.
pub(crate) async fn link_reader<R: ReadLink>(b: Arc<Bundle>, i: usize, mut r: R) {
    let peer = b.peer;
    let n = b.work.len();
    let mut buf = BytesMut::with_capacity(64 << 10);
    let (err, eof) = 'read: loop {
        let mut need = SEG_HEADER;
        while buf.len() >= SEG_HEADER {
            let (kind, len, off) = match parse(&buf[..SEG_HEADER], peer, n) {
                Ok(h) => h,
                Err(e) => {
                    b.fail(&mut b.st.lock(), e);
                    return;
                }
            };
            if buf.len() < SEG_HEADER + len {
                need = SEG_HEADER + len;
                break;
            }
            buf.advance(SEG_HEADER);
            let payload = buf.split_to(len).freeze();
            b.links.heard_from(peer);
            let res = match kind {
                KIND_DATA => b.on_data(i, off, payload),
                KIND_ACK => b.on_ack(off, &payload),
                _ => {
                    b.owe_ack(&mut b.st.lock());
                    Ok(())
                }
            };
            if let Err(e) = res {
                b.fail(&mut b.st.lock(), e.with_peer(peer));
                return;
            }
        }
        let want = need - buf.len();
        buf.reserve(want.max(64 << 10));
        let (res, back) = r.read(buf, usize::MAX).await;
        buf = back;
        match res {
            Ok(0) => {
                let e = Error::new(ErrorKind::PeerFailed, format!("link {i} to rank {peer} ended")).with_peer(peer);
                break 'read (e, true);
            }
            Ok(_) => {
                b.read_at[i].store(b.epoch.elapsed().as_micros() as u64, Ordering::Relaxed);
                b.links.heard_from(peer);
            }
            Err(e) => {
                let e = Error::new(ErrorKind::PeerFailed, format!("link {i} to rank {peer} broke while receiving"))
                    .with_peer(peer)
                    .with_source(e);
                break 'read (e, false);
            }
        }
    };
    b.link_down(i, err, eof);
}

/// Sends owed acknowledgements and moves the segments of stalled links, until the
/// bundle is done.
pub(crate) async fn monitor(b: Arc<Bundle>) {
    let mut last = tokio::time::Instant::now();
    let mut busy = false;
    loop {
        let activity = b.activity.notified();
        tokio::pin!(activity);
        activity.as_mut().enable();
        let now = tokio::time::Instant::now();
        let late = busy && now - last > ACK_TICK * 8;
        last = now;
        match b.tick(late) {
            Tick::Done => break,
            Tick::Idle => {
                busy = false;
                activity.await;
                // Acknowledgements owed for a burst go out together, a tick later.
                tokio::time::sleep(ACK_TICK).await;
                last = tokio::time::Instant::now();
            }
            Tick::Busy => {
                busy = true;
                tokio::time::sleep(ACK_TICK).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_bad_ones_are_refused() {
        let h = header(KIND_DATA, 1000, 1 << 40);
        assert_eq!(parse(&h, 1, 2).unwrap(), (KIND_DATA, 1000, 1 << 40));
        let a = header(KIND_ACK, 16, 77);
        assert_eq!(parse(&a, 1, 2).unwrap(), (KIND_ACK, 16, 77));
        assert!(parse(&a, 1, 3).is_err(), "an acknowledgement sized for another link count");
        assert!(parse(&header(KIND_DATA, MAX_SEG + 1, 0), 1, 2).is_err());
        assert!(parse(&header(9, 0, 0), 1, 2).is_err());
        assert_eq!(parse(&header(KIND_PROBE, 0, 0), 1, 2).unwrap(), (KIND_PROBE, 0, 0));
        assert!(parse(&header(KIND_PROBE, 8, 0), 1, 2).is_err(), "a probe with a payload");
        let mut r = h;
        r[2] = 1;
        assert!(parse(&r, 1, 2).is_err());
    }

    fn links(state: &[(bool, bool, usize)]) -> Vec<LinkState> {
        state
            .iter()
            .map(|&(alive, suspect, inflight)| LinkState { alive, suspect, inflight, ..LinkState::new() })
            .collect()
    }

    #[test]
    fn choice_prefers_trusted_idle_links() {
        let l = links(&[(true, false, 100), (true, false, 50), (true, true, 0), (false, false, 0)]);
        assert_eq!(choose(&l, None, None), Some(1));
        assert_eq!(choose(&l, Some(1), None), Some(0));
        assert_eq!(choose(&l, None, Some(50)), None, "trusted links full: wait, do not use the suspect");
        let l = links(&[(true, true, 10), (true, true, 5), (false, false, 0)]);
        assert_eq!(choose(&l, None, None), Some(1), "only suspects left: the least loaded");
        assert_eq!(choose(&l, Some(1), None), Some(0));
        let l = links(&[(false, false, 0), (true, false, 0)]);
        assert_eq!(choose(&l, Some(1), None), None);
    }

    /// A bundle to rank 1 from rank 0 over two links (no tasks, no sockets), its
    /// stall limit the 40 ms floor.
    fn bundle() -> Bundle {
        let links = Arc::new(Links::new(Arc::new(hcomm_core::mailbox::Mailbox::new(0)), 2));
        Bundle::new(1, 2, links, Duration::from_millis(40), Vec::new())
    }

    /// Sent state: `segs` are (offset, length, link) of unacknowledged segments, all
    /// taken by their link's writer; `reported[k]` bytes arrived on link `k`; every
    /// link last heard from, and the stall clock started, `ago`.
    fn sending(b: &Bundle, segs: &[(u64, usize, usize)], reported: [u64; 2], ago: Duration) {
        let mut st = b.st.lock();
        let then = Instant::now() - ago;
        for &(off, len, k) in segs {
            st.unacked.push_back(Seg {
                off,
                data: Bytes::from(vec![0u8; len]),
                link: k,
                sent: Some(then),
                resent: false,
            });
            st.link[k].inflight += len;
            st.link[k].taken += len as u64;
            st.next_off = st.next_off.max(off + len as u64);
        }
        for (k, l) in st.link.iter_mut().enumerate() {
            l.reported = reported[k];
            l.heard_at = then;
        }
        (st.progress_at, st.checked_at) = (then, then);
    }

    const MIB: usize = 1 << 20;

    /// The hang of the path-cut tests: link 0 is cut with its first segment in
    /// transit; link 1 delivered all its segments, which wait for link 0's hole, so
    /// it reports nothing new either. The peer still acknowledges. Link 0's segments
    /// must move.
    #[test]
    fn a_silent_link_moves_while_the_other_delivered_everything() {
        let b = bundle();
        sending(
            &b,
            &[(0, MIB, 0), (MIB as u64, MIB, 1), (2 * MIB as u64, MIB, 0)],
            [0, MIB as u64],
            Duration::from_millis(200),
        );
        b.links.heard_from(1);
        assert!(matches!(b.tick(false), Tick::Busy));
        let st = b.st.lock();
        assert_eq!(st.stats.failovers, 1, "link 0's segments did not move");
        assert!(st.link[0].suspect && !st.link[1].suspect);
        assert_eq!((st.link[0].inflight, st.link[1].inflight), (0, 3 * MIB));
        let queued: Vec<u64> = st.link[1].queue.iter().map(|(off, _)| *off).collect();
        assert_eq!(queued, [0, 2 * MIB as u64], "the hole first");
    }

    /// The same after a late tick of this rank's own executor restarted the stall
    /// clock of both links: the delivered link must not be taken for the silent one.
    #[test]
    fn a_late_tick_does_not_make_the_delivered_link_the_suspect() {
        let b = bundle();
        sending(&b, &[(0, MIB, 0), (MIB as u64, MIB, 1)], [0, MIB as u64], Duration::from_millis(200));
        assert!(matches!(b.tick(true), Tick::Busy));
        assert_eq!(b.st.lock().stats.failovers, 0, "within the limit of the late tick");
        b.st.lock().checked_at -= Duration::from_millis(100);
        b.links.heard_from(1);
        b.tick(false);
        let st = b.st.lock();
        assert_eq!(st.stats.failovers, 1);
        assert!(st.link[0].suspect && !st.link[1].suspect, "the wrong link suspected");
    }

    /// Every link with bytes in transit and silent: the peer is slow or gone, and
    /// nothing moves (the peer watchdog judges). Nor does anything move when the
    /// other link delivered everything but the peer has not been heard from within
    /// the limit.
    #[test]
    fn nothing_moves_when_the_peer_itself_is_silent() {
        let b = bundle();
        sending(&b, &[(0, MIB, 0), (MIB as u64, MIB, 1)], [0, MIB as u64 / 2], Duration::from_millis(200));
        b.links.heard_from(1);
        b.tick(false);
        assert_eq!(b.st.lock().stats.failovers, 0, "both links in transit and silent");

        let b = bundle();
        sending(&b, &[(0, MIB, 0), (MIB as u64, MIB, 1)], [0, MIB as u64], Duration::from_millis(200));
        std::thread::sleep(Duration::from_millis(60));
        b.tick(false);
        assert_eq!(b.st.lock().stats.failovers, 0, "the peer was not heard from");
        b.links.heard_from(1);
        b.tick(false);
        assert_eq!(b.st.lock().stats.failovers, 1, "heard again");
    }

    /// Link 0 lost the last messages of both sides; link 1 is idle and the peer
    /// quiet (it too waits for something lost). The idle link is probed; once the
    /// peer answers, link 0's segments move. A probe that arrives is answered with an
    /// acknowledgement on every link.
    #[test]
    fn a_quiet_peer_is_probed_on_the_idle_link() {
        let b = bundle();
        sending(&b, &[(0, 100, 0)], [0, 0], Duration::from_millis(200));
        std::thread::sleep(Duration::from_millis(60));
        b.tick(false);
        {
            let st = b.st.lock();
            assert_eq!(st.stats.failovers, 0, "not heard: nothing moves yet");
            assert!(!st.link[0].probe_due && st.link[1].probe_due, "probe the idle link only");
        }
        b.st.lock().link[1].probe_due = false;
        b.tick(false);
        assert!(!b.st.lock().link[1].probe_due, "probed again within the limit");
        b.links.heard_from(1); // the answer
        b.tick(false);
        assert_eq!(b.st.lock().stats.failovers, 1);

        // The peer's side: a probe read on link 0, then the link ends.
        struct Once(Option<[u8; SEG_HEADER]>);
        impl ReadLink for Once {
            async fn read(&mut self, mut buf: BytesMut, _: usize) -> (std::io::Result<usize>, BytesMut) {
                let bytes = self.0.take();
                buf.extend_from_slice(bytes.as_ref().map_or(&[][..], |b| &b[..]));
                (Ok(bytes.map_or(0, |b| b.len())), buf)
            }
        }
        let peer = Arc::new(bundle());
        futures::executor::block_on(link_reader(peer.clone(), 0, Once(Some(header(KIND_PROBE, 0, 0)))));
        let st = peer.st.lock();
        assert!(!st.link[0].alive && st.link[1].ack_due, "the probe is answered on the other link");
    }

    /// A receiver whose prefix a hole holds back repeats its acknowledgement (the
    /// sender's evidence that it still reads), and keeps ticking with nothing of
    /// its own to send.
    #[test]
    fn a_hole_repeats_the_acknowledgement() {
        let b = bundle();
        {
            let mut st = b.st.lock();
            st.ooo.insert(4096, Bytes::from_static(b"later"));
            st.ack_at = Instant::now() - HOLE_ACK;
        }
        assert!(matches!(b.tick(false), Tick::Busy));
        assert!(b.st.lock().link.iter().all(|l| l.ack_due));
        for l in &mut b.st.lock().link {
            l.ack_due = false;
        }
        b.tick(false);
        assert!(b.st.lock().link.iter().all(|l| !l.ack_due), "repeated before HOLE_ACK passed");
        b.st.lock().ooo.clear();
        assert!(matches!(b.tick(false), Tick::Idle));
    }
}
