//! The frame header, its encoder and a decoder that never panics.
//!
//! Every message on a byte-stream transport is one or more frames: an 80-byte header
//! followed by `frag_len` payload bytes. Large messages are split into fragments
//! (`offset`, `frag_len` within `msg_len`) so that a stream can interleave fragments of
//! different messages; fragments of one message travel in order.
//!
//! ```text
//!  0  magic  "HCMF"        4  version u8   5  frame kind u8   6  op kind u8  7  dtype u8
//!  8  reduce op u8         9  algorithm u8 (part of the signature)   10  reserved u16 (zero)
//! 12  src rank u32        16  comm id u64            24  seq u64
//! 32  tag u32             36  root u32 (u32::MAX: none)
//! 40  count u64 (the collective's element count: part of the signature)
//! 48  msg id u64          56  msg len u64            64  offset u64
//! 72  frag len u32        76  reserved u32 (zero)
//! ```
//! All integers are little-endian.
//!
//! Shared-memory rings also carry *short frames*: a small single-fragment data message
//! written into the ring by the sending task, with a 40-byte header that leaves out
//! what such a message does not need (source rank: the ring's writer; message id,
//! offset: one fragment), so that header and payload of a small message fit one cache
//! line, and zero bytes of padding between frames, which keep such a frame inside one
//! line:
//!
//! ```text
//!  0  magic 0xA5           1  op kind u8    2  dtype u8    3  reduce op u8
//!  4  algorithm u8         5  reserved u8 (zero)           6  payload len u16
//!  8  tag u32             12  root u32 (u32::MAX: none)
//! 16  comm id u64         24  seq u64      32  count u64
//! ```

use std::fmt;

use crate::Rank;
use crate::dtype::{DType, ReduceOp};
use crate::op::{OpKind, Signature};

pub const MAGIC: [u8; 4] = *b"HCMF";
pub const VERSION: u8 = 1;
pub const HEADER_LEN: usize = 80;
/// Largest fragment a decoder accepts.
pub const MAX_FRAGMENT: u32 = 16 << 20;
/// Largest message a decoder accepts (1 TiB).
pub const MAX_MESSAGE: u64 = 1 << 40;
const NO_ROOT: u32 = u32::MAX;
/// First byte of a short frame.
pub const SHORT_MAGIC: u8 = 0xA5;
/// Length of a short frame's header.
pub const SHORT_LEN: usize = 40;
/// Largest payload of a short frame.
pub const SHORT_MAX: usize = 4096;
/// Padding between frames on a shared-memory ring.
pub const PAD: u8 = 0;

/// What a frame is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// Payload of an operation.
    Data = 1,
    /// The sender aborts operation (`comm`, `seq`); the payload is an error-kind byte
    /// followed by a UTF-8 reason.
    Abort = 2,
    /// The sender closes its side in an orderly way; no payload.
    Close = 3,
    /// Sent on an otherwise idle link so that the receiver can tell a silent peer from
    /// a dead one; no payload, never delivered to operations.
    Heartbeat = 4,
    /// Shared-memory links only: a data message whose payload stays in the sender's
    /// memory for the receiver to copy out itself (single copy, by cross-memory
    /// attach). The header is the message's; the payload describes where the bytes
    /// are (see the shared-memory transport).
    Pull = 5,
    /// Shared-memory links only: the receiver has copied (or dropped) the messages
    /// whose numbers the payload lists, so the sender may let their memory go.
    Release = 6,
}

