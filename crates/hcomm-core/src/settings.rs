//! Every `HCOMM_*` environment variable, declared once: name, kind (with its range),
//! default, a one-line description and who it is for.
//!
//! Parsing and validation come from the declaration ([`Setting::flag`],
//! [`Setting::bytes`], [`Setting::wait`] …: a value of the wrong kind, out of range or
//! empty is a configuration error naming the variable), and so do the warning about
//! unknown variables and the documentation tables ([`document`], the `hcomm settings`
//! command, `docs/settings.md`). Settings whose grammar is richer than a kind
//! ([`Kind::Text`]: interface lists, paths, algorithm names) are read here and parsed
//! where they are used, with the grammar stated in their description.

use std::fmt::Write as _;
use std::time::Duration;

use crate::{Error, Result};

/// What a setting holds, and the values it accepts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// `0` or `1` (also `false`/`true`, `no`/`yes`).
    Flag,
    /// A size in bytes, with an optional `K`, `M` or `G` suffix, from `min` to `max`.
    Bytes { min: usize, max: usize },
    /// A whole number of microseconds, at most `max`.
    Micros { max: u64 },
    /// A wait in seconds (fractions allowed); `off`, `never`, `none` or `0`: never.
    /// Any value longer than [`crate::NEVER`] is never too.
    Wait,
    /// A positive number.
    Number,
    /// A whole number from `min` to `max`.
    Count { min: u64, max: u64 },
    /// Text whose grammar the description gives, parsed where it is used.
    Text,
}

/// Who a setting is for; the documentation lists each group apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Audience {
    /// What a user of a job may need: deadlines, interfaces, security, statistics.
    User,
    /// Set by a launcher (`hcomm run`), or by hand without one.
    Launcher,
    /// Tuning and diagnosis: algorithm choices, cost-model figures, transport
    /// thresholds and spins. Their defaults serve; they may change between
    /// versions.
    Expert,
    /// Read by the test suite only.
    Test,
}

/// One `HCOMM_*` variable.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    pub name: &'static str,
    pub kind: Kind,
    /// The default, as the documentation shows it.
    pub default: &'static str,
    /// One line: what it does.
    pub doc: &'static str,
    pub audience: Audience,
}

/// The process environment, as the `get` of the readers below.
pub fn env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

impl Setting {
    fn bad(&self, v: &str, what: &str) -> Error {
        Error::config(format!("{}={v:?} is not {what}", self.name))
    }

    /// The value parsed by `parse`; set but empty (or blank) is an error for every
    /// setting, so that `HCOMM_JOB_SECRET=` never means "no secret" unnoticed.
    fn read<T>(
        &self,
        get: impl Fn(&str) -> Option<String>,
        parse: impl FnOnce(&str) -> Result<T>,
    ) -> Result<Option<T>> {
        match get(self.name) {
            None => Ok(None),
            Some(v) if v.trim().is_empty() => {
                Err(Error::config(format!("{} is set but empty (unset it for the default)", self.name)))
            }
            Some(v) => parse(&v).map(Some),
        }
    }

    /// A [`Kind::Flag`].
    ///
    /// # Errors
    /// A configuration error naming the variable if it is not a flag.
    pub fn flag(&self, get: impl Fn(&str) -> Option<String>) -> Result<Option<bool>> {
        debug_assert_eq!(self.kind, Kind::Flag, "{}", self.name);
        self.read(get, |v| match v.trim() {
            "1" | "true" | "yes" => Ok(true),
            "0" | "false" | "no" => Ok(false),
            _ => Err(self.bad(v, "0 or 1")),
        })
    }

