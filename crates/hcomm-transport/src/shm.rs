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
//! mistaken for a crash. A finalizing rank ends its side of the connection too,
//! after its close frame, but goes on reading until the peer's: to the peer's writer
//! that EOF only means "no more rings", and it keeps writing, polling for ring space
//! where it would have waited for a ring, until a write to the connection fails (the
//! peer's end is gone).
//!
//! Two shortcuts spare small messages the hand-overs between tasks (each costs a trip
//! through the executor, microseconds on a busy machine):
//!
//! - *Direct sends* (`ShmOut::send`): a send of up to 64 KiB whose writer task holds
//!   nothing writes its frame into the ring itself, at the call, and completes at
//!   once. A counter of the messages the writer task holds, under the same lock,
//!   keeps the order: while it is not zero, sends queue behind them.
//! - *Receives that poll* (`ShmInbox`, [`hcomm_core::mailbox::Progress`]): the
//!   parser of the ring sits behind a lock that the reader task and a waiting receive
//!   both try, so a receive whose peer is reached this way reads the ring whenever it
//!   is polled, and keeps polling inside its poll for
//!   [`StreamOptions::recv_spin`](crate::StreamOptions::recv_spin), as a blocking MPI
//!   receive does.
//!
//! *Boxes* for small messages (up to 4 KiB, as OpenMPI's "fast boxes"): a direct
//! send writes the message on whole cache lines of its own, the last 8 bytes of the
//! first line a *stamp* (the box's stream position mixed with a random key of the
//! ring), stored after the rest of the box and before the writer's counter. A reader
//! at a line start checks the stamp before the counter, and takes a box stamped for
//! its position without reading the counter: the reader learns of the message from
//! one cache line of the writer's core instead of two in a row (the counter's, then
//! the message's). A line left from an earlier lap carries another position's stamp,
//! and a fresh ring's zeroed lines none (the key is never zero). The counter still
//! covers every box, so a reader that finds one through it (or after other bytes, in
//! the parser's buffer) reads it as a frame.
//!
//! *Single copy for large messages* (Linux cross-memory attach, as OpenMPI's and
//! MPICH's shared-memory paths do): a data message of [`ShmOptions::pull_min`] bytes
//! or more does not go through the ring. The sender *lends* it: it writes a *pull*
//! frame instead (the message's header and where the payload lies), and the receiver
//! copies the payload out of the sender's memory with `process_vm_readv`, straight
//! into the receive's own buffer when it has one (`recv_into`), then sends a
//! *release* frame back, upon which the sender lets the memory go. That is one copy
//! in all where the ring takes two (into it and out of it), and the sender never
//! waits for the ring to drain.
//!
//! Only memory the transport owns is lent: a payload handed to it (a `Bytes`:
//! `send_bytes`, the collectives' own buffers), kept until the release. A send of
//! the application's borrowed slice (`send`) copies it into such a payload first:
//! the peer reads this process's memory whenever it gets to it, after the sending
//! future's poll has returned, and a borrowed slice may be freed by then (a future
//! can be leaked, so no `Drop` can take the loan back in time).
//!
//! A sender whose side of the link goes away first (its transport dropped, with lent
//! messages unread) marks that in the ring file before it frees them, and a receiver
//! that finds the mark after its copy fails that receive instead of returning what
//! the memory held by then; a sender process that died cannot be read at all. Each
//! copy also reads a random word the sender's process published at setup, so that a
//! process that took a dead sender's pid is never mistaken for it. Setup checks, both
//! ways, that the peer's memory can be read (a container's seccomp filter or the Yama
//! `ptrace_scope` setting may forbid it); where it cannot, large messages keep going
//! through the ring.
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

use std::collections::HashMap;
use std::sync::OnceLock;

use bytes::{Bytes, BytesMut};
use memmap2::MmapMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Notify, mpsc};

use hcomm_core::mailbox::{Frame, RemotePayload};
use hcomm_core::wire::{FrameKind, Header, MAX_MESSAGE, PAD, SHORT_LEN, SHORT_MAGIC};
use hcomm_core::{Error, ErrorKind, OpKind, Rank, Result};
use parking_lot::Mutex;

use crate::arm::{LINGER, ReadArm, Wait};
use crate::framing::{Assembler, BOX_FIRST, BOX_LINE, BOX_MAGIC, BOX_MAX, Outgoing, box_header, box_len, box_payload};
use crate::stream::{Links, WriteLink, unannounced_eof};

/// Directory of the ring files.
const DIR: &str = "/dev/shm";
/// The longest pause of a writer polling for room in a ring whose reader rings no
/// more ([`room_without_rings`]).
const QUIET_POLL: Duration = Duration::from_millis(5);
/// Header of a ring file: counters on their own cache lines.
const HDR: usize = 256;
/// Start of the ring's data (on a cache line).
const DATA: usize = HDR;
/// A cache line.
const LINE: usize = 64;
const _: () = assert!(DATA.is_multiple_of(LINE));

/// Bytes written so far (by the writer).
const HEAD: usize = 0;
/// Bytes read so far (by the reader).
const TAIL: usize = 64;
/// 1 while the reader waits for data.
const READER_WAITS: usize = 128;
/// 1 while the writer waits for space.
const WRITER_WAITS: usize = 192;
/// The key of the ring's line stamps ([`Ring::push_box`]), random per ring, set by the
/// side that creates the ring file.
const STAMP_KEY: usize = 224;
/// 1 once the writer's process has let go of the memory it lent (its side of the link
/// is gone): a message pulled after that may hold anything (see [`Pulled`]).
const LENDER_GONE: usize = 160;

const _: () = assert!(BOX_LINE == LINE);
// Every message a short frame can carry fits a box.
const _: () = assert!(BOX_MAX >= hcomm_core::wire::SHORT_MAX);

const DOORBELL_DATA: u8 = 1;
const DOORBELL_SPACE: u8 = 2;

/// Default ring capacity per direction (`HCOMM_SHM_RING`).
pub const DEFAULT_RING: usize = 4 << 20;
/// Default spin before a waiting side parks (`HCOMM_SHM_SPIN_US`).
pub const DEFAULT_SPIN: Duration = Duration::from_micros(200);
/// Default least size of a message that the receiver copies straight out of the
/// sender's memory instead of through the ring (`HCOMM_SHM_CMA`).
pub const DEFAULT_PULL_MIN: usize = 64 << 10;

/// One direction's ring, mapped.
struct Ring {
    _map: MmapMut,
    base: *mut u8,
    cap: usize,
    /// The writer's last reading of the reader's counter: room is computed from it,
    /// and the shared counter (whose cache line the reader writes on every read) is
    /// read again only when that room is not enough.
    tail_seen: AtomicU64,
    /// [`STAMP_KEY`]'s value.
    key: u64,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring").field("cap", &self.cap).finish_non_exhaustive()
    }
}

// SAFETY: the mapping lives as long as the `Ring`; the counters are atomics and the
// data region is written only by the one writer (below `head`) and read only by the
// one reader (between `tail` and `head`), with acquire/release ordering on the
// counters. Each side's `Ring` is used by one task at a time.
unsafe impl Send for Ring {}
unsafe impl Sync for Ring {}

