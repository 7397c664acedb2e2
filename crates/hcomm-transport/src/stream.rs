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

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::{Bytes, BytesMut};
use hcomm_core::wire::FrameKind;
use hcomm_core::{Error, ErrorKind, Frame, Header, Mailbox, OpKind, Rank, Result, Transport};
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;

use crate::framing::{Assembler, Outgoing, WriteQueue};

/// Tuning of the stream transports.
#[derive(Debug, Clone)]
pub struct StreamOptions {
    /// Largest fragment written at once; larger messages are split and interleaved
    /// with other traffic to the same peer.
    pub fragment: usize,
}

impl Default for StreamOptions {
    fn default() -> StreamOptions {
        StreamOptions { fragment: 512 << 10 }
    }
}

/// A TCP transport over a full mesh of connections. See the module documentation.
#[derive(Debug)]
pub struct StreamTransport {
    rank: Rank,
    size: usize,
    name: &'static str,
    mailbox: Arc<Mailbox>,
    links: Vec<Option<mpsc::UnboundedSender<Outgoing>>>,
    readers: Mutex<Vec<AbortHandle>>,
    closed: AtomicBool,
}

fn broken(peer: Rank, what: &str, e: std::io::Error) -> Error {
    Error::new(ErrorKind::PeerFailed, format!("connection to rank {peer} broke while {what}"))
        .with_peer(peer)
        .with_source(e)
}

fn unannounced_eof(peer: Rank) -> Error {
    Error::new(
        ErrorKind::PeerFailed,
        format!("rank {peer} closed the connection without a close frame (did the process die?)"),
    )
    .with_peer(peer)
}