    /// A [`Kind::Bytes`], checked against its range.
    ///
    /// # Errors
    /// A configuration error naming the variable if it is not a size or is out of
    /// range.
    pub fn bytes(&self, get: impl Fn(&str) -> Option<String>) -> Result<Option<usize>> {
        let Kind::Bytes { min, max } = self.kind else { panic!("{} is not a size", self.name) };
        self.read(get, |v| {
            let n = parse_size(v).ok_or_else(|| self.bad(v, "a size such as 4M, 512K or 65536"))?;
            if n < min {
                return Err(Error::config(format!("{}={v:?} is below {}, its least value", self.name, size_text(min))));
            }
            if n > max {
                return Err(Error::config(format!(
                    "{}={v:?} is above {}, its largest value",
                    self.name,
                    size_text(max)
                )));
            }
            Ok(n)
        })
    }

    /// A [`Kind::Micros`], checked against its bound.
    ///
    /// # Errors
    /// A configuration error naming the variable if it is not a whole number of
    /// microseconds or is above the bound.
    pub fn micros(&self, get: impl Fn(&str) -> Option<String>) -> Result<Option<Duration>> {
        let Kind::Micros { max } = self.kind else { panic!("{} is not microseconds", self.name) };
        self.read(get, |v| match v.trim().parse::<u64>() {
            Ok(us) if us <= max => Ok(Duration::from_micros(us)),
            Ok(_) => Err(Error::config(format!("{}={v:?} is above {max}, its largest value", self.name))),
            Err(_) => Err(self.bad(v, "a whole number of microseconds")),
        })
    }

    /// A [`Kind::Wait`]: `Some(None)` for never.
    ///
    /// # Errors
    /// A configuration error naming the variable if it is neither a number of
    /// seconds nor `off`.
    pub fn wait(&self, get: impl Fn(&str) -> Option<String>) -> Result<Option<Option<Duration>>> {
        debug_assert_eq!(self.kind, Kind::Wait, "{}", self.name);
        self.read(get, |v| parse_wait(v).ok_or_else(|| self.bad(v, "a number of seconds, nor `off`")))
    }

    /// A [`Kind::Number`].
    ///
    /// # Errors
    /// A configuration error naming the variable if it is not a positive number.
    pub fn number(&self, get: impl Fn(&str) -> Option<String>) -> Result<Option<f64>> {
        debug_assert_eq!(self.kind, Kind::Number, "{}", self.name);
        self.read(get, |v| match v.trim().parse::<f64>() {
            Ok(x) if x > 0.0 && x.is_finite() => Ok(x),
            _ => Err(self.bad(v, "a positive number")),
        })
    }

    /// A [`Kind::Count`], checked against its range.
    ///
    /// # Errors
    /// A configuration error naming the variable if it is not a whole number in
    /// range.
    pub fn count(&self, get: impl Fn(&str) -> Option<String>) -> Result<Option<u64>> {
        let Kind::Count { min, max } = self.kind else { panic!("{} is not a count", self.name) };
        self.read(get, |v| match v.trim().parse::<u64>() {
            Ok(n) if (min..=max).contains(&n) => Ok(n),
            _ => Err(self.bad(v, &format!("a whole number from {min} to {max}"))),
        })
    }

    /// A [`Kind::Text`], trimmed.
    ///
    /// # Errors
    /// A configuration error naming the variable if it is set but empty.
    pub fn text(&self, get: impl Fn(&str) -> Option<String>) -> Result<Option<String>> {
        debug_assert_eq!(self.kind, Kind::Text, "{}", self.name);
        self.read(get, |v| Ok(v.trim().to_owned()))
    }

    /// The values the setting accepts, as the documentation states them.
    pub fn values(&self) -> String {
        match self.kind {
            Kind::Flag => "`0`, `1`".into(),
            Kind::Bytes { min: 0, max: ANY } => "bytes (`K`, `M`, `G`)".into(),
            Kind::Bytes { min, max } => format!("bytes, {}..{}", size_text(min), size_text(max)),
            Kind::Micros { max: u64::MAX } => "µs".into(),
            Kind::Micros { max } => format!("µs, at most {max}"),
            Kind::Wait => "seconds, or `off`".into(),
            Kind::Number => "a positive number".into(),
            Kind::Count { min, max } if max == u32::MAX as u64 => format!("from {min}"),
            Kind::Count { min, max } => format!("{min}..{max}"),
            Kind::Text => "text".into(),
        }
    }
}

