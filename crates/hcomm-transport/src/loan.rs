//! A message lent to a TCP writer task out of the caller's memory
//! ([`LocalTransport::send_borrowed`](hcomm_core::LocalTransport::send_borrowed)).
//!
//! A send of a slice used to copy it into a payload at the call, and the kernel copied
//! it again into the socket; on a loopback or a fast network the first copy was a
//! large part of the sender's time (a 2-rank broadcast spends its root's core on
//! exactly these copies). A [`Loan`] lets the writer task hand the caller's memory
//! straight to `send(2)` instead.
//!
//! The rules that keep it safe, as the shared-memory transport's loans:
//! - the writer touches the memory only inside [`Loan::send_to`], under the loan's
//!   lock, and only through the system call (no Rust reference to it is ever made
//!   outside the borrow), so that it can be revoked between two writes;
//! - the send future that borrows the slice revokes the loan when it is dropped before
//!   the message is written ([`Loan::revoke`], under the same lock): the slice is
//!   copied then, while it is still borrowed, and the writer sends the rest from the
//!   copy;
//! - a future that is leaked instead (`mem::forget`) never revokes: the writer keeps
//!   sending from the memory as it is then, which is what the trait's documentation of
//!   `send_borrowed` says (the peer gets the memory's contents at the time it is sent,
//!   or the connection fails with `EFAULT` if it was unmapped).
#![allow(unsafe_code)] // a raw pointer kept across the borrow, and send(2) from it

use std::ops::Range;
use std::os::fd::RawFd;

use bytes::Bytes;
use parking_lot::Mutex;

/// A message lent by a send future to the writer task of its peer's connection.
#[derive(Debug)]
pub(crate) struct Loan {
    len: usize,
    state: Mutex<State>,
}

#[derive(Debug)]
enum State {
    /// The caller's memory, borrowed by the send future (address, as an integer so
    /// that the loan is `Send` and `Sync` without a claim about the memory itself).
    Lent(usize),
    /// The future was dropped first: a copy of the whole message.
    Revoked(Bytes),
}

impl Loan {
    /// A loan of `data`, which the caller keeps borrowed until it has
    /// [revoked](Loan::revoke) the loan or the writer has sent it all.
    pub(crate) fn new(data: &[u8]) -> Loan {
        Loan { len: data.len(), state: Mutex::new(State::Lent(data.as_ptr() as usize)) }
    }

    /// The message's length.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Ends the loan of `data` (the slice [`Loan::new`] was given, still borrowed):
    /// what the writer has not sent yet it sends from a copy. Waits for a write in
    /// progress to return.
    pub(crate) fn revoke(&self, data: &[u8]) {
        debug_assert_eq!(data.len(), self.len);
        let mut s = self.state.lock();
        if let State::Lent(addr) = *s {
            debug_assert_eq!(addr, data.as_ptr() as usize);
            *s = State::Revoked(Bytes::copy_from_slice(data));
        }
    }

    /// Sends bytes `range` of the message on the non-blocking socket `fd` (one
    /// `send(2)`, `MSG_DONTWAIT`): how many went, or the error (`WouldBlock` when the
    /// socket's buffer is full).
    pub(crate) fn send_to(&self, fd: RawFd, range: Range<usize>) -> std::io::Result<usize> {
        assert!(range.start <= range.end && range.end <= self.len, "range within the message");
        let s = self.state.lock();
        let (ptr, len) = match &*s {
            State::Lent(addr) => ((*addr + range.start) as *const u8, range.len()),
            State::Revoked(copy) => (copy[range.clone()].as_ptr(), range.len()),
        };
        // SAFETY: while the state is `Lent`, the memory is borrowed by the send future,
        // which revokes under this lock before the borrow ends (or leaked the borrow,
        // as documented); the kernel reads it, no reference is formed here. A revoked
        // loan's copy is ours. The range is inside the message (asserted).
        let n = unsafe { libc::send(fd, ptr.cast(), len, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        if n < 0 { Err(std::io::Error::last_os_error()) } else { Ok(n as usize) }
    }

    /// A copy of bytes `range`, for a link that cannot send from the loan (every link
    /// but a plain tokio TCP connection; none is given loans, see
    /// [`crate::stream::StreamOptions::tcp_lend`]).
    pub(crate) fn copy(&self, range: Range<usize>) -> Bytes {
        assert!(range.start <= range.end && range.end <= self.len, "range within the message");
        let s = self.state.lock();
        match &*s {
            State::Lent(addr) => {
                // SAFETY: as in `send_to`: borrowed by the live send future while `Lent`.
                let src = unsafe { std::slice::from_raw_parts((*addr + range.start) as *const u8, range.len()) };
                Bytes::copy_from_slice(src)
            }
            State::Revoked(copy) => copy.slice(range),
        }
    }
}

/// The send future's side of a [`Loan`]: revokes it when dropped before the message
/// was written.
#[derive(Debug)]
pub(crate) struct Lender<'a> {
    pub loan: std::sync::Arc<Loan>,
    pub data: &'a [u8],
    pub done: bool,
    /// Counts the revocations ([`crate::StreamTransport::tcp_loans`]).
    pub revoked: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Lender<'_> {
    /// The writer no longer reads the loan (it sent it all, or its connection
    /// failed): nothing to revoke.
    pub(crate) fn finish(&mut self) {
        self.done = true;
    }
}

impl Drop for Lender<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.loan.revoke(self.data);
            self.revoked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::AsRawFd;

    fn pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    #[test]
    fn sends_from_the_lent_memory_then_from_the_copy_once_revoked() {
        let (a, mut b) = pair();
        let mut data: Vec<u8> = (0..100u8).collect();
        let loan = Loan::new(&data);
        assert_eq!(loan.send_to(a.as_raw_fd(), 0..40).unwrap(), 40);
        loan.revoke(&data);
        // The caller's memory changes after the revocation: the rest comes from the
        // copy made at the revocation, not from the memory.
        data.iter_mut().for_each(|x| *x = 0xee);
        let mut at = 40;
        while at < 100 {
            at += loan.send_to(a.as_raw_fd(), at..100).unwrap();
        }
        assert_eq!(loan.copy(90..100), (90..100u8).collect::<Vec<_>>());
        let mut got = vec![0u8; 100];
        b.read_exact(&mut got).unwrap();
        assert_eq!(got, (0..100u8).collect::<Vec<_>>());
    }

    #[test]
    fn a_lender_dropped_early_revokes_and_one_done_does_not() {
        let data = vec![7u8; 10];
        let revoked = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let loan = std::sync::Arc::new(Loan::new(&data));
        drop(Lender { loan: loan.clone(), data: &data, done: true, revoked: revoked.clone() });
        assert!(matches!(*loan.state.lock(), State::Lent(_)));
        drop(Lender { loan: loan.clone(), data: &data, done: false, revoked: revoked.clone() });
        assert!(matches!(&*loan.state.lock(), State::Revoked(c) if c[..] == [7u8; 10]));
        assert_eq!(revoked.load(std::sync::atomic::Ordering::Relaxed), 1);
    }
}
