//! RDMA transport (InfiniBand, RoCE) on `async-rdma`: cargo feature `rdma`.
//!
//! **Licence.** async-rdma is GPL-3.0-only. A binary built with this feature links it,
//! so the binary as a whole is under the GPL-3.0; without the feature (the default)
//! nothing of it is compiled or linked.
//!
//! # Connections
//! One reliable-connected queue pair per peer, all on one device context, protection
//! domain and completion queue, so that any registered buffer can go to any peer. The
//! queue-pair endpoints are exchanged over the job's authenticated TCP connection to
//! that peer (the handshake of [`crate::connect_mesh`]): async-rdma's own exchange
//! speaks plain TCP to an address, so it is pointed at a loopback socket of ours that
//! relays the endpoint through the authenticated connection. That TCP connection stays
//! open as the liveness channel: a dead process closes it (noticed at once), a hung one
//! stops its heartbeats (noticed after [`RdmaOptions::peer_timeout`]).
//!
//! # Messages
//! Every message goes out, in the order of the calls, as one RDMA send into a receive
//! buffer the peer keeps posted ([`RdmaOptions::recv_depth`] of them, each
//! [`RdmaOptions::eager`] bytes of payload):
//! - **eager**: messages up to [`RdmaOptions::eager`] bytes travel inside the send (the
//!   sender copies them into a registered bounce buffer, the receiver copies them out
//!   and its buffer goes back to the pool, from which the next receive is posted);
//! - **rendezvous**: a larger message is announced by a send carrying the address, length
//!   and key of registered memory that holds it; the receiver reads it with RDMA reads
//!   straight into registered memory of its own, which it hands to the application as
//!   the message's bytes (no copy), and then tells the sender, which lets go of its
//!   buffer. A payload that already lies in memory this transport registered
//!   ([`LocalTransport::send_buffer`](hcomm_core::LocalTransport::send_buffer) hands
//!   such buffers out) is announced as it is; any other is copied once into a
//!   registered buffer first.
//!
//! # Registered memory
//! Every region (send bounce buffers, receive buffers, rendezvous sources and
//! destinations) comes from a pool of registered regions by power-of-two size class;
//! a region is registered with the device only when the pool has none of its class,
//! and the pool keeps up to 256 MiB. The default of [`RdmaOptions::eager`] (16 KiB)
//! was measured in the soft-RoCE guest: larger limits made small
//! messages slower than the eager path made the 32–64 KiB ones faster.
//!
//! # Cancel safety
//! No RDMA operation ever touches memory the application holds: payloads are owned
//! [`Bytes`] kept by this transport until the peer has read them, receive buffers and
//! rendezvous destinations belong to the transport until they are complete, and a work
//! request still posted when its future is dropped keeps its memory region alive until
//! the device completes or flushes it (async-rdma holds a reference per posted
//! request).

use std::alloc::Layout;
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use async_rdma::{LocalMr, LocalMrReadAccess, LocalMrWriteAccess, MrAccess, MrToken, RdmaBuilder, RemoteMr};
use bytes::Bytes;
use futures::stream::{FuturesOrdered, FuturesUnordered, StreamExt};
use hcomm_core::wire::{FrameKind, HEADER_LEN};
use hcomm_core::{Error, ErrorKind, Frame, Header, Mailbox, OpKind, Rank, Result, Transport};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::AbortHandle;

/// Tuning of the RDMA transport.
#[derive(Debug, Clone)]
pub struct RdmaOptions {
    /// Device name (`rxe0`, `mlx5_0`); `None` takes the first device.
    pub device: Option<String>,
    /// Port of the device (from 1).
    pub port: u8,
    /// GID index: 1 is the IPv4-mapped RoCE v2 address on soft-RoCE.
    pub gid_index: usize,
    /// Largest message sent eagerly, inside the send; larger ones go by rendezvous
    /// (`HCOMM_RDMA_EAGER`).
    pub eager: usize,
    /// Receive buffers kept posted per peer (`HCOMM_RDMA_RECV_DEPTH`).
    pub recv_depth: usize,
    /// Sends in flight per peer before the writer waits for completions.
    pub send_depth: usize,
    /// A peer whose liveness connection carried nothing (no heartbeat) for this long
    /// is failed; `None` turns heartbeats off (a dead process is still noticed by its
    /// closed connection).
    pub peer_timeout: Option<Duration>,
}

impl Default for RdmaOptions {
    fn default() -> Self {
        RdmaOptions {
            device: None,
            port: 1,
            gid_index: 1,
            eager: DEFAULT_EAGER,
            recv_depth: 64,
            send_depth: 64,
            peer_timeout: Some(Duration::from_secs(2)),
        }
    }
}

/// Default of [`RdmaOptions::eager`].
pub const DEFAULT_EAGER: usize = 16 << 10;

/// Bytes before the frame header in every send: kind, reserved, id.
const PREFIX: usize = 16;
/// Address, length, key of a rendezvous source.
const TOKEN_LEN: usize = 20;
/// Smallest pooled region.
const MIN_CLASS: usize = 4096;
/// Most registered bytes the pool keeps for reuse, per transport.
const POOL_LIMIT: usize = 256 << 20;
/// Largest single RDMA read (the verbs limit is 2^31 bytes per request).
const MAX_READ: usize = 1 << 30;

const KIND_EAGER: u8 = 1;
const KIND_RTS: u8 = 2;
const KIND_FIN: u8 = 3;

/// How the sender's registered memory is named to the reader.
#[derive(Debug, Clone, Copy)]
struct Token {
    addr: u64,
    len: u64,
    rkey: u32,
}