/// `16M`, `4K`, `1G` or a plain number of bytes; `None` if it is none of these or
/// overflows.
pub fn parse_size(text: &str) -> Option<usize> {
    let t = text.trim();
    let (num, shift) = match t.as_bytes().last()? {
        b'K' | b'k' => (&t[..t.len() - 1], 10),
        b'M' | b'm' => (&t[..t.len() - 1], 20),
        b'G' | b'g' => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    num.parse::<usize>().ok()?.checked_mul(1 << shift)
}

/// A size as the documentation writes it: `64K` for 65536, `100` for 100.
pub fn size_text(n: usize) -> String {
    match n {
        0 => "0".into(),
        usize::MAX => "any".into(),
        n if n.is_multiple_of(1 << 30) => format!("{}G", n >> 30),
        n if n.is_multiple_of(1 << 20) => format!("{}M", n >> 20),
        n if n.is_multiple_of(1 << 10) => format!("{}K", n >> 10),
        n => n.to_string(),
    }
}

/// A wait (see [`Kind::Wait`]): `Some(None)` for never, `None` if it is not one.
pub fn parse_wait(v: &str) -> Option<Option<Duration>> {
    let v = v.trim();
    if ["off", "never", "none"].iter().any(|w| v.eq_ignore_ascii_case(w)) {
        return Some(None);
    }
    match v.parse::<f64>() {
        Ok(0.0) => Some(None),
        Ok(s) if s > 0.0 => {
            let d = Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX);
            Some((d < crate::NEVER).then_some(d))
        }
        // Negative, NaN, or not a number.
        _ => None,
    }
}

const fn s(name: &'static str, kind: Kind, default: &'static str, audience: Audience, doc: &'static str) -> Setting {
    Setting { name, kind, default, doc, audience }
}

const ANY: usize = usize::MAX;
use Audience::{Expert, Launcher, Test, User};
use Kind::{Bytes, Count, Flag, Micros, Number, Text, Wait};

pub const TIMEOUT: Setting = s("HCOMM_TIMEOUT", Wait, "300", User, "Deadline of each operation.");
pub const CONNECT_TIMEOUT: Setting = s("HCOMM_CONNECT_TIMEOUT", Wait, "60", User, "Deadline of bootstrap.");
pub const PEER_TIMEOUT: Setting = s(
    "HCOMM_PEER_TIMEOUT",
    Wait,
    "0.6",
    User,
    "Silence after which a peer is failed (`off`: hung peers are left to the operation deadline).",
);
pub const STALL_WARN: Setting = s(
    "HCOMM_STALL_WARN",
    Wait,
    "5",
    User,
    "Wait after which a waiting operation reports what it waits for, then again at twice, four times … that.",
);
pub const IFNAME: Setting = s(
    "HCOMM_IFNAME",
    Text,
    "the interface that reaches rank 0",
    User,
    "Interfaces of the ranks' listeners: names (`eth0`), prefixes (`ib*`), CIDR networks (`10.0.0.0/8`), comma-separated, each negatable with `^`.",
);
pub const PORT_RANGE: Setting =
    s("HCOMM_PORT_RANGE", Text, "any free port", User, "Ports the ranks' listeners may take: `lo-hi` or one port.");
pub const JOB_SECRET: Setting = s(
    "HCOMM_JOB_SECRET",
    Text,
    "random under `hcomm run`; else the job id",
    User,
    "The secret every connection of the job proves; the same on every rank.",
);
pub const SHM: Setting =
    s("HCOMM_SHM", Flag, "1", User, "Peers on the same host talk through shared-memory rings; `0`: TCP to every peer.");
pub const TLS: Setting =
    s("HCOMM_TLS", Flag, "0", User, "Encrypt the connections to other hosts with TLS 1.3 (cargo feature `tls`).");
