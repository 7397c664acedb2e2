//! Connection setup for the TCP transports: the handshake every connection starts
//! with, and the full mesh between the ranks of a job.
//!
//! The handshake authenticates both ends with the job key (`hcomm_core::auth`):
//!
//! 1. the dialer sends its hello (magic, protocol version, a hash of the job id, the
//!    source and destination ranks, the job size; 32 bytes) and a nonce;
//! 2. the acceptor checks the hello and answers with its acknowledgement, its own
//!    nonce and its proof of the key over both hellos and nonces;
//! 3. the dialer checks that proof and sends its own.
//!
//! A connection that does not complete this for this job and this rank within the
//! handshake timeout, or whose proof is wrong, is logged and closed; the job goes on
//! accepting the connections it expects.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use hcomm_core::auth::{JobKey, PROOF_LEN};
use hcomm_core::{Error, ErrorKind, OpKind, Rank, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::time::{Instant, timeout, timeout_at};

const HELLO_MAGIC: [u8; 4] = *b"HCMH";
/// Version of the handshake (2: with proofs of the job key; 3: with the link index
/// and count, for several connections per peer; 4: the same hello, but bundles of
/// several connections send probe segments, which a version-3 peer refuses; 5: the
/// same, but shared-memory links carry lent messages and their releases, frame kinds
/// a version-4 peer refuses; 6: the same, but shared-memory rings carry boxes,
/// which a version-5 peer refuses).
const HELLO_VERSION: u8 = 6;
const HELLO_LEN: usize = 32;
const KIND_HELLO: u8 = 1;
const KIND_ACK: u8 = 2;

/// Timeouts and identity for connection setup.
#[derive(Debug, Clone)]
pub struct MeshOptions {
    /// Hash of the job id: connections from other jobs are refused.
    pub job: u64,
    /// The job's key: connections that cannot prove it are refused.
    pub key: JobKey,
    /// Deadline for the whole mesh (every expected connection made and accepted).
    pub timeout: Duration,
    /// How long one connection may take to complete its handshake.
    pub handshake_timeout: Duration,
    /// The TCP congestion control of the connections (`HCOMM_TCP_CONGESTION`).
    pub congestion: Congestion,
}

/// Which TCP congestion control the connections between ranks use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Congestion {
    /// Reno where the system's default is BBR or CUBIC (Linux's default), else
    /// the system's (DCTCP, say, which a data centre chose on purpose). BBR paces
    /// segments at its estimate of the path's bandwidth, which drops after the
    /// spurious retransmissions of microsecond round trips, and CUBIC was slower
    /// than Reno where ranks outnumber processors (`docs/tuning-rules.md`). Reno is
    /// built into every Linux kernel and always allowed to unprivileged processes.
    #[default]
    Auto,
    /// The system's default (`net.ipv4.tcp_congestion_control`), whatever it is.
    System,
    /// This one, by its kernel name (`cubic`, `reno`, `dctcp`...): it must be
    /// available and, for unprivileged processes, allowed
    /// (`net.ipv4.tcp_allowed_congestion_control`).
    Named(String),
}