impl FrameKind {
    fn from_code(code: u8) -> Option<FrameKind> {
        match code {
            1 => Some(FrameKind::Data),
            2 => Some(FrameKind::Abort),
            3 => Some(FrameKind::Close),
            4 => Some(FrameKind::Heartbeat),
            5 => Some(FrameKind::Pull),
            6 => Some(FrameKind::Release),
            _ => None,
        }
    }
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Header {
    pub kind: FrameKind,
    pub op: OpKind,
    pub dtype: Option<DType>,
    pub reduce: Option<ReduceOp>,
    pub flags: u8,
    pub src: u32,
    pub comm: u64,
    pub seq: u64,
    pub tag: u32,
    pub root: Option<u32>,
    pub count: u64,
    pub msg_id: u64,
    pub msg_len: u64,
    pub offset: u64,
    pub frag_len: u32,
}

/// Why a header was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    Short(usize),
    BadMagic([u8; 4]),
    BadVersion(u8),
    BadFrameKind(u8),
    BadOpKind(u8),
    BadDType(u8),
    BadReduceOp(u8),
    Reserved,
    TooLarge {
        msg_len: u64,
        frag_len: u32,
    },
    BadFragment {
        offset: u64,
        frag_len: u32,
        msg_len: u64,
    },
    /// A payload of signature records whose length (the value) is not a whole
    /// number of records.
    BadRecordLen(usize),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Short(n) => write!(f, "header needs {HEADER_LEN} bytes, got {n}"),
            WireError::BadMagic(m) => write!(f, "bad magic {m:02x?}"),
            WireError::BadVersion(v) => write!(f, "unsupported protocol version {v} (this build speaks {VERSION})"),
            WireError::BadFrameKind(k) => write!(f, "unknown frame kind {k}"),
            WireError::BadOpKind(k) => write!(f, "unknown operation kind {k}"),
            WireError::BadDType(k) => write!(f, "unknown element type {k}"),
            WireError::BadReduceOp(k) => write!(f, "unknown reduce operator {k}"),
            WireError::Reserved => f.write_str("reserved header bytes are not zero"),
            WireError::TooLarge { msg_len, frag_len } => {
                write!(f, "message of {msg_len} bytes or fragment of {frag_len} bytes exceeds the limits")
            }
            WireError::BadFragment { offset, frag_len, msg_len } => {
                write!(f, "fragment {offset}+{frag_len} does not fit a message of {msg_len} bytes")
            }
            WireError::BadRecordLen(n) => write!(f, "{n} bytes are not a whole number of {RECORD_LEN}-byte records"),
        }
    }
}

impl std::error::Error for WireError {}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// The operation kind, element type and operator of their codes (0: none, for the
/// last two).
fn codes(op: u8, dtype: u8, reduce: u8) -> Result<(OpKind, Option<DType>, Option<ReduceOp>), WireError> {
    let op = OpKind::from_code(op).ok_or(WireError::BadOpKind(op))?;
    let dtype = match dtype {
        0 => None,
        c => Some(DType::from_code(c).ok_or(WireError::BadDType(c))?),
    };
    let reduce = match reduce {
        0 => None,
        c => Some(ReduceOp::from_code(c).ok_or(WireError::BadReduceOp(c))?),
    };
    Ok((op, dtype, reduce))
}

/// Length of one signature record: sequence number u64, count u64, operation kind
/// u8, element type u8 (0: none), reduce operator u8 (0: none), algorithm u8, root
/// u32 (`u32::MAX`: none); little-endian.
pub const RECORD_LEN: usize = 24;

/// The record of operation `seq` with signature `sig` (see [`RECORDS_SEQ`](crate::keys::RECORDS_SEQ)).
pub fn encode_record(seq: u64, sig: &Signature) -> [u8; RECORD_LEN] {
    let mut b = [0u8; RECORD_LEN];
    b[0..8].copy_from_slice(&seq.to_le_bytes());
    b[8..16].copy_from_slice(&sig.count.to_le_bytes());
    b[16] = sig.op as u8;
    b[17] = sig.dtype.map_or(0, |d| d as u8);
    b[18] = sig.reduce.map_or(0, |r| r as u8);
    b[19] = sig.algo;
    b[20..24].copy_from_slice(&sig.root.unwrap_or(NO_ROOT).to_le_bytes());
    b
}

/// The records of a payload of [`encode_record`]s, in order. Never panics: a length
/// that is not a whole number of records, or a code that names nothing, is an error.
pub fn decode_records(b: &[u8]) -> Result<Vec<(u64, Signature)>, WireError> {
    records(b)?.collect()
}