/// Counters of the registered memory this transport uses (for statistics).
#[derive(Debug, Default)]
struct Usage {
    eager_sent: AtomicU64,
    rendezvous_sent: AtomicU64,
    zero_copy_sent: AtomicU64,
    copied_bytes: AtomicU64,
    registered_in_use: AtomicUsize,
    registered_peak: AtomicUsize,
    pooled: AtomicUsize,
    registrations: AtomicU64,
}

/// What the transport has done with registered memory, from
/// [`RdmaTransport::buffer_stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RdmaBufferStats {
    /// Messages sent inside the send (eager).
    pub eager_sent: u64,
    /// Messages sent by rendezvous.
    pub rendezvous_sent: u64,
    /// Of those, messages whose payload already lay in registered memory (no copy).
    pub zero_copy_sent: u64,
    /// Bytes copied into registered bounce buffers on the sending side.
    pub copied_bytes: u64,
    /// Registered bytes held now by messages in flight (both directions).
    pub registered_in_use: usize,
    /// The most registered bytes held at once.
    pub registered_peak: usize,
    /// Registered bytes kept in the pool for reuse now.
    pub pooled: usize,
    /// Regions registered with the device so far (the pool had none of the size).
    pub registrations: u64,
}

impl Usage {
    fn hold(&self, n: usize) {
        let now = self.registered_in_use.fetch_add(n, Ordering::Relaxed) + n;
        self.registered_peak.fetch_max(now, Ordering::Relaxed);
    }
    fn release(&self, n: usize) {
        self.registered_in_use.fetch_sub(n, Ordering::Relaxed);
    }
}

/// A message queued for a peer's writer.
struct Outgoing {
    header: Header,
    payload: Bytes,
    done: Option<oneshot::Sender<Result<()>>>,
}

struct Shared {
    rank: Rank,
    mailbox: Arc<Mailbox>,
    rdma: async_rdma::Rdma,
    /// Registered buffers handed out by `send_buffer`, by start address: a payload in
    /// one of them is sent without a copy.
    registered: Mutex<std::collections::BTreeMap<usize, (usize, std::sync::Weak<RegisteredMem>)>>,
    usage: Usage,
    closed: AtomicBool,
    /// Peers whose close arrived.
    peer_closed: Mutex<Vec<bool>>,
    /// Messages queued and not yet complete, per peer.
    pending: Vec<AtomicUsize>,
    changed: Notify,
    /// Registered regions not in use, by size class (a power of two): taken before
    /// registering anew, given back when a message is done with them.
    pool: Mutex<HashMap<usize, Vec<LocalMr>>>,
    /// Per peer: set when it failed, which ends its writer and receive loop.
    dead: Vec<tokio::sync::watch::Sender<bool>>,
    tasks: Mutex<Vec<AbortHandle>>,
}

impl Shared {
    fn fail(&self, peer: Rank, what: &str) {
        if self.closed.load(Ordering::Acquire) && self.peer_closed.lock()[peer] {
            return;
        }
        let err = Error::new(ErrorKind::PeerFailed, format!("rank {peer}: {what}")).with_peer(peer).at_rank(self.rank);
        tracing::debug!(rank = self.rank, peer, what, "rdma peer failed");
        self.mailbox.fail_peer(peer, err);
        self.dead[peer].send_replace(true);
        self.changed.notify_waiters();
    }

    /// A registered region of at least `len` bytes: from the pool, or registered now
    /// (counted in `registrations`) when the pool has none of its class.
    fn alloc(self: &Arc<Self>, len: usize) -> std::io::Result<Reg> {
        let class = len.max(MIN_CLASS).next_power_of_two();
        let pooled = self.pool.lock().get_mut(&class).and_then(Vec::pop);
        let mr = match pooled {
            Some(mr) => {
                self.usage.pooled.fetch_sub(class, Ordering::Relaxed);
                mr
            }
            None => {
                let layout = Layout::from_size_align(class, 4096).map_err(std::io::Error::other)?;
                let mr = self.rdma.alloc_local_mr(layout)?;
                self.usage.registrations.fetch_add(1, Ordering::Relaxed);
                mr
            }
        };
        self.usage.hold(class);
        Ok(Reg { mr: Some(mr), shared: Arc::downgrade(self) })
    }

    /// Takes `mr` back into the pool, or lets it go (deregistered) beyond the limit.
    fn give_back(&self, mr: LocalMr) {
        let class = mr.length();
        self.usage.release(class);
        if self.usage.pooled.fetch_add(class, Ordering::Relaxed) + class > POOL_LIMIT {
            self.usage.pooled.fetch_sub(class, Ordering::Relaxed);
            return;
        }
        self.pool.lock().entry(class).or_default().push(mr);
    }

    /// The registered memory `payload` lies in, if any (a `send_buffer`).
    fn registered_for(&self, payload: &Bytes) -> Option<(Arc<RegisteredMem>, usize)> {
        let addr = payload.as_ptr() as usize;
        let map = self.registered.lock();
        let (&start, (len, weak)) = map.range(..=addr).next_back()?;
        if addr + payload.len() > start + len {
            return None;
        }
        Some((weak.upgrade()?, addr - start))
    }
}

/// A registered region taken from the pool; it goes back when dropped.
struct Reg {
    mr: Option<LocalMr>,
    shared: std::sync::Weak<Shared>,
}

impl std::ops::Deref for Reg {
    type Target = LocalMr;
    fn deref(&self) -> &LocalMr {
        self.mr.as_ref().expect("a region until dropped")
    }
}

impl std::ops::DerefMut for Reg {
    fn deref_mut(&mut self) -> &mut LocalMr {
        self.mr.as_mut().expect("a region until dropped")
    }
}

impl Drop for Reg {
    fn drop(&mut self) {
        if let (Some(mr), Some(s)) = (self.mr.take(), self.shared.upgrade()) {
            s.give_back(mr);
        }
    }
}

