//! From a launcher's environment to a connected communicator.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hcomm_collectives::{Group, Tuning};
use hcomm_core::JobKey;
use hcomm_core::{Error, ErrorKind, LocalTransport, OpKind, Result};
use hcomm_topology::{Placement, Topology, TopologyFile, host_identity, numa_node};
use hcomm_transport::{
    CROWDED_TCP_EAGER, Congestion, MeshOptions, PeerLink, StreamOptions, StreamTransport, connect_mesh_links, shm,
};
use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use crate::comm::{Communicator, Keep};
use crate::env::LaunchEnv;
use crate::ifname::IfSpec;
use crate::store::{StoreClient, StoreServer};

/// Default deadline of each operation (`HCOMM_TIMEOUT`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// Default deadline of bootstrap (`HCOMM_CONNECT_TIMEOUT`).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// How to set up a communicator. [`Config::from_env`] fills it from a launcher's
/// environment; [`Config::new`] from explicit values.
#[derive(Debug, Clone)]
pub struct Config {
    pub rank: usize,
    pub size: usize,
    /// `host:port` of the rendezvous store that rank 0 serves.
    pub addr: String,
    /// Job identity; connections from other jobs are refused.
    pub job_id: String,
    /// The per-job secret every connection proves (`HCOMM_JOB_SECRET`; `hcomm run`
    /// makes one). `None`: the job id stands in for it, which keeps other jobs out
    /// but not an attacker who knows the id.
    pub secret: Option<String>,
    /// Deadline of each operation (`HCOMM_TIMEOUT`, seconds, or `off`);
    /// [`hcomm_core::NEVER`] or more for never.
    pub timeout: Duration,
    /// Deadline of the whole bootstrap (`HCOMM_CONNECT_TIMEOUT`, seconds, or `off`);
    /// [`hcomm_core::NEVER`] or more for never.
    pub connect_timeout: Duration,
    /// After how long a waiting operation reports what it waits for; `None` for
    /// never (`HCOMM_STALL_WARN`, seconds, or `off`).
    pub stall_warn: Option<Duration>,
    /// Tuning of the TCP transports.
    pub stream: StreamOptions,
    /// Where this host runs more ranks of the job than it has cores: the TCP readers
    /// keep their spin but give the processor away between tries
    /// ([`StreamOptions::spin_yield`]), and the shared-memory rings do not spin. A
    /// rank that polls without yielding holds a core the rank it waits for needs;
    /// one that yields lets it run at once, as MPI libraries do when
    /// oversubscribed. On by default; setting `HCOMM_TCP_SPIN_US`, `HCOMM_SHM_SPIN_US` or
    /// `HCOMM_SPIN_YIELD` turns it off (the spins are then as set or by default).
    pub auto_spin: bool,
    /// Where this host runs more ranks of the job than it has cores, small sends are
    /// completed eagerly up to [`CROWDED_TCP_EAGER`] (4 KiB) instead of
    /// [`StreamOptions::tcp_eager`] (8 KiB by default). On by default; setting
    /// `HCOMM_TCP_EAGER` turns it off.
    pub auto_eager: bool,
    /// Where this host runs more of the job's ranks than this process may use
    /// processors, and nothing bound the process already (it may use every online
    /// processor), each rank binds its threads to one processor, the host's ranks in
    /// blocks in rank order (with 4 ranks on 2 processors: 0 and 1 on the first, 2
    /// and 3 on the second), as MPI launchers map ranks by core. Left to the
    /// scheduler, which ranks share a processor changes from run to run, and with it
    /// the collectives' times. `HCOMM_BIND=0` turns it off; on
    /// by default for a rank of its own process ([`Config::from_env`]), off in
    /// [`Config::new`] (ranks that share a process would bind each other's threads).
    pub bind: bool,
    /// Which interface the mesh listener uses (`HCOMM_IFNAME`, see
    /// [`crate::ifname`]); `None`: the one through which this rank reaches the store.
    pub ifname: Option<IfSpec>,
    /// Connections per peer over TCP (`HCOMM_LINKS`, 1 to 16; default 1): with more
    /// than one, messages are striped over them and a connection that breaks or
    /// stalls has its data moved to the others (see `hcomm_transport::bundle`).
    pub links: usize,
    /// The interfaces of the paths the connections take, one listener each; connection
    /// `i` to a peer takes path `i % paths` (`HCOMM_LINKS=eth0;eth1`). Empty: one path,
    /// the interface `ifname` chooses.
    pub link_paths: Vec<IfSpec>,
    /// Encrypt the TCP connections to other hosts with TLS 1.3 (`HCOMM_TLS=1`; needs
    /// the cargo feature `tls`, see `hcomm_transport::tls`). Peers on this host keep
    /// shared memory. Not with several connections per peer.
    pub tls: bool,
    /// Ports the mesh listener may take (`HCOMM_PORT_RANGE=lo-hi`, inclusive);
    /// `None`: any free port.
    pub port_range: Option<(u16, u16)>,
    /// The TCP congestion control of the connections between ranks
    /// (`HCOMM_TCP_CONGESTION`: `auto`, the default, replaces BBR and CUBIC with Reno;
    /// `system` keeps the system's; or a kernel name). See
    /// [`hcomm_transport::Congestion`].
    pub congestion: Congestion,
    /// Whether peers on this host are reached through shared memory (`HCOMM_SHM`,
    /// default on; see `hcomm_transport::shm`). Off, every peer is reached over TCP.
    pub shm: bool,
    /// This rank's rack (`HCOMM_RACK`); `None`: the rack `topology` gives this host,
    /// if any. See `hcomm_topology`.
    pub rack: Option<String>,
    /// The racks of the cluster, from the file `HCOMM_TOPOLOGY` names.
    pub topology: Option<TopologyFile>,
    /// Infer the racks by probing round trips between hosts after connecting
    /// (`HCOMM_TOPOLOGY=probe`; see `Communicator::probe_racks`).
    pub probe_racks: bool,
    /// The host this rank reports (`HCOMM_HOST`); `None`: its host identity (hostname
    /// and boot id). Ranks reporting the same host share memory and sit together in
    /// rings; set it to tell apart containers or emulated hosts that share a kernel
    /// and a hostname.
    pub host: Option<String>,
    /// Whether rank 0 serves the store (off when the caller runs one).
    pub serve_store: bool,
    /// Read the algorithm tuning from the environment (`HCOMM_ALGO_ALLREDUCE`,
    /// `HCOMM_REPRODUCIBLE`, `HCOMM_COST_*`; see `Tuning::with_env`).
    pub tuning_from_env: bool,
    /// Tuning of the RDMA transport ([`Config::connect_rdma`]): device, port, GID
    /// index, eager limit, receive depth (`HCOMM_RDMA_*`).
    #[cfg(all(feature = "rdma", target_os = "linux"))]
    pub rdma: hcomm_transport::rdma::RdmaOptions,
}