pub const LINKS: Setting = s(
    "HCOMM_LINKS",
    Text,
    "1",
    User,
    "Connections per TCP peer, 1 to 16, striped with failover; or one path per connection, `HCOMM_IFNAME` choices separated by `;`.",
);
pub const TOPOLOGY: Setting = s(
    "HCOMM_TOPOLOGY",
    Text,
    "none",
    User,
    "A TOML (or `.json`) file of `[[rack]]` tables with `name` and `hosts`; or `probe`: infer racks from round trips.",
);
pub const RACK: Setting =
    s("HCOMM_RACK", Text, "from `HCOMM_TOPOLOGY`", User, "This rank's rack; rings keep racks, then hosts, contiguous.");
pub const HOST: Setting = s(
    "HCOMM_HOST",
    Text,
    "hostname and boot id",
    User,
    "The host this rank reports, for containers or emulated hosts that share a kernel and a hostname.",
);
pub const STATS: Setting = s("HCOMM_STATS", Flag, "0", User, "Collect per-operation statistics.");
pub const STATS_LEVEL: Setting = s(
    "HCOMM_STATS_LEVEL",
    Count { min: 1, max: 2 },
    "1",
    User,
    "`2` adds size histograms, per-algorithm rows, per-peer bytes and waits, and hotspots.",
);
pub const STATS_FILE: Setting = s(
    "HCOMM_STATS_FILE",
    Text,
    "a summary on standard error",
    User,
    "JSON file per rank, `%r` standing for the rank; merge them with `hcomm stats`.",
);
pub const REPRODUCIBLE: Setting = s(
    "HCOMM_REPRODUCIBLE",
    Flag,
    "0",
    User,
    "Float reductions in rank order: bitwise the same result whatever the algorithm and size.",
);
pub const CHECK_ARGS: Setting = s(
    "HCOMM_CHECK_ARGS",
    Text,
    "1",
    User,
    "Argument checks of rooted collectives and scans: `1` deferred, `sync` (every rank fails a mismatch), `0` none.",
);

pub const RANK: Setting =
    s("HCOMM_RANK", Count { min: 0, max: u32::MAX as u64 }, "from the launcher", Launcher, "This process's rank.");
pub const SIZE: Setting =
    s("HCOMM_SIZE", Count { min: 1, max: u32::MAX as u64 }, "from the launcher", Launcher, "The number of ranks.");
pub const LOCAL_RANK: Setting = s(
    "HCOMM_LOCAL_RANK",
    Count { min: 0, max: u32::MAX as u64 },
    "from the launcher",
    Launcher,
    "This process's rank among its host's.",
);
pub const ADDR: Setting =
    s("HCOMM_ADDR", Text, "from the launcher", Launcher, "`host:port` where rank 0 serves the rendezvous store.");
pub const JOB_ID: Setting =
    s("HCOMM_JOB_ID", Text, "from the launcher", Launcher, "The job's id: ranks of other jobs are refused.");

pub const ALGO_ALLREDUCE: Setting = s(
    "HCOMM_ALGO_ALLREDUCE",
    Text,
    "auto",
    Expert,
    "`ring`, `recursive_doubling`, `rabenseifner`, `tree`, `ordered`, `hierarchical` or `auto`.",
);
pub const ALGO_BROADCAST: Setting =
    s("HCOMM_ALGO_BROADCAST", Text, "auto", Expert, "`binomial`, `chain`, `scatter_allgather` or `auto`.");
pub const ALGO_ALLGATHER: Setting =
    s("HCOMM_ALGO_ALLGATHER", Text, "auto", Expert, "`ring`, `bruck`, `recursive_doubling` or `auto`.");
pub const ALGO_ALLTOALL: Setting = s("HCOMM_ALGO_ALLTOALL", Text, "auto", Expert, "`pairwise`, `bruck` or `auto`.");
pub const ALGO_REDUCE_SCATTER: Setting =
    s("HCOMM_ALGO_REDUCE_SCATTER", Text, "auto", Expert, "`ring`, `recursive_halving` or `auto`.");
