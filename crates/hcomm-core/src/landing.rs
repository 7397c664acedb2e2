//! Receives that take a large message straight into their own buffer.
//!
//! A receive into a caller's buffer ([`Mailbox::recv_frame_into`]) posts a
//! [`Landing`] with it: the buffer's length, no pointer. When the first fragment of a
//! message of exactly that length arrives on a link that can read into it, and this
//! receive is the first waiting for the message's key, the link **claims** the
//! landing ([`Mailbox::claim`]): the message is this receive's from then on, and the
//! mailbox no longer matches it. From then on, whoever holds the link's parser reads
//! the message's bytes:
//! - the receive itself, in its own poll ([`PollLink::poll_into`]), reads them
//!   straight from the socket into its buffer, which it borrows for that poll only;
//! - anyone else (the link's reader task) reads them into pooled pieces. It first gives
//!   the receive a turn ([`Landing::offer_turn`]), since the receive's reads save a
//!   copy, and reads itself only if the receive is slow to come.
//!
//! When the message is whole, the link completes the receive with a frame whose
//! payload is [`Placed`]: the pieces that others read, which
//! [`read_into`](RemotePayload::read_into) copies into the buffer (the rest is there
//! already). No pointer to the buffer ever leaves the receive's poll, so a receive that
//! is dropped, or leaked, can never be written to afterwards; a dropped receive loses
//! its message, as the mailbox's cancel-safety rule says.
//!
//! [`Mailbox::recv_frame_into`]: crate::Mailbox::recv_frame_into
//! [`Mailbox::claim`]: crate::Mailbox::claim
//! [`PollLink::poll_into`]: crate::mailbox::PollLink::poll_into

use std::sync::Arc;
use std::task::Waker;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::error::{Error, ErrorKind, Result};
use crate::mailbox::{Frame, RemotePayload};
use crate::wire::Header;

/// Receives into buffers of at least this many bytes offer a [`Landing`]; smaller
/// messages are read whole by the link and copied, which costs less than the
/// bookkeeping.
pub const LANDING_MIN: usize = 64 << 10;

/// A receive's offer to take its message straight into its own buffer. See the module
/// documentation.
#[derive(Debug)]
pub struct Landing {
    len: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The receive's sender, moved here from the mailbox when a link claims the
    /// landing.
    tx: Option<oneshot::Sender<Result<Frame>>>,
    claimed: bool,
    /// The receive was dropped: nothing waits for the message any more.
    gone: bool,
    /// The receive's waker, for a turn.
    waker: Option<Waker>,
    /// When the receive was last given a turn it has not taken yet.
    turn: Option<Instant>,
}

impl Landing {
    /// A landing for a buffer of `len` bytes.
    pub fn new(len: usize) -> Landing {
        Landing { len, state: Mutex::new(State::default()) }
    }

    /// The buffer's length: only a message of exactly this length lands.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty (no message lands in it: see [`LANDING_MIN`]).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The mailbox hands the claimed receive's sender over; `false` if the receive is
    /// gone (nothing claimed).
    pub(crate) fn claim(&self, tx: oneshot::Sender<Result<Frame>>) -> bool {
        let mut s = self.state.lock();
        if s.gone || s.claimed {
            return false;
        }
        s.claimed = true;
        s.tx = Some(tx);
        true
    }

    /// The receive notes its waker (each poll).
    pub(crate) fn set_waker(&self, w: &Waker) {
        let mut s = self.state.lock();
        if !s.waker.as_ref().is_some_and(|x| x.will_wake(w)) {
            s.waker = Some(w.clone());
        }
    }

    /// The receive was dropped.
    pub(crate) fn drop_owner(&self) {
        let mut s = self.state.lock();
        s.gone = true;
        s.waker = None;
    }

    /// Whether the receive that offered this landing still waits.
    pub fn owner_waits(&self) -> bool {
        !self.state.lock().gone
    }

    /// The receive read bytes of its message itself: its turn is taken.
    pub fn turn_taken(&self) {
        self.state.lock().turn = None;
    }

