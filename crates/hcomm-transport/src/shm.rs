//! Shared-memory links between ranks on the same host.
//!
//! Each direction of a peer pair is a single-producer single-consumer byte ring in a
//! file under `/dev/shm`, mapped by both processes. The ring carries exactly the byte
//! stream a TCP connection would (the same frames, parsed by the same sans-IO
//! framing), so a shared-memory link is one more backend of [`crate::StreamTransport`]'s
//! read and write loops: heartbeats, failure detection, abort and close work
//! unchanged.
//!
//! The pair's authenticated TCP connection stays open as the *doorbell*: a reader
//! with nothing to read, after a short bounded spin, marks itself waiting in the ring
//! and parks on a `tokio::sync::Notify`; a writer that finds the mark sends one byte
//! (`1`: data) over the connection, and the peer's doorbell task wakes the reader.
//! A writer facing a full ring does the same the other way (`2`: space). No thread
//! of ours and no busy polling beyond the spin. A peer process that dies closes the
//! connection: its doorbell task sees the EOF, and the reader drains what the ring
//! still holds before reporting the end, so a close frame written just before is not
//! mistaken for a crash.
//!
//! Two shortcuts spare small messages the hand-overs between tasks (each costs a trip
//! through the executor, microseconds on a busy machine):
//!
//! - *Direct sends* ([`ShmOut::send`]): a send of up to 64 KiB whose writer task holds
//!   nothing writes its frame into the ring itself, at the call, and completes at
//!   once. A counter of the messages the writer task holds, under the same lock,
//!   keeps the order: while it is not zero, sends queue behind them.
//! - *Receives that poll* ([`ShmInbox`], [`hcomm_core::mailbox::Progress`]): the
//!   parser of the ring sits behind a lock that the reader task and a waiting receive
//!   both try, so a receive whose peer is reached this way reads the ring whenever it
//!   is polled, and, with [`ShmOptions::poll`] (`HCOMM_SHM_POLL_US`), keeps polling
//!   inside its poll for that long, as a blocking MPI receive does.
//!
//! Setup ([`negotiate`]) runs over the connection once the mesh stands: each side
//! creates its outgoing ring (`O_EXCL`, mode 0600), sends the file's name, maps the
//! peer's, and both confirm; each then unlinks the file it created, so nothing stays
//! in `/dev/shm` once the processes are gone. If either side cannot (another host or
//! container behind the same host name, `/dev/shm` full), both keep TCP for that pair.
#![allow(unsafe_code)] // mapping shared memory and touching it through raw pointers

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use memmap2::MmapMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;

use hcomm_core::Rank;
use hcomm_core::wire::{HEADER_LEN, Header};
use parking_lot::Mutex;

use crate::framing::Assembler;
use crate::stream::{Links, WriteLink, deliver_all, unannounced_eof};

/// Directory of the ring files.
const DIR: &str = "/dev/shm";
/// Header of a ring file: counters on their own cache lines.
const HDR: usize = 256;
/// Bytes written so far (by the writer).
const HEAD: usize = 0;
/// Bytes read so far (by the reader).
const TAIL: usize = 64;
/// 1 while the reader waits for data.
const READER_WAITS: usize = 128;
/// 1 while the writer waits for space.
const WRITER_WAITS: usize = 192;

const DOORBELL_DATA: u8 = 1;
const DOORBELL_SPACE: u8 = 2;

/// Default ring capacity per direction (`HCOMM_SHM_RING`).
pub const DEFAULT_RING: usize = 4 << 20;
/// Default spin before a waiting side parks (`HCOMM_SHM_SPIN_US`).
pub const DEFAULT_SPIN: Duration = Duration::from_micros(200);

/// One direction's ring, mapped.
struct Ring {
    _map: MmapMut,
    base: *mut u8,
    cap: usize,
    /// The writer's last reading of the reader's counter: room is computed from it,
    /// and the shared counter (whose cache line the reader writes on every read) is
    /// read again only when that room is not enough.
    tail_seen: AtomicU64,
}