/// The records of a payload of [`encode_record`]s, one by one (no allocation): an
/// error at once for a length that is not a whole number of records, and for each
/// record whose codes name nothing.
pub fn records(b: &[u8]) -> Result<impl Iterator<Item = Result<(u64, Signature), WireError>> + '_, WireError> {
    if !b.len().is_multiple_of(RECORD_LEN) {
        return Err(WireError::BadRecordLen(b.len()));
    }
    Ok(b.chunks_exact(RECORD_LEN).map(|r| {
        let (op, dtype, reduce) = codes(r[16], r[17], r[18])?;
        let root = match u32_at(r, 20) {
            NO_ROOT => None,
            x => Some(x),
        };
        Ok((u64_at(r, 0), Signature { op, dtype, reduce, count: u64_at(r, 8), root, algo: r[19] }))
    }))
}

impl Header {
    /// A single-fragment data header for an operation with signature `sig`.
    pub fn data(src: Rank, comm: u64, seq: u64, tag: u32, sig: &Signature, len: usize) -> Header {
        Header {
            kind: FrameKind::Data,
            op: sig.op,
            dtype: sig.dtype,
            reduce: sig.reduce,
            flags: sig.algo,
            src: src as u32,
            comm,
            seq,
            tag,
            root: sig.root,
            count: sig.count,
            msg_id: 0,
            msg_len: len as u64,
            offset: 0,
            frag_len: 0,
        }
    }

    /// A control header (abort, close) with a payload of `len` bytes.
    pub fn control(kind: FrameKind, op: OpKind, src: Rank, comm: u64, seq: u64, len: usize) -> Header {
        Header {
            kind,
            op,
            dtype: None,
            reduce: None,
            flags: 0,
            src: src as u32,
            comm,
            seq,
            tag: 0,
            root: None,
            count: 0,
            msg_id: 0,
            msg_len: len as u64,
            offset: 0,
            frag_len: 0,
        }
    }

    /// The signature the sender declared.
    pub fn signature(&self) -> Signature {
        Signature {
            op: self.op,
            dtype: self.dtype,
            reduce: self.reduce,
            count: self.count,
            root: self.root,
            algo: self.flags,
        }
    }