/// Registered memory behind a [`Bytes`]: the region stays registered (and out of the
/// pool) while any clone of the bytes lives.
struct RegisteredMem {
    mr: Reg,
    len: usize,
}

impl AsRef<[u8]> for RegisteredMem {
    fn as_ref(&self) -> &[u8] {
        registered_bytes(&self.mr, self.len)
    }
}

impl Drop for RegisteredMem {
    fn drop(&mut self) {
        if let Some(s) = self.mr.shared.upgrade() {
            let addr = self.mr.addr();
            let mut map = s.registered.lock();
            if map.get(&addr).is_some_and(|(_, w)| w.strong_count() == 0) {
                map.remove(&addr);
            }
        }
    }
}

/// The first `len` bytes of a memory region no request uses any more.
#[allow(unsafe_code)]
fn registered_bytes(mr: &LocalMr, len: usize) -> &[u8] {
    let len = len.min(mr.length());
    // SAFETY: the region is `mr.length()` bytes of memory owned by `mr` (allocated by
    // async-rdma and kept until `mr` drops), so the pointer is valid for `len <=
    // mr.length()` bytes for the borrow of `mr`. Every `LocalMr` reaching this function
    // is owned by a `RegisteredMem` and no longer the target of any posted request: a
    // rendezvous destination after its reads completed, or a send buffer after it was
    // filled; posted sends and reads from it only read. Nothing writes to it while the
    // borrow lives.
    unsafe { std::slice::from_raw_parts(mr.as_ptr_unchecked(), len) }
}

/// Full mesh over RDMA queue pairs. See the module documentation.
#[derive(Debug)]
pub struct RdmaTransport {
    rank: Rank,
    size: usize,
    shared: Arc<Shared>,
    queues: Vec<Option<mpsc::UnboundedSender<Outgoing>>>,
    eager: usize,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("rank", &self.rank).finish_non_exhaustive()
    }
}

fn boot(rank: Rank, peer: Rank, what: impl Into<String>) -> Error {
    Error::new(ErrorKind::Bootstrap, what).in_op(OpKind::Bootstrap, None).at_rank(rank).with_peer(peer)
}

impl RdmaTransport {
    /// Connects rank `rank` to every peer that has a stream in `streams` (authenticated
    /// TCP connections from [`crate::connect_mesh`]; `None` for this rank itself): opens
    /// the device, exchanges queue-pair endpoints over the streams and keeps them as
    /// liveness channels. Must run inside a tokio runtime (its tasks are spawned on it).
    ///
    /// # Errors
    /// A bootstrap error if the device cannot be opened, a queue pair cannot be set up
    /// or a peer does not answer within `timeout`.
    ///
    /// # Cancel safety
    /// Dropping the future drops the connections made so far.
    pub async fn connect(
        rank: Rank,
        streams: Vec<Option<TcpStream>>,
        opts: &RdmaOptions,
        timeout: Duration,
    ) -> Result<RdmaTransport> {
        let size = streams.len();
        let peers = size.saturating_sub(1).max(1);
        let depth = opts.recv_depth.max(2);
        let cq = u32::try_from((depth + opts.send_depth + 16) * peers).unwrap_or(u32::MAX).max(1024);
        let mut b = RdmaBuilder::default()
            .set_raw(true)
            .set_port_num(opts.port)
            .set_gid_index(opts.gid_index)
            .set_cq_size(cq)
            .set_max_cqe(i32::try_from(cq).unwrap_or(i32::MAX))
            .set_qp_max_recv_wr(u32::try_from(depth + 8).unwrap_or(u32::MAX))
            .set_qp_max_send_wr(u32::try_from(opts.send_depth + 16).unwrap_or(u32::MAX))
            // Receivers repost at once, so a send that finds no buffer is retried
            // without limit (7) rather than failed; a dead peer is noticed by its
            // liveness connection and by the transport retry limit.
            .set_rnr_retry(7)
            .set_min_rnr_timer(1)
            // async-rdma's completion task re-arms the completion queue's notification
            // after its last poll without polling again, so a completion that lands in
            // between waits for this timeout (100 ms by default) before it is seen;
            // 5 ms bounds that stall at the price of an idle poll every 5 ms.
            .set_cc_evnet_timeout(Duration::from_millis(5));
        if let Some(d) = &opts.device {
            b = b.set_dev(d);
        }
        // Regions are registered one by one and pooled here. async-rdma's default
        // allocator (jemalloc arenas of registered extents) fails assertions in its
        // extent lookup for large regions and for two transports in one process.
        b = b.set_mr_strategy(async_rdma::MRManageStrategy::Raw);
        let mut root = b.build().map_err(|e| boot(rank, rank, "opening the RDMA device").with_source(e))?;
        let ep_len = bincode::serialized_size(&root.get_qp_endpoint())
            .map_err(|e| boot(rank, rank, format!("sizing a queue-pair endpoint: {e}")))? as usize;
        let mut qps: Vec<Option<async_rdma::Rdma>> = (0..size).map(|_| None).collect();
        let mut streams = streams;
        // Every rank takes its peers in rank order, so the pairs are set up in one
        // global order and no two ranks wait on each other.
        for (peer, slot) in streams.iter_mut().enumerate() {
            let Some(s) = slot else { continue };
            let qp = tokio::time::timeout(timeout, relay_connect(&mut root, s, ep_len))
                .await
                .map_err(|_| boot(rank, peer, format!("rank {peer} did not set up its queue pair in time")))?
                .map_err(|e| boot(rank, peer, format!("setting up the queue pair with rank {peer}")).with_source(e))?;
            qps[peer] = Some(qp);
        }
        let mailbox = Arc::new(Mailbox::new(rank));
        let shared = Arc::new(Shared {
            rank,
            mailbox,
            rdma: root,
            registered: Mutex::new(std::collections::BTreeMap::new()),
            usage: Usage::default(),
            closed: AtomicBool::new(false),
            peer_closed: Mutex::new(vec![false; size]),
            pending: (0..size).map(|_| AtomicUsize::new(0)).collect(),
            changed: Notify::new(),
            dead: (0..size).map(|_| tokio::sync::watch::channel(false).0).collect(),
            pool: Mutex::new(HashMap::new()),
            tasks: Mutex::new(Vec::new()),
        });
        let mut queues = Vec::with_capacity(size);
        let eager = opts.eager.max(1);
        let mut liveness = Vec::new();
        for (peer, (qp, stream)) in qps.into_iter().zip(streams).enumerate() {
            let (Some(qp), Some(stream)) = (qp, stream) else {
                queues.push(None);
                continue;
            };
            let qp = Arc::new(qp);
            let (tx, rx) = mpsc::unbounded_channel();
            let (fins, fins_rx) = mpsc::unbounded_channel();
            let posted = Arc::new(Notify::new());
            let r = tokio::spawn(recv_loop(shared.clone(), qp.clone(), peer, depth, eager, fins, posted.clone()));
            posted.notified().await;
            let w = tokio::spawn(write_loop(shared.clone(), qp, peer, rx, fins_rx, eager, opts.send_depth.max(1)));
            shared.tasks.lock().extend([r.abort_handle(), w.abort_handle()]);
            liveness.push((peer, stream));
            queues.push(Some(tx));
        }
        // Receives are posted on both sides before anything is sent: one byte each way.
        let ready = liveness.iter_mut().map(|(peer, s)| async move {
            s.write_all(&[1]).await?;
            let mut b = [0u8];
            s.read_exact(&mut b).await?;
            Ok::<_, std::io::Error>(*peer)
        });
        tokio::time::timeout(timeout, futures::future::try_join_all(ready))
            .await
            .map_err(|_| boot(rank, rank, "peers did not post their receives in time"))?
            .map_err(|e| boot(rank, rank, "liveness connection broke during setup").with_source(e))?;
        for (peer, s) in liveness {
            let (rd, wr) = s.into_split();
            let w = tokio::spawn(watch(shared.clone(), peer, rd, opts.peer_timeout));
            let h = tokio::spawn(heartbeat(wr, opts.peer_timeout));
            shared.tasks.lock().extend([w.abort_handle(), h.abort_handle()]);
        }
        Ok(RdmaTransport { rank, size, shared, queues, eager })
    }