#[derive(Debug, Serialize, Deserialize)]
struct RankInfo {
    /// The rank's listener on every path.
    paths: Vec<SocketAddr>,
    links: usize,
    #[serde(flatten)]
    place: Placement,
}

/// This rank's placement settings from the environment: `HCOMM_RACK`, the file
/// `HCOMM_TOPOLOGY` names, and `HCOMM_HOST`.
fn place_env() -> Result<(Option<String>, Option<TopologyFile>, Option<String>)> {
    use hcomm_core::settings::{self as set, env};
    let file = match set::TOPOLOGY.text(env)? {
        Some(v) if v == "probe" => None,
        Some(v) => Some(TopologyFile::load(std::path::Path::new(&v))?),
        None => None,
    };
    Ok((set::RACK.text(env)?, file, set::HOST.text(env)?))
}

fn placement_of(rack: Option<String>, file: Option<&TopologyFile>, host: Option<String>) -> Placement {
    let host = host.unwrap_or_else(host_identity);
    let rack = rack.or_else(|| file?.rack_of(&host).map(str::to_owned));
    Placement { host, rack, numa: numa_node() }
}

/// Where this process runs, from the environment alone (`HCOMM_RACK`,
/// `HCOMM_TOPOLOGY`, `HCOMM_HOST`, sysfs): what it would report at bootstrap.
///
/// # Errors
/// A configuration error for an empty `HCOMM_RACK` or `HCOMM_HOST`, or a bad topology
/// file.
pub fn local_placement() -> Result<Placement> {
    let (rack, file, host) = place_env()?;
    Ok(placement_of(rack, file.as_ref(), host))
}

/// The processors of the one host every rank is on (`hosts`), if the ranks outnumber
/// them ([`Tuning::crowded`]). Ranks spread over several hosts know only their own
/// host's count, and would not choose alike: `None`.
fn crowded_host(hosts: &[String], processors: usize) -> Option<usize> {
    let first = hosts.first()?;
    (hosts.iter().all(|h| h == first) && hosts.len() > processors).then_some(processors)
}

/// This host's online processors (`/sys/devices/system/cpu/online`, a list such as
/// `0-3,6`), the same for every process on it whatever its affinity; where that file
/// cannot be read, this process's `available_parallelism`.
fn online_processors() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| count_cpu_list(s.trim()))
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The number of processors in a kernel CPU list (`0-3,6` is 5).
fn count_cpu_list(list: &str) -> Option<usize> {
    list.split(',')
        .map(|r| match r.split_once('-') {
            Some((a, b)) => b.trim().parse::<usize>().ok()?.checked_sub(a.trim().parse().ok()?).map(|d| d + 1),
            None => r.trim().parse::<usize>().ok().map(|_| 1),
        })
        .sum()
}

/// Binds this process's threads to the processor [`block_cpu`] gives this rank among
/// the ranks of its host (`hosts`, one entry per rank), if they outnumber the
/// processors it may use and those are all the host's online ones
/// ([`Config::bind`]). Returns the processor, or `None` where it does not bind (or
/// cannot: then the scheduler places the process, as before).
fn bind_block(hosts: &[String], rank: usize) -> Option<usize> {
    use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
    use nix::unistd::Pid;
    let host = hosts.get(rank)?;
    let here: Vec<usize> = (0..hosts.len()).filter(|&r| &hosts[r] == host).collect();
    let allowed = sched_getaffinity(Pid::from_raw(0)).ok()?;
    let cpus: Vec<usize> = (0..CpuSet::count()).filter(|&c| allowed.is_set(c).unwrap_or(false)).collect();
    if cpus.len() != online_processors() || here.len() <= cpus.len() {
        return None;
    }
    let cpu = cpus[block_cpu(here.iter().position(|&r| r == rank)?, here.len(), cpus.len())];
    let mut set = CpuSet::new();
    set.set(cpu).ok()?;
    // Every thread of the process, the runtime's and any started before; threads
    // started later inherit it.
    let tids: Vec<i32> =
        std::fs::read_dir("/proc/self/task").ok()?.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    let mut bound = false;
    for tid in tids {
        bound |= sched_setaffinity(Pid::from_raw(tid), &set).is_ok();
    }
    bound.then_some(cpu)
}

