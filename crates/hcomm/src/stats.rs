//! `HCOMM_STATS`: per-operation statistics built from the operations' `tracing`
//! events (`hcomm_core::events`), not from counters in the code paths.
//!
//! - `HCOMM_STATS=1` turns them on; `HCOMM_STATS_LEVEL=1` (default) keeps, per rank
//!   and operation kind, the count, errors, total/min/mean/max time and bytes;
//!   `HCOMM_STATS_LEVEL=2` adds a histogram of sizes per operation (powers of two),
//!   a per-algorithm breakdown, per-peer bytes, messages and receive waits, and the
//!   hotspots: the operations and the peers that took the most time.
//! - `HCOMM_STATS_FILE=path`, where `%r` stands for the rank (`stats.%r.json`):
//!   each rank's statistics as JSON when its world communicator is dropped; without
//!   it a readable summary goes to standard error then.
//! - `hcomm stats FILES...` merges per-rank files into one report ([`merge_report`]).
//!
//! The statistics are a `tracing` layer, [`StatsLayer`], behind its own per-layer
//! filter. [`crate::init`] and the
//! `local*` constructors install it as the global subscriber when `HCOMM_STATS=1` and
//! no global subscriber exists; an application with its own subscriber adds
//! [`layer_from_env`] (or [`StatsLayer::new`]) to it. With stats off nothing is
//! installed and every event costs one relaxed atomic load.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};

use hcomm_core::events::{BUF_TARGET, MSG_TARGET, OP_TARGET};
use hcomm_core::{Error, OpKind, Result};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tracing::field::{Field, Visit};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};
use tracing_subscriber::filter::Filtered;
use tracing_subscriber::layer::{Context, Filter, Layer};
use tracing_subscriber::registry::LookupSpan;

/// Time and bytes of a set of operations.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Agg {
    pub count: u64,
    pub errors: u64,
    pub total_ns: u64,
    pub min_ns: u64,
    pub max_ns: u64,
    pub bytes: u64,
}

impl Agg {
    fn add(&mut self, ns: u64, bytes: u64, ok: bool) {
        self.min_ns = if self.count == 0 { ns } else { self.min_ns.min(ns) };
        self.max_ns = self.max_ns.max(ns);
        self.count += 1;
        self.errors += u64::from(!ok);
        self.total_ns += ns;
        self.bytes += bytes;
    }

    /// Mean time per operation, nanoseconds.
    pub fn mean_ns(&self) -> u64 {
        self.total_ns.checked_div(self.count).unwrap_or(0)
    }
}

/// Traffic between this rank and one peer (level 2).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerStats {
    pub sent_bytes: u64,
    pub sent_msgs: u64,
    pub recv_bytes: u64,
    pub recv_msgs: u64,
    /// Sum over received messages of the time from posting the receive to the data's
    /// arrival: how long this rank waited for the peer.
    pub recv_wait_ns: u64,
    pub recv_wait_max_ns: u64,
}

/// One rank's statistics, as written to `HCOMM_STATS_FILE`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RankStats {
    pub rank: u32,
    pub level: u8,
    /// Per operation kind (`allreduce`, `send`, …).
    pub ops: BTreeMap<String, Agg>,
    /// Level 2: per `op/algorithm`.
    #[serde(default)]
    pub algos: BTreeMap<String, Agg>,
    /// Level 2: per operation kind, counts of sizes by power of two: key `k` counts
    /// sizes in `[2^k, 2^(k+1))` bytes, key `-1` sizes of 0.
    #[serde(default)]
    pub sizes: BTreeMap<String, BTreeMap<i32, u64>>,
    /// Level 2: per peer (world rank).
    #[serde(default)]
    pub peers: BTreeMap<u32, PeerStats>,
    /// Level 2: the operation kinds by total time, most first (up to 5).
    #[serde(default)]
    pub hot_ops: Vec<(String, u64)>,
    /// Level 2: the peers this rank waited for longest, most first (up to 5).
    #[serde(default)]
    pub hot_peers: Vec<(u32, u64)>,
    /// Registered memory of an RDMA transport, reported when it closed: eager and
    /// rendezvous messages sent, zero-copy sends, bytes copied into registered
    /// memory, peak registered bytes, bytes pooled, registrations.
    #[serde(default)]
    pub buffers: BTreeMap<String, u64>,
}

