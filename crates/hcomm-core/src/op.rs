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
    Broadcast = 8,
    Reduce = 9,
    Gather = 10,
    Scatter = 11,
    ReduceScatter = 12,
    AllToAll = 13,
    /// Inclusive prefix reduction.
    Scan = 14,
    /// Exclusive prefix reduction.
    ExScan = 15,
    AllGatherV = 16,
    GatherV = 17,
    ScatterV = 18,
    ReduceScatterV = 19,
    AllToAllV = 20,
    /// Agreement of the surviving ranks on a new communicator after failures.
    Shrink = 21,
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
            OpKind::Broadcast => "broadcast",
            OpKind::Reduce => "reduce",
            OpKind::Gather => "gather",
            OpKind::Scatter => "scatter",
            OpKind::ReduceScatter => "reduce_scatter",
            OpKind::AllToAll => "alltoall",
            OpKind::Scan => "scan",
            OpKind::ExScan => "exscan",
            OpKind::AllGatherV => "allgatherv",
            OpKind::GatherV => "gatherv",
            OpKind::ScatterV => "scatterv",
            OpKind::ReduceScatterV => "reduce_scatterv",
            OpKind::AllToAllV => "alltoallv",
            OpKind::Shrink => "shrink",
        }
    }

    /// Every kind, in wire-code order (codes are contiguous from 1).
    pub const ALL: [OpKind; 21] = {
        use OpKind::*;
        [
            Send,
            Recv,
            Barrier,
            AllReduce,
            AllGather,
            Split,
            Bootstrap,
            Broadcast,
            Reduce,
            Gather,
            Scatter,
            ReduceScatter,
            AllToAll,
            Scan,
            ExScan,
            AllGatherV,
            GatherV,
            ScatterV,
            ReduceScatterV,
            AllToAllV,
            Shrink,
        ]
    };

    pub fn from_code(code: u8) -> Option<OpKind> {
        OpKind::ALL.get(usize::from(code).checked_sub(1)?).copied()
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
    /// Algorithm code (0: not part of the signature), so that ranks that chose
    /// different algorithms find out.
    pub algo: u8,
}

impl Signature {
    /// A signature with no element type, operator or root.
    pub const fn bare(op: OpKind, count: u64) -> Signature {
        Signature { op, dtype: None, reduce: None, count, root: None, algo: 0 }
    }
}

/// The names of the algorithms' codes, per operation: see [`name_algorithms`].
static ALGO_NAMES: std::sync::OnceLock<fn(OpKind, u8) -> Option<&'static str>> = std::sync::OnceLock::new();

/// Lets signatures show their algorithm by name (`algorithm=ring`) rather than by
/// code: the crate that defines the algorithms calls this once, with the names of
/// its codes.
pub fn name_algorithms(names: fn(OpKind, u8) -> Option<&'static str>) {
    let _ = ALGO_NAMES.set(names);
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
        if self.algo != 0 {
            match ALGO_NAMES.get().and_then(|names| names(self.op, self.algo)) {
                Some(name) => write!(f, ", algorithm={name}")?,
                None => write!(f, ", algorithm={}", self.algo)?,
            }
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_codes_round_trip() {
        for code in 0..=255u8 {
            if let Some(k) = OpKind::from_code(code) {
                assert_eq!(k as u8, code);
            }
        }
        assert_eq!(OpKind::from_code(21), Some(OpKind::Shrink));
        assert_eq!(OpKind::from_code(22), None);
        for (i, k) in OpKind::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i + 1, "{k} is out of order");
        }
    }
}