/// The index among `cpus` processors of the one the `k`-th of `ranks` ranks of a
/// host takes: consecutive ranks share a processor, in blocks as even as they go.
fn block_cpu(k: usize, ranks: usize, cpus: usize) -> usize {
    (k * cpus / ranks.max(1)).min(cpus.saturating_sub(1))
}

/// The host identity of each rank.
fn hosts_of(places: &[Placement]) -> Vec<String> {
    places.iter().map(|p| p.host.clone()).collect()
}

/// FNV-1a of the job id, as carried in handshakes.
pub(crate) fn job_hash(job_id: &str) -> u64 {
    job_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

fn boot(rank: usize, msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Bootstrap, msg).in_op(OpKind::Bootstrap, None).at_rank(rank)
}

impl Config {
    /// Rank `rank` of `size`, rendezvous at `addr`, defaults elsewhere.
    pub fn new(rank: usize, size: usize, addr: impl Into<String>) -> Config {
        Config {
            rank,
            size,
            addr: addr.into(),
            job_id: String::from("default"),
            secret: None,
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            stall_warn: Some(hcomm_collectives::DEFAULT_STALL_WARN),
            port_range: None,
            congestion: Congestion::Auto,
            ifname: None,
            links: 1,
            link_paths: Vec::new(),
            tls: false,
            shm: true,
            stream: StreamOptions::default(),
            auto_spin: true,
            auto_eager: true,
            bind: false,
            rack: None,
            host: None,
            probe_racks: false,
            topology: None,
            serve_store: true,
            tuning_from_env: false,
            #[cfg(all(feature = "rdma", target_os = "linux"))]
            rdma: hcomm_transport::rdma::RdmaOptions::default(),
        }
    }

    /// From the launcher's environment (see [`crate::env`]), plus `HCOMM_TIMEOUT`,
    /// `HCOMM_CONNECT_TIMEOUT`, `HCOMM_STALL_WARN` and `HCOMM_PEER_TIMEOUT`
    /// (seconds; `0` turns stall reports and peer failure detection off).
    ///
    /// # Errors
    /// A configuration error naming the variable at fault.
    pub fn from_env() -> Result<Config> {
        use hcomm_core::settings::{self as set, env};
        crate::env::warn_unknown_vars();
        let e = LaunchEnv::from_env()?;
        let mut c = Config::new(e.rank, e.size, e.addr);
        c.job_id = e.job_id;
        c.secret = set::JOB_SECRET.text(env)?;
        if let Some(t) = set::TIMEOUT.wait(env)? {
            c.timeout = hcomm_core::saturate(t);
        }
        if let Some(t) = set::CONNECT_TIMEOUT.wait(env)? {
            c.connect_timeout = hcomm_core::saturate(t);
        }
        if let Some(t) = set::STALL_WARN.wait(env)? {
            c.stall_warn = t;
        }
        if let Some(t) = set::PEER_TIMEOUT.wait(env)? {
            c.stream.peer_timeout = t;
        }
        if let Some(shm) = set::SHM.flag(env)? {
            c.shm = shm;
        }
        if let Some(r) = set::SHM_RING.bytes(env)? {
            c.stream.shm.ring = r;
        }
        if let Some(min) = set::SHM_CMA.bytes(env)? {
            c.stream.shm.pull_min = min;
        }
        if let Some(min) = set::TCP_LEND.bytes(env)? {
            c.stream.tcp_lend = min;
        }
        if let Some(min) = set::TCP_LAND.bytes(env)? {
            c.stream.tcp_land = min;
        }
        if let Some(max) = set::TCP_DIRECT.bytes(env)? {
            c.stream.tcp_direct = max;
        }
        if let Some(max) = set::TCP_EAGER.bytes(env)? {
            c.stream.tcp_eager = max;
            c.auto_eager = false;
        }
        if let Some(spin) = set::SHM_SPIN_US.micros(env)? {
            c.stream.shm.spin = spin;
            c.auto_spin = false;
        }
        if let Some(spin) = set::RECV_SPIN_US.micros(env)? {
            c.stream.recv_spin = spin;
        }
        if let Some(spin) = set::TCP_SPIN_US.micros(env)? {
            c.stream.tcp_spin = spin;
            c.auto_spin = false;
        }
        if let Some(y) = set::SPIN_YIELD.flag(env)? {
            c.stream.spin_yield = y;
            c.auto_spin = false;
        }
        c.bind = set::BIND.flag(env)?.unwrap_or(true);
        if let Some(b) = set::POOL_BYTES.bytes(env)? {
            // Process-wide, like the memory it bounds.
            hcomm_core::pool::set_limit(b);
        }
        (c.rack, c.topology, c.host) = place_env()?;
        c.probe_racks = set::TOPOLOGY.text(env)?.is_some_and(|v| v == "probe");
        if let Some(v) = set::IFNAME.text(env)? {
            c.ifname = Some(IfSpec::parse(&v)?);
        }
        if let Some(v) = set::LINKS.text(env)? {
            (c.links, c.link_paths) = parse_links(&v)?;
        }
        if let Some(tls) = set::TLS.flag(env)? {
            c.tls = tls;
        }
        if let Some(us) = set::LINK_STALL_US.micros(env)? {
            c.stream.link_stall = us;
        }
        if let Some(v) = set::PORT_RANGE.text(env)? {
            c.port_range = Some(parse_port_range(&v)?);
        }
        if let Some(v) = set::TCP_CONGESTION.text(env)? {
            c.congestion = Congestion::parse(&v)?;
        }
        #[cfg(all(feature = "rdma", target_os = "linux"))]
        rdma_env(&mut c.rdma)?;
        c.tuning_from_env = true;
        // Fail on a bad variable before connecting, not after.
        Tuning::for_transport("tcp").with_env(|k| std::env::var(k).ok())?;
        Ok(c)
    }