pub const TUNE: Setting = s(
    "HCOMM_TUNE",
    Text,
    "0",
    Expert,
    "`1`, or the largest size to measure (`4M`): `init` measures every algorithm and selects by the measurements.",
);
pub const TUNE_FILE: Setting = s(
    "HCOMM_TUNE_FILE",
    Text,
    "none",
    Expert,
    "A tuning table to use if it was measured on a job of this shape; else one is measured (`HCOMM_TUNE`) and saved there.",
);
pub const ADAPT: Setting =
    s("HCOMM_ADAPT", Flag, "1", Expert, "Adaptive selection among a measured table's alternatives while the job runs.");
pub const CALIBRATE: Setting = s(
    "HCOMM_CALIBRATE",
    Flag,
    "0",
    Expert,
    "`init` measures the cost model's latency and bandwidth per level of link.",
);
pub const TOPO_AWARE: Setting = s(
    "HCOMM_TOPO_AWARE",
    Flag,
    "1",
    Expert,
    "Rings keep racks and hosts contiguous and the hierarchical allreduce competes; `0`: rank order, flat network.",
);
pub const COST_ALPHA_US: Setting = s(
    "HCOMM_COST_ALPHA_US",
    Number,
    "measured default",
    Expert,
    "Cost model: latency per message between hosts of a rack, µs.",
);
pub const COST_GBPS: Setting =
    s("HCOMM_COST_GBPS", Number, "measured default", Expert, "Cost model: bandwidth between hosts of a rack, GB/s.");
pub const COST_REDUCE_GBPS: Setting =
    s("HCOMM_COST_REDUCE_GBPS", Number, "measured default", Expert, "Cost model: reduction bandwidth, GB/s.");
pub const COST_HOST_US: Setting =
    s("HCOMM_COST_HOST_US", Number, "as the rack's", Expert, "Cost model: latency per message inside a host, µs.");
pub const COST_HOST_GBPS: Setting =
    s("HCOMM_COST_HOST_GBPS", Number, "as the rack's", Expert, "Cost model: bandwidth inside a host, GB/s.");
pub const COST_SPINE_US: Setting =
    s("HCOMM_COST_SPINE_US", Number, "as the rack's", Expert, "Cost model: latency per message between racks, µs.");
