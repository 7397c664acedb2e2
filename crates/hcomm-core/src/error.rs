//! One opaque error type for the whole library.
//!
//! An [`Error`] says what went wrong ([`ErrorKind`], a message, an optional source) and
//! where: the rank that reports it, the operation and its sequence number, and the peer
//! involved. It is cheap to clone, so that one failure (a dead peer, a remote abort) can
//! be handed to every operation that waits on it.

use std::fmt;
use std::sync::Arc;

use crate::Rank;
use crate::op::OpKind;

/// The category of an [`Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[repr(u8)]
pub enum ErrorKind {
    /// The caller passed something invalid (a rank out of range, an operator the
    /// element type does not support, a buffer of the wrong length).
    InvalidArgument = 1,
    /// Ranks called the same collective with different arguments (kind, element type,
    /// operator, root or length).
    Mismatch = 2,
    /// An operation did not finish before its deadline.
    Timeout = 3,
    /// A peer process died, closed its communicator, or its connection broke.
    PeerFailed = 4,
    /// The operation was aborted: by a rank that hit an error, or because a rank
    /// dropped (cancelled) it.
    Aborted = 5,
    /// A peer sent bytes that do not follow the protocol.
    Protocol = 6,
    /// An I/O error outside any one peer (binding a socket, for example).
    Io = 7,
    /// The job could not be set up: rendezvous, handshake, missing ranks.
    Bootstrap = 8,
    /// The environment or configuration is wrong.
    Config = 9,
    /// The communicator was shut down.
    Closed = 10,
}

impl ErrorKind {
    /// Lower-case description used in messages.
    pub const fn describe(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::Mismatch => "mismatched collective arguments",
            ErrorKind::Timeout => "timed out",
            ErrorKind::PeerFailed => "peer failed",
            ErrorKind::Aborted => "aborted",
            ErrorKind::Protocol => "protocol violation",
            ErrorKind::Io => "I/O error",
            ErrorKind::Bootstrap => "bootstrap failed",
            ErrorKind::Config => "configuration error",
            ErrorKind::Closed => "communicator closed",
        }
    }

    /// Decodes a wire code (used by abort frames); unknown codes become `Aborted`.
    pub fn from_code(code: u8) -> ErrorKind {
        use ErrorKind::*;
        [InvalidArgument, Mismatch, Timeout, PeerFailed, Aborted, Protocol, Io, Bootstrap, Config, Closed]
            .into_iter()
            .find(|k| *k as u8 == code)
            .unwrap_or(Aborted)
    }
}

#[derive(Clone)]
struct Inner {
    kind: ErrorKind,
    message: String,
    rank: Option<Rank>,
    peer: Option<Rank>,
    origin: Option<Rank>,
    op: Option<OpKind>,
    seq: Option<u64>,
    source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
}

/// The error type of every fallible HComm operation.
#[derive(Clone)]
pub struct Error(Box<Inner>);