// SAFETY: the mapping lives as long as the `Ring`; the counters are atomics and the
// data region is written only by the one writer (below `head`) and read only by the
// one reader (between `tail` and `head`), with acquire/release ordering on the
// counters. Each side's `Ring` is used by one task at a time.
unsafe impl Send for Ring {}
unsafe impl Sync for Ring {}

impl Ring {
    fn map(file: &File, cap: usize) -> io::Result<Ring> {
        // SAFETY: the file is ours and the peer's only (0600, unlinked after setup);
        // its contents are touched only through atomics and raw copies below.
        let mut map = unsafe { MmapMut::map_mut(file)? };
        if map.len() != HDR + cap {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "ring file of the wrong size"));
        }
        let base = map.as_mut_ptr();
        Ok(Ring { _map: map, base, cap, tail_seen: AtomicU64::new(0) })
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        // SAFETY: `off` is one of the header offsets, 64-byte aligned within the
        // page-aligned mapping.
        unsafe { &*self.base.add(off).cast::<AtomicU64>() }
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        // SAFETY: as `u64_at`.
        unsafe { &*self.base.add(off).cast::<AtomicU32>() }
    }

    fn readable(&self) -> usize {
        // The reader's counter first: a receive that polls may ask while the holder
        // of the reading side advances it, and the writer's counter, read after, is
        // then at least as far.
        let tail = self.u64_at(TAIL).load(Ordering::Acquire);
        (self.u64_at(HEAD).load(Ordering::Acquire) - tail) as usize
    }

    fn writable(&self) -> usize {
        self.room(usize::MAX)
    }

    /// Writer: the room in the ring, read afresh from the reader's counter only if
    /// the last reading leaves less than `need`.
    fn room(&self, need: usize) -> usize {
        let head = self.u64_at(HEAD).load(Ordering::Relaxed);
        let room = self.cap - (head - self.tail_seen.load(Ordering::Relaxed)) as usize;
        if room >= need {
            return room;
        }
        let tail = self.u64_at(TAIL).load(Ordering::Acquire);
        self.tail_seen.store(tail, Ordering::Relaxed);
        self.cap - (head - tail) as usize
    }

    /// Writer: copies as much of `src` as fits; returns how much.
    fn push(&self, src: &[u8]) -> usize {
        let n = self.room(src.len()).min(src.len());
        self.push_parts(&[&src[..n]]);
        n
    }

    /// Writer: copies `parts` one after the other and publishes them together; the
    /// caller has checked that they fit ([`Ring::writable`]).
    fn push_parts(&self, parts: &[&[u8]]) {
        let mut head = self.u64_at(HEAD).load(Ordering::Relaxed);
        for src in parts {
            let n = src.len();
            let at = (head % self.cap as u64) as usize;
            let first = n.min(self.cap - at);
            // SAFETY: both pieces lie in the data region, in the part the reader has
            // released (the caller checked `writable`), and `src` is a separate
            // allocation.
            unsafe {
                let data = self.base.add(HDR);
                std::ptr::copy_nonoverlapping(src.as_ptr(), data.add(at), first);
                std::ptr::copy_nonoverlapping(src.as_ptr().add(first), data, n - first);
            }
            head += n as u64;
        }
        self.u64_at(HEAD).store(head, Ordering::Release);
    }

    /// Reader: copies up to `len` bytes to `dst`; returns how many.
    ///
    /// # Safety
    /// `dst` must be valid for `len` bytes of writes.
    unsafe fn pop(&self, dst: *mut u8, len: usize) -> usize {
        let tail = self.u64_at(TAIL).load(Ordering::Relaxed);
        let n = self.readable().min(len);
        let at = (tail % self.cap as u64) as usize;
        let first = n.min(self.cap - at);
        // SAFETY: both pieces lie in the data region, in the part the writer has
        // published (`readable`); `dst` is valid for `len >= n` bytes (caller).
        unsafe {
            let data = self.base.add(HDR);
            std::ptr::copy_nonoverlapping(data.add(at), dst, first);
            std::ptr::copy_nonoverlapping(data, dst.add(first), n - first);
        }
        self.u64_at(TAIL).store(tail + n as u64, Ordering::Release);
        n
    }
}

/// A peer's two rings, mapped, after [`negotiate`].
pub struct ShmPair {
    tx: Ring,
    rx: Ring,
}

