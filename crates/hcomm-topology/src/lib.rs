//! Where the ranks of a job run, and the orders that follow from it.
//!
//! The model has three levels above a rank: its NUMA node, its host and its rack;
//! ranks in different racks talk through the spine. Each rank reports a
//! [`Placement`] at bootstrap:
//!
//! - the host identity ([`host_identity`]: hostname plus the kernel's boot id, so that
//!   two containers with one hostname on different machines stay apart);
//! - its rack, from `HCOMM_RACK`, else from a topology file (`HCOMM_TOPOLOGY`, see
//!   [`TopologyFile`]) that lists the hosts of each rack; hosts whose rack nobody
//!   names share one unnamed rack (a flat network);
//! - the NUMA node its CPUs belong to ([`numa_node`], from sysfs), if they lie in one.
//!
//! From those, [`Topology`] numbers hosts and racks, says which [`Level`] joins two
//! ranks, and orders rings so that each rack's ranks, and within it each host's, are
//! contiguous: a ring then crosses each rack boundary and each host boundary once in
//! each direction, instead of once per rank with an interleaved placement.
//!
//! Racks can also be inferred from measured round trips ([`racks_from_rtt`], used by
//! `Communicator::probe_racks` under `HCOMM_TOPOLOGY=probe`), and [`Grid`] places an
//! application's 2-D or 3-D grid so that neighbours share hosts and racks. The
//! per-level link costs of the algorithm selection live in `hcomm-collectives`
//! (`CostModel`), configured or measured by `Communicator::calibrate`.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use hcomm_core::{Error, Result};
use serde::{Deserialize, Serialize};

/// What one rank reports about where it runs.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Placement {
    /// Host identity ([`host_identity`]).
    pub host: String,
    /// Rack name, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rack: Option<String>,
    /// NUMA node of the rank's CPUs, if they lie in one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<u32>,
}

impl Placement {
    /// On host `host`, rack and NUMA node unknown.
    pub fn on_host(host: impl Into<String>) -> Placement {
        Placement { host: host.into(), rack: None, numa: None }
    }
}

/// The closest level two ranks share: the slowest kind of link between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// The same rank.
    Rank,
    /// The same host (shared memory).
    Host,
    /// Different hosts of one rack.
    Rack,
    /// Different racks: through the spine.
    Spine,
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Rank => "rank",
            Level::Host => "host",
            Level::Rack => "rack",
            Level::Spine => "spine",
        })
    }
}

/// The placement of the ranks of a communicator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    placements: Vec<Placement>,
    /// Host index of each rank; hosts are numbered in order of first appearance.
    host_of: Vec<usize>,
    hosts: Vec<String>,
    /// Rack index of each host; racks numbered in order of first appearance.
    rack_of_host: Vec<usize>,
    /// Rack names; `None` for the rack of the hosts nobody placed.
    racks: Vec<Option<String>>,
}

/// Numbers `keys` in order of first appearance.
fn number<K: std::hash::Hash + Eq + Clone>(keys: impl Iterator<Item = K>) -> (Vec<usize>, Vec<K>) {
    let mut index: HashMap<K, usize> = HashMap::new();
    let mut distinct = Vec::new();
    let of = keys
        .map(|k| {
            *index.entry(k.clone()).or_insert_with(|| {
                distinct.push(k);
                distinct.len() - 1
            })
        })
        .collect();
    (of, distinct)
}

impl Topology {
    /// All `n` ranks on one host.
    pub fn single_host(n: usize) -> Topology {
        Topology::from_placements(&vec![Placement::on_host("localhost"); n])
    }

    /// From the host identity each rank reported, in rank order (racks unknown).
    pub fn from_hosts<S: AsRef<str>>(ids: &[S]) -> Topology {
        let p: Vec<Placement> = ids.iter().map(|h| Placement::on_host(h.as_ref())).collect();
        Topology::from_placements(&p)
    }

    /// From what each rank reported, in rank order. A host's rack is the first rack
    /// one of its ranks names (a host is in one rack).
    pub fn from_placements(placements: &[Placement]) -> Topology {
        let (host_of, hosts) = number(placements.iter().map(|p| p.host.clone()));
        let mut rack_name: Vec<Option<String>> = vec![None; hosts.len()];
        for (p, &h) in placements.iter().zip(&host_of) {
            if rack_name[h].is_none() {
                rack_name[h].clone_from(&p.rack);
            }
        }
        let (rack_of_host, racks) = number(rack_name.into_iter());
        Topology { placements: placements.to_vec(), host_of, hosts, rack_of_host, racks }
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.host_of.len()
    }

    /// Number of distinct hosts.
    pub fn host_count(&self) -> usize {
        self.hosts.len()
    }