pub const COST_SPINE_GBPS: Setting = s(
    "HCOMM_COST_SPINE_GBPS",
    Number,
    "as the rack's",
    Expert,
    "Cost model: bandwidth between racks, GB/s; a slow spine makes the hierarchical allreduce win.",
);
pub const BIND: Setting = s(
    "HCOMM_BIND",
    Flag,
    "1",
    Expert,
    "Where a host runs more ranks than processors, bind each rank to one processor, in blocks in rank order; alike on every rank.",
);
pub const SHM_RING: Setting = s(
    "HCOMM_SHM_RING",
    Bytes { min: 64 << 10, max: 1 << 30 },
    "4M",
    Expert,
    "Bytes of each direction's shared-memory ring.",
);
pub const SHM_SPIN_US: Setting = s(
    "HCOMM_SHM_SPIN_US",
    Micros { max: u64::MAX },
    "200",
    Expert,
    "How long an idle shared-memory writer, or reader on a current-thread runtime, polls before it parks (off where ranks outnumber cores).",
);
pub const SHM_CMA: Setting = s(
    "HCOMM_SHM_CMA",
    Bytes { min: 0, max: ANY },
    "64K",
    Expert,
    "Size from which a shared-memory message goes by single copy, the receiver copying it out of the sender's memory; `0`: never.",
);
pub const TCP_LEND: Setting = s(
    "HCOMM_TCP_LEND",
    Bytes { min: 0, max: ANY },
    "64K",
    Expert,
    "Size from which a plain-TCP send writes straight from the caller's buffer in its own poll; `0`: always copied.",
);
pub const TCP_DIRECT: Setting = s(
    "HCOMM_TCP_DIRECT",
    Bytes { min: 0, max: 1 << 20 },
    "64K",
    Expert,
    "Size up to which the sending task writes a plain-TCP message to the socket itself when its writer is idle; `0`: never.",
);
pub const TCP_EAGER: Setting = s(
    "HCOMM_TCP_EAGER",
    Bytes { min: 0, max: 64 << 10 },
    "8K (4K where ranks outnumber cores)",
    Expert,
    "Size up to which a queued plain-TCP send completes when queued; `0`: never.",
);
pub const TCP_LAND: Setting = s(
    "HCOMM_TCP_LAND",
    Bytes { min: 0, max: ANY },
    "512K",
    Expert,
    "Size from which a posted receive reads its message from the socket straight into its buffer; `0`: never.",
);
pub const TCP_SPIN_US: Setting = s(
    "HCOMM_TCP_SPIN_US",
    Micros { max: u64::MAX },
    "100",
    Expert,
    "How long an idle TCP reader task keeps trying before it sleeps in the poller.",
);
pub const RECV_SPIN_US: Setting = s(
    "HCOMM_RECV_SPIN_US",
    Micros { max: 10_000 },
    "50",
    Expert,
    "How long a receive keeps reading its ring or socket in its own poll before it waits to be woken.",
);
pub const SPIN_YIELD: Setting = s(
    "HCOMM_SPIN_YIELD",
    Flag,
    "1 where ranks outnumber cores, else 0",
    Expert,
    "Spinning readers give the processor to other processes between tries (`sched_yield`).",
);
pub const POOL_BYTES: Setting = s(
    "HCOMM_POOL_BYTES",
    Bytes { min: 0, max: ANY },
    "512M",
    Expert,
    "Most bytes of freed message buffers (64 KiB and larger) kept for reuse.",
);
pub const TCP_CONGESTION: Setting = s(
    "HCOMM_TCP_CONGESTION",
    Text,
    "auto",
    Expert,
    "TCP congestion control between ranks: `auto` (Reno where the system uses BBR or CUBIC), `system`, or a kernel name.",
);
pub const LINK_STALL_US: Setting = s(
    "HCOMM_LINK_STALL_US",
    Micros { max: u64::MAX },
    "40000",
    Expert,
    "With several connections per peer: least silence of a connection holding data before its data moves to the others.",
);
pub const RDMA_DEVICE: Setting = s("HCOMM_RDMA_DEVICE", Text, "the first", Expert, "RDMA device (`connect_rdma`).");
pub const RDMA_PORT: Setting = s("HCOMM_RDMA_PORT", Count { min: 1, max: 255 }, "1", Expert, "RDMA device port.");
pub const RDMA_GID_INDEX: Setting = s(
    "HCOMM_RDMA_GID_INDEX",
    Count { min: 0, max: 255 },
    "1",
    Expert,
    "RDMA GID index (1: RoCE v2 over IPv4 on soft-RoCE).",
);
pub const RDMA_EAGER: Setting =
    s("HCOMM_RDMA_EAGER", Bytes { min: 64, max: 1 << 20 }, "16K", Expert, "Largest RDMA message sent eagerly.");
pub const RDMA_RECV_DEPTH: Setting =
    s("HCOMM_RDMA_RECV_DEPTH", Count { min: 2, max: 4096 }, "64", Expert, "Receive buffers kept posted per RDMA peer.");

pub const TEST_REQUIRE_NETNS: Setting = s(
    "HCOMM_TEST_REQUIRE_NETNS",
    Flag,
    "0",
    Test,
    "The network-namespace tests fail instead of skipping when they cannot build their hosts.",
);

