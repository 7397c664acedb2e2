//! Where the ranks of a job run, and the orders that follow from it.
//!
//! This first version knows one level, the host: ranks report a host identity at
//! bootstrap ([`host_identity`]: hostname plus the kernel's boot id, so that two
//! containers with one hostname on different machines stay apart), and rings keep the
//! ranks of one host next to each other, so that a ring crosses each host boundary
//! once in each direction instead of once per rank. Racks, measured links and
//! hierarchical trees come later.

use std::collections::HashMap;

/// The placement of the ranks of a communicator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// Host index of each rank; hosts are numbered in order of first appearance.
    host_of: Vec<usize>,
    hosts: Vec<String>,
}

impl Topology {
    /// All `n` ranks on one host.
    pub fn single_host(n: usize) -> Topology {
        Topology { host_of: vec![0; n], hosts: vec![String::from("localhost")] }
    }

    /// From the host identity each rank reported, in rank order.
    pub fn from_hosts<S: AsRef<str>>(ids: &[S]) -> Topology {
        let mut index: HashMap<&str, usize> = HashMap::new();
        let mut hosts = Vec::new();
        let host_of = ids
            .iter()
            .map(|id| {
                *index.entry(id.as_ref()).or_insert_with(|| {
                    hosts.push(id.as_ref().to_owned());
                    hosts.len() - 1
                })
            })
            .collect();
        Topology { host_of, hosts }
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.host_of.len()
    }

    /// Number of distinct hosts.
    pub fn host_count(&self) -> usize {
        self.hosts.len()
    }

    /// Host index of `rank`.
    pub fn host_of(&self, rank: usize) -> usize {
        self.host_of[rank]
    }

    /// Identity of host `h`.
    pub fn host_name(&self, h: usize) -> &str {
        &self.hosts[h]
    }

    /// The topology of a subset of ranks (`members[i]` is the old rank of new rank `i`).
    pub fn subset(&self, members: &[usize]) -> Topology {
        let ids: Vec<&str> = members.iter().map(|&m| self.hosts[self.host_of[m]].as_str()).collect();
        Topology::from_hosts(&ids)
    }

    /// A ring over all ranks that visits each host's ranks contiguously: hosts in
    /// order of first appearance, ranks in increasing order within a host. Equal to
    /// `0..n` when ranks are already placed host by host.
    pub fn ring_order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.size()).collect();
        order.sort_by_key(|&r| (self.host_of[r], r));
        order
    }

    /// Number of ring edges (including the closing one) that join two hosts.
    pub fn ring_host_crossings(&self, ring: &[usize]) -> usize {
        if ring.len() < 2 {
            return 0;
        }
        (0..ring.len()).filter(|&i| self.host_of[ring[i]] != self.host_of[ring[(i + 1) % ring.len()]]).count()
    }
}

/// This machine's identity for grouping ranks by host: `hostname/boot-id`.
pub fn host_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| String::from("unknown-host"));
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    format!("{}/{}", host.trim(), boot.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaved_placement_gets_contiguous_ring() {
        let t = Topology::from_hosts(&["a", "b", "a", "b", "c", "a"]);
        assert_eq!(t.host_count(), 3);
        let ring = t.ring_order();
        assert_eq!(ring, vec![0, 2, 5, 1, 3, 4]);
        assert_eq!(t.ring_host_crossings(&(0..6).collect::<Vec<_>>()), 5);
        assert_eq!(t.ring_host_crossings(&ring), 3);
        let s = t.subset(&[1, 3, 4]);
        assert_eq!(s.ring_order(), vec![0, 1, 2]);
        assert_eq!(s.host_count(), 2);
    }

    #[test]
    fn single_host_is_identity() {
        assert_eq!(Topology::single_host(4).ring_order(), vec![0, 1, 2, 3]);
        assert!(host_identity().contains('/'));
    }
}