    /// Number of distinct racks (hosts nobody placed count as one).
    pub fn rack_count(&self) -> usize {
        self.racks.len()
    }

    /// Host index of `rank`.
    pub fn host_of(&self, rank: usize) -> usize {
        self.host_of[rank]
    }

    /// Rack index of `rank`.
    pub fn rack_of(&self, rank: usize) -> usize {
        self.rack_of_host[self.host_of[rank]]
    }

    /// NUMA node of `rank`, if known.
    pub fn numa_of(&self, rank: usize) -> Option<u32> {
        self.placements[rank].numa
    }

    /// Identity of host `h`.
    pub fn host_name(&self, h: usize) -> &str {
        &self.hosts[h]
    }

    /// Name of rack `r` (`None` for the hosts nobody placed).
    pub fn rack_name(&self, r: usize) -> Option<&str> {
        self.racks[r].as_deref()
    }

    /// What `rank` reported.
    pub fn placement(&self, rank: usize) -> &Placement {
        &self.placements[rank]
    }

    /// The closest level ranks `a` and `b` share.
    pub fn level(&self, a: usize, b: usize) -> Level {
        if a == b {
            Level::Rank
        } else if self.host_of[a] == self.host_of[b] {
            Level::Host
        } else if self.rack_of(a) == self.rack_of(b) {
            Level::Rack
        } else {
            Level::Spine
        }
    }

    /// The topology of a subset of ranks (`members[i]` is the old rank of new rank `i`).
    pub fn subset(&self, members: &[usize]) -> Topology {
        let p: Vec<Placement> = members
            .iter()
            .map(|&m| Placement { rack: self.racks[self.rack_of(m)].clone(), ..self.placements[m].clone() })
            .collect();
        Topology::from_placements(&p)
    }

    /// A ring over all ranks that visits each rack's ranks contiguously, and within a
    /// rack each host's, and within a host each NUMA node's: racks and hosts in order
    /// of first appearance, ranks in increasing order. Equal to `0..n` when ranks are
    /// already placed that way.
    pub fn ring_order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.size()).collect();
        order.sort_by_key(|&r| (self.rack_of(r), self.host_of[r], self.numa_of(r), r));
        order
    }

    /// The order of a tree or chain rooted at `root` over `ring` (a ring such as
    /// [`Topology::ring_order`] gives): `order[v]` is the rank at virtual rank `v`, the
    /// root at 0. The ring rotated to start at the root, with the rest of the root's
    /// host, then the rest of its rack, moved right after it, so that every host and
    /// every rack stays contiguous: a binomial tree over it crosses the spine once
    /// between two racks of equal power-of-two size, and a chain once per rack.
    pub fn tree_order(&self, ring: &[usize], root: usize) -> Vec<usize> {
        let n = ring.len();
        let at = ring.iter().position(|&r| r == root).expect("the ring holds the root");
        let mut order: Vec<usize> = (0..n).map(|i| ring[(at + i) % n]).collect();
        // Stable: the rotated ring order holds within each class.
        order.sort_by_key(|&r| (self.rack_of(r) != self.rack_of(root), self.host_of(r) != self.host_of(root)));
        order
    }

    /// Number of ring edges (including the closing one) whose ends share no level
    /// below `level`: with [`Level::Rack`], the edges that leave a host; with
    /// [`Level::Spine`], the edges that cross the spine.
    pub fn ring_crossings(&self, ring: &[usize], level: Level) -> usize {
        if ring.len() < 2 {
            return 0;
        }
        (0..ring.len()).filter(|&i| self.level(ring[i], ring[(i + 1) % ring.len()]) >= level).count()
    }

    /// Number of ring edges (including the closing one) that join two hosts.
    pub fn ring_host_crossings(&self, ring: &[usize]) -> usize {
        self.ring_crossings(ring, Level::Rack)
    }
}

impl fmt::Display for Topology {
    /// Racks, their hosts and each host's ranks (with NUMA nodes where known).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} ranks on {} hosts in {} racks", self.size(), self.host_count(), self.rack_count())?;
        for r in 0..self.rack_count() {
            writeln!(f, "rack {}", self.rack_name(r).unwrap_or("(unnamed)"))?;
            for h in (0..self.host_count()).filter(|&h| self.rack_of_host[h] == r) {
                let ranks: Vec<String> = (0..self.size())
                    .filter(|&k| self.host_of[k] == h)
                    .map(|k| match self.numa_of(k) {
                        Some(n) => format!("{k} (numa {n})"),
                        None => k.to_string(),
                    })
                    .collect();
                writeln!(f, "  host {}: ranks {}", self.host_name(h), ranks.join(", "))?;
            }
        }
        Ok(())
    }
}