impl RankStats {
    fn finish(&mut self) {
        if self.level < 2 {
            return;
        }
        let mut ops: Vec<(String, u64)> = self.ops.iter().map(|(k, a)| (k.clone(), a.total_ns)).collect();
        ops.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        ops.truncate(5);
        self.hot_ops = ops;
        let mut peers: Vec<(u32, u64)> = self.peers.iter().map(|(p, s)| (*p, s.recv_wait_ns)).collect();
        peers.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        peers.truncate(5);
        self.hot_peers = peers;
    }
}

/// Where statistics go and how much is kept.
#[derive(Debug, Clone, PartialEq)]
pub struct StatsConfig {
    /// 1 or 2.
    pub level: u8,
    /// File pattern (`%r` is the rank); `None`: a summary on standard error.
    pub file: Option<String>,
}

impl StatsConfig {
    /// From `HCOMM_STATS`, `HCOMM_STATS_LEVEL` and `HCOMM_STATS_FILE` read through
    /// `get`; `None` when statistics are off.
    ///
    /// # Errors
    /// A configuration error naming the variable at fault.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<StatsConfig>> {
        use hcomm_core::settings as set;
        if set::STATS.flag(&get)? != Some(true) {
            return Ok(None);
        }
        let level = set::STATS_LEVEL.count(&get)?.unwrap_or(1) as u8;
        let file = set::STATS_FILE.text(&get)?;
        Ok(Some(StatsConfig { level, file }))
    }

    /// The file of `rank`: the pattern with `%r` replaced (and `.rank` appended when
    /// the pattern has no `%r`, so that ranks never overwrite each other).
    pub fn file_for(&self, rank: u32) -> Option<String> {
        self.file
            .as_ref()
            .map(|p| if p.contains("%r") { p.replace("%r", &rank.to_string()) } else { format!("{p}.{rank}") })
    }
}

#[derive(Debug)]
struct Sink {
    config: StatsConfig,
    ranks: Mutex<BTreeMap<u32, RankStats>>,
}

static SINK: OnceLock<Arc<Sink>> = OnceLock::new();

/// The layer that turns HComm's events into statistics.
#[derive(Debug, Clone)]
pub struct StatsLayer {
    sink: Arc<Sink>,
}

impl StatsLayer {
    /// A layer with `config`; the process's statistics go to it (the first layer
    /// made in a process is the one that communicators flush at their drop).
    pub fn new(config: StatsConfig) -> StatsLayer {
        let sink = SINK.get_or_init(|| Arc::new(Sink { config, ranks: Mutex::new(BTreeMap::new()) })).clone();
        StatsLayer { sink }
    }

    /// The layer behind the filter that passes it HComm's events alone (a per-layer
    /// filter: the other layers of the subscriber still see what they ask for).
    pub fn filtered<S: Subscriber + for<'a> LookupSpan<'a>>(self) -> Filtered<StatsLayer, StatsFilter, S> {
        let level = self.sink.config.level;
        self.with_filter(StatsFilter { level })
    }
}

/// Passes HComm's operation events, and at level 2 its message events.
#[derive(Debug, Clone, Copy)]
pub struct StatsFilter {
    level: u8,
}

impl StatsFilter {
    fn wants(&self, meta: &Metadata<'_>) -> bool {
        meta.is_event()
            && (meta.target() == OP_TARGET
                || meta.target() == BUF_TARGET
                || (self.level >= 2 && meta.target() == MSG_TARGET))
    }
}

impl<S: Subscriber> Filter<S> for StatsFilter {
    fn enabled(&self, meta: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        self.wants(meta)
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        if self.wants(meta) { Interest::always() } else { Interest::never() }
    }
}

/// The statistics layer configured from the environment, or `None` when
/// `HCOMM_STATS` is off: for applications that compose their own subscriber, e.g.
/// `tracing_subscriber::registry().with(fmt_layer).with(hcomm::stats::layer_from_env()?)`.
///
/// # Errors
/// As [`StatsConfig::from_vars`].
pub fn layer_from_env<S: Subscriber + for<'a> LookupSpan<'a>>() -> Result<Option<Filtered<StatsLayer, StatsFilter, S>>>
{
    Ok(StatsConfig::from_vars(|k| std::env::var(k).ok())?.map(|c| StatsLayer::new(c).filtered()))
}