    /// Connects over TCP with tokio sockets. Must run inside a tokio runtime; the
    /// transport's tasks are spawned on it.
    ///
    /// # Errors
    /// A bootstrap error naming what failed: the store address cannot be bound (rank
    /// 0) or reached, ranks that never registered or never connected before
    /// `connect_timeout`.
    ///
    /// # Cancel safety
    /// Dropping the future closes every connection made so far; the job cannot start
    /// without this rank.
    pub async fn connect(self) -> Result<Communicator<StreamTransport>> {
        self.check_tls()?;
        let (streams, places, keep) = self.rendezvous().await?;
        let hosts = hosts_of(&places);
        let links = self.encrypted(self.shared_memory(streams, &hosts).await?).await?;
        let t = StreamTransport::tokio_links(self.rank, links, &self.stream_options(&hosts));
        self.probed(self.finish(t, &places, keep)?).await
    }

    /// Replaces the connections to peers on this host by shared-memory links, where
    /// both ends manage (`Config::shm`).
    async fn shared_memory(
        &self,
        streams: Vec<Option<Vec<TcpStream>>>,
        hosts: &[String],
    ) -> Result<Vec<Option<PeerLink<TcpStream>>>> {
        let (rank, job) = (self.rank, job_hash(&self.job_id));
        let mut opts = self.stream.shm.clone();
        // Every ring of the host's pairs mapped whole at setup only while they fit the
        // budget together (two per pair).
        let here = hosts.iter().filter(|h| hosts.get(rank) == Some(*h)).count();
        opts.populate &= shm::rings_fit_populate(here, opts.ring);
        let links = streams.into_iter().enumerate().map(|(peer, s)| {
            let local = self.shm && hosts.get(peer) == hosts.get(rank);
            let opts = &opts;
            async move {
                let Some(mut all) = s else { return Ok(None) };
                if !local && all.len() > 1 {
                    return Ok(Some(PeerLink::Bundle(all)));
                }
                // Shared memory needs one connection, as doorbell; both ends drop the others.
                let mut s = all.swap_remove(0);
                if !local {
                    return Ok(Some(PeerLink::Tcp(s)));
                }
                let pair = tokio::time::timeout(self.connect_timeout, shm::negotiate(&mut s, rank, peer, job, opts))
                    .await
                    .map_err(|_| boot(rank, format!("rank {peer} did not set up shared memory in time")))?
                    .map_err(|e| boot(rank, format!("setting up shared memory with rank {peer}")).with_source(e))?;
                Ok(Some(match pair {
                    Some(p) => PeerLink::Shm(p, s),
                    None => PeerLink::Tcp(s),
                }))
            }
        });
        futures::future::try_join_all(links).await
    }