impl Ring {
    /// Maps a ring file of capacity `cap`; with `populate`, every page at once (see
    /// [`ShmOptions::populate`]).
    fn map(file: &File, cap: usize, populate: bool) -> io::Result<Ring> {
        let mut opts = memmap2::MmapOptions::new();
        if populate {
            opts.populate();
        }
        // SAFETY: the file is ours and the peer's only (0600, unlinked after setup);
        // its contents are touched only through atomics and raw copies below.
        let mut map = unsafe { opts.map_mut(file)? };
        if map.len() != DATA + cap || !cap.is_power_of_two() {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "ring file of the wrong size"));
        }
        let base = map.as_mut_ptr();
        let mut ring = Ring { _map: map, base, cap, tail_seen: AtomicU64::new(0), key: 0 };
        ring.key = ring.u64_at(STAMP_KEY).load(Ordering::Acquire);
        Ok(ring)
    }

    /// Where stream position `pos` lies in the data region (the capacity is a power of
    /// two: a mask, where `%` would be a division on every copy in and out).
    fn at(&self, pos: u64) -> usize {
        (pos & (self.cap as u64 - 1)) as usize
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        // SAFETY: `off` is one of the header offsets, 8-byte aligned within the
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
        // Saturating: the reader may have taken a box whose stamp it saw
        // before the writer's counter that covers it.
        self.u64_at(HEAD).load(Ordering::Acquire).saturating_sub(tail) as usize
    }

    fn writable(&self) -> usize {
        self.room(usize::MAX)
    }

    /// Writer: bytes written so far (the data region starts on a cache line, so this
    /// modulo [`LINE`] is the next byte's place in its line).
    fn written(&self) -> u64 {
        self.u64_at(HEAD).load(Ordering::Relaxed)
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
            // SAFETY: the bytes lie in the part the reader has released (the caller
            // checked `writable`), and `src` is a separate allocation.
            unsafe { self.copy_in(head, src) };
            head += src.len() as u64;
        }
        self.u64_at(HEAD).store(head, Ordering::Release);
    }

    /// The stamp word of the line at data offset `at` (a line start).
    fn stamp(&self, at: usize) -> &AtomicU64 {
        // SAFETY: `at` is a line start in the data region (which starts on a line of
        // the page-aligned mapping), so the last 8 bytes of its line are in the region
        // and 8-byte aligned.
        unsafe { &*self.base.add(DATA + at + LINE - 8).cast::<AtomicU64>() }
    }

    /// Writer: `pad` bytes of padding up to a line start, then a box: `first` as the
    /// first line, whose last 8 bytes are its stamp (its stream position mixed with
    /// the ring's key), and `rest` on the lines after it. The stamp is stored after
    /// everything else of the box and before the writer's counter. The reader can
    /// then find the box by polling its stamp ([`Ring::boxed`]): a small message
    /// costs the reader one cache line from the writer's core before it knows it has
    /// one, not two in a row (the counter's, then the message's). The caller has
    /// checked that it fits.
    fn push_box(&self, pad: usize, first: &[u8; LINE - 8], rest: &[u8]) {
        let head = self.u64_at(HEAD).load(Ordering::Relaxed);
        let pos = head + pad as u64;
        debug_assert_eq!(pos % LINE as u64, 0, "a box starts a line");
        let at = self.at(pos);
        // SAFETY: the padding lies between `head` and the line start, in the same line
        // (so it does not wrap); the first line lies in the data region (the capacity
        // is a multiple of a line) and `rest` after it, wrapping at the end (`copy_in`);
        // all of it in the part the reader has released.
        unsafe {
            let data = self.base.add(DATA);
            std::ptr::write_bytes(data.add(self.at(head)), PAD, pad);
            if !rest.is_empty() {
                self.copy_in(pos + LINE as u64, rest);
            }
            std::ptr::copy_nonoverlapping(first.as_ptr(), data.add(at), first.len());
        }
        self.stamp(at).store(pos ^ self.key, Ordering::Release);
        self.u64_at(HEAD).store(pos + box_len(BOX_FIRST + rest.len()) as u64, Ordering::Release);
    }

    /// Copies `src` into the data region at stream position `pos`, wrapping at its end.
    ///
    /// # Safety
    /// The bytes must lie in the part of the ring the reader has released; only the
    /// writer calls it.
    unsafe fn copy_in(&self, pos: u64, src: &[u8]) {
        let at = self.at(pos);
        let first = src.len().min(self.cap - at);
        // SAFETY: both pieces lie in the data region (the caller's promise for the
        // positions).
        unsafe {
            let data = self.base.add(DATA);
            std::ptr::copy_nonoverlapping(src.as_ptr(), data.add(at), first);
            std::ptr::copy_nonoverlapping(src.as_ptr().add(first), data, src.len() - first);
        }
    }

    /// Copies `len` bytes at stream position `pos` out of the data region to `dst`,
    /// wrapping at its end.
    ///
    /// # Safety
    /// `dst` must be valid for `len` bytes of writes, and the bytes written by the
    /// writer, which does not touch them again until the reader's counter passes them.
    unsafe fn copy_out(&self, pos: u64, dst: *mut u8, len: usize) {
        let at = self.at(pos);
        let first = len.min(self.cap - at);
        // SAFETY: both pieces lie in the data region; `dst` as the caller promises.
        unsafe {
            let data = self.base.add(DATA);
            std::ptr::copy_nonoverlapping(data.add(at), dst, first);
            std::ptr::copy_nonoverlapping(data, dst.add(first), len - first);
        }
    }

    /// Reader: whether the line at the reader's position is a box the writer
    /// has stamped for this position (and therefore finished), whatever the writer's
    /// counter says yet.
    fn boxed(&self) -> bool {
        let tail = self.u64_at(TAIL).load(Ordering::Relaxed);
        tail.is_multiple_of(LINE as u64) && self.stamp(self.at(tail)).load(Ordering::Acquire) == tail ^ self.key
    }

    /// Reader: copies up to `len` bytes to `dst`; returns how many.
    ///
    /// # Safety
    /// `dst` must be valid for `len` bytes of writes.
    unsafe fn pop(&self, dst: *mut u8, len: usize) -> usize {
        // SAFETY: as the caller promises.
        let n = unsafe { self.peek(dst, len) };
        self.skip(n);
        n
    }

    /// Reader: copies the first `LINE - 8` bytes of the line at the reader's position
    /// (a line start), whether or not the writer's counter covers it yet.
    ///
    /// # Safety
    /// `dst` must be valid for `LINE - 8` bytes of writes, and the line stamped
    /// ([`Ring::boxed`]).
    unsafe fn peek_line(&self, dst: *mut u8) {
        let at = self.at(self.u64_at(TAIL).load(Ordering::Relaxed));
        // SAFETY: the line lies in the data region (`at` is a line start); the writer
        // finished it before its stamp (caller) and does not touch it again until the
        // reader's counter passes it.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(DATA + at), dst, LINE - 8) };
    }

    /// Reader: copies up to `len` bytes to `dst` without taking them out of the ring;
    /// returns how many.
    ///
    /// # Safety
    /// `dst` must be valid for `len` bytes of writes.
    unsafe fn peek(&self, dst: *mut u8, len: usize) -> usize {
        let tail = self.u64_at(TAIL).load(Ordering::Relaxed);
        let n = self.readable().min(len);
        // SAFETY: the bytes are in the part the writer has published (`readable`);
        // `dst` is valid for `len >= n` bytes (caller).
        unsafe { self.copy_out(tail, dst, n) };
        n
    }

    /// Reader: takes `n` bytes out of the ring (at most what is readable).
    fn skip(&self, n: usize) {
        let tail = self.u64_at(TAIL).load(Ordering::Relaxed);
        self.u64_at(TAIL).store(tail + n as u64, Ordering::Release);
    }
}

/// What went by single copy on a shared-memory link ([`crate::StreamTransport::shm_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShmStats {
    /// Messages lent to the peer (payloads the transport owns).
    pub lent: u64,
    /// Messages this side copied out of the peer's memory.
    pub pulled: u64,
}

#[derive(Debug, Default)]
struct Counters {
    lent: AtomicU64,
    pulled: AtomicU64,
}