    /// Encodes into exactly [`HEADER_LEN`] bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        b[5] = self.kind as u8;
        b[6] = self.op as u8;
        b[7] = self.dtype.map_or(0, |d| d as u8);
        b[8] = self.reduce.map_or(0, |r| r as u8);
        b[9] = self.flags;
        b[12..16].copy_from_slice(&self.src.to_le_bytes());
        b[16..24].copy_from_slice(&self.comm.to_le_bytes());
        b[24..32].copy_from_slice(&self.seq.to_le_bytes());
        b[32..36].copy_from_slice(&self.tag.to_le_bytes());
        b[36..40].copy_from_slice(&self.root.unwrap_or(NO_ROOT).to_le_bytes());
        b[40..48].copy_from_slice(&self.count.to_le_bytes());
        b[48..56].copy_from_slice(&self.msg_id.to_le_bytes());
        b[56..64].copy_from_slice(&self.msg_len.to_le_bytes());
        b[64..72].copy_from_slice(&self.offset.to_le_bytes());
        b[72..76].copy_from_slice(&self.frag_len.to_le_bytes());
        b
    }

    /// The short-frame header of this header (see the module documentation), if it is
    /// a data message of one fragment of at most [`SHORT_MAX`] bytes.
    pub fn encode_short(&self) -> Option<[u8; SHORT_LEN]> {
        let len = self.msg_len;
        if self.kind != FrameKind::Data || self.offset != 0 || u64::from(self.frag_len) != len || len > SHORT_MAX as u64
        {
            return None;
        }
        let mut b = [0u8; SHORT_LEN];
        b[0] = SHORT_MAGIC;
        b[1] = self.op as u8;
        b[2] = self.dtype.map_or(0, |d| d as u8);
        b[3] = self.reduce.map_or(0, |r| r as u8);
        b[4] = self.flags;
        b[6..8].copy_from_slice(&(len as u16).to_le_bytes());
        b[8..12].copy_from_slice(&self.tag.to_le_bytes());
        b[12..16].copy_from_slice(&self.root.unwrap_or(NO_ROOT).to_le_bytes());
        b[16..24].copy_from_slice(&self.comm.to_le_bytes());
        b[24..32].copy_from_slice(&self.seq.to_le_bytes());
        b[32..40].copy_from_slice(&self.count.to_le_bytes());
        Some(b)
    }

    /// Decodes and validates the short-frame header at the start of `b`, a frame from
    /// rank `src`. Never panics and never allocates.
    pub fn decode_short(b: &[u8], src: u32) -> Result<Header, WireError> {
        if b.len() < SHORT_LEN {
            return Err(WireError::Short(b.len()));
        }
        if b[0] != SHORT_MAGIC {
            return Err(WireError::BadMagic([b[0], b[1], b[2], b[3]]));
        }
        let (op, dtype, reduce) = codes(b[1], b[2], b[3])?;
        if b[5] != 0 {
            return Err(WireError::Reserved);
        }
        let len = u16::from_le_bytes([b[6], b[7]]);
        if usize::from(len) > SHORT_MAX {
            return Err(WireError::TooLarge { msg_len: u64::from(len), frag_len: u32::from(len) });
        }
        let root = match u32_at(b, 12) {
            NO_ROOT => None,
            r => Some(r),
        };
        Ok(Header {
            kind: FrameKind::Data,
            op,
            dtype,
            reduce,
            flags: b[4],
            src,
            comm: u64_at(b, 16),
            seq: u64_at(b, 24),
            tag: u32_at(b, 8),
            root,
            count: u64_at(b, 32),
            msg_id: u64::MAX,
            msg_len: u64::from(len),
            offset: 0,
            frag_len: u32::from(len),
        })
    }

    /// Decodes and validates the first [`HEADER_LEN`] bytes of `b`. Never panics and
    /// never allocates; every field is range-checked.
    pub fn decode(b: &[u8]) -> Result<Header, WireError> {
        if b.len() < HEADER_LEN {
            return Err(WireError::Short(b.len()));
        }
        let b = &b[..HEADER_LEN];
        let magic = [b[0], b[1], b[2], b[3]];
        if magic != MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        if b[4] != VERSION {
            return Err(WireError::BadVersion(b[4]));
        }
        let kind = FrameKind::from_code(b[5]).ok_or(WireError::BadFrameKind(b[5]))?;
        let (op, dtype, reduce) = codes(b[6], b[7], b[8])?;
        if b[10] != 0 || b[11] != 0 || u32_at(b, 76) != 0 {
            return Err(WireError::Reserved);
        }
        let root = match u32_at(b, 36) {
            NO_ROOT => None,
            r => Some(r),
        };
        let h = Header {
            kind,
            op,
            dtype,
            reduce,
            flags: b[9],
            src: u32_at(b, 12),
            comm: u64_at(b, 16),
            seq: u64_at(b, 24),
            tag: u32_at(b, 32),
            root,
            count: u64_at(b, 40),
            msg_id: u64_at(b, 48),
            msg_len: u64_at(b, 56),
            offset: u64_at(b, 64),
            frag_len: u32_at(b, 72),
        };
        if h.msg_len > MAX_MESSAGE || h.frag_len > MAX_FRAGMENT {
            return Err(WireError::TooLarge { msg_len: h.msg_len, frag_len: h.frag_len });
        }
        match h.offset.checked_add(u64::from(h.frag_len)) {
            Some(end) if end <= h.msg_len => Ok(h),
            _ => Err(WireError::BadFragment { offset: h.offset, frag_len: h.frag_len, msg_len: h.msg_len }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Header {
        let sig = Signature {
            op: OpKind::AllReduce,
            dtype: Some(DType::F32),
            reduce: Some(ReduceOp::Sum),
            count: 1000,
            root: None,
            algo: 1,
        };
        let mut h = Header::data(3, 7, 42, 9, &sig, 4000);
        h.frag_len = 4000;
        h
    }

    #[test]
    fn round_trip() {
        let h = sample();
        assert_eq!(Header::decode(&h.encode()), Ok(h));
        let mut r = h;
        r.root = Some(0);
        r.dtype = None;
        assert_eq!(Header::decode(&r.encode()), Ok(r));
    }

    #[test]
    fn rejects() {
        let h = sample();
        let mut b = h.encode();
        assert!(matches!(Header::decode(&b[..79]), Err(WireError::Short(79))));
        b[0] = b'X';
        assert!(matches!(Header::decode(&b), Err(WireError::BadMagic(_))));
        let mut b = h.encode();
        b[4] = 2;
        assert!(matches!(Header::decode(&b), Err(WireError::BadVersion(2))));
        let mut b = h.encode();
        b[72..76].copy_from_slice(&4001u32.to_le_bytes());
        assert!(matches!(Header::decode(&b), Err(WireError::BadFragment { .. })));
        let mut b = h.encode();
        b[64..72].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(Header::decode(&b), Err(WireError::BadFragment { .. })));
    }

    #[test]
    fn signature_records_round_trip_and_reject_bad_input() {
        let a = sample().signature();
        let b = Signature { root: Some(3), dtype: None, reduce: None, ..a };
        let mut run = encode_record(7, &a).to_vec();
        run.extend_from_slice(&encode_record(u64::MAX - 2, &b));
        assert_eq!(decode_records(&run), Ok(vec![(7, a), (u64::MAX - 2, b)]));
        assert_eq!(decode_records(&[]), Ok(vec![]));
        assert_eq!(decode_records(&run[..30]), Err(WireError::BadRecordLen(30)));
        let mut bad = run.clone();
        bad[RECORD_LEN + 16] = 0xee;
        assert_eq!(decode_records(&bad), Err(WireError::BadOpKind(0xee)));
    }

    #[test]
    fn only_small_whole_data_messages_are_short() {
        let mut h = sample();
        h.msg_id = u64::MAX;
        assert_eq!(Header::decode_short(&h.encode_short().unwrap(), h.src), Ok(h));
        let mut frag = h;
        frag.frag_len = 1000;
        assert_eq!(frag.encode_short(), None, "one fragment of several");
        let mut ctl = Header::control(FrameKind::Abort, OpKind::AllReduce, 3, 7, 42, 10);
        ctl.frag_len = 10;
        assert_eq!(ctl.encode_short(), None, "not data");
        let mut b = h.encode_short().unwrap();
        b[6..8].copy_from_slice(&(SHORT_MAX as u16 + 1).to_le_bytes());
        assert!(matches!(Header::decode_short(&b, 3), Err(WireError::TooLarge { .. })));
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Header::decode(&bytes);
            let _ = Header::decode_short(&bytes, 1);
        }

        /// Short frames carry every field a small data message needs.
        #[test]
        fn short_headers_round_trip(
            len in 0usize..=SHORT_MAX,
            tag in any::<u32>(),
            comm in any::<u64>(),
            seq in any::<u64>(),
            count in any::<u64>(),
            root in proptest::option::of(0u32..1000),
            algo in any::<u8>(),
        ) {
            let sig = Signature { op: OpKind::Broadcast, dtype: Some(DType::F16), reduce: Some(ReduceOp::Max), count, root, algo };
            let mut h = Header::data(5, comm, seq, tag, &sig, len);
            h.frag_len = len as u32;
            h.msg_id = u64::MAX;
            let b = h.encode_short().expect("a small data message has a short form");
            prop_assert_eq!(Header::decode_short(&b, 5), Ok(h));
            // Larger messages and other frames have none.
            h.msg_len = SHORT_MAX as u64 + 1;
            h.frag_len = h.msg_len as u32;
            prop_assert_eq!(h.encode_short(), None);
        }

        #[test]
        fn mutated_short_headers_decode_or_fail_cleanly(pos in 0usize..SHORT_LEN, val in any::<u8>()) {
            let mut h = sample();
            h.msg_len = 100;
            h.frag_len = 100;
            h.msg_id = u64::MAX;
            let mut b = h.encode_short().unwrap();
            b[pos] = val;
            if let Ok(d) = Header::decode_short(&b, h.src) {
                prop_assert_eq!(d.encode_short().unwrap(), b);
            }
        }

        #[test]
        fn mutated_headers_decode_or_fail_cleanly(pos in 0usize..HEADER_LEN, val in any::<u8>()) {
            let mut b = sample().encode();
            b[pos] = val;
            if let Ok(h) = Header::decode(&b) {
                // Whatever decodes re-encodes to the same bytes.
                prop_assert_eq!(h.encode(), b);
            }
        }
    }
}