/// Every setting, in the order the documentation lists them.
pub const ALL: &[Setting] = &[
    TIMEOUT,
    CONNECT_TIMEOUT,
    PEER_TIMEOUT,
    STALL_WARN,
    IFNAME,
    PORT_RANGE,
    JOB_SECRET,
    SHM,
    TLS,
    LINKS,
    TOPOLOGY,
    RACK,
    HOST,
    STATS,
    STATS_LEVEL,
    STATS_FILE,
    REPRODUCIBLE,
    CHECK_ARGS,
    RANK,
    SIZE,
    LOCAL_RANK,
    ADDR,
    JOB_ID,
    ALGO_ALLREDUCE,
    ALGO_BROADCAST,
    ALGO_ALLGATHER,
    ALGO_ALLTOALL,
    ALGO_REDUCE_SCATTER,
    TUNE,
    TUNE_FILE,
    ADAPT,
    CALIBRATE,
    TOPO_AWARE,
    COST_ALPHA_US,
    COST_GBPS,
    COST_REDUCE_GBPS,
    COST_HOST_US,
    COST_HOST_GBPS,
    COST_SPINE_US,
    COST_SPINE_GBPS,
    BIND,
    SHM_RING,
    SHM_SPIN_US,
    SHM_CMA,
    TCP_LEND,
    TCP_DIRECT,
    TCP_EAGER,
    TCP_LAND,
    TCP_SPIN_US,
    RECV_SPIN_US,
    SPIN_YIELD,
    POOL_BYTES,
    TCP_CONGESTION,
    LINK_STALL_US,
    RDMA_DEVICE,
    RDMA_PORT,
    RDMA_GID_INDEX,
    RDMA_EAGER,
    RDMA_RECV_DEPTH,
    TEST_REQUIRE_NETNS,
];

/// The setting called `name`.
pub fn find(name: &str) -> Option<&'static Setting> {
    ALL.iter().find(|s| s.name == name)
}

/// The Markdown table of the settings for `audience`.
pub fn table(audience: Audience) -> String {
    let mut t = String::from("| variable | default | values | meaning |\n|---|---|---|---|\n");
    for s in ALL.iter().filter(|s| s.audience == audience) {
        let _ = writeln!(t, "| `{}` | {} | {} | {} |", s.name, s.default, s.values(), s.doc);
    }
    t
}

