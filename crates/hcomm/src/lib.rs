//! # HComm
//!
//! Point-to-point and collective communication (MPI/NCCL/Gloo-class) in which every
//! operation is a future driven by the application's own executor.
//!
//! ```no_run
//! # async fn run() -> hcomm::Result<()> {
//! let comm = hcomm::init().await?; // rank and size from hcomm run, mpirun, srun or torchrun
//! let mut grads = vec![1.0f32; 1 << 20];
//! comm.all_reduce(&mut grads, hcomm::ReduceOp::Sum).await?;
//! # Ok(()) }
//! ```
//!
//! - [`init`] / [`Config`]: connect the ranks of a job (TCP over tokio, or io_uring
//!   with [`Config::connect_uring`]).
//! - [`local`], [`local_tcp`]: n ranks in one process, for tests.
//! - [`Communicator`]: `send`/`recv`/`sendrecv`, `all_reduce`, `all_gather`,
//!   `barrier`, `split`.
//! - [`launch`]: the `hcomm run` launcher.

mod bootstrap;
mod comm;
pub mod env;
pub mod launch;
pub mod store;

pub use bootstrap::{Config, DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT};
pub use comm::Communicator;
pub use hcomm_core::{bf16, f16, DType, Element, Error, ErrorKind, LocalTransport, OpKind, Rank, ReduceOp, Result, Tag, Transport};
pub use hcomm_topology::Topology;
pub use hcomm_transport::{MemTransport, StreamOptions, StreamTransport, HAS_URING};

use std::sync::Arc;

use hcomm_collectives::Group;

/// Connects this process to its job, from the launcher's environment (see [`env`]),
/// over TCP with tokio sockets. Must run inside a tokio runtime.
///
/// # Errors
/// A configuration error for a wrong or missing environment, a bootstrap error naming
/// the ranks that never arrived.
///
/// # Cancel safety
/// Dropping the future abandons the bootstrap; the job cannot start without this rank.
pub async fn init() -> Result<Communicator> {
    Config::from_env()?.connect().await
}

/// `n` communicators of one job in this process over the in-process transport: rank
/// `i` is element `i`. Drive them from tasks or join their futures.
pub fn local(n: usize) -> Vec<Communicator<MemTransport>> {
    let keep = Arc::new(comm_keep());
    MemTransport::group(n)
        .into_iter()
        .map(|t| {
            let g = Group::world(Arc::new(t), 0, Topology::single_host(n), DEFAULT_TIMEOUT)
                .expect("a single-host topology of n ranks fits n ranks");
            Communicator::new(g, keep.clone())
        })
        .collect()
}

fn comm_keep() -> comm::Keep {
    comm::Keep::default()
}

/// `n` communicators of one job in this process, connected over loopback TCP (tokio
/// sockets). Must run inside a tokio runtime.
///
/// # Errors
/// As [`Config::connect`].
pub async fn local_tcp(n: usize) -> Result<Vec<Communicator<StreamTransport>>> {
    let (store, configs) = bootstrap::local_configs(n).await?;
    let comms = futures::future::try_join_all(configs.into_iter().map(Config::connect)).await?;
    Ok(bootstrap::attach_store(comms, store))
}

/// `n` communicators of one job in this process, connected over loopback TCP driven
/// by io_uring. Must run inside `tokio_uring::start`.
///
/// # Errors
/// As [`Config::connect`].
#[cfg(all(feature = "uring", target_os = "linux"))]
pub async fn local_uring(n: usize) -> Result<Vec<Communicator<StreamTransport>>> {
    let (store, configs) = bootstrap::local_configs(n).await?;
    let comms = futures::future::try_join_all(configs.into_iter().map(Config::connect_uring)).await?;
    Ok(bootstrap::attach_store(comms, store))
}