    /// Registered-memory use so far.
    pub fn buffer_stats(&self) -> RdmaBufferStats {
        let u = &self.shared.usage;
        RdmaBufferStats {
            eager_sent: u.eager_sent.load(Ordering::Relaxed),
            rendezvous_sent: u.rendezvous_sent.load(Ordering::Relaxed),
            zero_copy_sent: u.zero_copy_sent.load(Ordering::Relaxed),
            copied_bytes: u.copied_bytes.load(Ordering::Relaxed),
            registered_in_use: u.registered_in_use.load(Ordering::Relaxed),
            registered_peak: u.registered_peak.load(Ordering::Relaxed),
            pooled: u.pooled.load(Ordering::Relaxed),
            registrations: u.registrations.load(Ordering::Relaxed),
        }
    }

    /// Largest message sent eagerly.
    pub fn eager_limit(&self) -> usize {
        self.eager
    }

    fn enqueue(
        &self,
        peer: Rank,
        mut header: Header,
        payload: Bytes,
        done: Option<oneshot::Sender<Result<()>>>,
    ) -> Result<()> {
        if peer >= self.size {
            return Err(Error::invalid(format!("peer rank {peer} out of range for {} ranks", self.size)));
        }
        header.src = self.rank as u32;
        header.msg_len = payload.len() as u64;
        header.offset = 0;
        header.frag_len = 0;
        let Some(q) = &self.queues[peer] else {
            self.shared.mailbox.deliver(Frame::new(header, payload));
            if let Some(tx) = done {
                let _ = tx.send(Ok(()));
            }
            return Ok(());
        };
        if header.kind != FrameKind::Close
            && let Some(e) = self.shared.mailbox.peer_failure(peer)
        {
            return Err(e);
        }
        self.shared.pending[peer].fetch_add(1, Ordering::AcqRel);
        q.send(Outgoing { header, payload, done }).map_err(|_| {
            self.shared.pending[peer].fetch_sub(1, Ordering::AcqRel);
            self.shared
                .mailbox
                .peer_failure(peer)
                .unwrap_or_else(|| Error::new(ErrorKind::Closed, "transport closed").at_rank(self.rank).with_peer(peer))
        })
    }

    fn post_closes(&self) -> bool {
        if self.shared.closed.swap(true, Ordering::AcqRel) {
            return false;
        }
        let b = self.buffer_stats();
        hcomm_core::events::buffers(
            self.rank as u32,
            "rdma",
            hcomm_core::events::BufferUse {
                eager_sent: b.eager_sent,
                rendezvous_sent: b.rendezvous_sent,
                zero_copy_sent: b.zero_copy_sent,
                copied_bytes: b.copied_bytes,
                registered_peak: b.registered_peak as u64,
                pooled: b.pooled as u64,
                registrations: b.registrations,
            },
        );
        let why = self.shared.mailbox.close_payload();
        for peer in (0..self.size).filter(|&p| p != self.rank) {
            let h = Header::control(FrameKind::Close, OpKind::Bootstrap, self.rank, 0, 0, why.len());
            let _ = self.enqueue(peer, h, why.clone(), None);
        }
        true
    }

    fn stop(&self) {
        for t in self.shared.tasks.lock().drain(..) {
            t.abort();
        }
        self.shared.mailbox.close(Error::new(ErrorKind::Closed, "communicator closed").at_rank(self.rank));
    }
}