    /// Connects over TCP driven by io_uring. Must run inside `tokio_uring::start`.
    ///
    /// # Errors
    /// As [`Config::connect`].
    ///
    /// # Cancel safety
    /// As [`Config::connect`].
    #[cfg(all(feature = "uring", target_os = "linux"))]
    pub async fn connect_uring(self) -> Result<Communicator<StreamTransport>> {
        self.check_tls()?;
        let (streams, places, keep) = self.rendezvous().await?;
        let hosts = hosts_of(&places);
        let links = self
            .encrypted(self.shared_memory(streams, &hosts).await?)
            .await?
            .into_iter()
            .map(|l| match l {
                Some(PeerLink::Tcp(s)) => s.into_std().map(|s| Some(PeerLink::Tcp(s))),
                Some(PeerLink::Bundle(v)) => v
                    .into_iter()
                    .map(TcpStream::into_std)
                    .collect::<std::io::Result<Vec<_>>>()
                    .map(|v| Some(PeerLink::Bundle(v))),
                Some(PeerLink::Shm(p, s)) => Ok(Some(PeerLink::Shm(p, s))),
                // Driven by tokio tasks under the io_uring runtime too.
                #[cfg(feature = "tls")]
                Some(PeerLink::Tls(s)) => Ok(Some(PeerLink::Tls(s))),
                None => Ok(None),
            })
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| Error::io("handing a socket to io_uring", e))?;
        let t = StreamTransport::uring_links(self.rank, links, &self.stream_options(&hosts));
        self.probed(self.finish(t, &places, keep)?).await
    }

    /// Connects over RDMA (cargo feature `rdma`): every peer through a queue pair on
    /// the device [`Config::rdma`] names, set up over the authenticated TCP mesh, which
    /// stays as liveness channel (see `hcomm_transport::rdma`). Shared memory, several
    /// connections per peer and TLS do not apply. Must run inside a tokio runtime.
    ///
    /// # Errors
    /// As [`Config::connect`], and a bootstrap error if the device cannot be opened or
    /// a queue pair cannot be connected.
    ///
    /// # Cancel safety
    /// As [`Config::connect`].
    #[cfg(all(feature = "rdma", target_os = "linux"))]
    pub async fn connect_rdma(mut self) -> Result<Communicator<hcomm_transport::rdma::RdmaTransport>> {
        if self.tls || self.links > 1 {
            return Err(Error::config("the RDMA transport takes neither HCOMM_TLS nor HCOMM_LINKS above 1"));
        }
        self.links = 1;
        let (streams, places, keep) = self.rendezvous().await?;
        let streams = streams.into_iter().map(|s| s.and_then(|mut v| v.pop())).collect();
        let mut opts = self.rdma.clone();
        opts.peer_timeout = self.stream.peer_timeout;
        let t = hcomm_transport::rdma::RdmaTransport::connect(self.rank, streams, &opts, self.connect_timeout).await?;
        self.finish(t, &places, keep)
    }

    /// `tls` is possible: the feature is built in and one connection per peer.
    fn check_tls(&self) -> Result<()> {
        if !self.tls {
            return Ok(());
        }
        if !cfg!(feature = "tls") {
            return Err(Error::config("HCOMM_TLS=1, but this program was built without hcomm's `tls` feature"));
        }
        if self.links > 1 {
            return Err(Error::config("HCOMM_TLS=1 with HCOMM_LINKS above 1 is not supported (yet)"));
        }
        Ok(())
    }

    /// The job's key: from the secret, or else from the job id.
    fn job_key(&self) -> JobKey {
        JobKey::from_secret(self.secret.as_deref().unwrap_or(&self.job_id))
    }

    /// With `tls`, runs TLS over every TCP link (this rank dialed the lower ranks).
    #[cfg(feature = "tls")]
    async fn encrypted(&self, links: Vec<Option<PeerLink<TcpStream>>>) -> Result<Vec<Option<PeerLink<TcpStream>>>> {
        if !self.tls {
            return Ok(links);
        }
        let (rank, key) = (self.rank, self.job_key());
        let key = &key;
        futures::future::try_join_all(links.into_iter().enumerate().map(|(peer, l)| async move {
            match l {
                Some(PeerLink::Tcp(s)) => {
                    let tls =
                        hcomm_transport::tls::secure(s, peer < rank, key, self.connect_timeout).await.map_err(|e| {
                            boot(rank, format!("TLS with rank {peer} failed")).with_peer(peer).with_source(e)
                        })?;
                    Ok(Some(PeerLink::Tls(Box::new(tls))))
                }
                other => Ok(other),
            }
        }))
        .await
    }

    #[cfg(not(feature = "tls"))]
    async fn encrypted(&self, links: Vec<Option<PeerLink<TcpStream>>>) -> Result<Vec<Option<PeerLink<TcpStream>>>> {
        Ok(links)
    }

    /// `stream`, with yielding TCP spins and no shared-memory spins (`auto_spin`) and
    /// the smaller eager limit (`auto_eager`) if this host is oversubscribed.
    fn stream_options(&self, hosts: &[String]) -> StreamOptions {
        let mut o = self.stream.clone();
        let here = hosts.iter().filter(|h| hosts.get(self.rank) == Some(h)).count();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let crowded = here > cores;
        if self.auto_eager && crowded {
            o.tcp_eager = o.tcp_eager.min(CROWDED_TCP_EAGER);
        }
        if self.auto_spin && crowded {
            tracing::debug!(
                rank = self.rank,
                ranks_here = here,
                cores,
                "oversubscribed: spins yield to other processes"
            );
            o.spin_yield = true;
            o.shm.spin = Duration::ZERO;
        }
        o
    }

    fn finish<T: LocalTransport + Send + Sync + 'static>(
        &self,
        t: T,
        places: &[Placement],
        keep: Keep,
    ) -> Result<Communicator<T>> {
        let mut group = Group::world(Arc::new(t), 0, Topology::from_placements(places), self.timeout)?;
        if let Some(store) = &keep.store {
            // A second process claimed a rank of this job (see `StoreServer::set`): a
            // stranger may be among the ranks this one just connected to.
            if let Some(why) = store.conflict() {
                return Err(boot(self.rank, format!("the rendezvous store this rank serves refused a rank: {why}")));
            }
            let transport = Arc::downgrade(group.transport());
            let (rank, size) = (self.rank, self.size);
            store.on_conflict(move |why| {
                if let Some(t) = transport.upgrade() {
                    let members: Vec<usize> = (0..size).collect();
                    let reason = format!("the rendezvous store refused a rank after the job formed: {why}");
                    hcomm_collectives::abort_comm(&*t, 0, &members, rank, &reason);
                }
            });
        }
        group.set_stall_warn(self.stall_warn);
        if self.tuning_from_env {
            group.set_tuning(Tuning::for_transport(group.transport().name()).with_env(|k| std::env::var(k).ok())?);
        }
        if let Some(processors) = crowded_host(&hosts_of(places), online_processors()) {
            let mut t = group.tuning().clone();
            t.crowded = Some(hcomm_collectives::Crowded { processors, blocks: self.bind });
            group.set_tuning(t);
        }
        let topo = group.topology();
        tracing::debug!(rank = self.rank, size = self.size, hosts = topo.host_count(), racks = topo.rack_count(), topology = %topo, crowded = ?group.tuning().crowded, "connected");
        Ok(Communicator::new(group, Arc::new(keep)))
    }

    /// Probes the racks when asked to (`HCOMM_TOPOLOGY=probe`).
    async fn probed(&self, mut comm: Communicator<StreamTransport>) -> Result<Communicator<StreamTransport>> {
        if self.probe_racks {
            let racks = comm.probe_racks().await?;
            tracing::debug!(rank = self.rank, racks, topology = %comm.topology(), "racks probed");
        }
        Ok(comm)
    }

    async fn store_bind_addr(&self) -> Result<SocketAddr> {
        let mut addrs = tokio::net::lookup_host(&self.addr).await.map_err(|e| {
            boot(self.rank, format!("cannot resolve the rendezvous address {:?}", self.addr)).with_source(e)
        })?;
        let a = addrs.next().ok_or_else(|| boot(self.rank, format!("{:?} resolves to no address", self.addr)))?;
        // A loopback store stays on loopback; otherwise listen on every interface, as
        // the other ranks reach rank 0 by the name they were given.
        Ok(if a.ip().is_loopback() { a } else { SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), a.port()) })
    }

    /// Where this rank runs, as it reports it to the others.
    fn placement(&self) -> Placement {
        placement_of(self.rack.clone(), self.topology.as_ref(), self.host.clone())
    }

    async fn rendezvous(&self) -> Result<(Vec<Option<Vec<TcpStream>>>, Vec<Placement>, Keep)> {
        let (rank, size) = (self.rank, self.size);
        if size == 0 || rank >= size {
            return Err(Error::config(format!("rank {rank} of {size} ranks")));
        }
        let deadline = Instant::now() + self.connect_timeout.min(hcomm_core::NEVER);
        let job = job_hash(&self.job_id);
        if self.secret.is_none() {
            tracing::warn!(rank, "HCOMM_JOB_SECRET is not set: connections prove the job id only");
        }
        let key = self.job_key();
        let mut keep = Keep::default();
        if rank == 0 && self.serve_store {
            let bind = self.store_bind_addr().await?;
            keep.store = Some(StoreServer::start(bind, key.clone(), job, size).await.map_err(|e| e.at_rank(rank))?);
        }
        let mut store =
            StoreClient::connect(&self.addr, &key, job, rank, size, deadline).await.map_err(|e| e.at_rank(rank))?;
        let via = store.local_addr()?.ip();
        let ips = match (&self.ifname, &self.link_paths[..]) {
            (_, [_, ..]) => {
                let ifs = crate::ifname::interfaces()?;
                let ips = self.link_paths.iter().map(|p| p.choose(&ifs, via)).collect::<Result<Vec<IpAddr>>>();
                ips.map_err(|e| e.at_rank(rank))?
            }
            (Some(spec), []) => vec![spec.choose(&crate::ifname::interfaces()?, via).map_err(|e| e.at_rank(rank))?],
            (None, []) => vec![via],
        };
        if ips[0] != via {
            tracing::debug!(rank, ip = %ips[0], %via, "HCOMM_IFNAME chose another address than the store's route");
        }
        let mut listeners = Vec::with_capacity(ips.len());
        for ip in ips {
            listeners.push(bind_listener(ip, self.port_range).await.map_err(|e| e.at_rank(rank))?);
        }
        let paths = listeners
            .iter()
            .map(TcpListener::local_addr)
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| Error::io("listener address", e))?;
        let me = RankInfo { paths, links: self.links, place: self.placement() };
        let me = serde_json::to_string(&me).map_err(|e| boot(rank, e.to_string()))?;
        store.set(&format!("rank/{rank}"), &me).await.map_err(|e| e.at_rank(rank))?;
        let keys: Vec<String> = (0..size).map(|r| format!("rank/{r}")).collect();
        let values = match store
            .get(&keys, deadline.saturating_duration_since(Instant::now()))
            .await
            .map_err(|e| e.at_rank(rank))?
        {
            Ok(v) => v,
            Err(missing) => {
                let ranks: Vec<&str> = missing.iter().map(|k| k.trim_start_matches("rank/")).collect();
                return Err(boot(
                    rank,
                    format!(
                        "ranks [{}] never reached the rendezvous store at {} within {:?}",
                        ranks.join(", "),
                        self.addr,
                        self.connect_timeout
                    ),
                ));
            }
        };
        let infos: Vec<RankInfo> = values
            .iter()
            .map(|v| serde_json::from_str(v))
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| boot(rank, format!("malformed rank entry in the store: {e}")))?;
        if let Some((r, other)) = infos.iter().enumerate().find(|(_, i)| i.links != self.links) {
            return Err(boot(
                rank,
                format!(
                    "rank {r} opens {} connections per peer and this rank {}: HCOMM_LINKS must be the same on every rank",
                    other.links, self.links
                ),
            ));
        }
        let addrs: Vec<Vec<SocketAddr>> = infos.iter().map(|i| i.paths.clone()).collect();
        let places: Vec<Placement> = infos.into_iter().map(|i| i.place).collect();
        if self.bind
            && let Some(cpu) = bind_block(&hosts_of(&places), rank)
        {
            tracing::debug!(rank, cpu, "bound to one processor: this host runs more ranks than it has");
        }
        let opts = MeshOptions {
            job,
            key,
            timeout: deadline.saturating_duration_since(Instant::now()),
            congestion: self.congestion.clone(),
            ..MeshOptions::default()
        };
        let streams = connect_mesh_links(rank, size, listeners, &addrs, self.links, &opts).await?;
        Ok((streams, places, keep))
    }
}