/// A Cartesian grid of ranks (`dims`, row-major: the last dimension varies fastest),
/// each dimension periodic or not, with the neighbour arithmetic of `MPI_Cart_*`.
/// A grid position is a *grid rank*: `0..product(dims)` in row-major order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grid {
    dims: Vec<usize>,
    periodic: Vec<bool>,
}

impl Grid {
    /// A grid of `dims`, periodic where `periodic` says (missing entries: not).
    ///
    /// # Errors
    /// An invalid-argument error for no dimensions or a zero extent.
    pub fn new(dims: &[usize], periodic: &[bool]) -> Result<Grid> {
        if dims.is_empty() || dims.contains(&0) {
            return Err(Error::invalid(format!("grid dimensions {dims:?}: need at least one, none zero")));
        }
        let periodic = (0..dims.len()).map(|i| periodic.get(i).copied().unwrap_or(false)).collect();
        Ok(Grid { dims: dims.to_vec(), periodic })
    }

    /// The extents.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// Number of positions.
    pub fn size(&self) -> usize {
        self.dims.iter().product()
    }

    /// The coordinates of grid rank `g`.
    pub fn coords(&self, mut g: usize) -> Vec<usize> {
        let mut c = vec![0; self.dims.len()];
        for (i, &d) in self.dims.iter().enumerate().rev() {
            c[i] = g % d;
            g /= d;
        }
        c
    }

    /// The grid rank at `coords` (periodic dimensions wrap), or `None` off the grid.
    pub fn rank_at(&self, coords: &[isize]) -> Option<usize> {
        let mut g = 0;
        for ((&c, &d), &p) in coords.iter().zip(&self.dims).zip(&self.periodic) {
            let d = d as isize;
            let c = if p { c.rem_euclid(d) } else { c };
            if !(0..d).contains(&c) {
                return None;
            }
            g = g * d as usize + c as usize;
        }
        Some(g)
    }

    /// As `MPI_Cart_shift`: for grid rank `g`, the grid ranks `disp` steps back and
    /// forward along `dim` — the source to receive from and the destination to send
    /// to in a shift — each `None` where it falls off a non-periodic edge.
    pub fn shift(&self, g: usize, dim: usize, disp: isize) -> (Option<usize>, Option<usize>) {
        let c: Vec<isize> = self.coords(g).into_iter().map(|x| x as isize).collect();
        let mut back = c.clone();
        let mut forward = c;
        back[dim] -= disp;
        forward[dim] += disp;
        (self.rank_at(&back), self.rank_at(&forward))
    }

    /// The distinct grid ranks one step away from `g` in every dimension.
    pub fn neighbours(&self, g: usize) -> Vec<usize> {
        let mut n: Vec<usize> = (0..self.dims.len())
            .flat_map(|d| {
                let (a, b) = self.shift(g, d, 1);
                [a, b]
            })
            .flatten()
            .filter(|&x| x != g)
            .collect();
        n.sort_unstable();
        n.dedup();
        n
    }

    /// Where to put the ranks of `topo` on this grid: `order[g]` is the rank for grid
    /// rank `g`. Ranks in ring order (rack, host, NUMA node) fill the grid tile by
    /// tile: one tile per rack, its shape the one with the least surface that divides
    /// the grid, and inside it one sub-tile per host, again of least surface; so grid
    /// neighbours share a host, or else a rack, as often as the hardware allows. A
    /// level whose groups differ in size, or whose tile does not fit, is left out
    /// (hosts tiled straight over the grid); where no host tile fits either, ranks
    /// fill the grid in row-major order, which still keeps each host's ranks in whole
    /// rows where they fit.
    ///
    /// # Errors
    /// An invalid-argument error if the grid does not have `topo.size()` positions.
    pub fn placement(&self, topo: &Topology) -> Result<Vec<usize>> {
        if self.size() != topo.size() {
            return Err(Error::invalid(format!(
                "a grid of {:?} has {} positions for {} ranks",
                self.dims,
                self.size(),
                topo.size()
            )));
        }
        let ranks = topo.ring_order();
        // The group size at a level, if every group there has as many ranks.
        let equal = |groups: usize, of: &dyn Fn(usize) -> usize| -> Option<usize> {
            let sizes: Vec<usize> = (0..groups).map(|g| (0..topo.size()).filter(|&r| of(r) == g).count()).collect();
            sizes.iter().all(|&k| k == sizes[0]).then(|| sizes[0])
        };
        let per_host = equal(topo.host_count(), &|r| topo.host_of(r));
        let per_rack = equal(topo.rack_count(), &|r| topo.rack_of(r)).filter(|_| topo.rack_count() > 1);
        let levels: Vec<Vec<usize>> = match (per_rack, per_host) {
            (Some(r), Some(h)) => vec![vec![r, h], vec![h]],
            (None, Some(h)) => vec![vec![h]],
            _ => Vec::new(),
        };
        let cells = levels
            .iter()
            .find_map(|ks| nested_tiles(&self.dims, ks))
            .map(|coords| coords.iter().map(|c| self.index(c)).collect())
            .unwrap_or_else(|| (0..self.size()).collect::<Vec<usize>>());
        let mut order = vec![0; self.size()];
        for (cell, rank) in cells.into_iter().zip(ranks) {
            order[cell] = rank;
        }
        Ok(order)
    }