impl std::fmt::Debug for ShmPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmPair").field("cap", &self.tx.cap).finish()
    }
}

/// Shared-memory settings.
#[derive(Debug, Clone)]
pub struct ShmOptions {
    /// Ring capacity per direction, bytes (a power of two).
    pub ring: usize,
    /// How long a side with nothing to do spins before it parks.
    pub spin: Duration,
    /// How long a receive from a shared-memory peer keeps polling the ring inside
    /// one poll of its future, holding the thread, before it returns `Pending` and
    /// waits to be woken (`HCOMM_SHM_POLL_US`; zero, the default: no such spin, the
    /// receive polls the ring once whenever it is polled). Lowers small-message
    /// latency to what a polling MPI library gets, at the price of the other tasks of
    /// that thread waiting up to this long.
    pub poll: Duration,
}

impl Default for ShmOptions {
    fn default() -> ShmOptions {
        ShmOptions { ring: DEFAULT_RING, spin: DEFAULT_SPIN, poll: Duration::ZERO }
    }
}

fn create_ring(job: u64, me: usize, peer: usize, cap: usize) -> io::Result<(Ring, PathBuf)> {
    let name = format!("hcomm-{job:016x}-{me}-{peer}-{:016x}", rand_u64());
    let path = Path::new(DIR).join(name);
    let file = OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&path)?;
    let ring = file.set_len((HDR + cap) as u64).and_then(|()| Ring::map(&file, cap));
    match ring {
        Ok(r) => Ok((r, path)),
        Err(e) => {
            let _ = std::fs::remove_file(&path);
            Err(e)
        }
    }
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    // RandomState's keys are random per process; the pid separates processes too.
    h.write_u32(std::process::id());
    h.finish()
}

fn open_ring(name: &str, cap: usize) -> io::Result<Ring> {
    if !name.starts_with("hcomm-") || name.contains('/') || name.len() > 200 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not a ring file name"));
    }
    let file = OpenOptions::new().read(true).write(true).open(Path::new(DIR).join(name))?;
    Ring::map(&file, cap)
}

/// Sets up shared-memory rings with the peer at the other end of `stream` (which
/// must be on this host for it to work), as the module documentation describes.
/// Both ends call it at the same point. `Ok(None)`: keep TCP for this pair.
///
/// # Errors
/// The connection failed during the exchange.
pub async fn negotiate(
    stream: &mut TcpStream,
    me: usize,
    peer: usize,
    job: u64,
    opts: &ShmOptions,
) -> io::Result<Option<ShmPair>> {
    let cap = opts.ring.next_power_of_two();
    let mine = create_ring(job, me, peer, cap);
    if let Err(e) = &mine {
        tracing::debug!(me, peer, error = %e, "no shared-memory ring: keeping TCP");
    }
    let name = mine.as_ref().map(|(_, p)| p.file_name().unwrap_or_default().to_string_lossy().into_owned());
    let name = name.unwrap_or_default();
    let mut offer = Vec::with_capacity(10 + name.len());
    offer.extend_from_slice(&(cap as u64).to_le_bytes());
    offer.extend_from_slice(&(name.len() as u16).to_le_bytes());
    offer.extend_from_slice(name.as_bytes());
    let result = async {
        stream.write_all(&offer).await?;
        let peer_cap = stream.read_u64_le().await? as usize;
        let len = stream.read_u16_le().await? as usize;
        let mut theirs = vec![0u8; len];
        stream.read_exact(&mut theirs).await?;
        let rx = match (len, peer_cap == cap) {
            (0, _) | (_, false) => None,
            _ => open_ring(&String::from_utf8_lossy(&theirs), cap).ok(),
        };
        let ok = u8::from(rx.is_some() && mine.is_ok());
        stream.write_all(&[ok]).await?;
        let peer_ok = stream.read_u8().await?;
        io::Result::Ok((rx, ok == 1 && peer_ok == 1))
    }
    .await;
    let (mine, path) = match mine {
        Ok((r, p)) => (Some(r), Some(p)),
        Err(_) => (None, None),
    };
    if let Some(p) = path {
        let _ = std::fs::remove_file(p);
    }
    let (rx, both) = result?;
    Ok(match (mine, rx, both) {
        (Some(tx), Some(rx), true) => Some(ShmPair { tx, rx }),
        _ => None,
    })
}

