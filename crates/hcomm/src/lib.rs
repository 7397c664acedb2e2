//! # HComm
//!
//! Point-to-point and collective communication (MPI/NCCL/Gloo-class) in which every
//! operation is a future driven by the application's own executor.
//!
//! ```no_run
//! use hcomm::ReduceOp;
//!
//! #[tokio::main]
//! async fn main() -> hcomm::Result<()> {
//!     // Rank and size from `hcomm run`, mpirun, srun or torchrun.
//!     let comm = hcomm::init().await?;
//!     let mut grads = vec![comm.rank() as f32; 1 << 20];
//!     comm.all_reduce(&mut grads, ReduceOp::Sum).await?;
//!
//!     // Collectives are futures: join them, spawn them, race them.
//!     let mut a = vec![1u64; 1000];
//!     let mut b = vec![2.0f64; 10];
//!     let (ra, rb) = futures::join!(comm.all_reduce(&mut a, ReduceOp::Max), comm.all_reduce(&mut b, ReduceOp::Avg));
//!     ra?;
//!     rb?;
//!
//!     // Point to point, tagged, ordered per peer and tag.
//!     if comm.rank() == 0 {
//!         comm.send(1, 7, &[1.5f32, 2.5]).await?;
//!     } else if comm.rank() == 1 {
//!         let v: Vec<f32> = comm.recv(0, 7).await?;
//!         assert_eq!(v, [1.5, 2.5]);
//!     }
//!     comm.barrier().await?;
//!     // As MPI_Finalize: nothing still in flight is lost when the process exits.
//!     comm.finalize().await
//! }
//! ```
//!
//! - [`init`] / [`Config`]: connect the ranks of a job (TCP over tokio, or io_uring
//!   with [`Config::connect_uring`]).
//! - [`local`], [`local_tcp`]: n ranks in one process, for tests.
//! - [`Communicator`]: `send`/`recv`/`sendrecv`; `all_reduce` (ring, recursive
//!   doubling, Rabenseifner, tree, chosen by a cost model or forced), `broadcast`,
//!   `reduce`, `all_gather(_v)`, `gather(v)`, `scatter(v)`, `reduce_scatter(_v)`,
//!   `all_to_all(_v)`, `scan`, `exscan`, `barrier`, `split`; reproducible mode.

mod bootstrap;
mod comm;
pub mod env;
pub mod ifname;
mod object;
pub mod stats;
pub mod store;
mod tune;
mod tune_file;

pub use bootstrap::{Config, DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT, local_placement};
/// The byte buffers of `send_bytes` and `recv_bytes`.
pub use bytes::Bytes;
pub use comm::Communicator;
pub use hcomm_collectives::{
    AllgatherAlgo, AllreduceAlgo, AlltoallAlgo, ArgCheck, BcastAlgo, CostModel, Crowded, Deadline, Measured, Quiet,
    ReduceScatterAlgo, Tuning, deadline, quiet,
};
pub use hcomm_core::keys::RESERVED_TAGS;
pub use hcomm_core::settings;
pub use hcomm_core::{
    DType, Element, Error, ErrorKind, JobKey, LocalTransport, OpKind, Rank, ReduceOp, Result, Tag, Transport, bf16, f16,
};
pub use hcomm_topology::{Grid, Level, Placement, Topology, TopologyFile};
/// The RDMA transport (cargo feature `rdma`).
#[cfg(all(feature = "rdma", target_os = "linux"))]
pub use hcomm_transport::rdma::{RdmaBufferStats, RdmaOptions, RdmaTransport};
pub use hcomm_transport::{BundleStats, HAS_RDMA, HAS_URING, MemTransport, ShmStats, StreamOptions, StreamTransport};
pub use tune::{TuneOptions, round_order, tune_sizes};

use std::sync::Arc;

use hcomm_collectives::Group;

/// Connects this process to its job, from the launcher's environment (see [`env`](mod@env)),
/// over TCP with tokio sockets. Must run inside a tokio runtime. With
/// `HCOMM_CALIBRATE=1` it then runs [`Communicator::calibrate`] (the cost model's
/// parameters measured, per level of link), and with `HCOMM_TUNE` set (`1`, or the
/// largest size to measure such as `4M`) [`Communicator::tune`], so that algorithm
/// selection follows measurements. With `HCOMM_TUNE_FILE` set to a path, a table
/// saved there by an earlier job of the same shape is used instead of measuring
/// ([`Communicator::load_tuning`]), and a table measured now is saved there
/// ([`Communicator::save_tuning`]).
///
/// # Errors
/// A configuration error for a wrong or missing environment, a bootstrap error naming
/// the ranks that never arrived.
///
/// # Cancel safety
/// Dropping the future abandons the bootstrap; the job cannot start without this rank.
pub async fn init() -> Result<Communicator> {
    stats::install_from_env()?;
    let measure = tune::Measure::from_env(|k| std::env::var(k).ok())?;
    measure.run(Config::from_env()?.connect().await?).await
}

/// What [`init`] does once connected, for a communicator made otherwise (with
/// [`Config::connect`], `Config::connect_uring` and the like): calibrates and tunes
/// `comm` as `HCOMM_CALIBRATE`, `HCOMM_TUNE` and `HCOMM_TUNE_FILE` ask. Collective.
///
/// # Errors
/// A configuration error for a wrong value of those variables; as
/// [`Communicator::calibrate`], [`Communicator::tune`] and
/// [`Communicator::load_tuning`].
///
/// # Cancel safety
/// Dropping the future drops `comm` (its collective in flight is aborted on every
/// rank).
pub async fn measure_from_env<T: LocalTransport>(comm: Communicator<T>) -> Result<Communicator<T>> {
    tune::Measure::from_env(|k| std::env::var(k).ok())?.run(comm).await
}