/// Installs the statistics as the global subscriber if `HCOMM_STATS=1` asks for
/// them and none is installed yet (called by `init` and the `local*` constructors).
///
/// # Errors
/// As [`StatsConfig::from_vars`].
pub(crate) fn install_from_env() -> Result<()> {
    if SINK.get().is_some() {
        return Ok(());
    }
    let Some(layer) = layer_from_env()? else { return Ok(()) };
    use tracing_subscriber::layer::SubscriberExt;
    if tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer)).is_err() {
        eprintln!(
            "hcomm: HCOMM_STATS=1 but a global tracing subscriber is already installed: add \
             hcomm::stats::layer_from_env() to it to collect statistics"
        );
    }
    Ok(())
}

#[derive(Default)]
struct Fields {
    rank: u64,
    peer: i64,
    seq: u64,
    bytes: u64,
    elapsed_ns: u64,
    wait_ns: u64,
    ok: bool,
    send: bool,
    op: Option<&'static str>,
    algo: Option<String>,
    want_algo: bool,
}

impl Visit for Fields {
    fn record_u64(&mut self, f: &Field, v: u64) {
        match f.name() {
            "rank" => self.rank = v,
            "peer" => self.peer = v as i64,
            "seq" => self.seq = v,
            "bytes" => self.bytes = v,
            "elapsed_ns" => self.elapsed_ns = v,
            "wait_ns" => self.wait_ns = v,
            _ => {}
        }
    }

    fn record_i64(&mut self, f: &Field, v: i64) {
        match f.name() {
            "peer" => self.peer = v,
            _ => self.record_u64(f, v.max(0) as u64),
        }
    }

    fn record_bool(&mut self, f: &Field, v: bool) {
        match f.name() {
            "ok" => self.ok = v,
            "send" => self.send = v,
            _ => {}
        }
    }

    fn record_str(&mut self, f: &Field, v: &str) {
        match f.name() {
            // Operation names are the static names of `OpKind`: no allocation.
            "op" => self.op = OpKind::ALL.iter().map(|k| k.name()).find(|n| *n == v),
            "algo" if self.want_algo => self.algo = Some(v.to_string()),
            _ => {}
        }
    }

    fn record_debug(&mut self, _f: &Field, _v: &dyn std::fmt::Debug) {}
}

/// The `u64` fields of a registered-memory report, by name.
#[derive(Default)]
struct Counters {
    rank: u32,
    values: BTreeMap<String, u64>,
}

impl Visit for Counters {
    fn record_u64(&mut self, f: &Field, v: u64) {
        match f.name() {
            "rank" => self.rank = v as u32,
            name => {
                self.values.insert(name.to_string(), v);
            }
        }
    }

    fn record_i64(&mut self, f: &Field, v: i64) {
        self.record_u64(f, v.max(0) as u64);
    }

    fn record_debug(&mut self, _f: &Field, _v: &dyn std::fmt::Debug) {}
}

fn size_bucket(bytes: u64) -> i32 {
    if bytes == 0 { -1 } else { 63 - bytes.leading_zeros() as i32 }
}

impl<S: Subscriber> Layer<S> for StatsLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        let level = self.sink.config.level;
        if meta.target() == BUF_TARGET {
            let mut b = Counters::default();
            event.record(&mut b);
            let rank = b.rank;
            let mut ranks = self.sink.ranks.lock();
            let st = ranks.entry(rank).or_insert_with(|| RankStats { rank, level, ..RankStats::default() });
            st.buffers.extend(b.values);
            return;
        }
        if meta.target() != OP_TARGET && meta.target() != MSG_TARGET {
            return;
        }
        let mut f = Fields { peer: -1, want_algo: level >= 2, ..Fields::default() };
        event.record(&mut f);
        let Some(op) = f.op else { return };
        let rank = f.rank as u32;
        let mut ranks = self.sink.ranks.lock();
        let st = ranks.entry(rank).or_insert_with(|| RankStats { rank, level, ..RankStats::default() });
        if meta.target() == OP_TARGET {
            match st.ops.get_mut(op) {
                Some(a) => a.add(f.elapsed_ns, f.bytes, f.ok),
                None => st.ops.entry(op.to_string()).or_default().add(f.elapsed_ns, f.bytes, f.ok),
            }
            if level >= 2 {
                if let Some(algo) = &f.algo {
                    st.algos.entry(format!("{op}/{algo}")).or_default().add(f.elapsed_ns, f.bytes, f.ok);
                }
                *st.sizes.entry(op.to_string()).or_default().entry(size_bucket(f.bytes)).or_default() += 1;
            }
        } else if f.peer >= 0 {
            let p = st.peers.entry(f.peer as u32).or_default();
            if f.send {
                p.sent_bytes += f.bytes;
                p.sent_msgs += 1;
            } else {
                p.recv_bytes += f.bytes;
                p.recv_msgs += 1;
                p.recv_wait_ns += f.wait_ns;
                p.recv_wait_max_ns = p.recv_wait_max_ns.max(f.wait_ns);
            }
        }
    }
}