impl Transport for RdmaTransport {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn name(&self) -> &'static str {
        "rdma"
    }

    fn mailbox(&self) -> &Arc<Mailbox> {
        &self.shared.mailbox
    }

    /// Large payloads (above the eager limit) are copied into registered memory, from
    /// which the rendezvous sends them without another copy; small ones into an
    /// ordinary pool buffer (they are copied into the send anyway).
    fn payload_from(&self, data: &[u8]) -> Bytes {
        let len = data.len();
        if len > self.eager {
            match self.shared.alloc(len) {
                Ok(mut mr) => {
                    mr.as_mut_slice()[..len].copy_from_slice(data);
                    let addr = mr.addr();
                    let mem = Arc::new(RegisteredMem { mr, len });
                    self.shared.registered.lock().insert(addr, (len, Arc::downgrade(&mem)));
                    return Bytes::from_owner(ArcMem(mem));
                }
                Err(e) => {
                    tracing::debug!(rank = self.rank, len, error = %e, "no registered memory: an ordinary buffer")
                }
            }
        }
        let mut b = hcomm_core::pool::take(len);
        b.extend_from_slice(data);
        b.freeze()
    }

    fn send(&self, peer: Rank, header: Header, payload: Bytes) -> impl Future<Output = Result<()>> + Send {
        let (tx, rx) = oneshot::channel();
        let queued = self.enqueue(peer, header, payload, Some(tx));
        let (rank, mailbox) = (self.rank, self.shared.mailbox.clone());
        async move {
            queued?;
            rx.await.unwrap_or_else(|_| {
                Err(mailbox.peer_failure(peer).unwrap_or_else(|| {
                    Error::new(ErrorKind::Closed, "transport closed before the message was sent")
                        .at_rank(rank)
                        .with_peer(peer)
                }))
            })
        }
    }

    fn send_borrowed(&self, peer: Rank, header: Header, data: &[u8]) -> impl Future<Output = Result<()>> + Send {
        self.send(peer, header, self.payload_from(data))
    }

    fn post(&self, peer: Rank, header: Header, payload: Bytes) {
        let _ = self.enqueue(peer, header, payload, None);
    }

    fn close(&self) {
        if self.post_closes() {
            self.stop();
        }
    }

    fn shutdown(&self, deadline: Duration) -> impl Future<Output = Result<()>> + Send {
        self.post_closes();
        let shared = self.shared.clone();
        let rank = self.rank;
        let this = self.unfinished_fn();
        async move {
            let all_done = async {
                loop {
                    let changed = shared.changed.notified();
                    tokio::pin!(changed);
                    changed.as_mut().enable();
                    if this(&shared).is_empty() {
                        return;
                    }
                    changed.await;
                }
            };
            let waited = tokio::time::timeout(deadline, all_done).await;
            for t in shared.tasks.lock().drain(..) {
                t.abort();
            }
            shared.mailbox.close(Error::new(ErrorKind::Closed, "communicator closed").at_rank(rank));
            match waited {
                Ok(()) => Ok(()),
                Err(_) => Err(Error::new(
                    ErrorKind::Timeout,
                    format!("shutdown: ranks {:?} had not closed after {} ms", this(&shared), deadline.as_millis()),
                )
                .at_rank(rank)),
            }
        }
    }
}

impl RdmaTransport {
    /// The peers `shutdown` still waits for, as a function of the shared state.
    fn unfinished_fn(&self) -> impl Fn(&Shared) -> Vec<Rank> + Send + 'static {
        let peers: Vec<Rank> = (0..self.size).filter(|&p| p != self.rank && self.queues[p].is_some()).collect();
        move |s: &Shared| {
            let closed = s.peer_closed.lock();
            peers
                .iter()
                .copied()
                .filter(|&p| {
                    let failed = s.mailbox.peer_failure(p).is_some() && !closed[p];
                    let owed = s.pending[p].load(Ordering::Acquire) > 0;
                    !failed && (owed || !closed[p])
                })
                .collect()
        }
    }
}

impl Drop for RdmaTransport {
    fn drop(&mut self) {
        self.close();
    }
}

struct ArcMem(Arc<RegisteredMem>);

impl AsRef<[u8]> for ArcMem {
    fn as_ref(&self) -> &[u8] {
        (*self.0).as_ref()
    }
}

/// Sets up a queue pair with `root`'s device, protection domain and completion queue,
/// connected to the peer at the other end of `s`: async-rdma's endpoint exchange is
/// pointed at a loopback listener of ours that relays it through `s`.
async fn relay_connect(
    root: &mut async_rdma::Rdma,
    s: &mut TcpStream,
    ep_len: usize,
) -> std::io::Result<async_rdma::Rdma> {
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let addr = listener.local_addr()?;
    let relay = async move {
        let (mut c, _) = listener.accept().await?;
        let mut mine = vec![0u8; ep_len];
        c.read_exact(&mut mine).await?;
        let len = u16::try_from(ep_len).map_err(std::io::Error::other)?;
        s.write_all(&len.to_le_bytes()).await?;
        s.write_all(&mine).await?;
        let mut n = [0u8; 2];
        s.read_exact(&mut n).await?;
        if usize::from(u16::from_le_bytes(n)) != ep_len {
            return Err(std::io::Error::other("the peer's queue-pair endpoint has another size"));
        }
        let mut theirs = vec![0u8; ep_len];
        s.read_exact(&mut theirs).await?;
        c.write_all(&theirs).await?;
        Ok::<_, std::io::Error>(())
    };
    let (qp, relayed) = tokio::join!(root.new_connect(addr), relay);
    relayed?;
    qp
}

fn encode_prefix(buf: &mut [u8], kind: u8, id: u64) {
    buf[..PREFIX].fill(0);
    buf[0] = kind;
    buf[8..16].copy_from_slice(&id.to_le_bytes());
}