/// What the two directions of one shared-memory peer share.
struct Bell {
    stream: Arc<TcpStream>,
    data: Notify,
    space: Notify,
    /// The doorbell connection ended (the peer closed it or died).
    dead: AtomicBool,
}

impl Bell {
    fn ring(&self, what: u8) {
        // A full socket buffer means the peer has unread doorbells: it is awake.
        let _ = self.stream.try_write(&[what]);
    }
}

/// The receiving half of a shared-memory peer: the ring and the parser of what it
/// carries, shared by the reader task and by receives that poll the link themselves
/// ([`hcomm_core::mailbox::Progress`]).
pub(crate) struct ShmInbox {
    ring: Ring,
    bell: Arc<Bell>,
    peer: Rank,
    links: Arc<Links>,
    asm: Mutex<Assembler>,
    /// The peer's close frame, a protocol error or the end of the link was seen: the
    /// mailbox knows, and nothing more is read.
    ended: AtomicBool,
}

/// What one [`ShmInbox::drain`] did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Drained {
    /// Nothing had arrived, or another task was reading.
    Nothing,
    /// Bytes were read and every complete message in them delivered.
    Some,
    /// The link has ended (see [`ShmInbox::ended`]), or the transport has stopped
    /// its readers.
    Ended,
}

impl ShmInbox {
    /// Reads what has arrived and delivers every complete message to the mailbox,
    /// unless another task is reading.
    pub(crate) fn drain(&self) -> Drained {
        if self.ended.load(Ordering::Acquire) {
            return Drained::Ended;
        }
        // A transport that stopped its readers reads nothing more: for this link that
        // is its end (the mailbox is closed already), not "nothing yet", which would
        // keep the reader task looping over bytes it may not read.
        if self.links.readers_stopped.load(Ordering::Acquire) {
            return Drained::Ended;
        }
        if self.ring.readable() == 0 {
            return Drained::Nothing;
        }
        let Some(mut asm) = self.asm.try_lock() else { return Drained::Nothing };
        let mut got = false;
        loop {
            let (mut buf, limit) = asm.read_target();
            let spare = (buf.capacity() - buf.len()).min(limit);
            debug_assert!(spare > 0, "the framing hands out buffers with room");
            // SAFETY: the spare capacity of `buf` is valid for `spare` bytes; the
            // bytes `pop` wrote become part of its length. Only the holder of `asm`
            // pops, so the ring has one reader.
            let n = unsafe {
                let n = self.ring.pop(buf.as_mut_ptr().add(buf.len()), spare);
                buf.set_len(buf.len() + n);
                n
            };
            asm.filled(buf);
            if n == 0 {
                break;
            }
            got = true;
            fence(Ordering::SeqCst);
            if self.ring.u32_at(WRITER_WAITS).swap(0, Ordering::SeqCst) == 1 {
                self.bell.ring(DOORBELL_SPACE);
            }
            match deliver_all(&mut asm, &self.links.mailbox) {
                Ok(false) => {}
                Ok(true) => {
                    self.end(None);
                    return Drained::Ended;
                }
                Err(e) => {
                    self.end(Some(e.with_peer(self.peer)));
                    return Drained::Ended;
                }
            }
        }
        if got {
            self.links.heard_from(self.peer);
            Drained::Some
        } else {
            Drained::Nothing
        }
    }

    /// Ends the link: the peer's failure (`None`: its orderly close, already
    /// delivered) goes to the mailbox, and the reader task, if it waits, wakes to
    /// stop.
    fn end(&self, err: Option<hcomm_core::Error>) {
        if self.ended.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(err) = err {
            tracing::debug!(peer = self.peer, error = %err, "shared-memory reader stopped");
            self.links.mailbox.fail_peer(self.peer, err);
        }
        self.links.mark(&self.links.reader_done, self.peer);
        self.bell.data.notify_one();
    }

    /// Whether the link has ended.
    pub(crate) fn ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }
}

impl hcomm_core::mailbox::PollLink for ShmInbox {
    fn poll(&self) -> bool {
        self.drain() != Drained::Ended
    }
}