/// As [`init`], over RDMA ([`Config::connect_rdma`], cargo feature `rdma`): connects
/// this process to its job from the launcher's environment, with `HCOMM_STATS`,
/// `HCOMM_CALIBRATE`, `HCOMM_TUNE` and `HCOMM_TUNE_FILE` as `init` takes them.
///
/// # Errors
/// As [`init`], and a bootstrap error if the RDMA device cannot be opened or a queue
/// pair cannot be connected.
///
/// # Cancel safety
/// As [`init`].
#[cfg(all(feature = "rdma", target_os = "linux"))]
pub async fn init_rdma() -> Result<Communicator<hcomm_transport::rdma::RdmaTransport>> {
    stats::install_from_env()?;
    let measure = tune::Measure::from_env(|k| std::env::var(k).ok())?;
    measure.run(Config::from_env()?.connect_rdma().await?).await
}

/// `n` communicators of one job in this process over the in-process transport: rank
/// `i` is element `i`. Drive them from tasks or join their futures.
pub fn local(n: usize) -> Vec<Communicator<MemTransport>> {
    local_placed(&vec![Placement::on_host("localhost"); n])
}

/// As [`local`], with the ranks placed as `placements` says (rank `i` at
/// `placements[i]`): the in-process transport carries every message, but rings,
/// hierarchical plans and grid placement follow the hosts and racks given, so that
/// topology-aware code can be tested in one process.
pub fn local_placed(placements: &[Placement]) -> Vec<Communicator<MemTransport>> {
    if let Err(e) = stats::install_from_env() {
        eprintln!("hcomm: statistics off: {e}");
    }
    let n = placements.len();
    let keep = Arc::new(comm::Keep::default());
    MemTransport::group(n)
        .into_iter()
        .map(|t| {
            let g = Group::world(Arc::new(t), 0, Topology::from_placements(placements), DEFAULT_TIMEOUT)
                .expect("a topology of n placements fits n ranks");
            Communicator::new(g, keep.clone())
        })
        .collect()
}

/// `n` communicators of one job in this process, connected over loopback TCP (tokio
/// sockets). Must run inside a tokio runtime.
///
/// # Errors
/// As [`Config::connect`].
pub async fn local_tcp(n: usize) -> Result<Vec<Communicator<StreamTransport>>> {
    local_tcp_with(n, |_| {}).await
}

/// As [`local_tcp`], each rank's configuration first changed by `adjust` (several
/// connections per peer, say: `|c| c.links = 3`).
///
/// # Errors
/// As [`Config::connect`].
pub async fn local_tcp_with(n: usize, adjust: impl Fn(&mut Config)) -> Result<Vec<Communicator<StreamTransport>>> {
    stats::install_from_env()?;
    let (store, mut configs) = bootstrap::local_configs(n).await?;
    configs.iter_mut().for_each(&adjust);
    let comms = futures::future::try_join_all(configs.into_iter().map(Config::connect)).await?;
    Ok(bootstrap::attach_store(comms, store))
}

/// `n` communicators of one job in this process, connected through shared-memory
/// rings (`hcomm_transport::shm`), as ranks on one host are by default. Must run
/// inside a tokio runtime.
///
/// # Errors
/// As [`Config::connect`].
pub async fn local_shm(n: usize) -> Result<Vec<Communicator<StreamTransport>>> {
    local_tcp_with(n, |c| c.shm = true).await
}

/// `n` communicators of one job in this process, connected over RDMA (cargo feature
/// `rdma`; needs an RDMA device, soft-RoCE will do), each configuration first changed
/// by `adjust`. Must run inside a tokio runtime.
///
/// # Errors
/// As [`Config::connect_rdma`].
#[cfg(all(feature = "rdma", target_os = "linux"))]
pub async fn local_rdma_with(
    n: usize,
    adjust: impl Fn(&mut Config),
) -> Result<Vec<Communicator<hcomm_transport::rdma::RdmaTransport>>> {
    stats::install_from_env()?;
    let (store, mut configs) = bootstrap::local_configs(n).await?;
    configs.iter_mut().for_each(&adjust);
    let comms = futures::future::try_join_all(configs.into_iter().map(Config::connect_rdma)).await?;
    Ok(bootstrap::attach_store(comms, store))
}

/// `n` communicators of one job in this process, connected over loopback TCP driven
/// by io_uring. Must run inside `tokio_uring::start`.
///
/// # Errors
/// As [`Config::connect`].
#[cfg(all(feature = "uring", target_os = "linux"))]
pub async fn local_uring(n: usize) -> Result<Vec<Communicator<StreamTransport>>> {
    local_uring_with(n, |_| {}).await
}

/// As [`local_uring`], each rank's configuration first changed by `adjust`.
///
/// # Errors
/// As [`Config::connect`].
#[cfg(all(feature = "uring", target_os = "linux"))]
pub async fn local_uring_with(n: usize, adjust: impl Fn(&mut Config)) -> Result<Vec<Communicator<StreamTransport>>> {
    stats::install_from_env()?;
    let (store, mut configs) = bootstrap::local_configs(n).await?;
    configs.iter_mut().for_each(&adjust);
    let comms = futures::future::try_join_all(configs.into_iter().map(Config::connect_uring)).await?;
    Ok(bootstrap::attach_store(comms, store))
}
