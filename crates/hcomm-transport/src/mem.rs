//! In-process transport: ranks are tasks (or threads) of one process, and a send hands
//! the payload to the receiver's mailbox without a copy. For tests, for users' own unit
//! tests, and as the reference the other transports are compared against.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use hcomm_core::wire::FrameKind;
use hcomm_core::{Error, ErrorKind, Frame, Header, Mailbox, OpKind, Rank, Result, Transport};

/// One rank's end of an in-process group. Build a group with [`MemTransport::group`].
#[derive(Debug)]
pub struct MemTransport {
    rank: Rank,
    boxes: Arc<[Arc<Mailbox>]>,
    closed: Arc<[AtomicBool]>,
}

impl MemTransport {
    /// `n` connected endpoints, one per rank, in rank order.
    pub fn group(n: usize) -> Vec<MemTransport> {
        let boxes: Arc<[Arc<Mailbox>]> = (0..n).map(|r| Arc::new(Mailbox::new(r))).collect();
        let closed: Arc<[AtomicBool]> = (0..n).map(|_| AtomicBool::new(false)).collect();
        (0..n).map(|rank| MemTransport { rank, boxes: boxes.clone(), closed: closed.clone() }).collect()
    }

    fn deliver(&self, peer: Rank, mut header: Header, payload: Bytes) -> Result<()> {
        let size = self.boxes.len();
        if peer >= size {
            return Err(Error::invalid(format!("peer rank {peer} out of range for {size} ranks")));
        }
        if self.closed[self.rank].load(Ordering::Acquire) {
            return Err(Error::new(ErrorKind::Closed, "transport closed").at_rank(self.rank));
        }
        if self.closed[peer].load(Ordering::Acquire) && header.kind != FrameKind::Close {
            return Err(Error::new(ErrorKind::PeerFailed, "peer closed its communicator").with_peer(peer));
        }
        header.src = self.rank as u32;
        header.msg_len = payload.len() as u64;
        self.boxes[peer].deliver(Frame::new(header, payload));
        Ok(())
    }
}

impl Transport for MemTransport {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn size(&self) -> usize {
        self.boxes.len()
    }

    fn name(&self) -> &'static str {
        "mem"
    }

    fn mailbox(&self) -> &Arc<Mailbox> {
        &self.boxes[self.rank]
    }

    fn send(&self, peer: Rank, header: Header, payload: Bytes) -> impl Future<Output = Result<()>> + Send {
        let r = self.deliver(peer, header, payload);
        async move { r }
    }

    fn send_borrowed(&self, peer: Rank, header: Header, data: &[u8]) -> impl Future<Output = Result<()>> + Send {
        self.send(peer, header, self.payload_from(data))
    }

    fn post(&self, peer: Rank, header: Header, payload: Bytes) {
        let _ = self.deliver(peer, header, payload);
    }

    fn close(&self) {
        if self.closed[self.rank].load(Ordering::Acquire) {
            return;
        }
        let why = self.mailbox().close_payload();
        for peer in (0..self.boxes.len()).filter(|&p| p != self.rank) {
            let h = Header::control(FrameKind::Close, OpKind::Bootstrap, self.rank, 0, 0, why.len());
            let _ = self.deliver(peer, h, why.clone());
        }
        self.closed[self.rank].store(true, Ordering::Release);
        self.mailbox().close(Error::new(ErrorKind::Closed, "communicator closed").at_rank(self.rank));
    }

    fn shutdown(&self, _deadline: std::time::Duration) -> impl Future<Output = Result<()>> + Send {
        // Messages are delivered at the call: nothing is ever in flight.
        self.close();
        async { Ok(()) }
    }
}

impl Drop for MemTransport {
    fn drop(&mut self) {
        self.close();
    }
}