/// A posted send: its completion, and for an eager message the caller's wait (a
/// rendezvous announcement or a notice has none: the message is done when read).
type Posted = Pin<Box<dyn Future<Output = (std::io::Result<()>, Option<Option<oneshot::Sender<Result<()>>>>)> + Send>>;

/// A rendezvous source waiting for the peer's read.
struct Source {
    _mem: SourceMem,
    done: Option<oneshot::Sender<Result<()>>>,
}

/// What a rendezvous source holds until the peer has read it (dropped, it frees it).
#[allow(dead_code)]
enum SourceMem {
    /// A copy of the payload in a pooled region.
    Copied(Reg),
    /// The payload itself, in registered memory.
    Zero(Bytes),
}

/// Completion notices of rendezvous messages, from the receive loop to the writer.
#[derive(Debug, Clone, Copy)]
enum Fin {
    /// The peer has read our message `id`: its buffer can go.
    Arrived(u64),
    /// We have read the peer's message `id`: tell it.
    Owed(u64),
}

/// Sends `peer`'s messages in order, and the completion notices the receive loop asks
/// for. Completions are collected as they come; at most `depth` sends are in flight.
async fn write_loop(
    shared: Arc<Shared>,
    qp: Arc<async_rdma::Rdma>,
    peer: Rank,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    mut fins: mpsc::UnboundedReceiver<Fin>,
    eager: usize,
    depth: usize,
) {
    let mut w = Writer {
        shared: shared.clone(),
        qp,
        peer,
        eager,
        inflight: FuturesUnordered::new(),
        sources: HashMap::new(),
        next_id: 0,
    };
    let mut open = true;
    let mut dead = shared.dead[peer].subscribe();
    let result: std::result::Result<(), String> = loop {
        if !open && w.inflight.is_empty() && w.sources.is_empty() {
            break Ok(());
        }
        tokio::select! {
            biased;
            // The peer failed (its connection closed, say): what is queued or in flight
            // fails now rather than when the device gives up.
            _ = died(&mut dead) => break Ok(()),
            Some((r, d)) = w.inflight.next(), if !w.inflight.is_empty() => {
                if let Err(e) = r {
                    break Err(format!("RDMA send failed: {e}"));
                }
                if let Some(tx) = d {
                    w.finish(tx, Ok(()));
                }
            }
            f = fins.recv() => match f {
                Some(Fin::Arrived(id)) => match w.sources.remove(&id) {
                    Some(mut src) => w.finish(src.done.take(), Ok(())),
                    None => break Err(format!("protocol error: completion of unknown message {id}")),
                },
                Some(Fin::Owed(id)) => {
                    if let Err(e) = w.post_fin(id).await {
                        break Err(e);
                    }
                }
                // The receive loop ended: the peer failed (it said so) or we closed.
                None => break Ok(()),
            },
            m = rx.recv(), if open && w.inflight.len() < depth => {
                let Some(m) = m else { open = false; continue };
                let close = m.header.kind == FrameKind::Close;
                if let Err(e) = w.post_message(m).await {
                    break Err(e);
                }
                open &= !close;
            }
        }
    };
    if let Err(e) = result {
        shared.fail(peer, &e);
    }
    // Whatever is left fails: the peer is gone or the transport closed.
    let err = shared
        .mailbox
        .peer_failure(peer)
        .unwrap_or_else(|| Error::new(ErrorKind::Closed, "transport closed").at_rank(shared.rank).with_peer(peer));
    for (_, mut s) in std::mem::take(&mut w.sources) {
        let done = s.done.take();
        w.finish(done, Err(err.clone()));
    }
    rx.close();
    while let Ok(m) = rx.try_recv() {
        w.finish(m.done, Err(err.clone()));
    }
}

/// The sending side of one peer.
struct Writer {
    shared: Arc<Shared>,
    qp: Arc<async_rdma::Rdma>,
    peer: Rank,
    eager: usize,
    inflight: FuturesUnordered<Posted>,
    sources: HashMap<u64, Source>,
    next_id: u64,
}

impl Writer {
    /// A message is done (sent, or read by the peer): its caller hears `r`.
    fn finish(&self, done: Option<oneshot::Sender<Result<()>>>, r: Result<()>) {
        if let Some(tx) = done {
            let _ = tx.send(r);
        }
        self.shared.pending[self.peer].fetch_sub(1, Ordering::AcqRel);
        self.shared.changed.notify_waiters();
    }

    /// A registered send buffer of `len` bytes.
    fn buffer(&self, len: usize) -> std::result::Result<Reg, String> {
        self.shared.alloc(len).map_err(|e| format!("no registered memory for a send: {e}"))
    }

    /// Posts a send of the first `len` bytes of `buf`; `done` hears of its completion.
    async fn post_send(&mut self, buf: Reg, len: usize, done: Option<Option<oneshot::Sender<Result<()>>>>) {
        let qp = self.qp.clone();
        let f: Posted = Box::pin(async move {
            let r = match buf.get(0..len) {
                Some(part) => qp.send_raw(&part).await,
                None => Err(std::io::Error::other("send beyond its buffer")),
            };
            (r, done)
        });
        if let Some(p) = post(f).await {
            self.inflight.push(p);
        }
    }

    async fn post_fin(&mut self, id: u64) -> std::result::Result<(), String> {
        let mut buf = self.buffer(PREFIX)?;
        encode_prefix(&mut buf.as_mut_slice(), KIND_FIN, id);
        self.post_send(buf, PREFIX, None).await;
        Ok(())
    }

