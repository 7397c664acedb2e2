//! Emulated hosts for tests: Linux network namespaces joined by a relay in this
//! process that adds delay, loss, bandwidth limits and cuts per path.
//!
//! Each host is a namespace with a TUN device `hc0` holding address 10.78.0.(i+1)/24,
//! and, on a cluster of several *planes* (independent networks, as two NICs on two
//! switches give), `hcP` holding 10.(78+P).0.(i+1)/24 for plane P.
//! Every IP packet a host sends to another goes through [`Cluster`]'s relay threads,
//! which look up the path (source host, destination host), drop the packet if the
//! path is down or by the path's loss probability, and hand it to the destination's
//! device after the path's delay (and, with a rate set, after the time the link takes
//! to carry it, queued behind the path's earlier packets, or behind every packet of a
//! shared link such as an emulated spine: [`Cluster::set_spine`]).
//!
//! Why not `tc netem`: this machine's kernel has neither `sch_netem` nor `sch_fq` nor
//! `nft queue` (`tc qdisc add … netem` fails with "Specified qdisc kind is unknown"),
//! and TUN devices it has. The relay gives the same controls, per path rather than per
//! interface, and a test can change them while ranks run.
//!
//! Needs root (namespaces, TUN) and `ip` from iproute2; [`Cluster::new`] returns the
//! reason when it cannot build the hosts, for the test to print and skip.

#![allow(dead_code)] // each test binary uses part of it

/// The cluster `built` holds, or `None` after printing why it could not be built, for
/// the test to skip. Where `HCOMM_TEST_REQUIRE_NETNS` is set (`.ci/run` sets it when it
/// runs as root, where the hosts can be built), a test never skips: it fails with the
/// reason.
pub fn or_skip(built: Result<Cluster, String>) -> Option<Cluster> {
    or_skip_unless(built, std::env::var_os("HCOMM_TEST_REQUIRE_NETNS").is_some())
}

/// [`or_skip`], told whether skipping is forbidden.
pub fn or_skip_unless(built: Result<Cluster, String>, required: bool) -> Option<Cluster> {
    match built {
        Ok(c) => Some(c),
        Err(why) if required => {
            panic!("cannot build emulated hosts, and HCOMM_TEST_REQUIRE_NETNS forbids skipping: {why}")
        }
        Err(why) => {
            println!("SKIPPED: cannot build emulated hosts here: {why}");
            None
        }
    }
}

use std::collections::BinaryHeap;
use std::fs::File;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The conditions of one direction of one path.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Path {
    pub up: bool,
    pub delay: Duration,
    /// Probability that a packet is dropped.
    pub loss: f64,
    /// Bytes per second; `None` for unlimited.
    pub rate: Option<f64>,
    /// With a rate: the longest a packet may wait for the link (the buffer of the
    /// switch in front of it); later packets are dropped, as a full buffer drops
    /// them. `None`: packets wait as long as it takes.
    pub queue: Option<Duration>,
}

impl Default for Path {
    fn default() -> Path {
        Path { up: true, delay: Duration::ZERO, loss: 0.0, rate: None, queue: None }
    }
}

struct Packet {
    at: Instant,
    order: u64,
    to: usize,
    data: Vec<u8>,
    /// Between the hosts whose deliveries are logged.
    logged: bool,
}