impl Counters {
    fn add(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    fn read(&self) -> ShmStats {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ShmStats { lent: r(&self.lent), pulled: r(&self.pulled) }
    }
}

/// A peer's two rings, mapped, after [`negotiate`], and what cross-memory attach can
/// do between the two processes.
pub struct ShmPair {
    tx: Ring,
    rx: Ring,
    /// The peer's process, if this one can read its memory (it may lend to us).
    peer_mem: Option<PeerMem>,
    /// Messages of at least this many bytes are lent to the peer (0: none; the peer
    /// cannot read this process, or lending is off here).
    lend_min: usize,
}

impl std::fmt::Debug for ShmPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmPair")
            .field("cap", &self.tx.cap)
            .field("pulls", &self.peer_mem.is_some())
            .field("lend_min", &self.lend_min)
            .finish()
    }
}

impl ShmPair {
    /// Whether large messages go by single copy, in each direction: (this side
    /// lends to the peer, this side pulls from the peer).
    pub fn single_copy(&self) -> (bool, bool) {
        (self.lend_min > 0, self.peer_mem.is_some())
    }
}

/// Where a peer process's memory is read: its pid, and the address and value of the
/// random word it published ([`cookie`]).
#[derive(Debug, Clone, Copy)]
struct PeerMem {
    pid: i32,
    cookie_addr: u64,
    cookie: u64,
}

/// This process's published random word: its address and value. A peer reads it back
/// with every copy out of this process's memory, which tells it that the pid still
/// names this process.
fn cookie() -> (u64, u64) {
    static COOKIE: OnceLock<u64> = OnceLock::new();
    let c = COOKIE.get_or_init(|| rand_u64() | 1);
    (std::ptr::from_ref(c) as u64, *c)
}

/// Copies `len` bytes at `addr` in `mem`'s process to `dst`, with its cookie beside
/// them in the same call.
///
/// # Safety
/// `dst` must be valid for `len` bytes of writes.
#[cfg(not(target_os = "linux"))]
unsafe fn read_remote(_mem: &PeerMem, _addr: u64, _dst: *mut u8, _len: usize) -> io::Result<()> {
    Err(io::Error::new(io::ErrorKind::Unsupported, "cross-memory attach is Linux only"))
}

/// Copies `len` bytes at `addr` in `mem`'s process to `dst`, with its cookie beside
/// them in the same call.
///
/// # Safety
/// `dst` must be valid for `len` bytes of writes.
#[cfg(target_os = "linux")]
unsafe fn read_remote(mem: &PeerMem, addr: u64, dst: *mut u8, len: usize) -> io::Result<()> {
    let mut seen = 0u64;
    let local = [
        libc::iovec { iov_base: std::ptr::from_mut(&mut seen).cast(), iov_len: 8 },
        libc::iovec { iov_base: dst.cast(), iov_len: len },
    ];
    let remote = [
        libc::iovec { iov_base: mem.cookie_addr as *mut libc::c_void, iov_len: 8 },
        libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: len },
    ];
    // SAFETY: the local vectors point to `seen` and to `dst` (valid for `len` bytes,
    // the caller says); the remote ones are only read, in the other process, by the
    // kernel, which checks them.
    let n = unsafe { libc::process_vm_readv(mem.pid, local.as_ptr(), 2, remote.as_ptr(), 2, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // The kernel never splits one vector: either both arrived or the second failed.
    if n as usize != 8 + len {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("read {n} of {} bytes", 8 + len)));
    }
    if seen != mem.cookie {
        return Err(io::Error::new(io::ErrorKind::NotFound, "the pid names another process now"));
    }
    Ok(())
}

/// Whether this process can read `mem`'s process: its cookie, read back.
fn can_read(mem: &PeerMem) -> bool {
    let mut probe = 0u64;
    // SAFETY: `probe` is valid for 8 bytes of writes.
    let r = unsafe { read_remote(mem, mem.cookie_addr, std::ptr::from_mut(&mut probe).cast(), 8) };
    match r {
        Ok(()) => probe == mem.cookie,
        Err(e) => {
            tracing::debug!(pid = mem.pid, error = %e, "cross-memory attach refused: large messages go through the ring");
            false
        }
    }
}

/// Shared-memory settings.
#[derive(Debug, Clone)]
pub struct ShmOptions {
    /// Ring capacity per direction, bytes (a power of two).
    pub ring: usize,
    /// How long a side with nothing to do spins before it parks.
    pub spin: Duration,
    /// Data messages of at least this many bytes are lent to the peer, which copies
    /// them out of this process's memory itself, once, instead of through the ring
    /// (`HCOMM_SHM_CMA`; see the module documentation). Zero: never.
    pub pull_min: usize,
    /// Whether the rings are mapped with every page in place at setup
    /// (`MAP_POPULATE`), so that the first lap of small messages through a ring does
    /// not take a page fault every 64 of them (on both sides). The bootstrap turns it
    /// off when the rings of all same-host pairs together would take more than
    /// [`POPULATE_BUDGET`].
    pub populate: bool,
}

/// The most memory the rings of all same-host pairs may take together for the
/// bootstrap to map them whole at setup ([`ShmOptions::populate`]).
pub const POPULATE_BUDGET: usize = 1 << 30;

/// Whether the rings of `ranks_here` ranks on one host (one per direction of each
/// pair), of `ring` bytes each, fit [`POPULATE_BUDGET`] together.
pub fn rings_fit_populate(ranks_here: usize, ring: usize) -> bool {
    let rings = ranks_here.saturating_mul(ranks_here.saturating_sub(1));
    rings.saturating_mul(ring.next_power_of_two()) <= POPULATE_BUDGET
}

impl Default for ShmOptions {
    fn default() -> ShmOptions {
        ShmOptions { ring: DEFAULT_RING, spin: DEFAULT_SPIN, pull_min: DEFAULT_PULL_MIN, populate: true }
    }
}

fn create_ring(job: u64, me: usize, peer: usize, cap: usize, populate: bool) -> io::Result<(Ring, PathBuf)> {
    let name = format!("hcomm-{job:016x}-{me}-{peer}-{:016x}", rand_u64());
    let path = Path::new(DIR).join(name);
    let file = OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&path)?;
    let ring = file.set_len((DATA + cap) as u64).and_then(|()| Ring::map(&file, cap, populate));
    match ring {
        Ok(mut r) => {
            // Never zero: a fresh ring's zeroed lines must not look stamped.
            r.key = rand_u64() | 1;
            r.u64_at(STAMP_KEY).store(r.key, Ordering::Release);
            Ok((r, path))
        }
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

fn open_ring(name: &str, cap: usize, populate: bool) -> io::Result<Ring> {
    if !name.starts_with("hcomm-") || name.contains('/') || name.len() > 200 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not a ring file name"));
    }
    let file = OpenOptions::new().read(true).write(true).open(Path::new(DIR).join(name))?;
    Ring::map(&file, cap, populate)
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
    let mine = create_ring(job, me, peer, cap, opts.populate);
    if let Err(e) = &mine {
        tracing::debug!(me, peer, error = %e, "no shared-memory ring: keeping TCP");
    }
    let name = mine.as_ref().map(|(_, p)| p.file_name().unwrap_or_default().to_string_lossy().into_owned());
    let name = name.unwrap_or_default();
    let (cookie_addr, cookie) = cookie();
    // Ring size, the ring file's name, then where this process's memory is read.
    let mut offer = Vec::with_capacity(30 + name.len());
    offer.extend_from_slice(&(cap as u64).to_le_bytes());
    offer.extend_from_slice(&(name.len() as u16).to_le_bytes());
    offer.extend_from_slice(name.as_bytes());
    offer.extend_from_slice(&std::process::id().to_le_bytes());
    offer.extend_from_slice(&cookie_addr.to_le_bytes());
    offer.extend_from_slice(&cookie.to_le_bytes());
    let result = async {
        stream.write_all(&offer).await?;
        let peer_cap = stream.read_u64_le().await? as usize;
        let len = stream.read_u16_le().await? as usize;
        let mut theirs = vec![0u8; len];
        stream.read_exact(&mut theirs).await?;
        let peer_mem = PeerMem {
            pid: stream.read_u32_le().await? as i32,
            cookie_addr: stream.read_u64_le().await?,
            cookie: stream.read_u64_le().await?,
        };
        let rx = match (len, peer_cap == cap) {
            (0, _) | (_, false) => None,
            _ => open_ring(&String::from_utf8_lossy(&theirs), cap, opts.populate).ok(),
        };
        // Bit 0: the rings are set up on this side; bit 1: this side can read the
        // peer's memory (so the peer may lend to it).
        let reads = rx.is_some() && can_read(&peer_mem);
        let ok = u8::from(rx.is_some() && mine.is_ok()) | (u8::from(reads) << 1);
        stream.write_all(&[ok]).await?;
        let peer_ok = stream.read_u8().await?;
        let both = ok & 1 == 1 && peer_ok & 1 == 1;
        io::Result::Ok((rx, both, reads.then_some(peer_mem), peer_ok & 2 != 0))
    }
    .await;
    let (mine, path) = match mine {
        Ok((r, p)) => (Some(r), Some(p)),
        Err(_) => (None, None),
    };
    if let Some(p) = path {
        let _ = std::fs::remove_file(p);
    }
    let (rx, both, peer_mem, peer_reads) = result?;
    let lend_min = if peer_reads { opts.pull_min } else { 0 };
    Ok(match (mine, rx, both) {
        (Some(tx), Some(rx), true) => Some(ShmPair { tx, rx, peer_mem, lend_min }),
        _ => None,
    })
}