/// Starts a store on loopback and the configurations of `n` ranks that use it.
/// `HCOMM_RDMA_DEVICE`, `HCOMM_RDMA_PORT`, `HCOMM_RDMA_GID_INDEX`,
/// `HCOMM_RDMA_EAGER` (bytes, `16K`), `HCOMM_RDMA_RECV_DEPTH` into `o`.
#[cfg(all(feature = "rdma", target_os = "linux"))]
fn rdma_env(o: &mut hcomm_transport::rdma::RdmaOptions) -> Result<()> {
    use hcomm_core::settings::{self as set, env};
    if let Some(d) = set::RDMA_DEVICE.text(env)? {
        o.device = Some(d);
    }
    if let Some(p) = set::RDMA_PORT.count(env)? {
        o.port = p as u8;
    }
    if let Some(g) = set::RDMA_GID_INDEX.count(env)? {
        o.gid_index = g as usize;
    }
    if let Some(e) = set::RDMA_EAGER.bytes(env)? {
        o.eager = e;
    }
    if let Some(d) = set::RDMA_RECV_DEPTH.count(env)? {
        o.recv_depth = d as usize;
    }
    Ok(())
}

pub(crate) async fn local_configs(n: usize) -> Result<(StoreServer, Vec<Config>)> {
    let job_id = format!("local-{:016x}", rand::random::<u64>());
    let secret = hcomm_core::auth::hex(&JobKey::nonce());
    let key = JobKey::from_secret(&secret);
    let store = StoreServer::start(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), key, job_hash(&job_id), n).await?;
    let configs = (0..n)
        .map(|r| {
            let mut c = Config::new(r, n, store.addr().to_string());
            c.job_id = job_id.clone();
            c.secret = Some(secret.clone());
            c.serve_store = false;
            // In one process every peer is local: TCP unless asked otherwise.
            c.shm = false;
            c
        })
        .collect();
    Ok((store, configs))
}