    async fn post_message(&mut self, m: Outgoing) -> std::result::Result<(), String> {
        let id = self.next_id;
        self.next_id += 1;
        let mut header = m.header;
        header.msg_id = id;
        let len = m.payload.len();
        let usage = &self.shared.usage;
        if len <= self.eager {
            usage.eager_sent.fetch_add(1, Ordering::Relaxed);
            let mut buf = self.buffer(PREFIX + HEADER_LEN + len)?;
            {
                let mut b = buf.as_mut_slice();
                encode_prefix(&mut b, KIND_EAGER, id);
                b[PREFIX..PREFIX + HEADER_LEN].copy_from_slice(&header.encode());
                b[PREFIX + HEADER_LEN..PREFIX + HEADER_LEN + len].copy_from_slice(&m.payload);
            }
            self.post_send(buf, PREFIX + HEADER_LEN + len, Some(m.done)).await;
            return Ok(());
        }
        usage.rendezvous_sent.fetch_add(1, Ordering::Relaxed);
        let (token, mem) = match self.shared.registered_for(&m.payload) {
            Some((mem, off)) => {
                usage.zero_copy_sent.fetch_add(1, Ordering::Relaxed);
                let t = Token { addr: (mem.mr.addr() + off) as u64, len: len as u64, rkey: mem.mr.rkey() };
                (t, SourceMem::Zero(m.payload))
            }
            None => {
                let mut mr = self.buffer(len)?;
                mr.as_mut_slice()[..len].copy_from_slice(&m.payload);
                usage.copied_bytes.fetch_add(len as u64, Ordering::Relaxed);
                let t = Token { addr: mr.addr() as u64, len: len as u64, rkey: mr.rkey() };
                (t, SourceMem::Copied(mr))
            }
        };
        self.sources.insert(id, Source { _mem: mem, done: m.done });
        let mut buf = self.buffer(PREFIX + HEADER_LEN + TOKEN_LEN)?;
        {
            let mut b = buf.as_mut_slice();
            encode_prefix(&mut b, KIND_RTS, id);
            b[PREFIX..PREFIX + HEADER_LEN].copy_from_slice(&header.encode());
            let t = &mut b[PREFIX + HEADER_LEN..];
            t[..8].copy_from_slice(&token.addr.to_le_bytes());
            t[8..16].copy_from_slice(&token.len.to_le_bytes());
            t[16..20].copy_from_slice(&token.rkey.to_le_bytes());
        }
        self.post_send(buf, PREFIX + HEADER_LEN + TOKEN_LEN, None).await;
        Ok(())
    }
}

/// Resolves once the peer of `dead` is marked failed (never, if the transport went).
async fn died(dead: &mut tokio::sync::watch::Receiver<bool>) {
    let gone = dead.wait_for(|&d| d).await.is_err();
    if gone {
        std::future::pending::<()>().await;
    }
}

/// Polls `f` once, which posts its work request, so that requests are posted in the
/// order of the calls; the completion is awaited later (or now, if it came already).
async fn post(mut f: Posted) -> Option<Posted> {
    match futures::poll!(f.as_mut()) {
        std::task::Poll::Pending => Some(f),
        std::task::Poll::Ready(out) => Some(Box::pin(async move { out })),
    }
}

type Received = Pin<Box<dyn Future<Output = (std::io::Result<Option<u32>>, Reg)> + Send>>;
type Delivery = Pin<Box<dyn Future<Output = std::result::Result<Option<Frame>, String>> + Send>>;

/// Posts a receive into a pooled region of `len` bytes (the first poll posts it).
async fn post_receive(shared: &Arc<Shared>, qp: &Arc<async_rdma::Rdma>, len: usize) -> std::io::Result<Received> {
    let mut buf = shared.alloc(len)?;
    let qp = qp.clone();
    let mut f: Received = Box::pin(async move {
        let r = qp.receive_raw_into(&mut *buf).await;
        (r, buf)
    });
    // Receives complete in the order they were posted: post now, in order. A receive
    // whose message was already there completes in this first poll: its result is
    // kept, as a completed future must not be polled again (it was, and panicked with
    // "`async fn` resumed after completion" in a run of the soft-RoCE guest's tests).
    match futures::poll!(f.as_mut()) {
        std::task::Poll::Pending => Ok(f),
        std::task::Poll::Ready(out) => Ok(Box::pin(async move { out })),
    }
}

/// Keeps `depth` receives posted for `peer` and delivers its messages in order; the
/// reads of rendezvous messages run concurrently, their deliveries stay in order.
/// Receive buffers come from the pool and go back to it once parsed: no
/// registration per message.
#[allow(clippy::too_many_arguments)]
async fn recv_loop(
    shared: Arc<Shared>,
    qp: Arc<async_rdma::Rdma>,
    peer: Rank,
    depth: usize,
    eager: usize,
    fins: mpsc::UnboundedSender<Fin>,
    posted: Arc<Notify>,
) {
    let len = PREFIX + HEADER_LEN + eager.max(TOKEN_LEN);
    let mut receives: FuturesOrdered<Received> = FuturesOrdered::new();
    for _ in 0..depth {
        match post_receive(&shared, &qp, len).await {
            Ok(f) => receives.push_back(f),
            Err(e) => {
                shared.fail(peer, &format!("no registered memory for receives: {e}"));
                posted.notify_one();
                return;
            }
        }
    }
    posted.notify_one();
    let mut deliveries: FuturesOrdered<Delivery> = FuturesOrdered::new();
    let mut expect = 0u64;
    let mut dead = shared.dead[peer].subscribe();
    loop {
        tokio::select! {
            biased;
            _ = died(&mut dead) => return,
            Some(d) = deliveries.next(), if !deliveries.is_empty() => match d {
                Ok(Some(f)) => {
                    let close = f.header.kind == FrameKind::Close;
                    shared.mailbox.deliver(f);
                    if close {
                        shared.peer_closed.lock()[peer] = true;
                        shared.changed.notify_waiters();
                    }
                }
                Ok(None) => {}
                Err(e) => { shared.fail(peer, &e); return; }
            },
            Some((r, mr)) = receives.next() => {
                if let Err(e) = r {
                    shared.fail(peer, &format!("RDMA receive failed: {e}"));
                    return;
                }
                match post_receive(&shared, &qp, len).await {
                    Ok(f) => receives.push_back(f),
                    Err(e) => { shared.fail(peer, &format!("no registered memory for receives: {e}")); return; }
                }
                match parse(&shared, &qp, peer, &mr, eager, &mut expect, &fins) {
                    Ok(Some(d)) => deliveries.push_back(d),
                    Ok(None) => {}
                    Err(e) => { shared.fail(peer, &format!("protocol error: {e}")); return; }
                }
            }
        }
    }
}

