//! Operation kinds and the per-collective signature that ranks compare.

use std::fmt;

use crate::dtype::{DType, ReduceOp};

/// The operation a frame or an error belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[repr(u8)]
pub enum OpKind {
    /// Tagged point-to-point send.
    Send = 1,
    /// Tagged point-to-point receive.
    Recv = 2,
    Barrier = 3,
    AllReduce = 4,
    AllGather = 5,
    /// Communicator split (an all-gather of colours and keys underneath).
    Split = 6,
    /// Connection setup and rendezvous.
    Bootstrap = 7,
}

impl OpKind {
    pub const fn name(self) -> &'static str {
        match self {
            OpKind::Send => "send",
            OpKind::Recv => "recv",
            OpKind::Barrier => "barrier",
            OpKind::AllReduce => "allreduce",
            OpKind::AllGather => "allgather",
            OpKind::Split => "split",
            OpKind::Bootstrap => "bootstrap",
        }
    }

    pub fn from_code(code: u8) -> Option<OpKind> {
        use OpKind::*;
        [Send, Recv, Barrier, AllReduce, AllGather, Split, Bootstrap].into_iter().find(|k| *k as u8 == code)
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What every rank must agree on for one collective call. Each data frame carries the
/// sender's signature; a receiver that finds a different one fails the operation with
/// a mismatch error and aborts it on every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Signature {
    pub op: OpKind,
    pub dtype: Option<DType>,
    pub reduce: Option<ReduceOp>,
    /// Element count (per rank, for gathers).
    pub count: u64,
    /// Root rank, for rooted collectives.
    pub root: Option<u32>,
}

impl Signature {
    /// A signature with no element type, operator or root.
    pub const fn bare(op: OpKind, count: u64) -> Signature {
        Signature { op, dtype: None, reduce: None, count, root: None }
    }
}

impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(count={}", self.op, self.count)?;
        if let Some(d) = self.dtype {
            write!(f, ", dtype={d}")?;
        }
        if let Some(r) = self.reduce {
            write!(f, ", op={r}")?;
        }
        if let Some(root) = self.root {
            write!(f, ", root={root}")?;
        }
        f.write_str(")")
    }
}