/// Hands the store to rank 0's communicator, so that it lives as long as the job.
pub(crate) fn attach_store<T: hcomm_core::LocalTransport>(
    comms: Vec<Communicator<T>>,
    store: StoreServer,
) -> Vec<Communicator<T>> {
    let mut store = Some(store);
    comms
        .into_iter()
        .map(|c| match store.take() {
            Some(s) => c.with_store(s),
            None => c,
        })
        .collect()
}

/// Most connections per peer `HCOMM_LINKS` may ask for.
pub const MAX_LINKS: usize = 16;

/// `HCOMM_LINKS`: a number of connections per peer (`1` to [`MAX_LINKS`], all over
/// the interface `HCOMM_IFNAME` chooses), or one path per connection, as interface
/// choices in `HCOMM_IFNAME`'s grammar separated by `;` (`eth0;eth1`,
/// `10.1.0.0/16;10.2.0.0/16`). Returns the number of connections and the paths (empty
/// for the first form).
///
/// # Errors
/// A configuration error naming the variable.
pub fn parse_links(v: &str) -> Result<(usize, Vec<IfSpec>)> {
    let t = v.trim();
    if let Ok(n) = t.parse::<usize>() {
        if !(1..=MAX_LINKS).contains(&n) {
            return Err(Error::config(format!("HCOMM_LINKS={v:?}: between 1 and {MAX_LINKS} connections per peer")));
        }
        return Ok((n, Vec::new()));
    }
    let paths = t
        .split(';')
        .map(|p| IfSpec::parse(p).map_err(|e| Error::config(format!("HCOMM_LINKS={v:?}: path {p:?}: {e}"))))
        .collect::<Result<Vec<_>>>()?;
    if paths.len() > MAX_LINKS {
        return Err(Error::config(format!("HCOMM_LINKS={v:?}: more than {MAX_LINKS} paths")));
    }
    Ok((paths.len(), paths))
}

/// `HCOMM_PORT_RANGE`: `lo-hi` (inclusive) or a single port.
///
/// # Errors
/// A configuration error naming the variable.
pub fn parse_port_range(v: &str) -> Result<(u16, u16)> {
    let bad = || Error::config(format!("HCOMM_PORT_RANGE={v:?} is not a port or a range such as 29500-29599"));
    let (lo, hi) = match v.trim().split_once('-') {
        Some((a, b)) => (a.trim(), b.trim()),
        None => (v.trim(), v.trim()),
    };
    let (lo, hi): (u16, u16) = (lo.parse().map_err(|_| bad())?, hi.parse().map_err(|_| bad())?);
    if lo == 0 || lo > hi {
        return Err(bad());
    }
    Ok((lo, hi))
}