impl Congestion {
    /// Parses `HCOMM_TCP_CONGESTION`'s value: `auto`, `system` or a kernel name; the
    /// name is checked against the kernel on a socket of its own.
    ///
    /// # Errors
    /// A configuration error when the value is empty or the kernel refuses the name.
    pub fn parse(value: &str) -> Result<Congestion> {
        let v = value.trim();
        let c = match v {
            "auto" => Congestion::Auto,
            "system" => Congestion::System,
            _ if v.is_empty() || v.len() >= 16 || !v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') => {
                return Err(Error::config(format!(
                    "HCOMM_TCP_CONGESTION={value:?}: expected auto, system or a kernel congestion control name"
                )));
            }
            _ => Congestion::Named(v.to_owned()),
        };
        if let Congestion::Named(name) = &c {
            let probe = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                .and_then(|s| s.set_tcp_congestion(name.as_bytes()));
            if let Err(e) = probe {
                let list = |f: &str| {
                    std::fs::read_to_string(format!("/proc/sys/net/ipv4/{f}"))
                        .map_or_else(|_| "?".into(), |s| s.trim().to_owned())
                };
                return Err(Error::config(format!(
                    "HCOMM_TCP_CONGESTION={name}: the kernel refused it ({e}); available: {}; allowed without privileges: {}",
                    list("tcp_available_congestion_control"),
                    list("tcp_allowed_congestion_control")
                )));
            }
        }
        Ok(c)
    }

    /// Sets the congestion control of `s` as chosen. `Auto` keeps the system's
    /// where Reno cannot be set; a name that the kernel refuses is an error
    /// ([`Congestion::parse`] checks it once, before any connection).
    fn apply(&self, s: &TcpStream) -> std::io::Result<()> {
        let sock = socket2::SockRef::from(s);
        match self {
            Congestion::System => Ok(()),
            Congestion::Named(name) => sock.set_tcp_congestion(name.as_bytes()),
            Congestion::Auto => {
                // The kernel pads the name with NULs.
                let replace = |cc: Vec<u8>| {
                    let name = cc.split(|&b| b == 0).next().unwrap_or_default();
                    name.starts_with(b"bbr") || name == b"cubic"
                };
                if sock.tcp_congestion().is_ok_and(replace)
                    && let Err(e) = sock.set_tcp_congestion(b"reno")
                {
                    tracing::debug!(error = %e, "kept the system's congestion control: Reno could not be set");
                }
                Ok(())
            }
        }
    }
}