    /// Grid rank of in-range coordinates (row-major).
    fn index(&self, coords: &[usize]) -> usize {
        coords.iter().zip(&self.dims).fold(0, |acc, (&c, &d)| acc * d + c)
    }

    /// Number of neighbour pairs (each counted once) whose ranks under `order`
    /// (`order[g]`: the rank at grid rank `g`) share no level below `level` in `topo`.
    pub fn crossings(&self, order: &[usize], topo: &Topology, level: Level) -> usize {
        (0..self.size())
            .flat_map(|g| self.neighbours(g).into_iter().filter(move |&n| n > g).map(move |n| (g, n)))
            .filter(|&(g, n)| topo.level(order[g], order[n]) >= level)
            .count()
    }
}

/// Groups hosts into racks from their round-trip times (`rtt[a][b]`, seconds, for
/// `a != b`; symmetric): hosts whose round trip is under half the largest share a
/// rack (single linkage), the largest being a trip across the slowest level. When
/// the largest round trip is not at least twice the smallest, nothing sets racks
/// apart and every host is in rack 0. Noise only lengthens round trips, so the
/// minimum of several is the one to pass. Returns each host's rack, racks numbered
/// by their first host. Fewer than 3 hosts give one rack: two round trips cannot be
/// told apart without a third.
pub fn racks_from_rtt(rtt: &[Vec<f64>]) -> Vec<usize> {
    let h = rtt.len();
    let v: Vec<f64> =
        (0..h).flat_map(|a| (a + 1..h).map(move |b| (a, b))).map(|(a, b)| rtt[a][b]).filter(|x| *x > 0.0).collect();
    let (lo, hi) = v.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    if h < 3 || v.len() < 2 || hi < 2.0 * lo {
        return vec![0; h];
    }
    let threshold = hi / 2.0;
    let mut rack = vec![usize::MAX; h];
    let mut next = 0;
    for start in 0..h {
        if rack[start] != usize::MAX {
            continue;
        }
        rack[start] = next;
        let mut stack = vec![start];
        while let Some(a) = stack.pop() {
            for b in 0..h {
                if rack[b] == usize::MAX && rtt[a][b] > 0.0 && rtt[a][b] < threshold {
                    rack[b] = next;
                    stack.push(b);
                }
            }
        }
        next += 1;
    }
    rack
}

/// The tile of `k` positions whose extents divide `dims` with the least surface.
fn least_surface_tile(dims: &[usize], k: usize) -> Option<Vec<usize>> {
    fn search(dims: &[usize], k: usize, cur: &mut Vec<usize>, best: &mut Option<(usize, Vec<usize>)>) {
        let i = cur.len();
        if i == dims.len() {
            if k == 1 {
                let vol: usize = cur.iter().product();
                let surface = cur.iter().map(|&t| vol / t).sum();
                if best.as_ref().is_none_or(|(s, _)| surface < *s) {
                    *best = Some((surface, cur.clone()));
                }
            }
            return;
        }
        for t in (1..=dims[i]).filter(|t| dims[i].is_multiple_of(*t) && k.is_multiple_of(*t)) {
            cur.push(t);
            search(dims, k / t, cur, best);
            cur.pop();
        }
    }
    let mut best = None;
    search(dims, k, &mut Vec::new(), &mut best);
    best.map(|(_, t)| t)
}

/// The coordinates of a box of extents `dims`, ordered so that each run of `ks[0]`
/// consecutive positions is one least-surface tile of the box, each run of `ks[1]`
/// inside it one least-surface tile of that tile, and so on; positions in row-major
/// order inside the last level's tiles. `None` where some level has no tile.
fn nested_tiles(dims: &[usize], ks: &[usize]) -> Option<Vec<Vec<usize>>> {
    let Some((&k, rest)) = ks.split_first() else {
        let all = Grid { dims: dims.to_vec(), periodic: vec![false; dims.len()] };
        return Some((0..all.size()).map(|i| all.coords(i)).collect());
    };
    let tile = least_surface_tile(dims, k)?;
    let inside = nested_tiles(&tile, rest)?;
    let tiles = Grid { dims: dims.iter().zip(&tile).map(|(d, t)| d / t).collect(), periodic: vec![false; dims.len()] };
    let mut out = Vec::with_capacity(dims.iter().product());
    for t in 0..tiles.size() {
        let tc = tiles.coords(t);
        for pos in &inside {
            out.push(pos.iter().zip(&tc).zip(&tile).map(|((&p, &c), &w)| c * w + p).collect());
        }
    }
    Some(out)
}