    /// Before reading bytes of this landing's message itself, the link offers the
    /// receive a turn: the first call wakes the receive, and this and later calls
    /// answer `true` (leave the bytes to the receive) until the receive takes its
    /// turn or `patience` has passed since the offer, or the receive is gone.
    pub fn offer_turn(&self, patience: Duration) -> bool {
        let mut s = self.state.lock();
        if s.gone {
            return false;
        }
        match s.turn {
            None => {
                s.turn = Some(Instant::now());
                if let Some(w) = &s.waker {
                    w.wake_by_ref();
                }
                true
            }
            Some(t) => t.elapsed() < patience,
        }
    }

    /// The message is whole: completes the receive with `header` and the `pieces`
    /// (offset, bytes) that were read elsewhere than into its buffer.
    pub fn complete(&self, header: Header, pieces: Vec<(usize, Bytes)>) {
        let tx = self.state.lock().tx.take();
        if let Some(tx) = tx {
            let placed = Placed { len: self.len, pieces };
            let _ = tx.send(Ok(Frame::lent(header, Arc::new(placed))));
        }
    }

    /// Fails the receive (its link broke, its operation was aborted).
    pub fn fail(&self, err: Error) {
        let tx = self.state.lock().tx.take();
        if let Some(tx) = tx {
            let _ = tx.send(Err(err));
        }
    }
}

/// The payload of a message that landed in its receive's buffer: the parts that were
/// read elsewhere (the rest is in the buffer already).
#[derive(Debug)]
pub struct Placed {
    len: usize,
    pieces: Vec<(usize, Bytes)>,
}

impl RemotePayload for Placed {
    fn len(&self) -> usize {
        self.len
    }

    /// Copies the pieces read elsewhere into `dst`, which must be the buffer of the
    /// receive the message landed for.
    fn read_into(&self, dst: &mut [u8]) -> Result<()> {
        if dst.len() != self.len {
            return Err(Error::invalid(format!("{} bytes landed, read into {}", self.len, dst.len())));
        }
        for (at, piece) in &self.pieces {
            dst[*at..*at + piece.len()].copy_from_slice(piece);
        }
        Ok(())
    }

    /// Only possible if no byte was read into the receive's buffer (which is not
    /// here): a protocol error otherwise.
    fn read(&self) -> Result<Bytes> {
        let mut out = crate::pool::take(self.len);
        let mut at = 0;
        for (off, piece) in &self.pieces {
            if *off != at {
                break;
            }
            out.extend_from_slice(piece);
            at += piece.len();
        }
        if at != self.len {
            return Err(Error::new(ErrorKind::Protocol, "a message landed in a receive's buffer was read elsewhere"));
        }
        Ok(out.freeze())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::{OpKind, Signature};

    #[test]
    fn placed_fills_in_the_pieces_read_elsewhere() {
        let p = Placed { len: 10, pieces: vec![(2, Bytes::from_static(b"ab")), (8, Bytes::from_static(b"yz"))] };
        let mut dst = *b"0123456789";
        p.read_into(&mut dst).unwrap();
        assert_eq!(&dst, b"01ab4567yz");
        assert!(p.read_into(&mut [0u8; 9]).is_err());
        assert!(p.read().is_err(), "bytes 0..2 were not read elsewhere");
        let whole = Placed { len: 4, pieces: vec![(0, Bytes::from_static(b"ab")), (2, Bytes::from_static(b"cd"))] };
        assert_eq!(&whole.read().unwrap()[..], b"abcd");
    }

    #[test]
    fn a_turn_lasts_until_taken_or_out_of_patience() {
        let l = Landing::new(LANDING_MIN);
        let (tx, mut rx) = oneshot::channel();
        assert!(l.claim(tx));
        assert!(l.offer_turn(Duration::from_secs(60)));
        assert!(l.offer_turn(Duration::from_secs(60)), "still the receive's turn");
        assert!(!l.offer_turn(Duration::ZERO), "out of patience");
        l.turn_taken();
        assert!(l.offer_turn(Duration::ZERO), "a new turn after the last was taken");
        l.drop_owner();
        assert!(!l.offer_turn(Duration::from_secs(60)), "no turn for a receive that is gone");
        let h = Header::data(1, 1, 0, 0, &Signature::bare(OpKind::Send, 1), LANDING_MIN);
        l.complete(h, Vec::new());
        assert!(rx.try_recv().unwrap().unwrap().remote.is_some());
    }
}