impl Default for MeshOptions {
    fn default() -> MeshOptions {
        MeshOptions {
            job: 0,
            key: JobKey::default(),
            timeout: Duration::from_secs(60),
            handshake_timeout: Duration::from_secs(5),
            congestion: Congestion::Auto,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hello {
    kind: u8,
    job: u64,
    src: u32,
    dst: u32,
    size: u32,
    /// Which of the `links` connections between the two ranks this is.
    link: u8,
    links: u8,
}

impl Hello {
    fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..4].copy_from_slice(&HELLO_MAGIC);
        b[4] = HELLO_VERSION;
        b[5] = self.kind;
        b[6] = self.link;
        b[7] = self.links;
        b[8..16].copy_from_slice(&self.job.to_le_bytes());
        b[16..20].copy_from_slice(&self.src.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst.to_le_bytes());
        b[24..28].copy_from_slice(&self.size.to_le_bytes());
        b
    }

    fn decode(b: &[u8; HELLO_LEN]) -> std::result::Result<Hello, String> {
        if b[0..4] != HELLO_MAGIC {
            return Err(format!("bad handshake magic {:02x?}", &b[0..4]));
        }
        if b[4] != HELLO_VERSION {
            return Err(format!("handshake version {} (this build speaks {HELLO_VERSION})", b[4]));
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut job = [0u8; 8];
        job.copy_from_slice(&b[8..16]);
        Ok(Hello {
            kind: b[5],
            job: u64::from_le_bytes(job),
            src: u32_at(16),
            dst: u32_at(20),
            size: u32_at(24),
            link: b[6],
            links: b[7],
        })
    }
}

fn boot_err(rank: Rank, msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Bootstrap, msg).at_rank(rank).in_op(OpKind::Bootstrap, None)
}

fn tune(stream: &TcpStream, congestion: &Congestion) -> std::io::Result<()> {
    // Latency matters more than packet count for every message we send.
    let _ = stream.set_nodelay(true);
    congestion.apply(stream)
}

/// Which connection between two ranks, and from where it is made.
#[derive(Debug, Clone, Copy)]
struct LinkId {
    link: u8,
    links: u8,
    /// The local address to connect from (its interface carries the connection).
    from: Option<IpAddr>,
}

/// Connects from `local` (any port), or from wherever the route says.
async fn connect_from(addr: SocketAddr, local: Option<IpAddr>) -> std::io::Result<TcpStream> {
    let Some(ip) = local.filter(|ip| !ip.is_unspecified()) else { return TcpStream::connect(addr).await };
    let sock = if ip.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    sock.bind(SocketAddr::new(ip, 0))?;
    sock.connect(addr).await
}

/// Connects to `peer` at `addr`, retrying until `deadline`, and completes the
/// handshake.
async fn dial(
    rank: Rank,
    size: usize,
    peer: Rank,
    addr: SocketAddr,
    id: LinkId,
    opts: &MeshOptions,
    deadline: Instant,
) -> Result<TcpStream> {
    let mut delay = Duration::from_millis(5);
    loop {
        let attempt = async {
            let mut s = connect_from(addr, id.from).await?;
            tune(&s, &opts.congestion)?;
            let hello = Hello {
                kind: KIND_HELLO,
                job: opts.job,
                src: rank as u32,
                dst: peer as u32,
                size: size as u32,
                link: id.link,
                links: id.links,
            }
            .encode();
            let mine = JobKey::nonce();
            s.write_all(&[&hello[..], &mine[..]].concat()).await?;
            let mut b = [0u8; HELLO_LEN + 2 * PROOF_LEN];
            timeout(opts.handshake_timeout, s.read_exact(&mut b))
                .await
                .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no handshake reply"))??;
            let (ack, rest) = b.split_at(HELLO_LEN);
            let (theirs, proof) = rest.split_at(PROOF_LEN);
            let ack_fields = Hello::decode(ack.try_into().expect("HELLO_LEN bytes")).map_err(std::io::Error::other)?;
            if ack_fields.kind != KIND_ACK
                || ack_fields.src != peer as u32
                || ack_fields.job != opts.job
                || ack_fields.link != id.link
            {
                return Err(std::io::Error::other(format!("unexpected handshake reply {ack_fields:?}")));
            }
            let parts: [&[u8]; 4] = [&hello, &mine, ack, theirs];
            if !opts.key.verify(b"hcomm mesh accept", &parts, proof) {
                return Err(std::io::Error::other("the peer could not prove the job key (HCOMM_JOB_SECRET differs)"));
            }
            s.write_all(&opts.key.prove(b"hcomm mesh dial", &parts)).await?;
            Ok(s)
        };
        match timeout_at(deadline, attempt).await {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e)) if Instant::now() + delay < deadline => {
                tracing::debug!(rank, peer, %addr, error = %e, "connect failed, retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_millis(500));
            }
            Ok(Err(e)) => {
                return Err(boot_err(rank, format!("could not connect to rank {peer} at {addr}"))
                    .with_peer(peer)
                    .with_source(e));
            }
            Err(_) => {
                return Err(boot_err(rank, format!("timed out connecting to rank {peer} at {addr}")).with_peer(peer));
            }
        }
    }
}