/// The reader task of a shared-memory peer: drains the ring whenever it has data,
/// spinning briefly and then parking on the doorbell in between, until the link ends.
pub(crate) async fn read_task(inbox: Arc<ShmInbox>, spin: Duration) {
    inbox.links.heard_from(inbox.peer);
    let waits = inbox.ring.u32_at(READER_WAITS);
    loop {
        match inbox.drain() {
            Drained::Ended => return,
            // A ring that always has data never makes this task wait: take part in
            // tokio's cooperative budget, so that the executor's other tasks (the
            // heartbeat writer among them) still run.
            Drained::Some => tokio::task::coop::consume_budget().await,
            // Bytes are there, but a receive that polls the link holds the parser: let
            // it finish. Waiting for `readable() > 0` would return at once, and the
            // task would spin without ever giving the executor back.
            Drained::Nothing if inbox.ring.readable() > 0 => tokio::task::yield_now().await,
            Drained::Nothing => {
                let ready = || inbox.ring.readable() > 0 || inbox.ended();
                if !wait_until(spin, waits, ready, &inbox.bell.data, &inbox.bell.dead).await {
                    // The doorbell ended and the ring is empty: everything the peer
                    // wrote before it went is read. Without its close frame, it died.
                    if inbox.drain() != Drained::Ended {
                        inbox.end(Some(unannounced_eof(inbox.peer)));
                    }
                    return;
                }
            }
        }
    }
}

/// The sending half of a shared-memory peer, shared by the writer task and by
/// sends that write their message into the ring themselves ([`ShmOut::try_direct`]).
pub(crate) struct ShmOut {
    ring: Ring,
    bell: Arc<Bell>,
    /// Messages handed to the writer task and not yet completely written (and, once
    /// the writer has stopped, [`RETIRED`]): a direct write goes only when it is zero,
    /// so that messages leave in the order they were sent and never inside another's
    /// bytes.
    busy: Mutex<usize>,
}

impl std::fmt::Debug for ShmOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmOut").field("cap", &self.ring.cap).field("busy", &*self.busy.lock()).finish()
    }
}

/// [`ShmOut::busy`] of a writer that has stopped: nothing is written directly any more.
const RETIRED: usize = usize::MAX / 2;

/// The largest message written directly by the sending task.
const DIRECT_MAX: usize = 64 << 10;

impl ShmOut {
    /// Writes `header` and `payload` as one whole frame straight into the ring if
    /// `direct` allows it, the writer task holds nothing, the message is small and
    /// the ring has room (`true`); otherwise counts the message as the writer task's
    /// and hands it to `queue`, under the same lock, so that no direct write can
    /// overtake it.
    pub(crate) fn send(&self, header: Header, payload: Bytes, direct: bool, queue: impl FnOnce(Bytes)) -> bool {
        let mut busy = self.busy.lock();
        let len = payload.len();
        if direct
            && *busy == 0
            && len <= DIRECT_MAX
            && !self.bell.dead.load(Ordering::Acquire)
            && self.ring.room(HEADER_LEN + len) >= HEADER_LEN + len
        {
            let mut header = header;
            header.msg_id = u64::MAX;
            header.msg_len = len as u64;
            header.offset = 0;
            header.frag_len = len as u32;
            self.ring.push_parts(&[&header.encode(), &payload]);
            drop(busy);
            self.published();
            return true;
        }
        *busy += 1;
        queue(payload);
        false
    }

    /// Counts one more message as the writer task's (one it made itself: a
    /// heartbeat).
    pub(crate) fn hold(&self) {
        *self.busy.lock() += 1;
    }

    /// The writer task has written `n` of its messages completely.
    pub(crate) fn release(&self, n: usize) {
        let mut busy = self.busy.lock();
        *busy = busy.saturating_sub(n);
    }

    /// The writer task has stopped: no more direct writes.
    pub(crate) fn retire(&self) {
        *self.busy.lock() = RETIRED;
    }

    /// After bytes went into the ring: wakes the reader if it waits.
    fn published(&self) {
        fence(Ordering::SeqCst);
        if self.ring.u32_at(READER_WAITS).swap(0, Ordering::SeqCst) == 1 {
            self.bell.ring(DOORBELL_DATA);
        }
    }
}