/// `Result<T, hcomm_core::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A new error of `kind` with a message.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error(Box::new(Inner {
            kind,
            message: message.into(),
            rank: None,
            peer: None,
            origin: None,
            op: None,
            seq: None,
            source: None,
        }))
    }

    /// Shorthand for `Error::new(ErrorKind::InvalidArgument, ..)`.
    pub fn invalid(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidArgument, message)
    }

    /// Shorthand for `Error::new(ErrorKind::Config, ..)`.
    pub fn config(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Config, message)
    }

    /// The value `v` of the on/off variable `var`: `1`, `true`, `yes` or `0`,
    /// `false`, `no`.
    ///
    /// # Errors
    /// A configuration error naming the variable otherwise.
    pub fn parse_flag(var: &str, v: &str) -> Result<bool> {
        match v.trim() {
            "1" | "true" | "yes" => Ok(true),
            "0" | "false" | "no" => Ok(false),
            _ => Err(Error::config(format!("{var}={v:?} is not 0 or 1"))),
        }
    }

    /// An I/O error with a description of what was being done.
    pub fn io(what: impl Into<String>, err: std::io::Error) -> Error {
        let kind = match err.kind() {
            std::io::ErrorKind::TimedOut => ErrorKind::Timeout,
            _ => ErrorKind::Io,
        };
        Error::new(kind, what).with_source(err)
    }

    /// Appends `note` to the message (`message; note`).
    pub fn note(mut self, note: impl AsRef<str>) -> Error {
        self.0.message.push_str("; ");
        self.0.message.push_str(note.as_ref());
        self
    }

    /// Attaches the underlying cause.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Error {
        self.0.source = Some(Arc::new(source));
        self
    }

    /// Sets the reporting rank, unless one is already set.
    pub fn at_rank(mut self, rank: Rank) -> Error {
        self.0.rank.get_or_insert(rank);
        self
    }

    /// Sets the peer involved, unless one is already set.
    pub fn with_peer(mut self, peer: Rank) -> Error {
        self.0.peer.get_or_insert(peer);
        self
    }

    /// Sets the rank where the failure began, unless one is already set: a failure
    /// that travels from rank to rank (one rank fails, its neighbour gives up and
    /// closes, the next one sees that close) keeps naming the first.
    pub fn with_origin(mut self, origin: Rank) -> Error {
        self.0.origin.get_or_insert(origin);
        self
    }

    /// Sets the operation and its sequence number, unless already set.
    pub fn in_op(mut self, op: OpKind, seq: Option<u64>) -> Error {
        if self.0.op.is_none() {
            self.0.op = Some(op);
            self.0.seq = seq;
        }
        self
    }

    /// What went wrong, by category.
    pub fn kind(&self) -> ErrorKind {
        self.0.kind
    }

    /// The message, without the context that `Display` adds.
    pub fn message(&self) -> &str {
        &self.0.message
    }

    /// The rank that reported the error, when known.
    pub fn rank(&self) -> Option<Rank> {
        self.0.rank
    }

    /// The peer involved (the failed rank, the rank that aborted), when known.
    pub fn peer(&self) -> Option<Rank> {
        self.0.peer
    }

    /// The rank where the failure began, when this error is a consequence of a
    /// failure elsewhere: a dead, hung or aborting rank, possibly reported through
    /// other ranks that gave up because of it. `None` for errors that began here
    /// (a bad argument, a local timeout) or whose origin is unknown.
    pub fn origin(&self) -> Option<Rank> {
        self.0.origin
    }

    /// The operation the error belongs to, when known.
    pub fn op(&self) -> Option<OpKind> {
        self.0.op
    }

    /// The collective sequence number the error belongs to, when known.
    pub fn seq(&self) -> Option<u64> {
        self.0.seq
    }

    pub fn is_timeout(&self) -> bool {
        self.0.kind == ErrorKind::Timeout
    }
    pub fn is_peer_failed(&self) -> bool {
        self.0.kind == ErrorKind::PeerFailed
    }
    pub fn is_mismatch(&self) -> bool {
        self.0.kind == ErrorKind::Mismatch
    }
    pub fn is_aborted(&self) -> bool {
        self.0.kind == ErrorKind::Aborted
    }
    pub fn is_invalid_argument(&self) -> bool {
        self.0.kind == ErrorKind::InvalidArgument
    }
    pub fn is_protocol(&self) -> bool {
        self.0.kind == ErrorKind::Protocol
    }
    pub fn is_closed(&self) -> bool {
        self.0.kind == ErrorKind::Closed
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.0;
        if let Some(rank) = i.rank {
            write!(f, "rank {rank}: ")?;
        }
        if let Some(op) = i.op {
            write!(f, "{op}")?;
            if let Some(seq) = i.seq {
                write!(f, " #{seq}")?;
            }
            f.write_str(": ")?;
        }
        write!(f, "{}: {}", i.kind.describe(), i.message)?;
        match (i.peer, i.origin) {
            (Some(peer), Some(origin)) if origin != peer => {
                write!(f, " (peer rank {peer}; it began at rank {origin})")?
            }
            (Some(peer), _) => write!(f, " (peer rank {peer})")?,
            (None, Some(origin)) if Some(origin) != i.rank => write!(f, " (it began at rank {origin})")?,
            (None, _) => {}
        }
        if let Some(src) = &i.source {
            write!(f, ": {src}")?;
        }
        Ok(())
    }
}

/// The message, as `Display` gives it, so that `fn main() -> hcomm::Result<()>`
/// prints a sentence (as anyhow's errors do); `{:#?}` gives the fields.
impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !f.alternate() {
            return fmt::Display::fmt(self, f);
        }
        let i = &self.0;
        f.debug_struct("Error")
            .field("kind", &i.kind)
            .field("message", &i.message)
            .field("rank", &i.rank)
            .field("peer", &i.peer)
            .field("origin", &i.origin)
            .field("op", &i.op)
            .field("seq", &i.seq)
            .field("source", &i.source.as_ref().map(|s| s.to_string()))
            .finish()
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source.as_deref().map(|s| s as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_carries_context() {
        let e = Error::new(ErrorKind::PeerFailed, "connection reset")
            .with_peer(2)
            .in_op(OpKind::AllReduce, Some(12))
            .at_rank(3);
        assert!(e.is_peer_failed());
        assert_eq!(e.to_string(), "rank 3: allreduce #12: peer failed: connection reset (peer rank 2)");
        // Context is set once: the innermost wins.
        let e = e.at_rank(9).in_op(OpKind::Barrier, Some(1));
        assert_eq!(e.rank(), Some(3));
        assert_eq!(e.op(), Some(OpKind::AllReduce));
    }

    #[test]
    fn display_names_the_origin_of_a_knock_on_failure() {
        let e =
            Error::new(ErrorKind::PeerFailed, "rank 2 closed its communicator").with_peer(2).with_origin(3).at_rank(1);
        assert_eq!(e.origin(), Some(3));
        assert_eq!(
            e.to_string(),
            "rank 1: peer failed: rank 2 closed its communicator (peer rank 2; it began at rank 3)"
        );
        // The first origin set stays; one equal to the peer is not repeated.
        let e = Error::new(ErrorKind::PeerFailed, "gone").with_peer(3).with_origin(3).with_origin(1);
        assert_eq!((e.origin(), e.to_string().as_str()), (Some(3), "peer failed: gone (peer rank 3)"));
    }

    #[test]
    fn debug_reads_as_the_message_and_alternate_shows_the_fields() {
        let e = Error::new(ErrorKind::Timeout, "no matching message within 5s").with_peer(1).at_rank(0);
        assert_eq!(format!("{e:?}"), "rank 0: timed out: no matching message within 5s (peer rank 1)");
        let fields = format!("{e:#?}");
        assert!(fields.starts_with("Error {") && fields.contains("kind: Timeout"), "{fields}");
    }

    #[test]
    fn kind_codes() {
        assert_eq!(ErrorKind::from_code(ErrorKind::Mismatch as u8), ErrorKind::Mismatch);
        assert_eq!(ErrorKind::from_code(200), ErrorKind::Aborted);
    }
}