/// The hostname part of a host identity or a hostname.
fn hostname_of(id: &str) -> &str {
    id.split('/').next().unwrap_or(id)
}

/// This machine's identity for grouping ranks by host: `hostname/boot-id`.
pub fn host_identity() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    format!("{}/{}", hostname(), boot.trim())
}

/// This machine's hostname.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map_or_else(|| String::from("unknown-host"), |h| h.trim().to_owned())
}

/// The racks of a cluster as a topology file describes them (`HCOMM_TOPOLOGY`).
///
/// TOML (or JSON, for a path ending in `.json`), a list of racks with the hostnames in
/// each:
///
/// ```toml
/// [[rack]]
/// name = "r1"
/// hosts = ["node01", "node02"]
///
/// [[rack]]
/// name = "r2"
/// hosts = ["node03", "node04"]
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologyFile {
    #[serde(default)]
    pub rack: Vec<RackEntry>,
}

/// One rack of a [`TopologyFile`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RackEntry {
    pub name: String,
    pub hosts: Vec<String>,
}

impl TopologyFile {
    /// Parses a topology file's text, JSON if `json`, else TOML, and checks that no
    /// host is in two racks and no rack name is empty or repeated.
    ///
    /// # Errors
    /// A configuration error saying what is wrong.
    pub fn parse(text: &str, json: bool) -> Result<TopologyFile> {
        let f: TopologyFile = if json {
            serde_json::from_str(text).map_err(|e| Error::config(format!("topology file: {e}")))?
        } else {
            toml::from_str(text).map_err(|e| Error::config(format!("topology file: {e}")))?
        };
        let mut seen: HashMap<&str, &str> = HashMap::new();
        let mut names: HashMap<&str, ()> = HashMap::new();
        for r in &f.rack {
            if r.name.trim().is_empty() {
                return Err(Error::config("topology file: a rack has an empty name"));
            }
            if names.insert(&r.name, ()).is_some() {
                return Err(Error::config(format!("topology file: rack {:?} appears twice", r.name)));
            }
            for h in &r.hosts {
                if let Some(other) = seen.insert(h, &r.name) {
                    return Err(Error::config(format!(
                        "topology file: host {h:?} is in rack {other:?} and in rack {:?}",
                        r.name
                    )));
                }
            }
        }
        Ok(f)
    }

    /// Reads and parses the file at `path` (JSON if it ends in `.json`).
    ///
    /// # Errors
    /// A configuration error naming the file.
    pub fn load(path: &Path) -> Result<TopologyFile> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::config(format!("cannot read the topology file {}: {e}", path.display())))?;
        let json = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("json"));
        TopologyFile::parse(&text, json).map_err(|e| Error::config(format!("{}: {e}", path.display())))
    }

    /// The rack of `host` (a hostname or a host identity).
    pub fn rack_of(&self, host: &str) -> Option<&str> {
        let name = hostname_of(host);
        self.rack.iter().find(|r| r.hosts.iter().any(|h| h == name)).map(|r| r.name.as_str())
    }
}

/// Parses a Linux CPU list (`0-3,8,10-11`).
fn parse_cpulist(s: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if b < a || b - a > 1 << 16 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.trim().parse().ok()?),
        }
    }
    Some(cpus)
}

/// The NUMA node whose CPUs include every CPU in `allowed`, among `nodes` (node
/// number, its CPU list).
fn node_holding(allowed: &[u32], nodes: &[(u32, Vec<u32>)]) -> Option<u32> {
    if allowed.is_empty() {
        return None;
    }
    nodes.iter().find(|(_, cpus)| allowed.iter().all(|c| cpus.contains(c))).map(|(n, _)| *n)
}

