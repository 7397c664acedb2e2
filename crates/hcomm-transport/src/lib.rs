//! HComm transports.
//!
//! - [`MemTransport`]: ranks as tasks of one process (tests, users' unit tests).
//! - [`StreamTransport`]: TCP over a full mesh, driven by tokio sockets
//!   ([`StreamTransport::tokio`]) or by io_uring through tokio-uring
//!   ([`StreamTransport::uring`], cargo feature `uring`, on by default, Linux only).
//! - [`shm`]: shared-memory links to peers on the same host, used by
//!   [`StreamTransport`] in place of their TCP connection (which stays as doorbell).
//! - `rdma::RdmaTransport` (cargo feature `rdma`, GPL-3.0 through async-rdma): RDMA
//!   queue pairs to every peer, eager sends and zero-copy rendezvous reads.
//! - [`connect_mesh`]: the authenticated-by-job handshake and full-mesh connection
//!   setup that the TCP transports start from.

mod arm;
pub mod bundle;
mod connect;
mod framing;
mod mem;
#[cfg(all(feature = "rdma", target_os = "linux"))]
pub mod rdma;
pub mod shm;
mod stream;
mod tcp;
#[cfg(feature = "tls")]
pub mod tls;

pub use bundle::BundleStats;
pub use connect::{Congestion, MeshOptions, connect_mesh, connect_mesh_links};
pub use mem::MemTransport;
pub use shm::{ShmOptions, ShmPair, ShmStats};
pub use stream::{CROWDED_TCP_EAGER, DEFAULT_TCP_EAGER, PeerLink, StreamOptions, StreamTransport};

/// Whether this build has the RDMA transport (cargo feature `rdma`).
pub const HAS_RDMA: bool = cfg!(all(feature = "rdma", target_os = "linux"));

/// Entry points for the fuzz targets in `fuzz/` (not a stable API).
#[doc(hidden)]
pub mod fuzzing {
    use hcomm_core::Result;
    use hcomm_core::wire::HEADER_LEN;

    use crate::framing::{Assembler, MAX_PARTIAL, push};

    /// Feeds `data` to the frame parser of a connection from rank `peer`, in reads of
    /// the sizes `reads` gives in turn (the rest in one), and returns the number of
    /// complete messages; stops at the first protocol error. Checks the parser's
    /// bounds: its buffer never holds more than a frame and a read beyond what
    /// arrived, and at most `MAX_PARTIAL` messages are open.
    ///
    /// # Errors
    /// The protocol error the parser reports.
    pub fn feed(peer: usize, data: &[u8], reads: &[usize]) -> Result<usize> {
        let mut a = Assembler::new(peer);
        let mut out = Vec::new();
        let mut frames = 0;
        let mut rest = data;
        let mut sizes = reads.iter().copied().chain(std::iter::repeat(usize::MAX));
        while !rest.is_empty() {
            let n = sizes.next().unwrap_or(usize::MAX).clamp(1, rest.len());
            let (now, later) = rest.split_at(n);
            rest = later;
            push(&mut a, now, &mut out)?;
            for f in out.drain(..) {
                assert!(f.payload.len() as u64 == f.header.msg_len, "a message comes out whole");
                frames += 1;
            }
            assert!(a.buffered() < HEADER_LEN + hcomm_core::wire::MAX_FRAGMENT as usize + data.len().max(1));
            assert!(a.open_messages() <= MAX_PARTIAL);
        }
        Ok(frames)
    }
}

/// Whether this build has the io_uring backend.
pub const HAS_URING: bool = cfg!(all(feature = "uring", target_os = "linux"));
