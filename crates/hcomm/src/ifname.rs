//! `HCOMM_IFNAME`: which local interface the ranks' listeners use.
//!
//! Grammar: a comma-separated list of items; an item is a pattern, or `^` and a
//! pattern to exclude what it matches. A pattern is
//!
//! - an interface name, matched exactly: `eth0`;
//! - a name prefix ending in `*`: `ib*`, `enp*`;
//! - a network in CIDR notation, matched against the interface's addresses:
//!   `10.0.0.0/8`, `fd00::/8`.
//!
//! An address is eligible when it matches at least one inclusion (any address, when
//! the list has only exclusions) and no exclusion. With no inclusion, loopback
//! addresses are left out too: name `lo` or `127.0.0.0/8` to get them. Among the
//! eligible addresses, the one through which this rank reaches the rendezvous store
//! wins if it is eligible; otherwise the first IPv4 address, then the first IPv6 one,
//! in the system's interface order.
//!
//! Nothing eligible is an error that lists this host's interfaces, never a silent
//! fallback (to 127.0.0.1 or anything else).
//!
//! ```text
//! HCOMM_IFNAME=eth0            exactly eth0
//! HCOMM_IFNAME=ib*,eth1        any InfiniBand IPoIB interface, or eth1
//! HCOMM_IFNAME=^docker*,^veth* anything but loopback, docker and veth interfaces
//! HCOMM_IFNAME=10.1.0.0/16     the interface with an address in 10.1.0.0/16
//! ```

use std::net::IpAddr;

use hcomm_core::{Error, Result};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    Name(String),
    Prefix(String),
    Net(IpAddr, u8),
}

impl Pattern {
    fn matches(&self, name: &str, ip: IpAddr) -> bool {
        match self {
            Pattern::Name(n) => name == n,
            Pattern::Prefix(p) => name.starts_with(p.as_str()),
            Pattern::Net(net, bits) => in_network(ip, *net, *bits),
        }
    }
}

fn in_network(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = if bits == 0 { 0 } else { u32::MAX << (32 - u32::from(bits)) };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = if bits == 0 { 0 } else { u128::MAX << (128 - u32::from(bits)) };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// A parsed `HCOMM_IFNAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfSpec {
    text: String,
    include: Vec<Pattern>,
    exclude: Vec<Pattern>,
}

fn bad(text: &str, why: impl std::fmt::Display) -> Error {
    Error::config(format!(
        "HCOMM_IFNAME={text:?}: {why} (expected a comma-separated list of names, prefixes ending in '*', or CIDR \
         networks, each optionally preceded by '^' to exclude)"
    ))
}

impl IfSpec {
    /// Parses the grammar of the module documentation.
    ///
    /// # Errors
    /// A configuration error naming `HCOMM_IFNAME` and what is wrong.
    pub fn parse(text: &str) -> Result<IfSpec> {
        let mut spec = IfSpec { text: text.to_owned(), include: Vec::new(), exclude: Vec::new() };
        for item in text.split(',').map(str::trim) {
            let (negated, pat) = match item.strip_prefix('^') {
                Some(rest) => (true, rest.trim()),
                None => (false, item),
            };
            if pat.is_empty() {
                return Err(bad(text, "an empty item"));
            }
            let pattern = if let Some((net, bits)) = pat.split_once('/') {
                let net: IpAddr = net.parse().map_err(|_| bad(text, format!("{net:?} is not an IP address")))?;
                let max = if net.is_ipv4() { 32 } else { 128 };
                let bits: u8 = bits
                    .parse()
                    .ok()
                    .filter(|&b| b <= max)
                    .ok_or_else(|| bad(text, format!("{bits:?} is not a prefix length up to {max}")))?;
                Pattern::Net(net, bits)
            } else if let Some(prefix) = pat.strip_suffix('*') {
                if prefix.contains('*') {
                    return Err(bad(text, format!("{pat:?}: '*' may only end a prefix")));
                }
                Pattern::Prefix(prefix.to_owned())
            } else if pat.contains('*') || pat.chars().any(char::is_whitespace) {
                return Err(bad(text, format!("{pat:?} is not an interface name")));
            } else {
                Pattern::Name(pat.to_owned())
            };
            if negated { spec.exclude.push(pattern) } else { spec.include.push(pattern) }
        }
        Ok(spec)
    }

    fn eligible(&self, name: &str, ip: IpAddr) -> bool {
        let included =
            if self.include.is_empty() { !ip.is_loopback() } else { self.include.iter().any(|p| p.matches(name, ip)) };
        included && !self.exclude.iter().any(|p| p.matches(name, ip))
    }