/// What the two directions of one shared-memory peer share.
struct Bell {
    stream: Arc<TcpStream>,
    data: Notify,
    space: Notify,
    /// The peer rings no more: it ended its side of the doorbell connection, after
    /// its close frame as a finalizing rank does (and it still reads), or it died.
    /// The reader tells the two apart by the close frame, the writer by
    /// [`Bell::gone`].
    quiet: AtomicBool,
}

impl Bell {
    fn ring(&self, what: u8) {
        // A full socket buffer means the peer has unread doorbells: it is awake.
        let _ = self.stream.try_write(&[what]);
    }

    /// Whether the peer's end of the connection is gone (its process died or its
    /// link was dropped): a write to it fails, at the latest on the second try after
    /// the end, once the peer's kernel has answered the first with a reset. The
    /// byte written is a data ring, which a live peer takes for a spurious wake.
    fn gone(&self) -> bool {
        matches!(self.stream.try_write(&[DOORBELL_DATA]), Err(e) if e.kind() != io::ErrorKind::WouldBlock)
    }
}

/// The receiving half of a shared-memory peer: the ring and the parser of what it
/// carries, shared by the reader task and by receives that poll the link themselves
/// ([`hcomm_core::mailbox::Progress`]).
pub(crate) struct ShmInbox {
    ring: Arc<Ring>,
    bell: Arc<Bell>,
    peer: Rank,
    links: Arc<Links>,
    asm: Mutex<Assembler>,
    /// The peer's close frame, a protocol error or the end of the link was seen: the
    /// mailbox knows, and nothing more is read.
    ended: AtomicBool,
    /// This side's sending half: the releases of what it lent arrive here.
    out: Arc<ShmOut>,
    /// What the messages the peer lends need, if this process can read its memory.
    lender: Option<Arc<Lender>>,
    /// When the peer's writes ring the doorbell ([`READER_WAITS`]; see
    /// [`crate::arm`]).
    arm: ReadArm,
}

/// A peer that lends messages to this process: where its memory is read, the ring it
/// marks when it lets go of everything it lent, and the way back for releases.
#[derive(Debug)]
struct Lender {
    peer: Rank,
    mem: PeerMem,
    ring: Arc<Ring>,
    back: Releaser,
}

/// Sends release frames to a lending peer, through this side's sending half.
#[derive(Debug)]
struct Releaser {
    out: Arc<ShmOut>,
    /// The writer task's queue, for when it holds messages (a release must not
    /// overtake them). Weak: lent messages waiting in the mailbox must not keep the
    /// writer task's queue open.
    queue: mpsc::WeakUnboundedSender<Outgoing>,
    me: Rank,
}

impl Releaser {
    fn release(&self, id: u64) {
        let header = Header::control(FrameKind::Release, OpKind::Send, self.me, 0, 0, 8);
        let payload = Bytes::copy_from_slice(&id.to_le_bytes());
        self.out.send(header, payload, true, |header, payload| {
            if let Some(q) = self.queue.upgrade() {
                let _ = q.send(Outgoing::new(header, payload, None));
            }
        });
    }
}

/// A message a peer lent: its payload is read out of the peer's memory, once; when
/// the last reference goes, the peer is told it may let the memory go.
#[derive(Debug)]
struct Pulled {
    from: Arc<Lender>,
    id: u64,
    addr: u64,
    len: usize,
}

impl Pulled {
    /// # Safety
    /// `dst` must be valid for `self.len` bytes of writes.
    unsafe fn copy_to(&self, dst: *mut u8) -> Result<()> {
        let peer = self.from.peer;
        let read = |addr: u64| {
            // SAFETY: as the caller promises.
            let read = unsafe { read_remote(&self.from.mem, addr, dst, self.len) };
            read.map_err(|e| {
                Error::new(
                    ErrorKind::PeerFailed,
                    format!("could not read the message rank {peer} lent from its memory (did the process die?)"),
                )
                .with_peer(peer)
                .with_source(e)
            })
        };
        read(self.addr)?;
        Counters::add(&self.from.back.out.counts.pulled);
        // The lender marks its ring before it lets go of what it lent: if no mark is
        // there after the copy, the memory held the message during all of it.
        fence(Ordering::SeqCst);
        if self.from.ring.u32_at(LENDER_GONE).load(Ordering::SeqCst) != 0 {
            return Err(Error::new(
                ErrorKind::PeerFailed,
                format!(
                    "rank {peer} closed its side before this rank read the message it lent (call finalize before exiting)"
                ),
            )
            .with_peer(peer));
        }
        Ok(())
    }
}

impl RemotePayload for Pulled {
    fn len(&self) -> usize {
        self.len
    }

    fn read_into(&self, dst: &mut [u8]) -> Result<()> {
        if dst.len() != self.len {
            return Err(Error::invalid(format!(
                "a lent message of {} bytes read into a buffer of {}",
                self.len,
                dst.len()
            )));
        }
        // SAFETY: `dst` is valid for its length, which is `self.len`.
        unsafe { self.copy_to(dst.as_mut_ptr()) }
    }

    fn read(&self) -> Result<Bytes> {
        let mut buf = hcomm_core::pool::take(self.len);
        // SAFETY: the buffer has room for `self.len` bytes (`take`), all of which the
        // copy writes before they become part of its length.
        unsafe {
            self.copy_to(buf.as_mut_ptr())?;
            buf.set_len(self.len);
        }
        Ok(buf.freeze())
    }
}

impl Drop for Pulled {
    fn drop(&mut self) {
        self.from.back.release(self.id);
    }
}

/// What a pull frame carries: the lent message's number, address and length.
const PULL_LEN: usize = 24;

