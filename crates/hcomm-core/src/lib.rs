//! Core types of HComm: ranks and tags, element types and reduce operators with their
//! kernels, the error type, the wire frame header, the mailbox that matches messages
//! to receives, and the transport traits.
//!
//! Users normally depend on the `hcomm` facade crate, which re-exports what they need.

pub mod auth;
pub mod dtype;
pub mod error;
pub mod events;
pub mod keys;
pub mod landing;
pub mod mailbox;
pub mod op;
pub mod pool;
pub mod settings;
mod simd;
pub mod transport;
pub mod wire;

pub use auth::JobKey;
pub use dtype::{DType, Element, ReduceOp};
pub use error::{Error, ErrorKind, Result};
pub use mailbox::{Frame, Mailbox, MatchKey, RecvFrame, RecvFrameInto, RemotePayload};
pub use op::{OpKind, Signature};
pub use transport::{LocalTransport, Transport};
pub use wire::{FrameKind, Header};

/// A rank: the index of a process in a communicator (0-based).
pub type Rank = usize;

/// A point-to-point message tag, chosen by the application.
pub type Tag = u32;

/// The longest wait HComm arms a timer for: a timeout at or above it, or none at all,
/// never fires. About 34 years, so that adding it to any clock reading cannot
/// overflow.
pub const NEVER: std::time::Duration = std::time::Duration::from_secs(1 << 30);

/// A timeout as HComm keeps it: `None` (never) and anything longer than [`NEVER`]
/// become [`NEVER`].
pub fn saturate(timeout: Option<std::time::Duration>) -> std::time::Duration {
    timeout.map_or(NEVER, |t| t.min(NEVER))
}

pub use half::{bf16, f16};