/// Writes `rank`'s statistics (if statistics are on) to its file or standard
/// error, and forgets them. Called when a world communicator is dropped.
pub(crate) fn flush(rank: u32) {
    let Some(sink) = SINK.get() else { return };
    let Some(mut st) = sink.ranks.lock().remove(&rank) else { return };
    st.finish();
    match sink.config.file_for(rank) {
        Some(path) => {
            let json = serde_json::to_vec_pretty(&st).expect("statistics serialise");
            if let Err(e) = std::fs::write(&path, json) {
                eprintln!("hcomm: rank {rank}: cannot write statistics to {path}: {e}");
            }
        }
        None => eprint!("{}", summary(&st)),
    }
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

/// A readable summary of one rank's statistics.
pub fn summary(st: &RankStats) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "hcomm stats: rank {} (level {})", st.rank, st.level);
    let _ = writeln!(
        s,
        "  {:<24} {:>8} {:>6} {:>11} {:>10} {:>10} {:>10} {:>14}",
        "operation", "count", "errors", "total ms", "min us", "mean us", "max us", "bytes"
    );
    let rows = st.ops.iter().chain(st.algos.iter());
    for (k, a) in rows {
        let _ = writeln!(
            s,
            "  {:<24} {:>8} {:>6} {:>11.3} {:>10.1} {:>10.1} {:>10.1} {:>14}",
            k,
            a.count,
            a.errors,
            ms(a.total_ns),
            us(a.min_ns),
            us(a.mean_ns()),
            us(a.max_ns),
            a.bytes
        );
    }
    if !st.buffers.is_empty() {
        let cells: Vec<String> = st.buffers.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(s, "  registered memory: {}", cells.join(" "));
    }
    if st.level >= 2 {
        for (op, h) in &st.sizes {
            let cells: Vec<String> = h
                .iter()
                .map(|(k, c)| if *k < 0 { format!("0B:{c}") } else { format!("{}:{c}", human(1u64 << k)) })
                .collect();
            let _ = writeln!(s, "  sizes {op}: {}", cells.join(" "));
        }
        let _ = writeln!(
            s,
            "  {:<8} {:>14} {:>8} {:>14} {:>8} {:>14} {:>12}",
            "peer", "sent bytes", "msgs", "recv bytes", "msgs", "wait ms", "max wait us"
        );
        for (p, x) in &st.peers {
            let _ = writeln!(
                s,
                "  {:<8} {:>14} {:>8} {:>14} {:>8} {:>14.3} {:>12.1}",
                p,
                x.sent_bytes,
                x.sent_msgs,
                x.recv_bytes,
                x.recv_msgs,
                ms(x.recv_wait_ns),
                us(x.recv_wait_max_ns)
            );
        }
        let hot: Vec<String> = st.hot_ops.iter().map(|(k, t)| format!("{k} {:.3} ms", ms(*t))).collect();
        let _ = writeln!(s, "  hotspots: operations {}", hot.join(", "));
        let hot: Vec<String> = st.hot_peers.iter().map(|(p, t)| format!("rank {p} {:.3} ms", ms(*t))).collect();
        let _ = writeln!(s, "  hotspots: waited longest for {}", hot.join(", "));
    }
    s
}

fn human(b: u64) -> String {
    match b {
        b if b >= 1 << 30 => format!("{}G", b >> 30),
        b if b >= 1 << 20 => format!("{}M", b >> 20),
        b if b >= 1 << 10 => format!("{}K", b >> 10),
        b => format!("{b}B"),
    }
}