fn protocol(msg: String) -> Error {
    Error::new(ErrorKind::Protocol, msg)
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
        // The stamp first: a box is then taken with one cache line from the
        // writer's core (see `Ring::push_box`).
        if !self.ring.boxed() && self.ring.readable() == 0 {
            return Drained::Nothing;
        }
        let Some(mut asm) = self.asm.try_lock() else { return Drained::Nothing };
        let mut got = false;
        loop {
            if asm.idle() {
                match self.short_frames() {
                    Ok((0, _)) => {}
                    Ok((_, boxed)) => {
                        got = true;
                        if wakes(self.ring.u32_at(WRITER_WAITS)) {
                            self.bell.ring(DOORBELL_SPACE);
                        }
                        // Stopped after boxes: what follows, if anything, is for
                        // the next drain (reading the writer's counter now would wait
                        // for its cache line, just written by the other core).
                        if boxed {
                            break;
                        }
                    }
                    Err(e) => {
                        self.end(Some(e.with_peer(self.peer)));
                        return Drained::Ended;
                    }
                }
            }
            if self.ring.readable() == 0 {
                break;
            }
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
            if wakes(self.ring.u32_at(WRITER_WAITS)) {
                self.bell.ring(DOORBELL_SPACE);
            }
            match self.deliver_all(&mut asm) {
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

    /// Reads short frames, and the padding before them, straight out of the ring into
    /// the mailbox, as long as the ring holds them whole (the writer publishes each
    /// at once); stops at anything else, for the parser, which must hold no bytes
    /// (see [`Assembler::idle`]). The common case of a small message takes no copy
    /// into the parser's buffer and no split of it. Boxes ([`Ring::push_box`])
    /// are taken by their stamps; after them, it stops without reading the writer's
    /// counter. Returns how many bytes it took, and whether it stopped so.
    fn short_frames(&self) -> Result<(usize, bool)> {
        let mut taken = 0;
        let mut boxed = false;
        loop {
            if self.ring.boxed() {
                taken += self.take_box()?;
                boxed = true;
                continue;
            }
            if boxed {
                return Ok((taken, true));
            }
            let mut head = [0u8; SHORT_LEN];
            // SAFETY: `head` is valid for its length.
            let k = unsafe { self.ring.peek(head.as_mut_ptr(), SHORT_LEN) };
            let pad = head[..k].iter().take_while(|&&b| b == PAD).count();
            if pad > 0 {
                self.ring.skip(pad);
                taken += pad;
                continue;
            }
            if k < SHORT_LEN || head[0] != SHORT_MAGIC {
                return Ok((taken, false));
            }
            let h = Header::decode_short(&head, self.peer as u32).map_err(|e| protocol(e.to_string()))?;
            let len = h.frag_len as usize;
            if self.ring.readable() < SHORT_LEN + len {
                return Ok((taken, false));
            }
            self.ring.skip(SHORT_LEN);
            let mut payload = BytesMut::with_capacity(len);
            // SAFETY: `payload` has room for `len` bytes, all of which the ring holds
            // (checked above) and `pop` writes before they become its length.
            unsafe {
                let n = self.ring.pop(payload.as_mut_ptr(), len);
                debug_assert_eq!(n, len);
                payload.set_len(n);
            }
            self.links.mailbox.deliver(Frame::new(h, payload.freeze()));
            taken += SHORT_LEN + len;
        }
    }

    /// Takes the box at the reader's position ([`Ring::boxed`] said it is
    /// there) and delivers its message; returns the bytes it took.
    fn take_box(&self) -> Result<usize> {
        let mut first = [0u8; LINE - 8];
        // SAFETY: `first` is valid for its length; the box is whole (stamped), and
        // `peek_line` reads it whatever the writer's counter says.
        unsafe { self.ring.peek_line(first.as_mut_ptr()) };
        let h = box_header(&first, self.peer)?;
        let len = h.frag_len as usize;
        let payload = if len > BOX_FIRST {
            // The first line's part, then the rest straight out of the ring behind it.
            let mut b = BytesMut::with_capacity(len);
            b.extend_from_slice(&first[SHORT_LEN..SHORT_LEN + BOX_FIRST]);
            let pos = self.ring.u64_at(TAIL).load(Ordering::Relaxed) + LINE as u64;
            // SAFETY: `b` has room for `len` bytes, of which the copy writes the last
            // `len - BOX_FIRST` before they become its length; the box's lines are
            // whole (stamped).
            unsafe {
                self.ring.copy_out(pos, b.as_mut_ptr().add(BOX_FIRST), len - BOX_FIRST);
                b.set_len(len);
            }
            b.freeze()
        } else {
            box_payload(&h, &first[SHORT_LEN..], &[])
        };
        let took = box_len(len);
        self.ring.skip(took);
        self.links.mailbox.deliver(Frame::new(h, payload));
        Ok(took)
    }

    /// Delivers every complete message in `asm`, lent ones as frames whose payload is
    /// read out of the peer's memory, and takes the peer's releases of what this side
    /// lent. `Ok(true)` once the peer's close frame has been delivered.
    fn deliver_all(&self, asm: &mut Assembler) -> Result<bool> {
        let mailbox = &self.links.mailbox;
        while let Some(f) = asm.next_frame()? {
            match f.header.kind {
                FrameKind::Pull => mailbox.deliver(self.lent(f)?),
                FrameKind::Release => self.out.released(&f.payload)?,
                FrameKind::Close => {
                    mailbox.deliver(f);
                    return Ok(true);
                }
                _ => mailbox.deliver(f),
            }
        }
        Ok(false)
    }

    /// The data frame a pull frame stands for.
    fn lent(&self, f: Frame) -> Result<Frame> {
        let Some(lender) = &self.lender else {
            return Err(protocol(format!("rank {} lent a message this rank said it cannot read", self.peer)));
        };
        if f.payload.len() != PULL_LEN {
            return Err(protocol(format!("a pull frame of {} bytes", f.payload.len())));
        }
        let word = |i: usize| u64::from_le_bytes(f.payload[8 * i..8 * i + 8].try_into().expect("8 bytes"));
        let (id, addr, len) = (word(0), word(1), word(2));
        if len > MAX_MESSAGE {
            return Err(protocol(format!("a lent message of {len} bytes")));
        }
        let mut header = f.header;
        header.kind = FrameKind::Data;
        header.msg_len = len;
        header.frag_len = 0;
        let pulled = Pulled { from: lender.clone(), id, addr, len: len as usize };
        Ok(Frame::lent(header, Arc::new(pulled)))
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

    fn hold(&self) {
        self.arm.hold(|| self.disarm());
    }

    fn release(&self) {
        self.arm.release(true, || self.rearm());
    }

    fn parked(&self) {
        self.arm.park_rx(|| self.rearm());
    }

    fn unparked(&self) {
        self.arm.unpark_rx();
    }
}

impl ShmInbox {
    /// Asks the peer to ring the doorbell after its next write, and wakes the reader
    /// task if bytes came before the ask was seen (the fence pairs with the writer's
    /// in [`wakes`]: one of the two sides sees the other's store).
    fn rearm(&self) {
        self.ring.u32_at(READER_WAITS).store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if self.ring.readable() > 0 {
            self.bell.data.notify_one();
        }
    }

    fn disarm(&self) {
        self.ring.u32_at(READER_WAITS).store(0, Ordering::Relaxed);
    }

    /// Waits until the ring has bytes or the link ends, as the reader task does once
    /// it has read everything: spins for `spin` (see [`spin_until`]), then waits for
    /// the doorbell, armed as [`crate::arm`] decides. `false` if the peer rings no
    /// more while the ring stayed empty.
    async fn wait_readable(&self, spin: Duration) -> bool {
        let ready = || self.ring.readable() > 0 || self.ended();
        loop {
            if spin_until(spin, ready).await {
                return true;
            }
            // Armed here, the ring's bytes are looked at below.
            let how = self.arm.wait(|| self.ring.u32_at(READER_WAITS).store(1, Ordering::SeqCst));
            fence(Ordering::SeqCst);
            let r = if ready() {
                Some(true)
            } else if self.bell.quiet.load(Ordering::Acquire) {
                Some(false)
            } else {
                match how {
                    Wait::Armed => self.bell.data.notified().await,
                    Wait::Timed => {
                        let _ = tokio::time::timeout(LINGER, self.bell.data.notified()).await;
                    }
                }
                None
            };
            self.arm.woke(|| self.disarm());
            if let Some(r) = r {
                return r;
            }
        }
    }
}

/// The reader task of a shared-memory peer: drains the ring whenever it has data,
/// spinning briefly and then parking on the doorbell in between, until the link ends.
pub(crate) async fn read_task(inbox: Arc<ShmInbox>, spin: Duration) {
    inbox.links.heard_from(inbox.peer);
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
                if !inbox.wait_readable(spin).await {
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
    /// Data messages of at least this many bytes are lent (0: none).
    lend_min: usize,
    /// The messages lent and not yet released, by number.
    lent: Mutex<Lent>,
    /// Both directions' single-copy counts.
    counts: Counters,
}

/// The payloads lent to the peer and not yet released (kept, never read here), by
/// number.
#[derive(Debug, Default)]
struct Lent {
    next: u64,
    held: HashMap<u64, Bytes>,
}

impl Lent {
    fn number(&mut self, payload: Bytes) -> u64 {
        let id = self.next;
        self.next += 1;
        self.held.insert(id, payload);
        id
    }
}

/// The pull frame's payload.
fn pull_frame(id: u64, addr: u64, len: usize) -> Bytes {
    let mut pull = [0u8; PULL_LEN];
    for (i, w) in [id, addr, len as u64].into_iter().enumerate() {
        pull[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
    }
    Bytes::copy_from_slice(&pull)
}

impl std::fmt::Debug for ShmOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmOut")
            .field("cap", &self.ring.cap)
            .field("busy", &*self.busy.lock())
            .field("lent", &self.lent.lock().held.len())
            .finish()
    }
}

impl Drop for ShmOut {
    fn drop(&mut self) {
        // Before the lent memory goes (the fields drop after this): a peer that
        // copies any of it from now on finds the mark and refuses what it read.
        self.ring.u32_at(LENDER_GONE).store(1, Ordering::SeqCst);
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
    ///
    /// A data message of [`ShmOptions::pull_min`] bytes or more is lent: it stays
    /// here, and what goes to the peer is a pull frame that says where it is.
    pub(crate) fn send(&self, header: Header, payload: Bytes, direct: bool, queue: impl FnOnce(Header, Bytes)) -> bool {
        let (header, payload) = self.lend(header, payload);
        let p = payload.clone();
        self.write_or_queue(header, &payload, direct, move |h| queue(h, p))
    }

    /// As [`ShmOut::send`] for a message in the caller's memory, never lent: written
    /// straight from `data` when it can be, else handed to `queue` (which copies it)
    /// under the same lock.
    pub(crate) fn send_slice(&self, header: Header, data: &[u8], queue: impl FnOnce(Header)) -> bool {
        self.write_or_queue(header, data, true, queue)
    }

    fn write_or_queue(&self, header: Header, payload: &[u8], direct: bool, queue: impl FnOnce(Header)) -> bool {
        let mut busy = self.busy.lock();
        let len = payload.len();
        if direct && *busy == 0 && len <= DIRECT_MAX {
            let mut whole = header;
            whole.msg_id = u64::MAX;
            whole.msg_len = len as u64;
            whole.offset = 0;
            whole.frag_len = len as u32;
            // A small data message as a short frame, kept inside one cache line of the
            // ring (padding before it if it would straddle two): the reader then takes
            // one line from this core's cache, not two or three.
            let (short, full);
            let head: &[u8] = match whole.encode_short() {
                // A box, stamped (see `Ring::push_box`), on whole lines: padding up to
                // the next line start first, if not on one.
                Some(b) => {
                    let to_line = (LINE - (self.ring.written() % LINE as u64) as usize) % LINE;
                    let need = to_line + box_len(len);
                    if self.ring.room(need) >= need {
                        let head = len.min(BOX_FIRST);
                        let mut first = [0u8; LINE - 8];
                        first[..SHORT_LEN].copy_from_slice(&b);
                        first[0] = BOX_MAGIC;
                        first[SHORT_LEN..SHORT_LEN + head].copy_from_slice(&payload[..head]);
                        self.ring.push_box(to_line, &first, &payload[head..]);
                        drop(busy);
                        self.published();
                        return true;
                    }
                    // No room for the box's padding: the frame alone may fit.
                    short = b;
                    &short
                }
                None => {
                    full = whole.encode();
                    &full
                }
            };
            let need = head.len() + len;
            if self.ring.room(need) >= need {
                self.ring.push_parts(&[head, payload]);
                drop(busy);
                self.published();
                return true;
            }
        }
        *busy += 1;
        queue(header);
        false
    }

    /// Writes `frame` (a whole control frame without payload: a heartbeat) into the
    /// ring if nothing is queued before it and it fits, from any thread (the liveness
    /// beacon); `false` if it did not.
    pub(crate) fn try_beat(&self, frame: &[u8]) -> bool {
        let busy = self.busy.lock();
        if *busy != 0 || self.ring.room(frame.len()) < frame.len() {
            return false;
        }
        self.ring.push_parts(&[frame]);
        drop(busy);
        self.published();
        true
    }

    /// Whether a data message of `len` bytes would be lent.
    pub(crate) fn lends(&self, len: usize) -> bool {
        self.lend_min > 0 && len >= self.lend_min
    }

    /// The frame that goes to the peer for `header` and `payload`: a pull frame for a
    /// data message large enough to lend (the payload is kept until the peer
    /// releases it), else the message itself.
    fn lend(&self, header: Header, payload: Bytes) -> (Header, Bytes) {
        if header.kind != FrameKind::Data || self.lend_min == 0 || payload.len() < self.lend_min {
            return (header, payload);
        }
        let (addr, len) = (payload.as_ptr() as u64, payload.len());
        let id = self.lent.lock().number(payload);
        Counters::add(&self.counts.lent);
        let mut header = header;
        header.kind = FrameKind::Pull;
        (header, pull_frame(id, addr, len))
    }

    /// The peer released the lent messages whose numbers `ids` lists.
    fn released(&self, ids: &[u8]) -> Result<()> {
        if !ids.len().is_multiple_of(8) {
            return Err(protocol(format!("a release frame of {} bytes", ids.len())));
        }
        let mut lent = self.lent.lock();
        for id in ids.chunks_exact(8) {
            let id = u64::from_le_bytes(id.try_into().expect("8 bytes"));
            if lent.held.remove(&id).is_none() {
                return Err(protocol(format!("release of message {id}, which is not lent")));
            }
        }
        Ok(())
    }

    /// What went by single copy to and from this peer.
    pub(crate) fn stats(&self) -> ShmStats {
        self.counts.read()
    }

    /// Lent messages not yet released.
    pub(crate) fn lent_now(&self) -> usize {
        self.lent.lock().held.len()
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
        if wakes(self.ring.u32_at(READER_WAITS)) {
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

/// Splits a negotiated pair with `peer` into its halves and the doorbell task; `me` is
/// this rank and `queue` the writer task's queue for `peer` (releases of what the peer
/// lends go through it when the writer task holds messages).
pub(crate) fn split(
    pair: ShmPair,
    stream: TcpStream,
    spin: Duration,
    (me, peer): (Rank, Rank),
    links: Arc<Links>,
    queue: mpsc::WeakUnboundedSender<Outgoing>,
) -> Split {
    let _ = stream.set_nodelay(true);
    let bell = Arc::new(Bell {
        stream: Arc::new(stream),
        data: Notify::new(),
        space: Notify::new(),
        quiet: AtomicBool::new(false),
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
        b.quiet.store(true, Ordering::Release);
        b.data.notify_one();
        b.space.notify_one();
    };
    let out = Arc::new(ShmOut {
        ring: pair.tx,
        bell: bell.clone(),
        busy: Mutex::new(0),
        lend_min: pair.lend_min,
        lent: Mutex::new(Lent::default()),
        counts: Counters::default(),
    });
    let ring = Arc::new(pair.rx);
    let lender = pair.peer_mem.map(|mem| {
        let back = Releaser { out: out.clone(), queue, me };
        Arc::new(Lender { peer, mem, ring: ring.clone(), back })
    });
    let inbox = Arc::new(ShmInbox {
        ring,
        bell,
        peer,
        links,
        asm: Mutex::new(Assembler::for_ring(peer)),
        ended: AtomicBool::new(false),
        out: out.clone(),
        lender,
        arm: ReadArm::default(),
    });
    Split { inbox, writer: ShmWrite { out: out.clone(), spin }, out, doorbell: Box::pin(doorbell) }
}

/// After this side moved its counter: whether the other side marked itself waiting
/// (`flag`) and must be woken, clearing the mark. The fence pairs with the one in
/// [`wait_until`] (mark, fence, check the counter): at least one of the two sides sees
/// the other's store. The flag is only read unless it is set, a plain load where a
/// locked swap on every message cost more.
fn wakes(flag: &AtomicU32) -> bool {
    fence(Ordering::SeqCst);
    flag.load(Ordering::Relaxed) == 1 && flag.swap(0, Ordering::SeqCst) == 1
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
/// rings `notify` when it finds it set) and parks. `false` if the peer rings no
/// more (`quiet`) while `ready()` stayed false.
async fn wait_until(
    spin: Duration,
    flag: &AtomicU32,
    ready: impl Fn() -> bool,
    notify: &Notify,
    quiet: &AtomicBool,
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
        if quiet.load(Ordering::Acquire) {
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
        let closed = || io::Error::new(io::ErrorKind::BrokenPipe, "the peer's end of the shared-memory link is gone");
        let mut off = 0;
        while off < part.len() {
            let n = out.ring.push(&part[off..]);
            if n > 0 {
                off += n;
                out.published();
                // As in `read_task`: never monopolise the executor.
                tokio::task::coop::consume_budget().await;
            } else if !wait_until(self.spin, waits, || out.ring.writable() > 0, &out.bell.space, &out.bell.quiet).await
                && !room_without_rings(&out.ring, &out.bell).await
            {
                return Err(closed());
            }
        }
        Ok(())
    }
}

/// A full ring whose reader rings no more (it finalized, or died): polls for room,
/// with pauses growing to [`QUIET_POLL`], until there is some (`true`) or the
/// reader's end of the doorbell connection is gone (`false`). A finalizing reader
/// reads on until this side's close frame; a dead one fails the check within two
/// polls.
async fn room_without_rings(ring: &Ring, bell: &Bell) -> bool {
    let mut pause = Duration::from_micros(100);
    loop {
        if ring.writable() > 0 {
            return true;
        }
        if bell.gone() {
            return false;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(QUIET_POLL);
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
        looped_with(false).await
    }

    /// [`looped`], lending every data message (`lend`), which this process, as its
    /// own peer (rank 1), reads back out of its own memory.
    async fn looped_with(lend: bool) -> (Split, Arc<Links>) {
        let (split, links, server) = looped_bell(lend).await;
        // The test's end of the doorbell stays open: leaking it keeps the bell alive.
        std::mem::forget(server);
        (split, links)
    }

    /// [`looped_with`], and the test's end of the doorbell connection (the peer's).
    async fn looped_bell(lend: bool) -> (Split, Arc<Links>, TcpStream) {
        let cap = 1 << 12;
        let (tx, path) = create_ring(rand_u64(), 0, 1, cap, true).unwrap();
        let rx = open_ring(&path.file_name().unwrap().to_string_lossy(), cap, false).unwrap();
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let links = Arc::new(Links::new(Arc::new(hcomm_core::mailbox::Mailbox::new(0)), 2));
        let (cookie_addr, cookie) = cookie();
        let me = PeerMem { pid: std::process::id() as i32, cookie_addr, cookie };
        assert!(!lend || can_read(&me), "this process reads its own memory");
        let pair = ShmPair { tx, rx, peer_mem: lend.then_some(me), lend_min: usize::from(lend) };
        let (queue, rx) = mpsc::unbounded_channel();
        // Nothing reads the writer queue here; keep it open (releases go direct).
        std::mem::forget(rx);
        let split = split(pair, client, Duration::ZERO, (1, 1), links.clone(), queue.downgrade());
        std::mem::forget(queue);
        (split, links, server)
    }

    /// Runs `sp`'s doorbell task until the peer rings no more.
    async fn until_quiet(sp: &mut Split) {
        let bell = sp.out.bell.clone();
        let doorbell = std::mem::replace(&mut sp.doorbell, Box::pin(async {}));
        tokio::time::timeout(Duration::from_secs(5), doorbell).await.expect("the doorbell task sees the end");
        assert!(bell.quiet.load(Ordering::Acquire));
    }

    /// The CI failure of a finalize over shared memory: the peer had written its close
    /// frame and ended its side of the doorbell connection, and this side's writer
    /// then refused to write (a heartbeat, a release), failing the peer while its last
    /// messages were still in the ring. A peer that finalized still reads: writes go
    /// on, and a full ring is waited out by polling, as its reader rings no more.
    #[tokio::test]
    async fn a_peer_that_ended_its_doorbell_still_takes_writes() {
        let (mut sp, _links, server) = looped_bell(false).await;
        socket2::SockRef::from(&server).shutdown(std::net::Shutdown::Write).unwrap();
        until_quiet(&mut sp).await;
        // Three rings' worth, while a slow reader takes it 1000 bytes at a time.
        let data = random_bytes(3 << 12, 3);
        let ring = sp.inbox.ring.clone();
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            while got.len() < 3 << 12 {
                tokio::time::sleep(Duration::from_millis(2)).await;
                let mut buf = [0u8; 1000];
                // SAFETY: `buf` holds 1000 bytes.
                let n = unsafe { ring.peek(buf.as_mut_ptr(), buf.len()) };
                got.extend_from_slice(&buf[..n]);
                ring.skip(n);
            }
            got
        });
        let writer = ShmWrite { out: sp.out.clone(), spin: Duration::ZERO };
        tokio::time::timeout(Duration::from_secs(5), writer.write_all(&data)).await.unwrap().unwrap();
        assert_eq!(tokio::time::timeout(Duration::from_secs(5), reader).await.unwrap().unwrap(), data);
    }

    /// A peer whose end of the connection is gone fails a writer facing a full ring
    /// (within its deadline: a write to the connection fails), where it used to wait
    /// for a ring.
    #[tokio::test]
    async fn a_peer_that_is_gone_fails_a_writer_facing_a_full_ring() {
        let (mut sp, _links, server) = looped_bell(false).await;
        drop(server);
        until_quiet(&mut sp).await;
        let writer = ShmWrite { out: sp.out.clone(), spin: Duration::ZERO };
        let res = tokio::time::timeout(Duration::from_secs(5), writer.write_all(&[7u8; 3 << 12])).await;
        let e = res.expect("the writer notices the peer is gone").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
    }

    fn data_header(tag: u32, len: usize) -> Header {
        Header::data(1, 9, 0, tag, &hcomm_core::Signature::bare(OpKind::Send, len as u64), len)
    }

    fn key(tag: u32) -> hcomm_core::MatchKey {
        hcomm_core::MatchKey { src: 1, comm: 9, seq: 0, tag }
    }

    fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// A payload handed over is lent: the receiver copies it out of the sender's
    /// memory, and its release (a frame back) lets the sender drop it.
    #[tokio::test]
    async fn a_lent_payload_is_copied_once_and_released() {
        let (sp, links) = looped_with(true).await;
        let data = random_bytes(100_003, 1);
        let recv = links.mailbox.recv_frame(key(4));
        assert!(sp.out.send(data_header(4, data.len()), Bytes::from(data.clone()), true, |_, _| panic!("queued")));
        assert_eq!(sp.out.lent_now(), 1);
        assert_eq!(sp.inbox.drain(), Drained::Some);
        let f = recv.await.unwrap();
        let remote = f.remote.clone().expect("the payload stays in the sender's memory");
        assert!(f.payload.is_empty());
        let mut got = vec![0u8; data.len()];
        remote.read_into(&mut got).unwrap();
        assert_eq!(got, data);
        assert!(remote.read_into(&mut got[1..]).unwrap_err().kind() == hcomm_core::ErrorKind::InvalidArgument);
        drop((f, remote));
        // The release went into the ring; reading it frees the loan.
        assert_eq!(sp.inbox.drain(), Drained::Some);
        assert_eq!(sp.out.lent_now(), 0);
        let st = sp.out.stats();
        assert_eq!((st.lent, st.pulled), (1, 1));
    }

    /// A copy made after the lender marked its ring (its side of the link went) is
    /// refused, whatever the memory held.
    #[tokio::test]
    async fn a_copy_after_the_lender_let_go_fails() {
        let (sp, links) = looped_with(true).await;
        let recv = links.mailbox.recv_frame(key(7));
        sp.out.send(data_header(7, 4096), Bytes::from(vec![1u8; 4096]), true, |_, _| panic!("queued"));
        assert_eq!(sp.inbox.drain(), Drained::Some);
        let f = recv.await.unwrap();
        sp.out.ring.u32_at(LENDER_GONE).store(1, Ordering::SeqCst);
        let e = f.into_local().unwrap_err();
        assert!(e.is_peer_failed() && e.peer() == Some(1), "{e}");
        assert!(e.to_string().contains("closed its side"), "{e}");
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
        sp.out.ring.push(b"HCMF\x01");
        let held = sp.inbox.asm.lock();
        assert_eq!(poll_once(sp.inbox.clone()), Some(false), "the reader task must yield, not spin");
        drop(held);
        // With the parser free, the reader reads the bytes (less than a whole header,
        // so no message yet).
        assert_eq!(sp.inbox.drain(), Drained::Some);
        assert_eq!(sp.inbox.ring.readable(), 0);
    }

    /// Sends `sizes` straight into the ring (one tag each, from `tag0`), draining in
    /// between where `drain_after` says, and checks that every message arrives whole;
    /// returns the ring's bytes written.
    async fn send_sizes(sp: &Split, links: &Links, tag0: u32, sizes: &[usize], drain_after: &[usize]) -> u64 {
        let datas: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| random_bytes(n, 7 + i as u64)).collect();
        let recvs: Vec<_> = (0..sizes.len()).map(|i| links.mailbox.recv_frame(key(tag0 + i as u32))).collect();
        for (i, d) in datas.iter().enumerate() {
            let sent = sp.out.send_slice(data_header(tag0 + i as u32, d.len()), d, |_| panic!("queued"));
            assert!(sent, "written straight into the ring");
            if drain_after.contains(&i) {
                assert_eq!(sp.inbox.drain(), Drained::Some);
            }
        }
        while sp.inbox.drain() == Drained::Some {}
        for ((r, d), i) in recvs.into_iter().zip(&datas).zip(0..) {
            let f = r.await.unwrap();
            assert_eq!(&f.payload[..], &d[..], "message {i} of {} bytes", d.len());
        }
        sp.out.ring.written()
    }

    /// Small messages go as boxes, stamped, on whole lines of their own, and arrive
    /// whole and in order, read one by one or several at once, as the ring wraps
    /// (a box's lines too). (The parser's side, boxes in its buffer, is tested with
    /// the framing.)
    #[tokio::test]
    async fn small_messages_go_as_stamped_boxes() {
        let (sp, links) = looped().await;
        let line = LINE as u64;
        // Each alone: one line each (the first at the ring's start).
        let written = send_sizes(&sp, &links, 100, &[0, 1, 8, BOX_FIRST], &[0, 1, 2, 3]).await;
        assert_eq!(written, 4 * line);
        assert_eq!(sp.inbox.ring.readable(), 0);
        // One byte more takes a second line.
        let written = send_sizes(&sp, &links, 200, &[BOX_FIRST + 1, 3], &[0, 1]).await;
        assert_eq!(written, 7 * line);
        let w0 = sp.out.ring.written();
        send_sizes(&sp, &links, 300, &[1000, 5], &[]).await;
        assert_eq!(sp.out.ring.written(), w0 + (box_len(1000) + LINE) as u64);
        // Several at once.
        send_sizes(&sp, &links, 400, &[2000, 2, 16, 30, 9, 0], &[]).await;
        // A box whose lines wrap at the ring's end.
        let cap = sp.out.ring.cap as u64;
        let lines_left = (cap - sp.out.ring.written() % cap) / line;
        let empties = vec![0; lines_left as usize - 1];
        send_sizes(&sp, &links, 1000, &empties, &[]).await;
        assert_eq!(sp.out.ring.written() % cap, cap - line);
        send_sizes(&sp, &links, 2000, &[300], &[0]).await;
        assert_eq!(sp.out.ring.written() % cap, box_len(300) as u64 - line);
        // Mixed, read as they come.
        for round in 0..8 {
            send_sizes(&sp, &links, 3000 + 10 * round, &[7, 3000, 16, 17, 64, 1, 2000, 4], &[0, 1, 2, 3, 4, 5, 6, 7])
                .await;
        }
        assert_eq!(sp.inbox.ring.readable(), 0);
    }

    /// A line whose stamp is another position's (one lap old, say) is not taken; a
    /// stamped line that is not a box is a protocol error.
    #[tokio::test]
    async fn a_stale_or_foreign_stamp_is_not_a_message() {
        let (sp, links) = looped().await;
        let ring = &sp.out.ring;
        // The first line, stamped as if for the position one lap earlier.
        ring.stamp(0).store((0u64.wrapping_sub(ring.cap as u64)) ^ ring.key, Ordering::Release);
        assert!(!sp.inbox.ring.boxed());
        assert_eq!(sp.inbox.drain(), Drained::Nothing);
        // Stamped for this position, but not a box.
        ring.stamp(0).store(ring.key, Ordering::Release);
        assert!(sp.inbox.ring.boxed());
        assert_eq!(sp.inbox.drain(), Drained::Ended);
        let e = links.mailbox.recv_frame(key(1)).await.unwrap_err();
        assert!(e.to_string().contains("a box starting with"), "{e}");
    }

    /// The rings are mapped whole at setup while all of a host's fit the budget: 16
    /// ranks with the default ring do, 17 do not, nor 2 with rings of 1 GiB.
    #[test]
    fn populating_the_rings_stays_within_its_budget() {
        assert!(rings_fit_populate(1, DEFAULT_RING));
        assert!(rings_fit_populate(16, DEFAULT_RING));
        assert!(!rings_fit_populate(17, DEFAULT_RING));
        assert!(!rings_fit_populate(2, 1 << 30));
        assert!(!rings_fit_populate(usize::MAX, DEFAULT_RING));
    }
}
