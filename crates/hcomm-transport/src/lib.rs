//! HComm transports.
//!
//! - [`MemTransport`]: ranks as tasks of one process (tests, users' unit tests).
//! - [`StreamTransport`]: TCP over a full mesh, driven by tokio sockets
//!   ([`StreamTransport::tokio`]) or by io_uring through tokio-uring
//!   ([`StreamTransport::uring`], cargo feature `uring`, on by default, Linux only).
//! - [`connect_mesh`]: the authenticated-by-job handshake and full-mesh connection
//!   setup that the TCP transports start from.

mod connect;
mod framing;
mod mem;
mod stream;

pub use connect::{MeshOptions, connect_mesh};
pub use mem::MemTransport;
pub use stream::{StreamOptions, StreamTransport};

/// Whether this build has the io_uring backend.
pub const HAS_URING: bool = cfg!(all(feature = "uring", target_os = "linux"));