impl PartialEq for Packet {
    fn eq(&self, o: &Packet) -> bool {
        (self.at, self.order) == (o.at, o.order)
    }
}
impl Eq for Packet {}
impl PartialOrd for Packet {
    fn partial_cmp(&self, o: &Packet) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Packet {
    // Earliest first out of the max-heap.
    fn cmp(&self, o: &Packet) -> std::cmp::Ordering {
        (o.at, o.order).cmp(&(self.at, self.order))
    }
}

struct State {
    paths: Vec<Vec<Path>>,
    /// When each path's link is free again (for rates).
    busy_until: Vec<Vec<Instant>>,
    queue: BinaryHeap<Packet>,
    order: u64,
    /// Packets dropped by loss or a cut, and packets and bytes carried, per path.
    dropped: Vec<Vec<u64>>,
    carried: Vec<Vec<u64>>,
    bytes: Vec<Vec<u64>>,
    /// The shared link each path's packets queue on for its rate, if any (a spine
    /// that several paths cross), and when each shared link is free again.
    link_of: Vec<Vec<Option<usize>>>,
    link_busy: Vec<Instant>,
    /// Hosts whose deliveries between each other (on any plane, either way) are
    /// logged, and the log.
    logged: Option<(usize, usize)>,
    log: Vec<Instant>,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    stop: AtomicBool,
    devices: Vec<OwnedFd>,
}

/// A set of emulated hosts. Dropping it stops the relay and deletes the namespaces.
///
/// Paths are indexed by *endpoint*: host `h` on plane `p` is endpoint `p * hosts + h`
/// (plane 0's endpoints are the hosts themselves); packets never cross planes.
pub struct Cluster {
    names: Vec<String>,
    hosts: usize,
    planes: usize,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

static CLUSTERS: AtomicUsize = AtomicUsize::new(0);

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("cannot run `ip` (iproute2): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("`ip {}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// Opens TUN device `name` inside namespace `ns` (on a thread of its own, which
/// enters the namespace and then ends).
fn open_tun(ns: &str, name: &str) -> io::Result<OwnedFd> {
    let path = format!("/var/run/netns/{ns}");
    let name = name.as_bytes().to_vec();
    assert!(name.len() < 16);
    std::thread::spawn(move || -> io::Result<OwnedFd> {
        let nsf = File::open(path)?;
        // SAFETY: plain system calls on descriptors this function owns; `ifr` is an
        // `ifreq` as the kernel lays it out (16 bytes of name, then the flags).
        unsafe {
            if libc::setns(nsf.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                return Err(io::Error::last_os_error());
            }
            let fd = libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            let fd = OwnedFd::from_raw_fd(fd);
            let mut ifr = [0u8; 40];
            ifr[..name.len()].copy_from_slice(&name);
            let flags: libc::c_short = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
            ifr[16..18].copy_from_slice(&flags.to_ne_bytes());
            if libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, ifr.as_mut_ptr()) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(fd)
        }
    })
    .join()
    .expect("the namespace thread does not panic")
}

/// The address of host `i` (on plane 0).
pub fn host_ip(i: usize) -> Ipv4Addr {
    plane_ip(0, i)
}

/// The address of host `i` on plane `p`.
pub fn plane_ip(p: usize, i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 78 + p as u8, 0, i as u8 + 1)
}

impl Cluster {
    /// `hosts` namespaces joined by the relay, every path up with no delay or loss.
    /// `Err` says why they cannot be made here (not root, no `ip`, no TUN).
    pub fn new(hosts: usize) -> Result<Cluster, String> {
        Cluster::with_planes(hosts, 1)
    }

    /// `hosts` namespaces joined by `planes` independent networks (TUN devices `hc0`,
    /// `hc1`, … in each), every path up with no delay or loss.
    pub fn with_planes(hosts: usize, planes: usize) -> Result<Cluster, String> {
        assert!((1..200).contains(&hosts) && (1..=8).contains(&planes));
        let ends = hosts * planes;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(String::from("network namespaces need root"));
        }
        let id = CLUSTERS.fetch_add(1, Ordering::Relaxed);
        let names: Vec<String> = (0..hosts).map(|h| format!("hc{}-{id}-h{h}", std::process::id())).collect();
        let mut cluster = Cluster {
            names: Vec::new(),
            hosts,
            planes,
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    paths: vec![vec![Path::default(); ends]; ends],
                    busy_until: vec![vec![Instant::now(); ends]; ends],
                    queue: BinaryHeap::new(),
                    order: 0,
                    dropped: vec![vec![0; ends]; ends],
                    carried: vec![vec![0; ends]; ends],
                    bytes: vec![vec![0; ends]; ends],
                    link_of: vec![vec![None; ends]; ends],
                    link_busy: Vec::new(),
                    logged: None,
                    log: Vec::new(),
                }),
                wake: Condvar::new(),
                stop: AtomicBool::new(false),
                devices: Vec::new(),
            }),
            threads: Vec::new(),
        };
        // devices[endpoint]: plane by plane.
        let mut devices: Vec<Option<OwnedFd>> = (0..ends).map(|_| None).collect();
        for (h, ns) in names.iter().enumerate() {
            ip(&["netns", "add", ns])?;
            cluster.names.push(ns.clone());
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            for p in 0..planes {
                let dev = format!("hc{p}");
                let fd = open_tun(ns, &dev).map_err(|e| format!("cannot open a TUN device in {ns}: {e}"))?;
                devices[p * hosts + h] = Some(fd);
                ip(&["-n", ns, "addr", "add", &format!("{}/24", plane_ip(p, h)), "dev", &dev])?;
                ip(&["-n", ns, "link", "set", &dev, "up"])?;
            }
        }
        Arc::get_mut(&mut cluster.shared).expect("no thread yet").devices =
            devices.into_iter().map(|d| d.expect("every endpoint opened")).collect();
        for e in 0..ends {
            let s = cluster.shared.clone();
            cluster.threads.push(std::thread::spawn(move || receive(&s, e, hosts)));
        }
        let s = cluster.shared.clone();
        cluster.threads.push(std::thread::spawn(move || deliver(&s)));
        Ok(cluster)
    }

    /// Name of host `h`'s namespace.
    pub fn ns(&self, h: usize) -> &str {
        &self.names[h]
    }

    /// Sets every path.
    pub fn set_all(&self, p: Path) {
        let mut st = self.shared.state.lock().unwrap();
        for row in &mut st.paths {
            row.fill(p);
        }
    }

    /// Cuts (or restores) every path of host `h`, on every plane, both directions.
    pub fn isolate(&self, h: usize, cut: bool) {
        for p in 0..self.planes {
            for o in 0..self.hosts {
                self.cut(p, h, o, cut);
            }
        }
    }

    /// Cuts (or restores) the path between hosts `a` and `b` on plane `p`, both
    /// directions, as a pulled cable would.
    pub fn cut(&self, p: usize, a: usize, b: usize, cut: bool) {
        let mut st = self.shared.state.lock().unwrap();
        let (a, b) = (p * self.hosts + a, p * self.hosts + b);
        st.paths[a][b].up = !cut;
        st.paths[b][a].up = !cut;
    }

    /// Sets the path between hosts `a` and `b` on plane `p`, both directions.
    pub fn set_path(&self, p: usize, a: usize, b: usize, path: Path) {
        let mut st = self.shared.state.lock().unwrap();
        let (a, b) = (p * self.hosts + a, p * self.hosts + b);
        st.paths[a][b] = path;
        st.paths[b][a] = path;
    }

    /// Starts logging when each packet of more than 200 bytes between hosts `a` and `b`
    /// (on any plane, either way) is delivered; returns the start.
    pub fn start_delivery_log(&self, a: usize, b: usize) -> Instant {
        let mut st = self.shared.state.lock().unwrap();
        st.logged = Some((a, b));
        st.log.clear();
        Instant::now()
    }

    /// The delivery times logged since [`Cluster::start_delivery_log`].
    pub fn delivery_log(&self) -> Vec<Instant> {
        self.shared.state.lock().unwrap().log.clone()
    }

    /// Bytes carried so far from host `a` to host `b` on plane `p`.
    pub fn plane_bytes(&self, p: usize, a: usize, b: usize) -> u64 {
        self.bytes(p * self.hosts + a, p * self.hosts + b)
    }

    /// Groups the hosts into racks (`rack_of[h]`) joined by a spine: every path between
    /// two racks gets `spine`'s delay, loss and state, and its packets queue, for
    /// `spine`'s rate, on one link per ordered pair of racks that all such paths share
    /// (as a switch uplink is shared). Paths inside a rack are left as they are.
    pub fn set_spine(&self, rack_of: &[usize], spine: Path) {
        let mut st = self.shared.state.lock().unwrap();
        let n = st.paths.len();
        assert_eq!(rack_of.len(), n);
        let racks = rack_of.iter().max().map_or(0, |m| m + 1);
        st.link_busy = vec![Instant::now(); racks * racks];
        for a in 0..n {
            for b in 0..n {
                if rack_of[a] != rack_of[b] {
                    st.paths[a][b] = spine;
                    st.link_of[a][b] = Some(rack_of[a] * racks + rack_of[b]);
                }
            }
        }
    }

    /// Bytes (IP packets, headers included) carried so far from `a` to `b`.
    pub fn bytes(&self, a: usize, b: usize) -> u64 {
        self.shared.state.lock().unwrap().bytes[a][b]
    }

    /// Resets the byte counters.
    pub fn reset_bytes(&self) {
        let mut st = self.shared.state.lock().unwrap();
        for row in &mut st.bytes {
            row.fill(0);
        }
    }

    /// Packets carried and dropped so far, over all paths.
    pub fn counts(&self) -> (u64, u64) {
        let st = self.shared.state.lock().unwrap();
        (st.carried.iter().flatten().sum(), st.dropped.iter().flatten().sum())
    }

    /// A command that runs `program` inside host `h`.
    pub fn command(&self, h: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", self.ns(h)]).arg(program);
        c
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        for ns in &self.names {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// Reads endpoint `h`'s outgoing packets (host `h % hosts` on plane `h / hosts`) and
/// queues them on their path.
fn receive(s: &Shared, h: usize, hosts: usize) {
    let plane = h / hosts;
    let fd = s.devices[h].as_raw_fd();
    let mut buf = vec![0u8; 65536];
    while !s.stop.load(Ordering::Acquire) {
        let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, 50) } <= 0 {
            continue;
        }
        // SAFETY: reads into `buf`, within its length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 20 || buf[0] >> 4 != 4 {
            continue; // not IPv4 (the kernel's IPv6 chatter): dropped
        }
        let data = buf[..n as usize].to_vec();
        let dst = Ipv4Addr::new(data[16], data[17], data[18], data[19]).octets();
        let to = usize::from(dst[3]).wrapping_sub(1);
        if dst[..3] != [10, 78 + plane as u8, 0] || to >= hosts || plane * hosts + to == h {
            continue;
        }
        let to = plane * hosts + to;
        let mut st = s.state.lock().unwrap();
        let p = st.paths[h][to];
        if !p.up || (p.loss > 0.0 && rand::random::<f64>() < p.loss) {
            st.dropped[h][to] += 1;
            continue;
        }
        st.carried[h][to] += 1;
        st.bytes[h][to] += data.len() as u64;
        let now = Instant::now();
        let sent = match p.rate {
            Some(rate) => {
                let link = st.link_of[h][to];
                let busy = match link {
                    Some(l) => &mut st.link_busy[l],
                    None => &mut st.busy_until[h][to],
                };
                let start = (*busy).max(now);
                if p.queue.is_some_and(|q| start - now > q) {
                    st.carried[h][to] -= 1;
                    st.bytes[h][to] -= data.len() as u64;
                    st.dropped[h][to] += 1;
                    continue;
                }
                let done = start + Duration::from_secs_f64(data.len() as f64 / rate);
                *busy = done;
                done
            }
            None => now,
        };
        st.order += 1;
        let order = st.order;
        let (ha, hb) = (h % hosts, to % hosts);
        let logged = data.len() > 200 && st.logged.is_some_and(|(a, b)| (ha, hb) == (a, b) || (ha, hb) == (b, a));
        st.queue.push(Packet { at: sent + p.delay, order, to, data, logged });
        drop(st);
        s.wake.notify_one();
    }
}

/// Hands queued packets to their destination when their time comes.
fn deliver(s: &Shared) {
    let mut st = s.state.lock().unwrap();
    while !s.stop.load(Ordering::Acquire) {
        let now = Instant::now();
        match st.queue.peek() {
            Some(p) if p.at <= now => {
                let p = st.queue.pop().expect("peeked");
                drop(st);
                let fd = s.devices[p.to].as_raw_fd();
                // SAFETY: writes `p.data`, within its length. A full device drops
                // the packet, as a full link would.
                unsafe { libc::write(fd, p.data.as_ptr().cast(), p.data.len()) };
                st = s.state.lock().unwrap();
                if p.logged {
                    st.log.push(Instant::now());
                }
            }
            Some(p) => {
                let wait = p.at - now;
                st = s.wake.wait_timeout(st, wait).unwrap().0;
            }
            None => st = s.wake.wait_timeout(st, Duration::from_millis(50)).unwrap().0,
        }
    }
}