/// Reads and checks the handshake of an accepted connection; answers it. Returns the
/// peer and which of the `links` connections this is.
async fn greet(
    rank: Rank,
    size: usize,
    links: usize,
    mut s: TcpStream,
    opts: &MeshOptions,
) -> std::result::Result<(Rank, usize, TcpStream), String> {
    let until = Instant::now() + opts.handshake_timeout.min(hcomm_core::NEVER);
    let mut b = [0u8; HELLO_LEN + PROOF_LEN];
    match timeout_at(until, s.read_exact(&mut b)).await {
        Err(_) => return Err(format!("no handshake within {:?}", opts.handshake_timeout)),
        Ok(Err(e)) => return Err(format!("connection failed during handshake: {e}")),
        Ok(Ok(_)) => {}
    }
    let (hello, theirs) = b.split_at(HELLO_LEN);
    let h = Hello::decode(hello.try_into().expect("HELLO_LEN bytes"))?;
    if h.kind != KIND_HELLO {
        return Err(format!("handshake of kind {} where a hello was expected", h.kind));
    }
    if h.job != opts.job {
        return Err(format!("handshake for another job ({:#x})", h.job));
    }
    if h.dst != rank as u32 || h.size != size as u32 {
        return Err(format!("handshake for rank {} of {} ranks, this is rank {rank} of {size}", h.dst, h.size));
    }
    let src = h.src as Rank;
    if src <= rank || src >= size {
        return Err(format!("handshake from rank {src}, which should not connect to rank {rank}"));
    }
    if usize::from(h.links) != links || h.link >= h.links {
        return Err(format!(
            "rank {src} opens {} connections per peer (this is link {}), this rank {links}: HCOMM_LINKS differs",
            h.links, h.link
        ));
    }
    tune(&s, &opts.congestion).map_err(|e| format!("could not set the socket's options: {e}"))?;
    let ack = Hello {
        kind: KIND_ACK,
        job: opts.job,
        src: rank as u32,
        dst: h.src,
        size: size as u32,
        link: h.link,
        links: h.links,
    }
    .encode();
    let mine = JobKey::nonce();
    let parts: [&[u8]; 4] = [hello, theirs, &ack, &mine];
    let proof = opts.key.prove(b"hcomm mesh accept", &parts);
    s.write_all(&[&ack[..], &mine[..], &proof[..]].concat())
        .await
        .map_err(|e| format!("could not answer handshake: {e}"))?;
    let mut dial_proof = [0u8; PROOF_LEN];
    match timeout_at(until, s.read_exact(&mut dial_proof)).await {
        Err(_) => return Err(format!("no proof of the job key within {:?}", opts.handshake_timeout)),
        Ok(Err(e)) => return Err(format!("connection failed during handshake: {e}")),
        Ok(Ok(_)) => {}
    }
    if !opts.key.verify(b"hcomm mesh dial", &parts, &dial_proof) {
        return Err(format!("rank {src}'s connection could not prove the job key (HCOMM_JOB_SECRET differs)"));
    }
    Ok((src, usize::from(h.link), s))
}

/// Builds the full mesh: this rank dials every lower rank and accepts every higher
/// one on `listener`. Returns one stream per peer (`None` at this rank's own index).
///
/// # Errors
/// A bootstrap error naming the ranks that could not be reached or never connected
/// before the deadline.
///
/// # Cancel safety
/// Dropping the future closes every connection made so far.
pub async fn connect_mesh(
    rank: Rank,
    size: usize,
    listener: TcpListener,
    addrs: &[SocketAddr],
    opts: &MeshOptions,
) -> Result<Vec<Option<TcpStream>>> {
    let addrs: Vec<Vec<SocketAddr>> = addrs.iter().map(|a| vec![*a]).collect();
    let mesh = connect_mesh_links(rank, size, vec![listener], &addrs, 1, opts).await?;
    Ok(mesh.into_iter().map(|l| l.and_then(|mut v| v.pop())).collect())
}