/// One received buffer: an eager message (ready), a rendezvous announcement (a read,
/// then the message), or a completion notice for one of our rendezvous sends.
fn parse(
    shared: &Arc<Shared>,
    qp: &Arc<async_rdma::Rdma>,
    peer: Rank,
    mr: &LocalMr,
    eager: usize,
    expect: &mut u64,
    fins: &mpsc::UnboundedSender<Fin>,
) -> std::result::Result<Option<Delivery>, String> {
    let b = mr.as_slice();
    let kind = b[0];
    let id = u64::from_le_bytes(b[8..16].try_into().map_err(|_| "short prefix")?);
    if kind == KIND_FIN {
        let _ = fins.send(Fin::Arrived(id));
        return Ok(None);
    }
    if id != *expect {
        return Err(format!("message {id} arrived where {} was due", *expect));
    }
    *expect += 1;
    let mut header = Header::decode(&b[PREFIX..]).map_err(|e| format!("bad header: {e}"))?;
    header.src = peer as u32;
    let len = usize::try_from(header.msg_len).map_err(|_| "length beyond memory")?;
    match kind {
        KIND_EAGER => {
            if len > eager {
                return Err(format!("an eager message of {len} bytes exceeds the limit of {eager}"));
            }
            let payload = Bytes::copy_from_slice(&b[PREFIX + HEADER_LEN..PREFIX + HEADER_LEN + len]);
            Ok(Some(Box::pin(std::future::ready(Ok(Some(Frame::new(header, payload)))))))
        }
        KIND_RTS => {
            let t = &b[PREFIX + HEADER_LEN..PREFIX + HEADER_LEN + TOKEN_LEN];
            let token = Token {
                addr: u64::from_le_bytes(t[..8].try_into().map_err(|_| "short token")?),
                len: u64::from_le_bytes(t[8..16].try_into().map_err(|_| "short token")?),
                rkey: u32::from_le_bytes(t[16..20].try_into().map_err(|_| "short token")?),
            };
            if token.len != header.msg_len || len <= eager {
                return Err(format!("rendezvous of {} bytes for a message of {len}", token.len));
            }
            let (shared, qp, fins) = (shared.clone(), qp.clone(), fins.clone());
            Ok(Some(Box::pin(async move {
                let payload =
                    read_remote(&shared, &qp, token, len).await.map_err(|e| format!("RDMA read failed: {e}"))?;
                // The writer tells the peer, which then lets go of its buffer.
                let _ = fins.send(Fin::Owed(id));
                Ok(Some(Frame::new(header, payload)))
            })))
        }
        other => Err(format!("unknown message kind {other}")),
    }
}

/// Reads `len` bytes named by `token` into registered memory of ours, handed out as
/// [`Bytes`] without a copy.
async fn read_remote(shared: &Arc<Shared>, qp: &async_rdma::Rdma, token: Token, len: usize) -> std::io::Result<Bytes> {
    let mut mr = shared.alloc(len)?;
    // The peer's region, with the access rights ours has (the peer registered its
    // buffers with the same defaults).
    let mine = mr.token_with_timeout(Duration::from_secs(3600)).ok_or_else(|| std::io::Error::other("token"))?;
    let remote = RemoteMr::new(MrToken { addr: token.addr as usize, len, rkey: token.rkey, ..mine });
    let mut at = 0;
    while at < len {
        let end = (at + MAX_READ).min(len);
        let mut dst = mr.get_mut(at..end).ok_or_else(|| std::io::Error::other("destination range"))?;
        let src = remote.get(at..end)?;
        qp.read(&mut dst, &src).await?;
        at = end;
    }
    let mem = Arc::new(RegisteredMem { mr, len });
    Ok(Bytes::from_owner(ArcMem(mem)))
}

/// Fails `peer` when its liveness connection closes, errs, or (with a timeout) carries
/// nothing for that long.
async fn watch(shared: Arc<Shared>, peer: Rank, mut rd: tokio::net::tcp::OwnedReadHalf, timeout: Option<Duration>) {
    let mut buf = [0u8; 64];
    loop {
        let r = match timeout {
            Some(t) => match tokio::time::timeout(t, rd.read(&mut buf)).await {
                Ok(r) => r,
                Err(_) => {
                    shared.fail(peer, &format!("no heartbeat for {} ms", t.as_millis()));
                    return;
                }
            },
            None => rd.read(&mut buf).await,
        };
        match r {
            Ok(0) | Err(_) => {
                if !shared.peer_closed.lock()[peer] {
                    shared.fail(peer, "its connection closed (the process ended?)");
                }
                return;
            }
            Ok(_) => {}
        }
    }
}

/// Writes a heartbeat byte every quarter of `timeout`; holds the connection open.
async fn heartbeat(mut wr: tokio::net::tcp::OwnedWriteHalf, timeout: Option<Duration>) {
    let every = timeout.map_or(Duration::from_secs(3600), |t| t / 4);
    loop {
        tokio::time::sleep(every).await;
        if timeout.is_some() && wr.write_all(&[0]).await.is_err() {
            return;
        }
    }
}