/// Delivers every complete message in `asm`. `Ok(true)` once the peer's close frame
/// has been delivered.
fn deliver_all(asm: &mut Assembler, mailbox: &Mailbox) -> Result<bool> {
    while let Some(f) = asm.next_frame()? {
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
        let t = StreamTransport {
            rank,
            size,
            name,
            mailbox: Arc::new(Mailbox::new(rank)),
            links,
            readers: Mutex::new(Vec::new()),
            closed: AtomicBool::new(false),
        };
        (t, rxs)
    }

    /// A transport over tokio sockets: `streams[p]` is the connection to rank `p`
    /// (`None` at `rank`), as [`crate::connect_mesh`] returns them. Spawns one reader and
    /// one writer task per peer with `tokio::spawn`, so it must be called inside a
    /// tokio runtime.
    pub fn tokio(rank: Rank, streams: Vec<Option<tokio::net::TcpStream>>, opts: &StreamOptions) -> StreamTransport {
        let (t, rxs) = StreamTransport::new(rank, streams.len(), "tcp");
        for (peer, (s, rx)) in streams.into_iter().zip(rxs).enumerate() {
            let (Some(s), Some(rx)) = (s, rx) else { continue };
            let (rd, wr) = s.into_split();
            let h = tokio::spawn(read_loop(rd, peer, t.mailbox.clone()));
            t.readers.lock().push(h.abort_handle());
            tokio::spawn(write_loop(wr, rx, peer, t.mailbox.clone(), opts.fragment));
        }
        t
    }

    /// A transport over io_uring (tokio-uring): like [`StreamTransport::tokio`] but the
    /// sockets are driven by io_uring submissions. Must be called inside
    /// `tokio_uring::start`; the tasks are spawned with `tokio_uring::spawn`.
    #[cfg(all(feature = "uring", target_os = "linux"))]
    pub fn uring(rank: Rank, streams: Vec<Option<std::net::TcpStream>>, opts: &StreamOptions) -> StreamTransport {
        let (t, rxs) = StreamTransport::new(rank, streams.len(), "uring");
        for (peer, (s, rx)) in streams.into_iter().zip(rxs).enumerate() {
            let (Some(s), Some(rx)) = (s, rx) else { continue };
            let s = std::rc::Rc::new(tokio_uring::net::TcpStream::from_std(s));
            let h = tokio_uring::spawn(read_loop(uring_io::UringLink(s.clone()), peer, t.mailbox.clone()));
            t.readers.lock().push(h.abort_handle());
            tokio_uring::spawn(write_loop(uring_io::UringLink(s), rx, peer, t.mailbox.clone(), opts.fragment));
        }
        t
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
        let Some(link) = &self.links[peer] else {
            // To ourselves: straight into the mailbox.
            header.msg_len = payload.len() as u64;
            self.mailbox.deliver(Frame { header, payload });
            if let Some(tx) = done {
                let _ = tx.send(Ok(()));
            }
            return Ok(());
        };
        if let Some(e) = self.mailbox.peer_failure(peer) {
            return Err(e);
        }
        link.send(Outgoing { header, payload, done }).map_err(|_| {
            self.mailbox
                .peer_failure(peer)
                .unwrap_or_else(|| Error::new(ErrorKind::Closed, "transport closed").at_rank(self.rank).with_peer(peer))
        })
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
        let (tx, rx) = oneshot::channel();
        let queued = self.enqueue(peer, header, payload, Some(tx));
        let rank = self.rank;
        async move {
            queued?;
            rx.await.unwrap_or_else(|_| {
                Err(Error::new(ErrorKind::Closed, "transport closed before the message was sent")
                    .at_rank(rank)
                    .with_peer(peer))
            })
        }
    }

    fn post(&self, peer: Rank, header: Header, payload: Bytes) {
        let _ = self.enqueue(peer, header, payload, None);
    }

    fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        for peer in (0..self.size).filter(|&p| p != self.rank) {
            self.post(peer, Header::control(FrameKind::Close, OpKind::Bootstrap, self.rank, 0, 0, 0), Bytes::new());
        }
        for h in self.readers.lock().drain(..) {
            h.abort();
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
trait ReadLink {
    /// Reads more bytes, appending them to `buf` (within its spare capacity).
    async fn read(&mut self, buf: BytesMut) -> (std::io::Result<usize>, BytesMut);
}

/// The sending I/O a backend provides to the shared write loop.
trait WriteLink {
    /// Writes all of `batch`, then all of `big`; hands `batch` back.
    async fn write(&mut self, batch: BytesMut, big: Option<Bytes>) -> (std::io::Result<()>, BytesMut);
    /// Ends the sending direction.
    async fn finish(&mut self);
}

/// Reads frames from one peer into the mailbox until the peer closes or fails.
async fn read_loop<L: ReadLink>(mut link: L, peer: Rank, mailbox: Arc<Mailbox>) {
    let mut asm = Assembler::new(peer);
    let err = loop {
        match deliver_all(&mut asm, &mailbox) {
            Ok(true) => return,
            Ok(false) => {}
            Err(e) => break e.with_peer(peer),
        }
        let (res, buf) = link.read(asm.take_buf()).await;
        asm.put_buf(buf);
        match res {
            Ok(0) => break unannounced_eof(peer),
            Ok(_) => {}
            Err(e) => break broken(peer, "receiving", e),
        }
    };
    tracing::debug!(peer, error = %err, "reader stopped");
    mailbox.fail_peer(peer, err);
}

/// Writes the messages queued for one peer until the close frame is written, the
/// transport is dropped, or the connection fails.
async fn write_loop<L: WriteLink>(
    mut link: L,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    peer: Rank,
    mailbox: Arc<Mailbox>,
    fragment: usize,
) {
    let mut q = WriteQueue::new(fragment);
    let mut batch = BytesMut::with_capacity(256 << 10);
    let mut closing = false;
    loop {
        if q.is_idle() {
            if closing {
                break;
            }
            match rx.recv().await {
                Some(o) => closing = gather(&mut q, o, &mut rx),
                None => break,
            }
        } else if !closing {
            if let Ok(o) = rx.try_recv() {
                closing = gather(&mut q, o, &mut rx);
            }
        }
        let big = q.fill(&mut batch);
        let (res, b) = link.write(batch, big).await;
        batch = b;
        batch.clear();
        if let Err(e) = res {
            let err = broken(peer, "sending", e);
            fail_queue(&mut q, &mut rx, &err);
            mailbox.fail_peer(peer, err);
            return;
        }
        q.written();
    }
    link.finish().await;
}

mod tokio_io {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

    impl ReadLink for OwnedReadHalf {
        async fn read(&mut self, mut buf: BytesMut) -> (std::io::Result<usize>, BytesMut) {
            (self.read_buf(&mut buf).await, buf)
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
        async fn read(&mut self, buf: BytesMut) -> (std::io::Result<usize>, BytesMut) {
            // tokio-uring reads at the start of the buffer it is given: hand it the
            // spare capacity only, so that bytes already received stay in place.
            let (len, cap) = (buf.len(), buf.capacity());
            let (res, slice) = self.0.read(buf.slice(len..cap)).await;
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