/// The writer task's link to a shared-memory peer.
pub(crate) struct ShmWrite {
    out: Arc<ShmOut>,
    spin: Duration,
}

/// The halves of a negotiated pair and the doorbell task, which must run as long as
/// the link does.
pub(crate) struct Split {
    pub inbox: Arc<ShmInbox>,
    pub out: Arc<ShmOut>,
    pub writer: ShmWrite,
    pub doorbell: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>>,
}

/// Splits a negotiated pair with `peer` into its halves and the doorbell task.
pub(crate) fn split(pair: ShmPair, stream: TcpStream, spin: Duration, peer: Rank, links: Arc<Links>) -> Split {
    let _ = stream.set_nodelay(true);
    let bell = Arc::new(Bell {
        stream: Arc::new(stream),
        data: Notify::new(),
        space: Notify::new(),
        dead: AtomicBool::new(false),
    });
    let b = bell.clone();
    let doorbell = async move {
        let mut buf = [0u8; 64];
        loop {
            if b.stream.readable().await.is_err() {
                break;
            }
            match b.stream.try_read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    for &x in &buf[..n] {
                        match x {
                            DOORBELL_DATA => b.data.notify_one(),
                            DOORBELL_SPACE => b.space.notify_one(),
                            _ => tracing::warn!(byte = x, "unexpected byte on a shared-memory doorbell"),
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => break,
            }
        }
        b.dead.store(true, Ordering::Release);
        b.data.notify_one();
        b.space.notify_one();
    };
    let inbox = Arc::new(ShmInbox {
        ring: pair.rx,
        bell: bell.clone(),
        peer,
        links,
        asm: Mutex::new(Assembler::new(peer)),
        ended: AtomicBool::new(false),
    });
    let out = Arc::new(ShmOut { ring: pair.tx, bell, busy: Mutex::new(0) });
    Split { inbox, writer: ShmWrite { out: out.clone(), spin }, out, doorbell: Box::pin(doorbell) }
}

/// Polls `ready` for up to `spin`, yielding to the executor between polls (so that
/// the other tasks of a current-thread runtime, such as the one that will consume
/// what arrives, keep running); whether it became true.
///
/// `yield_now` defers the task until the runtime has polled its I/O driver, which
/// costs a system call per try. A plain self-wake would be cheaper per try, but
/// measured slower: a current-thread runtime then always has a runnable task and
/// polls the future it blocks on (the application's, waiting for what arrives) only
/// every few dozen tasks.
async fn spin_until(spin: Duration, ready: impl Fn() -> bool) -> bool {
    if ready() {
        return true;
    }
    if spin.is_zero() {
        return false;
    }
    let start = Instant::now();
    loop {
        tokio::task::yield_now().await;
        if ready() {
            return true;
        }
        if start.elapsed() >= spin {
            return false;
        }
    }
}

/// Waits until `ready()`: spins (see [`spin_until`]), then sets `flag` (the peer
/// rings `notify` when it finds it set) and parks. `false` if the doorbell died
/// while `ready()` stayed false.
async fn wait_until(
    spin: Duration,
    flag: &AtomicU32,
    ready: impl Fn() -> bool,
    notify: &Notify,
    dead: &AtomicBool,
) -> bool {
    loop {
        if spin_until(spin, &ready).await {
            return true;
        }
        flag.store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if ready() {
            flag.store(0, Ordering::Relaxed);
            return true;
        }
        if dead.load(Ordering::Acquire) {
            return false;
        }
        notify.notified().await;
    }
}

impl WriteLink for ShmWrite {
    async fn write(&mut self, batch: BytesMut, big: Option<Bytes>) -> (io::Result<()>, BytesMut) {
        let res = self.write_all(&batch).await;
        let res = match (res, big) {
            (Ok(()), Some(big)) => self.write_all(&big).await,
            (res, _) => res,
        };
        (res, batch)
    }

    async fn finish(&mut self) {
        // The peer's doorbell task sees the end, and its reader then the end of the
        // ring, after our close frame.
        let _ = socket2::SockRef::from(&*self.out.bell.stream).shutdown(std::net::Shutdown::Write);
    }

    fn written(&mut self, messages: usize) {
        self.out.release(messages);
    }

    fn heartbeat(&mut self) {
        self.out.hold();
    }

    fn stopped(&mut self) {
        self.out.retire();
    }
}

impl ShmWrite {
    async fn write_all(&self, part: &[u8]) -> io::Result<()> {
        let out = &*self.out;
        let waits = out.ring.u32_at(WRITER_WAITS);
        let closed = || io::Error::new(io::ErrorKind::BrokenPipe, "the peer's shared-memory doorbell closed");
        let mut off = 0;
        while off < part.len() {
            if out.bell.dead.load(Ordering::Acquire) {
                return Err(closed());
            }
            let n = out.ring.push(&part[off..]);
            if n > 0 {
                off += n;
                out.published();
                // As in `read_task`: never monopolise the executor.
                tokio::task::coop::consume_budget().await;
            } else if !wait_until(self.spin, waits, || out.ring.writable() > 0, &out.bell.space, &out.bell.dead).await {
                return Err(closed());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::task::{Context, Waker};

    /// A link whose receiving ring is its own sending ring (one file mapped twice),
    /// so that what the test pushes is what the reader finds; the doorbell is a
    /// loopback connection nobody rings.
    async fn looped() -> (Split, Arc<Links>) {
        let cap = 1 << 12;
        let (tx, path) = create_ring(rand_u64(), 0, 1, cap).unwrap();
        let rx = open_ring(&path.file_name().unwrap().to_string_lossy(), cap).unwrap();
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (_server, _) = listener.accept().await.unwrap();
        // The test's end of the doorbell stays open: leaking it keeps the bell alive.
        std::mem::forget(_server);
        let links = Arc::new(Links::new(Arc::new(hcomm_core::mailbox::Mailbox::new(0)), 2));
        (split(ShmPair { tx, rx }, client, Duration::ZERO, 1, links.clone()), links)
    }

    /// Polls the reader task once on another thread: `Some(ready)` if that poll
    /// returned within a few seconds, `None` if it never gave the thread back.
    fn poll_once(inbox: Arc<ShmInbox>) -> Option<bool> {
        let (done, wait) = std::sync::mpsc::channel();
        // A task that never returns from its poll keeps this thread; the test fails
        // instead of waiting for it.
        std::thread::spawn(move || {
            let mut task = Box::pin(read_task(inbox, Duration::ZERO));
            let ready = task.as_mut().poll(&mut Context::from_waker(Waker::noop())).is_ready();
            let _ = done.send(ready);
        });
        wait.recv_timeout(Duration::from_secs(5)).ok()
    }

    /// The hang seen in CI: the transport stopped its readers (the communicator was
    /// closing) while bytes were still arriving. The reader read nothing more, its
    /// wait for "bytes readable" returned at once, and it looped without ever
    /// yielding, so that its abort never took effect and it held a worker thread.
    #[tokio::test]
    async fn a_stopped_reader_with_bytes_in_the_ring_ends() {
        let (sp, links) = looped().await;
        sp.out.ring.push(&[0u8; 5]);
        links.readers_stopped.store(true, Ordering::Release);
        assert_eq!(poll_once(sp.inbox.clone()), Some(true), "the reader task must end, not spin");
        assert_eq!(sp.inbox.drain(), Drained::Ended);
    }

    /// The same spin with a receive that polls the link holding the parser: the
    /// reader task must give the thread back (to the receive, on a current-thread
    /// runtime) rather than wait for a lock inside its poll.
    #[tokio::test]
    async fn a_reader_that_finds_the_parser_busy_yields() {
        let (sp, _links) = looped().await;
        sp.out.ring.push(&[0u8; 5]);
        let held = sp.inbox.asm.lock();
        assert_eq!(poll_once(sp.inbox.clone()), Some(false), "the reader task must yield, not spin");
        drop(held);
        // With the parser free, the reader reads the bytes (less than a whole header,
        // so no message yet).
        assert_eq!(sp.inbox.drain(), Drained::Some);
        assert_eq!(sp.inbox.ring.readable(), 0);
    }
}
