//! A large message sent over a plain tokio TCP connection straight out of the caller's
//! slice ([`LocalTransport::send_borrowed`](hcomm_core::LocalTransport::send_borrowed)),
//! without a copy into a buffer of ours.
//!
//! The slice is borrowed by the send future, and only that future's own polls touch
//! it: its bytes go to the socket through `send(2)` calls the future makes itself. A
//! connection's writer task, which orders the messages to one peer, never sees the
//! slice: when it comes to a lent message's bytes, it gives the sending future a
//! *turn* ([`Loan::turn`]) and waits until the future has written them. A message
//! whose sending task began it directly (the writer had nothing queued) is its turn
//! from the start, and the future goes on writing it in its later polls.
//!
//! If the future is dropped before its last turn, its `Drop` copies what is left of
//! the slice (still borrowed then) into the loan, and the writer sends the rest from
//! that copy. If the future is leaked instead (`mem::forget`), nothing touches the
//! slice ever again: the writer waits for a turn that never ends, so the connection
//! to that peer carries nothing more and the peer fails this rank when its deadline
//! or its peer timeout passes. A leak costs the connection, never memory safety.
#![allow(unsafe_code)] // send(2) from the borrowed slice, in the borrowing future's poll

use std::ops::Range;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use parking_lot::Mutex;

/// A message lent to its peer's connection. See the module documentation.
#[derive(Debug)]
pub(crate) struct Loan {
    len: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The bytes the lender is to write now (its turn); empty between turns.
    turn: Range<usize>,
    /// Everything before this was written (by the lender, in its turns).
    done_to: usize,
    /// The lender went away before its last turn: the rest of the message from
    /// `.0` on, copied at its drop.
    copy: Option<(usize, Bytes)>,
    lender: Option<Waker>,
    writer: Option<Waker>,
}

/// What the writer is left with once a turn is over ([`Loan::turn`]).
#[derive(Debug)]
pub(crate) enum TurnOver {
    /// The lender wrote the turn's bytes.
    Written,
    /// The lender went away first: these bytes (the rest of the turn) are the
    /// writer's to write.
    Rest(Bytes),
}

impl Loan {
    /// A loan of a message of `len` bytes, with no turn yet.
    pub(crate) fn new(len: usize) -> Loan {
        Loan { len, state: Mutex::new(State::default()) }
    }

    /// The lender's sending task wrote the message's header and its first `at`
    /// bytes directly: the rest is its turn already.
    pub(crate) fn begin_at(&self, at: usize) {
        let mut s = self.state.lock();
        s.done_to = at;
        s.turn = at..self.len;
    }

    /// A loan whose lender went away before any turn, leaving a copy of `data`.
    #[cfg(test)]
    pub(crate) fn copied(data: &[u8]) -> Loan {
        let state = State { copy: Some((0, Bytes::copy_from_slice(data))), ..State::default() };
        Loan { len: data.len(), state: Mutex::new(state) }
    }

    /// The message's length.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The writer's side: bytes `range` of the message are to go to the socket now.
    /// Gives the lender that turn (unless it already has it, or wrote it) and waits
    /// until it is over.
    pub(crate) fn turn(&self, range: Range<usize>) -> impl Future<Output = TurnOver> + '_ {
        let mut asked = false;
        std::future::poll_fn(move |cx| {
            let mut s = self.state.lock();
            if !asked {
                asked = true;
                if s.turn.is_empty() && s.done_to < range.end {
                    s.turn = range.start.max(s.done_to)..range.end;
                    if let Some(w) = s.lender.take() {
                        w.wake();
                    }
                }
            }
            if s.turn.is_empty() {
                return Poll::Ready(TurnOver::Written);
            }
            if let Some((base, copy)) = &s.copy {
                let rest = copy.slice(s.turn.start - base..s.turn.end - base);
                s.turn.start = s.turn.end;
                return Poll::Ready(TurnOver::Rest(rest));
            }
            if !s.writer.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                s.writer = Some(cx.waker().clone());
            }
            Poll::Pending
        })
    }
}

/// The send future's side of a [`Loan`]: writes its turns from `data`, in its polls,
/// and copies what is left into the loan when dropped before its last turn.
#[derive(Debug)]
pub(crate) struct Lender<'a> {
    loan: Arc<Loan>,
    data: &'a [u8],
    /// The connection, whose socket it writes to.
    stream: Arc<crate::stream::TcpInbox>,
    /// Counts the copies made at a drop ([`crate::StreamTransport::tcp_loans`]).
    revoked: Arc<std::sync::atomic::AtomicU64>,
}

impl<'a> Lender<'a> {
    pub(crate) fn new(
        loan: Arc<Loan>,
        data: &'a [u8],
        stream: Arc<crate::stream::TcpInbox>,
        revoked: Arc<std::sync::atomic::AtomicU64>,
    ) -> Lender<'a> {
        debug_assert_eq!(loan.len, data.len());
        Lender { loan, data, stream, revoked }
    }

    /// Whether every byte of the message was written by this side's turns.
    pub(crate) fn all_written(&self) -> bool {
        self.loan.state.lock().done_to >= self.loan.len
    }

    /// Writes the turn it has, if any, as far as the socket takes it; registers to be
    /// woken for the next turn, or when the socket has room again.
    ///
    /// # Errors
    /// The socket's error (the connection broke; the reader and the writer report
    /// it to the mailbox too).
    pub(crate) fn poll_turn(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        loop {
            let turn = {
                let mut s = self.loan.state.lock();
                if s.turn.is_empty() {
                    if !s.lender.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                        s.lender = Some(cx.waker().clone());
                    }
                    return Poll::Ready(Ok(()));
                }
                s.turn.clone()
            };
            let stream: &tokio::net::TcpStream = self.stream.half.as_ref();
            match stream.try_io(tokio::io::Interest::WRITABLE, || send_now(stream, &self.data[turn.clone()])) {
                Ok(n) => {
                    let mut s = self.loan.state.lock();
                    s.turn.start += n;
                    if s.turn.is_empty() {
                        s.done_to = turn.end;
                        if let Some(w) = s.writer.take() {
                            w.wake();
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => match stream.poll_write_ready(cx) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                },
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

/// One non-blocking `send(2)` of `bytes`: how many went.
fn send_now(stream: &tokio::net::TcpStream, bytes: &[u8]) -> std::io::Result<usize> {
    // SAFETY: `bytes` is a live slice for the length of the call; the kernel copies
    // out of it before `send` returns and keeps no pointer to it.
    let n = unsafe {
        libc::send(stream.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
    };
    if n < 0 { Err(std::io::Error::last_os_error()) } else { Ok(n as usize) }
}

impl Drop for Lender<'_> {
    fn drop(&mut self) {
        let mut s = self.loan.state.lock();
        if s.done_to >= self.loan.len || s.copy.is_some() {
            return;
        }
        // `data` is still borrowed here: what no turn has written yet is copied, and
        // the writer sends it from the copy.
        let from = if s.turn.is_empty() { s.done_to } else { s.turn.start };
        s.copy = Some((from, Bytes::copy_from_slice(&self.data[from..])));
        self.revoked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Some(w) = s.writer.take() {
            w.wake();
        }
    }
}
