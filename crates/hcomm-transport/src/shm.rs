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

use crate::stream::{ReadLink, WriteLink};

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
        Ok(Ring { _map: map, base, cap })
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
        (self.u64_at(HEAD).load(Ordering::Acquire) - self.u64_at(TAIL).load(Ordering::Relaxed)) as usize
    }

    fn writable(&self) -> usize {
        self.cap - (self.u64_at(HEAD).load(Ordering::Relaxed) - self.u64_at(TAIL).load(Ordering::Acquire)) as usize
    }

    /// Writer: copies as much of `src` as fits; returns how much.
    fn push(&self, src: &[u8]) -> usize {
        let head = self.u64_at(HEAD).load(Ordering::Relaxed);
        let n = self.writable().min(src.len());
        let at = (head % self.cap as u64) as usize;
        let first = n.min(self.cap - at);
        // SAFETY: both pieces lie in the data region, in the part the reader has
        // released (`writable`), and `src` is a separate allocation.
        unsafe {
            let data = self.base.add(HDR);
            std::ptr::copy_nonoverlapping(src.as_ptr(), data.add(at), first);
            std::ptr::copy_nonoverlapping(src.as_ptr().add(first), data, n - first);
        }
        self.u64_at(HEAD).store(head + n as u64, Ordering::Release);
        n
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
}

impl Default for ShmOptions {
    fn default() -> ShmOptions {
        ShmOptions { ring: DEFAULT_RING, spin: DEFAULT_SPIN }
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

/// The receiving half of a shared-memory peer.
pub(crate) struct ShmRead {
    ring: Ring,
    bell: Arc<Bell>,
    spin: Duration,
}

/// The sending half of a shared-memory peer.
pub(crate) struct ShmWrite {
    ring: Ring,
    bell: Arc<Bell>,
    spin: Duration,
}

/// Splits a negotiated pair into its halves and the doorbell task, which must run
/// as long as the link does.
pub(crate) fn split(
    pair: ShmPair,
    stream: TcpStream,
    spin: Duration,
) -> (ShmRead, ShmWrite, impl std::future::Future<Output = ()> + Send + 'static) {
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
    (ShmRead { ring: pair.rx, bell: bell.clone(), spin }, ShmWrite { ring: pair.tx, bell, spin }, doorbell)
}

/// Polls `ready` for up to `spin`, yielding to the executor between polls (so that
/// the other tasks of a current-thread runtime, such as the one that will consume
/// what arrives, keep running); whether it became true.
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

impl ReadLink for ShmRead {
    async fn read(&mut self, mut buf: BytesMut, limit: usize) -> (io::Result<usize>, BytesMut) {
        let waits = self.ring.u32_at(READER_WAITS);
        loop {
            let spare = (buf.capacity() - buf.len()).min(limit);
            debug_assert!(spare > 0, "the framing hands out buffers with room");
            // SAFETY: the spare capacity of `buf` is valid for `spare` bytes; the
            // bytes `pop` wrote become part of its length.
            let n = unsafe {
                let n = self.ring.pop(buf.as_mut_ptr().add(buf.len()), spare);
                buf.set_len(buf.len() + n);
                n
            };
            if n > 0 {
                fence(Ordering::SeqCst);
                if self.ring.u32_at(WRITER_WAITS).swap(0, Ordering::SeqCst) == 1 {
                    self.bell.ring(DOORBELL_SPACE);
                }
                // A ring that always has data never makes this future wait: take
                // part in tokio's cooperative budget, so that the executor's other
                // tasks (the heartbeat writer among them) still run.
                tokio::task::coop::consume_budget().await;
                return (Ok(n), buf);
            }
            if !wait_until(self.spin, waits, || self.ring.readable() > 0, &self.bell.data, &self.bell.dead).await {
                // Everything the peer wrote before it went is read: the end.
                return (Ok(0), buf);
            }
        }
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
        let _ = socket2::SockRef::from(&*self.bell.stream).shutdown(std::net::Shutdown::Write);
    }
}

impl ShmWrite {
    async fn write_all(&self, part: &[u8]) -> io::Result<()> {
        let waits = self.ring.u32_at(WRITER_WAITS);
        let closed = || io::Error::new(io::ErrorKind::BrokenPipe, "the peer's shared-memory doorbell closed");
        let mut off = 0;
        while off < part.len() {
            if self.bell.dead.load(Ordering::Acquire) {
                return Err(closed());
            }
            let n = self.ring.push(&part[off..]);
            if n > 0 {
                off += n;
                fence(Ordering::SeqCst);
                if self.ring.u32_at(READER_WAITS).swap(0, Ordering::SeqCst) == 1 {
                    self.bell.ring(DOORBELL_DATA);
                }
                // As in `read`: never monopolise the executor.
                tokio::task::coop::consume_budget().await;
            } else if !wait_until(self.spin, waits, || self.ring.writable() > 0, &self.bell.space, &self.bell.dead)
                .await
            {
                return Err(closed());
            }
        }
        Ok(())
    }
}
