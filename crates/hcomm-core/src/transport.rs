//! The transport traits.
//!
//! A transport moves frames between the ranks of one job and delivers what arrives
//! into its [`Mailbox`]; everything above (matching, collectives, communicators) is the
//! same for every transport.
//!
//! [`LocalTransport`] is the trait to implement for transports whose futures are not
//! `Send` (io_uring's runtime is thread-local); [`Transport`] is its `Send` variant,
//! derived with `trait-variant`, for transports whose futures may move between threads
//! (tokio TCP, in-process). Code generic over `LocalTransport` works with both.
//!
//! Buffers are owned: [`send`](LocalTransport::send) takes the payload as [`Bytes`],
//! so that a dropped send future can never leave a transport (or a NIC) reading memory
//! the application got back. [`send_buffer`](LocalTransport::send_buffer) is where a
//! transport with registered memory (io_uring fixed buffers, RDMA memory regions) hands
//! out buffers that it can send without a copy or a registration; a `Bytes` can wrap
//! such memory through `Bytes::from_owner`.
//!
//! The methods that return futures are declared as `fn … -> impl Future`, not as
//! `async fn`: the blanket implementation of [`LocalTransport`] for every [`Transport`]
//! then calls the transport's method at once, so that what a transport does at the
//! call (queueing a message, for [`send`](LocalTransport::send)) happens at the call
//! for generic callers too. (For an `async fn`, `trait-variant` forwards inside another
//! `async fn`, which would defer the call to the first poll: a send dropped unpolled
//! would be lost, and two sends polled out of order would overtake each other.)

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;

use crate::Rank;
use crate::error::Result;
use crate::mailbox::Mailbox;
use crate::pool::PoolBuf;
use crate::wire::Header;

/// Moves frames between ranks. See the module documentation.
#[trait_variant::make(Transport: Send)]
pub trait LocalTransport {
    /// This process's rank in the job (the world rank).
    fn rank(&self) -> Rank;

    /// Number of ranks in the job.
    fn size(&self) -> usize;

    /// Short name for logs and benchmarks: `mem`, `tcp`, `uring`.
    fn name(&self) -> &'static str;

    /// The mailbox into which this transport delivers incoming messages.
    fn mailbox(&self) -> &Arc<Mailbox>;

    /// An empty buffer with room for `len` bytes, in memory that this transport sends
    /// cheaply; fill it (`extend_from_slice`) and freeze it into the payload. The
    /// default comes from the process-wide [`pool`](crate::pool) (not zeroed, since it
    /// is written at once), so that large payloads reuse memory already mapped.
    fn send_buffer(&self, len: usize) -> PoolBuf {
        crate::pool::take(len)
    }

    /// A payload holding a copy of `data`, in memory this transport sends cheaply: by
    /// default a [`send_buffer`](LocalTransport::send_buffer); a transport with
    /// registered memory (RDMA) copies large payloads into it, so that they go out
    /// without a second copy.
    fn payload_from(&self, data: &[u8]) -> Bytes {
        let mut b = self.send_buffer(data.len());
        b.extend_from_slice(data);
        b.freeze()
    }

    /// Sends one message to `peer`. The caller fills the header's matching and
    /// signature fields; the transport sets the framing fields (`msg_id`, `msg_len`,
    /// `offset`, `frag_len`) and the source rank. Messages to one peer are delivered in
    /// the order of the calls that queued them.
    ///
    /// # Errors
    /// A peer-failed error if the connection to `peer` is (or becomes) broken before
    /// the message is handed over, and an invalid-argument error for a `peer` out of
    /// range.
    ///
    /// # Cancel safety
    /// The message is queued when this method is called. Dropping the future does not
    /// withdraw it; it only stops waiting for the hand-over.
    fn send(&self, peer: Rank, header: Header, payload: Bytes) -> impl Future<Output = Result<()>>;

    /// Sends `data` to `peer` as [`send`](LocalTransport::send) does, from a slice the
    /// caller keeps: a transport may write it to its link straight from `data` within
    /// this call (TCP writes a large message from the slice when its connection's
    /// writer is idle), and copies whatever it has not written by the time the call
    /// returns into a payload of its own ([`payload_from`](LocalTransport::payload_from)).
    /// `data` is never read after the call: no task, thread, peer process or device
    /// keeps its address, so that a future that is dropped or leaked
    /// (`mem::forget`) cannot let anyone read memory the caller freed. The message is
    /// queued when this method is called, in order with
    /// [`send`](LocalTransport::send).
    ///
    /// # Errors
    /// As [`send`](LocalTransport::send).
    ///
    /// # Cancel safety
    /// The message is queued when this method is called and dropping (or leaking) the
    /// future does not withdraw it; it only stops waiting for the hand-over.
    fn send_borrowed(&self, peer: Rank, header: Header, data: &[u8]) -> impl Future<Output = Result<()>>;

    /// Queues a message to `peer` without waiting for anything: for control frames
    /// (aborts) sent from places that cannot wait, such as `Drop`. Failures are
    /// reported through the mailbox like any other peer failure.
    fn post(&self, peer: Rank, header: Header, payload: Bytes);

    /// [`post`](LocalTransport::post) for a small message that may wait: a transport
    /// may hold it until its next write to `peer` carries it along, or a short delay
    /// (a millisecond or two) has passed, whichever comes first. For messages whose
    /// receiver does not wait for them (the deferred argument checks of rooted
    /// collectives), so that a rank that only receives does not pay a system call
    /// per message to answer. A transport that holds it may merge it into the last
    /// frame it holds for `peer` if both are signature record frames of one key
    /// ([`RECORDS_SEQ`](crate::keys::RECORDS_SEQ)). By default, posted at once.
    fn post_lazy(&self, peer: Rank, header: Header, payload: &[u8]) {
        self.post(peer, header, Bytes::copy_from_slice(payload));
    }

    /// Closes every connection in an orderly way: peers see a close frame, pending
    /// receives here fail with a closed error.
    fn close(&self);

    /// Closes as [`LocalTransport::close`] does, then waits, up to `deadline`, until
    /// everything queued here is written and every peer has closed too, so that no
    /// message still in flight is lost when the process exits (closing a socket with
    /// unread data resets it, and the kernel then drops what it had not sent). Every
    /// rank must call it, as MPI's `MPI_Finalize`. A transport with nothing in
    /// flight may close at once.
    ///
    /// # Errors
    /// A timeout error naming the peers that had not closed by the deadline (the
    /// transport is closed all the same).
    ///
    /// # Cancel safety
    /// Dropping the future leaves the transport closed, its connections ending as
    /// after [`LocalTransport::close`].
    fn shutdown(&self, deadline: std::time::Duration) -> impl Future<Output = Result<()>>;
}

thread_local! {
    static GATHERING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` as a scope in which the caller is about to send several messages, some
/// of them to the same peer (a rooted collective's data beside its argument check):
/// a transport that would write a small message to its connection in the call (see
/// [`gathering`]) queues it for its writer instead, which sends the scope's messages
/// to each peer in one system call. The scope is this thread's, for the length of
/// `f`.
pub fn gather<R>(f: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            GATHERING.with(|g| g.set(self.0));
        }
    }
    let _reset = Reset(GATHERING.with(|g| g.replace(true)));
    f()
}

/// Whether this thread is inside [`gather`]: transports that write small messages
/// directly (TCP's `tcp_direct`) queue them instead.
pub fn gathering() -> bool {
    GATHERING.with(std::cell::Cell::get)
}