/// One report from several ranks' files: per operation the total count, the mean
/// time over ranks and the slowest rank (largest total time); the busiest links
/// (bytes sent from rank to peer) and the longest waits (rank waiting for peer).
pub fn merge_report(ranks: &[RankStats]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "hcomm stats: {} ranks", ranks.len());
    let mut ops: BTreeMap<&str, Vec<(u32, &Agg)>> = BTreeMap::new();
    for r in ranks {
        for (k, a) in &r.ops {
            ops.entry(k).or_default().push((r.rank, a));
        }
    }
    let _ = writeln!(
        s,
        "  {:<16} {:>8} {:>6} {:>14} {:>16} {:>14} {:>14}",
        "operation", "count", "errors", "bytes", "mean total ms", "slowest rank", "its total ms"
    );
    for (k, v) in &ops {
        let count: u64 = v.iter().map(|(_, a)| a.count).sum();
        let errors: u64 = v.iter().map(|(_, a)| a.errors).sum();
        let bytes: u64 = v.iter().map(|(_, a)| a.bytes).sum();
        let mean = v.iter().map(|(_, a)| ms(a.total_ns)).sum::<f64>() / v.len() as f64;
        let (slow, a) = v.iter().max_by_key(|(r, a)| (a.total_ns, std::cmp::Reverse(*r))).expect("non-empty");
        let _ = writeln!(
            s,
            "  {:<16} {:>8} {:>6} {:>14} {:>16.3} {:>14} {:>14.3}",
            k,
            count,
            errors,
            bytes,
            mean,
            slow,
            ms(a.total_ns)
        );
    }
    let mut links: Vec<(u32, u32, u64, u64)> = ranks
        .iter()
        .flat_map(|r| r.peers.iter().map(move |(p, x)| (r.rank, *p, x.sent_bytes, x.recv_wait_ns)))
        .collect();
    if links.is_empty() {
        let _ = writeln!(s, "  (per-peer figures need HCOMM_STATS_LEVEL=2)");
        return s;
    }
    links.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| (a.0, a.1).cmp(&(b.0, b.1))));
    let _ = writeln!(s, "  busiest links (bytes sent):");
    for (from, to, bytes, _) in links.iter().take(10) {
        let _ = writeln!(s, "    {from} -> {to}: {bytes}");
    }
    links.sort_by(|a, b| b.3.cmp(&a.3).then_with(|| (a.0, a.1).cmp(&(b.0, b.1))));
    let _ = writeln!(s, "  longest waits (rank waiting for peer):");
    for (from, to, _, wait) in links.iter().take(10) {
        let _ = writeln!(s, "    {from} waited for {to}: {:.3} ms", ms(*wait));
    }
    s
}

/// Reads per-rank statistics files.
///
/// # Errors
/// A file that cannot be read or is not a statistics file, named.
pub fn read_files(paths: &[std::path::PathBuf]) -> Result<Vec<RankStats>> {
    paths
        .iter()
        .map(|p| {
            let data = std::fs::read(p).map_err(|e| Error::io(format!("reading {}", p.display()), e))?;
            serde_json::from_slice(&data)
                .map_err(|e| Error::config(format!("{} is not an HComm statistics file: {e}", p.display())))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_grammar() {
        let vars = |v: &'static [(&'static str, &'static str)]| {
            move |k: &str| v.iter().find(|(n, _)| *n == k).map(|(_, x)| x.to_string())
        };
        assert_eq!(StatsConfig::from_vars(vars(&[])).unwrap(), None);
        assert_eq!(StatsConfig::from_vars(vars(&[("HCOMM_STATS", "0")])).unwrap(), None);
        let c = StatsConfig::from_vars(vars(&[("HCOMM_STATS", "1")])).unwrap().unwrap();
        assert_eq!(c, StatsConfig { level: 1, file: None });
        let c = StatsConfig::from_vars(vars(&[
            ("HCOMM_STATS", "1"),
            ("HCOMM_STATS_LEVEL", "2"),
            ("HCOMM_STATS_FILE", "/tmp/s.%r.json"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(c.level, 2);
        assert_eq!(c.file_for(3).unwrap(), "/tmp/s.3.json");
        assert_eq!(StatsConfig { level: 1, file: Some("out".into()) }.file_for(2).unwrap(), "out.2");
        for bad in [&[("HCOMM_STATS", "on")][..], &[("HCOMM_STATS", "1"), ("HCOMM_STATS_LEVEL", "3")]] {
            let e = StatsConfig::from_vars(vars(bad)).unwrap_err();
            assert!(e.to_string().contains("HCOMM_STATS"), "{e}");
        }
    }

    #[test]
    fn aggregates_and_buckets() {
        let mut a = Agg::default();
        a.add(30, 8, true);
        a.add(10, 8, false);
        assert_eq!(a, Agg { count: 2, errors: 1, total_ns: 40, min_ns: 10, max_ns: 30, bytes: 16 });
        assert_eq!(a.mean_ns(), 20);
        assert_eq!(size_bucket(0), -1);
        assert_eq!(size_bucket(1), 0);
        assert_eq!(size_bucket(1023), 9);
        assert_eq!(size_bucket(1024), 10);
    }
}