/// The NUMA node of this process: the node whose CPUs hold every CPU it may run on
/// (`Cpus_allowed_list` of `/proc/self/status` against
/// `/sys/devices/system/node/node*/cpulist`); `None` when the process may run on
/// several nodes or sysfs says nothing.
pub fn numa_node() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let allowed = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).and_then(parse_cpulist)?;
    let mut nodes = Vec::new();
    for e in std::fs::read_dir("/sys/devices/system/node").ok()?.flatten() {
        let name = e.file_name();
        let Some(n) = name.to_str().and_then(|s| s.strip_prefix("node")).and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Some(cpus) = std::fs::read_to_string(e.path().join("cpulist")).ok().and_then(|s| parse_cpulist(&s)) {
            nodes.push((n, cpus));
        }
    }
    node_holding(&allowed, &nodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placed(host: &str, rack: Option<&str>, numa: Option<u32>) -> Placement {
        Placement { host: host.into(), rack: rack.map(Into::into), numa }
    }

    #[test]
    fn interleaved_placement_gets_contiguous_ring() {
        let t = Topology::from_hosts(&["a", "b", "a", "b", "c", "a"]);
        assert_eq!(t.host_count(), 3);
        assert_eq!(t.rack_count(), 1);
        let ring = t.ring_order();
        assert_eq!(ring, vec![0, 2, 5, 1, 3, 4]);
        assert_eq!(t.ring_host_crossings(&(0..6).collect::<Vec<_>>()), 5);
        assert_eq!(t.ring_host_crossings(&ring), 3);
        let s = t.subset(&[1, 3, 4]);
        assert_eq!(s.ring_order(), vec![0, 1, 2]);
        assert_eq!(s.host_count(), 2);
    }

    #[test]
    fn racks_then_hosts_then_numa() {
        // Hosts h0..h3, racks r0 = {h0, h2}, r1 = {h1, h3}, two ranks per host,
        // placed round-robin over the hosts (the worst case for a flat ring).
        let hosts = ["h0", "h1", "h2", "h3"];
        let p: Vec<Placement> = (0..8)
            .map(|i| {
                let h = i % 4;
                placed(hosts[h], Some(if h % 2 == 0 { "r0" } else { "r1" }), Some((i / 4) as u32))
            })
            .collect();
        let t = Topology::from_placements(&p);
        assert_eq!((t.rack_count(), t.host_count()), (2, 4));
        assert_eq!(t.rack_name(t.rack_of(3)), Some("r1"));
        assert_eq!(t.level(0, 0), Level::Rank);
        assert_eq!(t.level(0, 4), Level::Host);
        assert_eq!(t.level(0, 2), Level::Rack);
        assert_eq!(t.level(0, 1), Level::Spine);
        let flat: Vec<usize> = (0..8).collect();
        assert_eq!(t.ring_crossings(&flat, Level::Spine), 8);
        let ring = t.ring_order();
        assert_eq!(ring, vec![0, 4, 2, 6, 1, 5, 3, 7]);
        assert_eq!(t.ring_crossings(&ring, Level::Spine), 2);
        assert_eq!(t.ring_crossings(&ring, Level::Rack), 4);
        // A subset keeps the racks.
        let s = t.subset(&[1, 2, 3]);
        assert_eq!((s.rack_count(), s.level(0, 2)), (2, Level::Rack));
        let shown = t.to_string();
        assert!(shown.starts_with("8 ranks on 4 hosts in 2 racks"), "{shown}");
        assert!(shown.contains("rack r1\n  host h1: ranks 1 (numa 0), 5 (numa 1)"), "{shown}");
    }

    #[test]
    fn unplaced_hosts_share_a_rack_and_the_first_named_rack_wins() {
        let t = Topology::from_placements(&[
            placed("a", None, None),
            placed("b", Some("r"), None),
            placed("b", Some("other"), None),
            placed("c", None, None),
        ]);
        assert_eq!(t.rack_count(), 2);
        assert_eq!(t.rack_of(0), t.rack_of(3));
        assert_eq!(t.rack_name(t.rack_of(2)), Some("r"));
        assert_eq!(t.rack_name(t.rack_of(0)), None);
    }

    #[test]
    fn single_host_is_identity() {
        assert_eq!(Topology::single_host(4).ring_order(), vec![0, 1, 2, 3]);
        assert!(host_identity().contains('/'));
        assert_eq!(hostname_of(&host_identity()), hostname());
    }

    #[test]
    fn topology_files_in_toml_and_json() {
        let toml_text =
            "[[rack]]\nname = \"r1\"\nhosts = [\"n1\", \"n2\"]\n\n[[rack]]\nname = \"r2\"\nhosts = [\"n3\"]\n";
        let t = TopologyFile::parse(toml_text, false).unwrap();
        assert_eq!(t.rack_of("n2"), Some("r1"));
        assert_eq!(t.rack_of("n3/0123-boot"), Some("r2"));
        assert_eq!(t.rack_of("n4"), None);
        let j = TopologyFile::parse(&serde_json::to_string(&t).unwrap(), true).unwrap();
        assert_eq!(j, t);
        for (bad, what) in [
            ("[[rack]]\nname = \"r1\"\nhosts = [\"n1\"]\n[[rack]]\nname = \"r2\"\nhosts = [\"n1\"]\n", "in rack"),
            ("[[rack]]\nname = \"r1\"\nhosts = []\n[[rack]]\nname = \"r1\"\nhosts = []\n", "twice"),
            ("[[rack]]\nname = \"\"\nhosts = []\n", "empty"),
            ("[[rack]]\nname = \"r\"\nhost = []\n", "unknown field"),
            ("rack = 3", "invalid type"),
        ] {
            let e = TopologyFile::parse(bad, false).unwrap_err().to_string();
            assert!(e.contains(what), "{bad:?}: {e}");
        }
        let e = TopologyFile::load(Path::new("/nonexistent/topo.toml")).unwrap_err().to_string();
        assert!(e.contains("/nonexistent/topo.toml"), "{e}");
    }

    #[test]
    fn grid_arithmetic_as_mpi_cart() {
        let g = Grid::new(&[3, 4], &[false, true]).unwrap();
        assert_eq!(g.size(), 12);
        assert_eq!(g.coords(7), vec![1, 3]);
        assert_eq!(g.rank_at(&[1, 3]), Some(7));
        assert_eq!(g.rank_at(&[1, 4]), Some(4), "dimension 1 wraps");
        assert_eq!(g.rank_at(&[3, 0]), None, "dimension 0 does not");
        assert_eq!(g.shift(7, 0, 1), (Some(3), Some(11)));
        assert_eq!(g.shift(3, 0, 1), (None, Some(7)));
        assert_eq!(g.shift(7, 1, 1), (Some(6), Some(4)));
        assert_eq!(g.neighbours(0), vec![1, 3, 4]);
        assert_eq!(Grid::new(&[2], &[true]).unwrap().neighbours(0), vec![1]);
        assert!(Grid::new(&[], &[]).is_err() && Grid::new(&[2, 0], &[]).is_err());
    }

    #[test]
    fn grid_placement_keeps_neighbours_on_a_host() {
        // 64 ranks, 8 per host, placed round-robin (rank r on host r % 8): an 8 x 8
        // grid in rank order puts each column on one host, so every one of the 56
        // horizontal neighbour pairs joins two hosts.
        let ids: Vec<String> = (0..64).map(|r| format!("h{}", r % 8)).collect();
        let t = Topology::from_hosts(&ids);
        let g = Grid::new(&[8, 8], &[]).unwrap();
        let naive: Vec<usize> = (0..64).collect();
        let placed = g.placement(&t).unwrap();
        let mut sorted = placed.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, naive, "a permutation of the ranks");
        let (before, after) = (g.crossings(&naive, &t, Level::Rack), g.crossings(&placed, &t, Level::Rack));
        assert_eq!(before, 56);
        // One 2 x 4 tile per host; only pairs across tile edges cross: 8 across the
        // one vertical edge, 3 x 8 across the three horizontal ones.
        assert_eq!(least_surface_tile(&[8, 8], 8), Some(vec![2, 4]));
        assert_eq!(after, 32);
        // Unequal hosts: row-major over the ring order.
        let t = Topology::from_hosts(&["a", "b", "a", "a", "b", "a"]);
        let g = Grid::new(&[2, 3], &[]).unwrap();
        let placed = g.placement(&t).unwrap();
        assert_eq!(g.crossings(&placed, &t, Level::Rack), 3);
        assert!(Grid::new(&[2, 2], &[]).unwrap().placement(&t).is_err());
    }

    #[test]
    fn grid_placement_keeps_racks_together_too() {
        // 8 ranks, rank r on host r % 4, host h in rack h % 2: in rank order a 2 x 4
        // grid has 6 of its 10 neighbour pairs across racks.
        let p: Vec<Placement> = (0..8)
            .map(|r| Placement { host: format!("h{}", r % 4), rack: Some(format!("r{}", r % 4 % 2)), numa: None })
            .collect();
        let t = Topology::from_placements(&p);
        let g = Grid::new(&[2, 4], &[]).unwrap();
        let naive: Vec<usize> = (0..8).collect();
        assert_eq!(g.crossings(&naive, &t, Level::Spine), 6);
        // One 2 x 2 tile per rack, one 1 x 2 tile per host inside it: only the two
        // pairs across the middle column edge cross racks.
        let placed = g.placement(&t).unwrap();
        assert_eq!(g.crossings(&placed, &t, Level::Spine), 2);
        assert_eq!(g.crossings(&placed, &t, Level::Rack), 6);
        for r in 0..8 {
            let at = placed.iter().position(|&x| x == r).unwrap();
            let mate = placed.iter().position(|&x| x != r && t.host_of(x) == t.host_of(r)).unwrap();
            assert!(g.neighbours(at).contains(&mate), "rank {r} and its host mate are not neighbours");
        }
        // Racks of different sizes: hosts tiled straight over the grid.
        let mut p2 = p.clone();
        p2[1].rack = Some("r0".into());
        p2[5].rack = Some("r0".into());
        let t2 = Topology::from_placements(&p2);
        assert_eq!(g.crossings(&g.placement(&t2).unwrap(), &t2, Level::Rack), 6);
        assert_eq!(nested_tiles(&[2, 4], &[4, 2]).unwrap().len(), 8);
        assert_eq!(nested_tiles(&[2, 4], &[3]), None);
    }

    #[test]
    fn binomial_trees_cross_the_spine_once() {
        // 8 ranks, host r % 4, rack h % 2 (interleaved); a binomial tree in rank order
        // from root 0 crosses the spine on 4 of its 7 edges.
        let p: Vec<Placement> = (0..8)
            .map(|r| Placement { host: format!("h{}", r % 4), rack: Some(format!("r{}", r % 4 % 2)), numa: None })
            .collect();
        let t = Topology::from_placements(&p);
        let edges = |order: &[usize]| -> Vec<(usize, usize)> {
            let mut e = Vec::new();
            for v in 1..order.len() {
                // The parent of v in a binomial tree: v without its lowest set bit.
                e.push((order[v & (v - 1)], order[v]));
            }
            e
        };
        let spine = |order: &[usize]| edges(order).iter().filter(|&&(a, b)| t.level(a, b) == Level::Spine).count();
        let host = |order: &[usize]| edges(order).iter().filter(|&&(a, b)| t.level(a, b) >= Level::Rack).count();
        assert_eq!(spine(&(0..8).collect::<Vec<_>>()), 4);
        let ring = t.ring_order();
        for root in 0..8 {
            let order = t.tree_order(&ring, root);
            assert_eq!(order[0], root);
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..8).collect::<Vec<_>>());
            assert_eq!(spine(&order), 1, "root {root}: {order:?}");
            // 4 hosts of 2: 3 edges must join hosts, and no more are used.
            assert_eq!(host(&order), 3, "root {root}: {order:?}");
            // A chain over the order leaves the root's rack once.
            let chain = (1..8).filter(|&v| t.level(order[v - 1], order[v]) == Level::Spine).count();
            assert_eq!(chain, 1);
        }
    }

    #[test]
    fn racks_from_round_trips() {
        // A 4-host matrix from the round trip between two distinct hosts.
        let matrix = |f: &dyn Fn(usize, usize) -> f64| -> Vec<Vec<f64>> {
            (0..4).map(|a| (0..4).map(|b| if a == b { 0.0 } else { f(a, b) }).collect()).collect()
        };
        // Hosts 0 and 2 in one rack, 1 and 3 in the other: 0.1 ms inside, 2 ms across.
        let rack = [0, 1, 0, 1];
        let rtt = matrix(&|a, b| if rack[a] == rack[b] { 1e-4 } else { 2e-3 });
        assert_eq!(racks_from_rtt(&rtt), vec![0, 1, 0, 1]);
        // Jitter within 2x: one rack.
        let flat = matrix(&|a, b| 1e-4 * (1.0 + (a + b) as f64 / 10.0));
        assert_eq!(racks_from_rtt(&flat), vec![0; 4]);
        // Two hosts: undecidable, one rack.
        assert_eq!(racks_from_rtt(&[vec![0.0, 5e-3], vec![5e-3, 0.0]]), vec![0, 0]);
        // Noisy trips inside the racks (one 6x the other) still fall under half the
        // trips across.
        let noisy = matrix(&|a, b| {
            if rack[a] == rack[b] { 1e-4 * (1 + 5 * (a % 2)) as f64 } else { 2e-3 + 1e-4 * (a + b) as f64 }
        });
        assert_eq!(racks_from_rtt(&noisy), vec![0, 1, 0, 1]);
        // Three racks of one host each and one of two.
        let r3 = [0, 1, 2, 0];
        let rtt3 = matrix(&|a, b| if r3[a] == r3[b] { 5e-5 } else { 1e-3 });
        assert_eq!(racks_from_rtt(&rtt3), vec![0, 1, 2, 0]);
    }

    #[test]
    fn cpu_lists_and_numa_nodes() {
        assert_eq!(parse_cpulist("0-3,8,10-11\n"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(parse_cpulist(""), Some(vec![]));
        assert_eq!(parse_cpulist("3-1"), None);
        assert_eq!(parse_cpulist("x"), None);
        let nodes = vec![(0, vec![0, 1, 2, 3]), (1, vec![4, 5, 6, 7])];
        assert_eq!(node_holding(&[1, 2], &nodes), Some(0));
        assert_eq!(node_holding(&[5], &nodes), Some(1));
        assert_eq!(node_holding(&[3, 4], &nodes), None);
        assert_eq!(node_holding(&[], &nodes), None);
        // Whatever this machine has, asking does not fail.
        let _ = numa_node();
    }
}