/// As [`connect_mesh`], with `links` connections to every peer (`HCOMM_LINKS`), over
/// several paths: `listeners[p]` is this rank's listener on path `p` and `addrs[r][p]`
/// rank `r`'s; connection `i` to a peer goes from this rank's address on path
/// `i % paths` to the peer's on the same path. Returns the connections to each peer
/// in link order.
///
/// # Errors
/// As [`connect_mesh`]; also a bootstrap error when a rank publishes another number of
/// paths than this one. A peer that opens another number of links is refused (and
/// logged) until the deadline.
///
/// # Cancel safety
/// Dropping the future closes every connection made so far.
pub async fn connect_mesh_links(
    rank: Rank,
    size: usize,
    listeners: Vec<TcpListener>,
    addrs: &[Vec<SocketAddr>],
    links: usize,
    opts: &MeshOptions,
) -> Result<Vec<Option<Vec<TcpStream>>>> {
    if addrs.len() != size || rank >= size {
        return Err(boot_err(rank, format!("address table has {} entries for {size} ranks", addrs.len())));
    }
    let paths = listeners.len();
    if paths == 0 || !(1..=usize::from(u8::MAX)).contains(&links) {
        return Err(boot_err(rank, format!("{paths} listeners and {links} links per peer")));
    }
    if let Some((r, a)) = addrs.iter().enumerate().find(|(_, a)| a.len() != paths) {
        return Err(boot_err(
            rank,
            format!("rank {r} listens on {} paths, this rank on {paths}: HCOMM_LINKS differs", a.len()),
        ));
    }
    let local: Vec<Option<IpAddr>> = listeners.iter().map(|l| l.local_addr().ok().map(|a| a.ip())).collect();
    let deadline = Instant::now() + opts.timeout.min(hcomm_core::NEVER);
    let dials = futures::future::try_join_all((0..rank).flat_map(|peer| (0..links).map(move |i| (peer, i))).map(
        |(peer, i)| {
            let id = LinkId { link: i as u8, links: links as u8, from: local[i % paths] };
            async move { dial(rank, size, peer, addrs[peer][i % paths], id, opts, deadline).await.map(|s| (peer, i, s)) }
        },
    ));
    let accepts = async {
        let mut missing: BTreeSet<(Rank, usize)> =
            (rank + 1..size).flat_map(|r| (0..links).map(move |i| (r, i))).collect();
        let mut got = Vec::new();
        let mut greeting = FuturesUnordered::new();
        let mut incoming = futures::stream::select_all(
            listeners
                .iter()
                .map(|l| Box::pin(futures::stream::unfold(l, |l| async move { Some((l.accept().await, l)) }))),
        );
        while !missing.is_empty() {
            tokio::select! {
                Some(acc) = incoming.next() => match acc {
                    Ok((s, from)) => greeting.push(async move { (from, greet(rank, size, links, s, opts).await) }),
                    Err(e) => tracing::warn!(rank, error = %e, "accept failed"),
                },
                Some((from, res)) = greeting.next(), if !greeting.is_empty() => match res {
                    Ok((src, i, s)) if missing.remove(&(src, i)) => got.push((src, i, s)),
                    Ok((src, i, _)) => tracing::warn!(rank, %from, src, link = i, "refused a second connection from the same rank"),
                    Err(why) => tracing::warn!(rank, %from, "refused a connection: {why}"),
                },
                _ = tokio::time::sleep_until(deadline) => {
                    let ranks: BTreeSet<Rank> = missing.iter().map(|&(r, _)| r).collect();
                    let list: Vec<String> = ranks.iter().map(|r| r.to_string()).collect();
                    return Err(boot_err(rank, format!("ranks {} never connected within {:?}", list.join(", "), opts.timeout)));
                }
            }
        }
        Ok(got)
    };
    let (dialed, accepted) = futures::try_join!(dials, accepts)?;
    let mut out: Vec<Option<Vec<Option<TcpStream>>>> = (0..size).map(|_| None).collect();
    for (peer, i, s) in dialed.into_iter().chain(accepted) {
        out[peer].get_or_insert_with(|| (0..links).map(|_| None).collect())[i] = Some(s);
    }
    Ok(out.into_iter().map(|l| l.map(|v| v.into_iter().map(|s| s.expect("every link connected")).collect())).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trip() {
        let h = Hello { kind: KIND_HELLO, job: 0xfeed, src: 3, dst: 1, size: 4, link: 1, links: 2 };
        assert_eq!(Hello::decode(&h.encode()), Ok(h));
        let mut b = h.encode();
        b[0] = 0;
        assert!(Hello::decode(&b).is_err());
    }
}