/// A listener on `ip`: on any free port, or on the first free one of `range`.
async fn bind_listener(ip: IpAddr, range: Option<(u16, u16)>) -> Result<TcpListener> {
    let Some((lo, hi)) = range else {
        return TcpListener::bind((ip, 0)).await.map_err(|e| Error::io(format!("binding a listener on {ip}"), e));
    };
    for port in lo..=hi {
        if let Ok(l) = TcpListener::bind((ip, port)).await {
            return Ok(l);
        }
    }
    Err(Error::new(ErrorKind::Bootstrap, format!("no free port on {ip} in HCOMM_PORT_RANGE {lo}-{hi}"))
        .in_op(OpKind::Bootstrap, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_bind_in_blocks() {
        let blocks = |ranks, cpus| (0..ranks).map(|k| block_cpu(k, ranks, cpus)).collect::<Vec<_>>();
        assert_eq!(blocks(4, 2), vec![0, 0, 1, 1]);
        assert_eq!(blocks(8, 2), vec![0, 0, 0, 0, 1, 1, 1, 1]);
        assert_eq!(blocks(3, 2), vec![0, 0, 1]);
        assert_eq!(blocks(6, 4), vec![0, 0, 1, 2, 2, 3]);
        // Not crowded (as many processors as ranks here): no binding; the host of
        // this test has one host entry per rank only as the test gives it.
        assert_eq!(bind_block(&[String::from("h")], 0), None);
        assert_eq!(bind_block(&[], 0), None);
    }

    #[test]
    fn a_crowded_host_is_one_host_with_fewer_processors_than_ranks() {
        let on = |hosts: &[&str]| hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>();
        assert_eq!(crowded_host(&on(&["a", "a", "a", "a"]), 2), Some(2));
        assert_eq!(crowded_host(&on(&["a", "a"]), 2), None);
        assert_eq!(crowded_host(&on(&["a", "a", "a"]), 4), None);
        // Several hosts: none is judged, as no rank knows another host's processors.
        assert_eq!(crowded_host(&on(&["a", "a", "a", "b"]), 2), None);
        assert_eq!(crowded_host(&[], 2), None);
        assert_eq!(count_cpu_list("0-1"), Some(2));
        assert_eq!(count_cpu_list("0-3,6,8-9"), Some(7));
        assert_eq!(count_cpu_list("5"), Some(1));
        for bad in ["", "x", "3-1", "0-", "0-1,,2"] {
            assert_eq!(count_cpu_list(bad), None, "{bad:?}");
        }
        assert!(online_processors() >= 1);
    }

    #[test]
    fn spins_yield_when_the_host_is_oversubscribed() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut c = Config::new(0, cores + 2, "127.0.0.1:1");
        let spins = |o: StreamOptions| (o.tcp_spin, o.shm.spin, o.spin_yield);
        let default = spins(StreamOptions::default());
        assert!(default.0 > Duration::ZERO && default.1 > Duration::ZERO && !default.2);
        // Every rank on one host: more ranks than cores. The TCP spin stays and
        // yields; the shared-memory one stops.
        let crowded = vec![String::from("a"); cores + 2];
        assert_eq!(spins(c.stream_options(&crowded)), (default.0, Duration::ZERO, true));
        // This rank shares its host with no one.
        let mut spread: Vec<String> = (0..cores + 2).map(|i| format!("h{i}")).collect();
        assert_eq!(spins(c.stream_options(&spread)), default);
        // As many on this host as cores.
        spread[..cores].iter_mut().for_each(|h| *h = String::from("h0"));
        assert_eq!(spins(c.stream_options(&spread)), default);
        // Explicit spins stay as they are.
        c.auto_spin = false;
        assert_eq!(spins(c.stream_options(&crowded)), default);
    }

    #[test]
    fn eager_limit_shrinks_when_the_host_is_oversubscribed() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut c = Config::new(0, cores + 2, "127.0.0.1:1");
        let crowded = vec![String::from("a"); cores + 2];
        let spread: Vec<String> = (0..cores + 2).map(|i| format!("h{i}")).collect();
        const { assert!(hcomm_transport::DEFAULT_TCP_EAGER > CROWDED_TCP_EAGER) };
        assert_eq!(c.stream_options(&spread).tcp_eager, hcomm_transport::DEFAULT_TCP_EAGER);
        assert_eq!(c.stream_options(&crowded).tcp_eager, CROWDED_TCP_EAGER);
        // A smaller limit set in the configuration stays.
        c.stream.tcp_eager = 1024;
        assert_eq!(c.stream_options(&crowded).tcp_eager, 1024);
        // One set by HCOMM_TCP_EAGER stays whatever the host.
        c.stream.tcp_eager = 16 << 10;
        c.auto_eager = false;
        assert_eq!(c.stream_options(&crowded).tcp_eager, 16 << 10);
    }

    #[test]
    fn tls_needs_the_feature_and_one_link() {
        let mut c = Config::new(0, 2, "127.0.0.1:1");
        c.tls = true;
        let built_in = cfg!(feature = "tls");
        match c.check_tls() {
            Ok(()) => assert!(built_in),
            Err(e) => {
                assert!(!built_in, "{e}");
                assert!(e.to_string().contains("`tls` feature"), "{e}");
            }
        }
        c.links = 2;
        assert!(c.check_tls().is_err());
        c.tls = false;
        assert!(c.check_tls().is_ok());
    }

    #[test]
    fn links_grammar() {
        assert_eq!(parse_links("3").unwrap(), (3, Vec::new()));
        let (n, paths) = parse_links("hc0; 10.79.0.0/24").unwrap();
        assert_eq!((n, paths.len()), (2, 2));
        for bad in ["0", "17", "", "eth0;", "a b"] {
            let e = parse_links(bad).unwrap_err();
            assert!(e.to_string().contains("HCOMM_LINKS"), "{bad}: {e}");
        }
    }

    #[test]
    fn port_range_grammar() {
        assert_eq!(parse_port_range("29500-29599").unwrap(), (29500, 29599));
        assert_eq!(parse_port_range(" 40000 - 40000 ").unwrap(), (40000, 40000));
        assert_eq!(parse_port_range("31000").unwrap(), (31000, 31000));
        for bad in ["", "0-10", "200-100", "1-70000", "a-b", "-5"] {
            let e = parse_port_range(bad).unwrap_err();
            assert!(e.to_string().contains("HCOMM_PORT_RANGE"), "{bad}: {e}");
        }
    }

    #[test]
    fn congestion_grammar() {
        assert_eq!(Congestion::parse(" auto ").unwrap(), Congestion::Auto);
        assert_eq!(Congestion::parse("system").unwrap(), Congestion::System);
        // Reno is built into every Linux kernel and always allowed.
        assert_eq!(Congestion::parse("reno").unwrap(), Congestion::Named("reno".into()));
        for bad in ["", "no_such_cc", "a b", "cubic;", "x234567890123456"] {
            let e = Congestion::parse(bad).unwrap_err();
            assert!(e.to_string().contains("HCOMM_TCP_CONGESTION"), "{bad}: {e}");
        }
    }
}