    /// Chooses among `interfaces` (name and address, in the system's order), as the
    /// module documentation says; `preferred` is the address through which this rank
    /// reaches the store.
    ///
    /// # Errors
    /// A configuration error listing the interfaces when none is eligible.
    pub fn choose(&self, interfaces: &[(String, IpAddr)], preferred: IpAddr) -> Result<IpAddr> {
        let eligible: Vec<IpAddr> =
            interfaces.iter().filter(|(n, ip)| self.eligible(n, *ip)).map(|(_, ip)| *ip).collect();
        if eligible.contains(&preferred) {
            return Ok(preferred);
        }
        if let Some(ip) = eligible.iter().find(|ip| ip.is_ipv4()).or(eligible.first()) {
            return Ok(*ip);
        }
        let here: Vec<String> = interfaces.iter().map(|(n, ip)| format!("{n} {ip}")).collect();
        Err(Error::config(format!(
            "HCOMM_IFNAME={:?} matches no interface of this host (interfaces: {})",
            self.text,
            if here.is_empty() { String::from("none") } else { here.join(", ") }
        )))
    }
}

/// This host's interfaces that are up, with their IPv4 and IPv6 addresses.
///
/// # Errors
/// An I/O error if the system will not list them.
pub fn interfaces() -> Result<Vec<(String, IpAddr)>> {
    let list = nix::ifaddrs::getifaddrs().map_err(|e| Error::io("listing network interfaces", e.into()))?;
    let mut out = Vec::new();
    for ifa in list {
        if !ifa.flags.contains(nix::net::if_::InterfaceFlags::IFF_UP) {
            continue;
        }
        let Some(addr) = ifa.address else { continue };
        let ip = if let Some(v4) = addr.as_sockaddr_in() {
            IpAddr::V4(v4.ip())
        } else if let Some(v6) = addr.as_sockaddr_in6() {
            IpAddr::V6(v6.ip())
        } else {
            continue;
        };
        out.push((ifa.interface_name, ip));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> Vec<(String, IpAddr)> {
        [
            ("lo", "127.0.0.1"),
            ("eth0", "192.168.1.10"),
            ("docker0", "172.17.0.1"),
            ("ib0", "10.1.2.3"),
            ("ib1", "10.2.0.7"),
            ("eth0", "fe80::1"),
            ("lo", "::1"),
        ]
        .iter()
        .map(|(n, ip)| (n.to_string(), ip.parse().unwrap()))
        .collect()
    }

    fn pick(spec: &str, preferred: &str) -> Result<String> {
        IfSpec::parse(spec)?.choose(&host(), preferred.parse().unwrap()).map(|ip| ip.to_string())
    }

    #[test]
    fn names_prefixes_networks_and_exclusions() {
        let via = "192.168.1.10";
        assert_eq!(pick("eth0", via).unwrap(), "192.168.1.10");
        assert_eq!(pick("ib*", via).unwrap(), "10.1.2.3");
        // The store's route wins when eligible.
        assert_eq!(pick("ib*", "10.2.0.7").unwrap(), "10.2.0.7");
        assert_eq!(pick("10.2.0.0/16", via).unwrap(), "10.2.0.7");
        assert_eq!(pick("ib*,^ib0", via).unwrap(), "10.2.0.7");
        assert_eq!(pick("^eth*,^docker*", via).unwrap(), "10.1.2.3");
        // Only exclusions: loopback stays out unless named.
        assert_eq!(pick("^eth0,^docker0,^ib*", via).unwrap_err().kind(), hcomm_core::ErrorKind::Config);
        assert_eq!(pick("lo", via).unwrap(), "127.0.0.1");
        assert_eq!(pick("127.0.0.0/8", via).unwrap(), "127.0.0.1");
        // IPv4 before IPv6; an IPv6 network picks IPv6.
        assert_eq!(pick("eth0", "10.9.9.9").unwrap(), "192.168.1.10");
        assert_eq!(pick("fe80::/10", via).unwrap(), "fe80::1");
        assert_eq!(pick(" eth0 , ^ docker0 ", via).unwrap(), "192.168.1.10");
    }

    #[test]
    fn nothing_eligible_lists_the_interfaces() {
        let e = pick("wlan*", "192.168.1.10").unwrap_err();
        let text = e.to_string();
        assert!(text.contains("HCOMM_IFNAME=\"wlan*\" matches no interface"), "{text}");
        assert!(text.contains("ib1 10.2.0.7"), "{text}");
    }

    #[test]
    fn malformed_specs_are_refused() {
        for spec in ["", "eth0,", "^", "e*th", "10.0.0.0/33", "fe80::/129", "1.2.3/8", "eth 0", "10.0.0.0/x"] {
            let e = IfSpec::parse(spec).unwrap_err();
            assert!(e.to_string().contains("HCOMM_IFNAME"), "{spec}: {e}");
        }
    }

    #[test]
    fn this_host_has_loopback() {
        let ifs = interfaces().unwrap();
        assert!(ifs.iter().any(|(n, ip)| n == "lo" && ip.is_loopback()), "{ifs:?}");
    }
}