/// The whole settings reference (`docs/settings.md`, `hcomm settings`).
pub fn document() -> String {
    let mut d = String::from(
        "# Settings\n\n\
         Generated from `crates/hcomm-core/src/settings.rs` by `hcomm settings`; a test fails when\n\
         this file is stale. An `HCOMM_*` variable not listed here gets a warning at `init` naming\n\
         the nearest listed one. A value of the wrong kind or out of range is a configuration\n\
         error naming the variable.\n\n",
    );
    for (audience, title, intro) in [
        (User, "For users", "What a job may need to set."),
        (Launcher, "Set by launchers", "`hcomm run` sets these; set them by hand to start ranks without a launcher."),
        (
            Expert,
            "For tuning and diagnosis",
            "Their defaults serve; they exist to compare algorithms and thresholds, and may change between versions.",
        ),
        (Test, "For the test suite", "Read by the tests only."),
    ] {
        let _ = write!(d, "## {title}\n\n{intro}\n\n{}\n", table(audience));
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(name: &'static str, v: &'static str) -> impl Fn(&str) -> Option<String> {
        move |k: &str| (k == name).then(|| v.to_owned())
    }

    #[test]
    fn names_are_unique_and_spelt_alike() {
        let mut names: Vec<_> = ALL.iter().map(|s| s.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ALL.len());
        for s in ALL {
            assert!(s.name.starts_with("HCOMM_") && s.name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_'));
            assert!(!s.doc.is_empty() && s.doc.ends_with('.'), "{}", s.name);
        }
        assert!(ALL.iter().filter(|s| s.audience == User).count() <= 18, "keep the user's list short");
    }

    #[test]
    fn values_are_parsed_and_checked_by_kind() {
        assert_eq!(TCP_EAGER.bytes(with("HCOMM_TCP_EAGER", "4K")).unwrap(), Some(4096));
        let e = TCP_EAGER.bytes(with("HCOMM_TCP_EAGER", "128K")).unwrap_err().to_string();
        assert!(e.contains("HCOMM_TCP_EAGER=\"128K\" is above 64K"), "{e}");
        let e = SHM_RING.bytes(with("HCOMM_SHM_RING", "1K")).unwrap_err().to_string();
        assert!(e.contains("is below 64K"), "{e}");
        assert!(TCP_EAGER.bytes(with("HCOMM_TCP_EAGER", "small")).unwrap_err().to_string().contains("is not a size"));
        assert_eq!(TCP_EAGER.bytes(|_| None).unwrap(), None);
        assert_eq!(RECV_SPIN_US.micros(with("HCOMM_RECV_SPIN_US", "20")).unwrap(), Some(Duration::from_micros(20)));
        assert!(RECV_SPIN_US.micros(with("HCOMM_RECV_SPIN_US", "20000")).is_err());
        assert_eq!(SHM.flag(with("HCOMM_SHM", "0")).unwrap(), Some(false));
        assert!(SHM.flag(with("HCOMM_SHM", "maybe")).is_err());
        assert_eq!(TIMEOUT.wait(with("HCOMM_TIMEOUT", "off")).unwrap(), Some(None));
        assert_eq!(TIMEOUT.wait(with("HCOMM_TIMEOUT", "1e30")).unwrap(), Some(None));
        assert_eq!(TIMEOUT.wait(with("HCOMM_TIMEOUT", "2.5")).unwrap(), Some(Some(Duration::from_millis(2500))));
        assert!(TIMEOUT.wait(with("HCOMM_TIMEOUT", "-3")).is_err());
        assert_eq!(COST_GBPS.number(with("HCOMM_COST_GBPS", "12.5")).unwrap(), Some(12.5));
        assert!(COST_GBPS.number(with("HCOMM_COST_GBPS", "0")).is_err());
        assert_eq!(RDMA_RECV_DEPTH.count(with("HCOMM_RDMA_RECV_DEPTH", "8")).unwrap(), Some(8));
        assert!(RDMA_RECV_DEPTH.count(with("HCOMM_RDMA_RECV_DEPTH", "1")).is_err());
        assert!(RACK.text(with("HCOMM_RACK", "  ")).is_err());
        assert_eq!(RACK.text(with("HCOMM_RACK", " r1 ")).unwrap().as_deref(), Some("r1"));
    }

    #[test]
    fn waits_are_seconds_or_never_and_never_overflow() {
        assert_eq!(parse_wait("1.5"), Some(Some(Duration::from_millis(1500))));
        assert_eq!(parse_wait(" 30 "), Some(Some(Duration::from_secs(30))));
        for never in ["0", "0.0", "off", "OFF", "never", "none", "1e30", "1e19", "inf", "1e300"] {
            assert_eq!(parse_wait(never), Some(None), "{never}");
        }
        for bad in ["", "-1", "NaN", "five", "1s", "-inf"] {
            assert_eq!(parse_wait(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn sizes_read_and_print_alike() {
        for n in [0, 1, 100, 64 << 10, 4 << 20, 1 << 30, 3 << 30] {
            assert_eq!(parse_size(&size_text(n)), Some(n));
        }
        assert_eq!(parse_size("99999999999999999999G"), None);
    }

    /// `docs/settings.md` is what [`document`] makes, and the README's list for
    /// users is its first table.
    #[test]
    fn the_documentation_is_generated_from_the_declarations() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let how = "regenerate it with `cargo run -p hcomm-cli -- settings > docs/settings.md`";
        let doc = std::fs::read_to_string(root.join("docs/settings.md")).unwrap_or_default();
        assert!(doc == document(), "docs/settings.md is stale: {how}");
        let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
        assert!(
            readme.contains(&table(User)),
            "the README's table of settings for users is stale: copy it from docs/settings.md"
        );
    }
}
