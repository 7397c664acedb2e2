//! Ranks on emulated hosts (network namespaces joined by the relay in `netem`), with
//! real network faults: a slow, lossy network (20 ms each way, 5% of packets lost on
//! every path) on which 100 allreduces of mixed sizes must come out right; a host
//! cut off in the middle of a stream of allreduces, which the others must fail within
//! a second, then shrink and carry on; and one of two paths between two hosts cut
//! during 64 MiB allreduces over two connections per peer (`HCOMM_LINKS`), which must
//! come out right, with the data moved to the other path (progress resumed within 1 s;
//! how fast is a benchmark's question, not this test's).
//!
//! The ranks are processes: this test binary itself, running the ignored
//! `netfault_rank` function inside a namespace. Without root or `ip`, the tests print
//! why and pass without running.

#[allow(unsafe_code)] // namespaces and TUN devices are system calls
mod netem;

use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hcomm::{Communicator, ReduceOp};
use netem::Cluster;

const HOSTS: usize = 3;
const PORT: u16 = 29500;

fn now_us() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros()
}

/// Element `k` of rank `r`'s contribution to allreduce `i`: small integers, exact in
/// f32 sums.
fn value(r: usize, i: usize, k: usize) -> f32 {
    ((r + i) % 13 + k % 5) as f32
}

/// Rank `ranks[r]`'s contribution to allreduce `i`, allreduced and checked. Filling
/// and checking run on the blocking pool: done on the executor, checking 16 Mi
/// elements (hundreds of milliseconds on a loaded machine, in this unoptimised
/// build) would hold back the transport's tasks past the peer timeout, and under
/// io_uring even a loop that yields would (tokio-uring submits queued operations only
/// when the thread parks). CI caught that: the peer failed a rank that was checking.
async fn allreduce_checked(comm: &Communicator, ranks: &[usize], i: usize, count: usize) -> hcomm::Result<()> {
    let r = comm.rank();
    let mine = ranks[r];
    let mut v = blocking(move || (0..count).map(|k| value(mine, i, k)).collect::<Vec<f32>>()).await;
    comm.all_reduce(&mut v, ReduceOp::Sum).await?;
    let ranks = ranks.to_vec();
    blocking(move || {
        for (k, x) in v.iter().enumerate() {
            let want: f32 = ranks.iter().map(|&q| value(q, i, k)).sum();
            assert_eq!(*x, want, "rank {r}: element {k} of allreduce {i} ({count} elements)");
        }
    })
    .await;
    Ok(())
}

/// Runs `f` on the blocking pool; its panic is this task's.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

const LOSSY_SIZES: [usize; 8] = [1, 2, 3, 7, 100, 1000, 4099, 16384];

async fn lossy(comm: Communicator) {
    let start = Instant::now();
    let all: Vec<usize> = (0..comm.size()).collect();
    for i in 0..100 {
        let count = LOSSY_SIZES[i % LOSSY_SIZES.len()];
        allreduce_checked(&comm, &all, i, count).await.unwrap_or_else(|e| panic!("allreduce {i}: {e}"));
    }
    println!("LOSSY_DONE rank {} 100 allreduces in {:.1} s", comm.rank(), start.elapsed().as_secs_f64());
    let r = comm.rank();
    comm.finalize().await.unwrap_or_else(|e| panic!("rank {r}: {e}"));
}

async fn cut(comm: Communicator, ready: &Path) {
    let r = comm.rank();
    let all: Vec<usize> = (0..comm.size()).collect();
    let mut i = 0;
    let err = loop {
        if i == 10 && r == 0 {
            std::fs::write(ready, b"ok").unwrap();
        }
        if let Err(e) = allreduce_checked(&comm, &all, i, 10_000).await {
            break e;
        }
        i += 1;
        assert!(i < 1_000_000, "rank {r}: no failure seen");
    };
    println!("FAILED_AT {} rank {r} after {i} allreduces: {err}", now_us());
    assert!(err.is_peer_failed(), "rank {r}: {err}");
    let small = comm.shrink().await.unwrap_or_else(|e| panic!("rank {r}: shrink: {e}"));
    // The cut-off host is alone on its side; the others have each other.
    let mine: Vec<usize> = if r == HOSTS - 1 { vec![r] } else { (0..HOSTS - 1).collect() };
    assert_eq!(small.size(), mine.len(), "rank {r}");
    for j in 0..3 {
        let mut v: Vec<f32> = (0..1000).map(|k| value(r, j, k)).collect();
        small.all_reduce(&mut v, ReduceOp::Sum).await.unwrap_or_else(|e| panic!("rank {r} after shrink: {e}"));
        let want: f32 = mine.iter().map(|&q| value(q, j, 3)).sum();
        assert_eq!(v[3], want);
    }
    println!("SHRUNK rank {r}: {} ranks", small.size());
}

/// 64 MiB allreduces, checked, until the harness has cut a path (`NETFAULT_CUT`
/// exists) and one more has run; prints each one's start and end and the bundle's
/// report.
async fn paths(comm: Communicator, ready: &Path) {
    let r = comm.rank();
    let all: Vec<usize> = (0..comm.size()).collect();
    let cut_file = PathBuf::from(std::env::var("NETFAULT_CUT").unwrap());
    allreduce_checked(&comm, &all, 0, 1000).await.unwrap();
    if r == 0 {
        std::fs::write(ready, b"ok").unwrap();
    }
    if std::env::var_os("NETFAULT_IDLE").is_some() {
        // Idle (heartbeats only) until the harness has cut the path and waited.
        let deadline = Instant::now() + Duration::from_secs(60);
        while !cut_file.exists() {
            assert!(Instant::now() < deadline, "rank {r}: the harness never cut the path");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let mut after_cut = 0;
    for i in 1..=20 {
        let start = now_us();
        allreduce_checked(&comm, &all, i, 16 << 20).await.unwrap_or_else(|e| panic!("rank {r}: allreduce {i}: {e}"));
        let end = now_us();
        println!("ALLREDUCE rank {r} {i} {start} {end}");
        // Every rank must agree on when to stop.
        let mut seen = [u8::from(cut_file.exists())];
        comm.all_reduce(&mut seen, ReduceOp::Max).await.unwrap();
        after_cut += usize::from(seen[0]);
        if after_cut == 2 {
            break;
        }
    }
    assert_eq!(after_cut, 2, "rank {r}: the harness never cut the path");
    let s = comm.transport().link_stats(1 - r).expect("two connections per peer");
    for (at, gap) in &s.failover_log {
        println!("FAILOVER rank {r} {} {}", at.duration_since(UNIX_EPOCH).unwrap().as_micros(), gap.as_micros());
    }
    println!(
        "LINKS rank {r} failovers {} resent {} max_gap_us {} alive {} received {:?}",
        s.failovers,
        s.resent_bytes,
        s.max_gap.as_micros(),
        s.alive,
        s.received
    );
    comm.finalize().await.unwrap_or_else(|e| panic!("rank {r}: {e}"));
}

/// One rank (started by the tests below inside a namespace).
#[test]
#[ignore = "a rank of the network fault tests, started by them"]
fn netfault_rank() {
    let case = std::env::var("NETFAULT_CASE").unwrap();
    let ready = PathBuf::from(std::env::var("NETFAULT_READY").unwrap());
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let run = |comm: Communicator| async move {
        match case.as_str() {
            "lossy" => lossy(comm).await,
            "paths" => paths(comm, &ready).await,
            _ => cut(comm, &ready).await,
        }
    };
    #[cfg(all(feature = "uring", target_os = "linux"))]
    if std::env::var_os("NETFAULT_URING").is_some() {
        return tokio_uring::start(async {
            run(hcomm::Config::from_env().unwrap().connect_uring().await.unwrap()).await
        });
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async { run(hcomm::Config::from_env().unwrap().connect().await.unwrap()).await });
}

/// Starts one rank per host.
fn start(c: &Cluster, case: &str, ready: &Path, env: &[(&str, &str)]) -> Vec<Child> {
    start_on(c, HOSTS, case, ready, env)
}

fn start_on(c: &Cluster, hosts: usize, case: &str, ready: &Path, env: &[(&str, &str)]) -> Vec<Child> {
    let me = std::env::current_exe().unwrap();
    (0..hosts)
        .map(|h| {
            let mut cmd = c.command(h, &me);
            cmd.args(["netfault_rank", "--exact", "--ignored", "--nocapture", "--test-threads", "1"])
                .env("HCOMM_RANK", h.to_string())
                // The namespaces share this machine's hostname: without their own host
                // names the ranks would talk through shared memory, not the network.
                .env("HCOMM_HOST", format!("h{h}"))
                .env("HCOMM_SIZE", hosts.to_string())
                .env("HCOMM_ADDR", format!("{}:{PORT}", netem::host_ip(0)))
                .env("HCOMM_JOB_ID", format!("netfault-{case}"))
                .env("HCOMM_JOB_SECRET", "netfault test")
                .env("HCOMM_TIMEOUT", "120")
                .env("NETFAULT_CASE", case)
                .env("NETFAULT_READY", ready)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for (k, v) in env {
                cmd.env(k, v);
            }
            cmd.spawn().unwrap()
        })
        .collect()
}

/// Waits for every rank; if any failed, panics with the output of each one that did
/// (a peer's failure is often explained by the other side's log).
fn finish(case: &str, children: Vec<Child>) -> Vec<String> {
    let mut outs = Vec::new();
    let mut failed = String::new();
    for (r, c) in children.into_iter().enumerate() {
        let Output { status, stdout, stderr } = c.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&stdout).into_owned();
        let stderr = String::from_utf8_lossy(&stderr);
        if std::env::var_os("RUST_LOG").is_some() {
            println!("{case}: rank {r}'s log:\n{stderr}");
        }
        if !status.success() {
            failed += &format!("{case}: rank {r} failed ({status}):\n{stdout}\n{stderr}\n");
        }
        outs.push(stdout);
    }
    assert!(failed.is_empty(), "{failed}");
    outs
}

/// Where emulated hosts are required (`.ci/run` as root), a failure to build them
/// fails the test instead of skipping it.
#[test]
#[should_panic(expected = "HCOMM_TEST_REQUIRE_NETNS forbids skipping: no namespaces")]
fn a_required_cluster_does_not_skip() {
    netem::or_skip_unless(Err(String::from("no namespaces")), true);
}

#[test]
fn an_optional_cluster_skips() {
    assert!(netem::or_skip_unless(Err(String::from("no namespaces")), false).is_none());
}

fn cluster() -> Option<Cluster> {
    cluster_of(HOSTS, 1)
}

fn cluster_of(hosts: usize, planes: usize) -> Option<Cluster> {
    netem::or_skip(Cluster::with_planes(hosts, planes))
}

fn ready_file(case: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("hcomm-netfault-{}-{case}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

#[test]
fn allreduces_complete_on_a_slow_lossy_network() {
    let Some(c) = cluster() else { return };
    c.set_all(netem::Path { delay: Duration::from_millis(20), loss: 0.05, ..netem::Path::default() });
    let ready = ready_file("lossy");
    // The same segment lost twice can stall a TCP connection for 0.2 + 0.4 s (the
    // retransmission timer doubles), as long as the default peer timeout, which is
    // meant for a healthy network. The test is about the data path, so it gives the
    // heartbeats room (with the default it passed too, but a false "peer failed"
    // there would be the network's doing).
    let start = Instant::now();
    let outs = finish("lossy", start_lossy(&c, &ready));
    let (carried, dropped) = c.counts();
    for out in &outs {
        let line = out.lines().find(|l| l.contains("LOSSY_DONE")).unwrap_or_else(|| panic!("{out}"));
        println!("{}", line.trim_start_matches("test netfault_rank ... "));
    }
    println!(
        "lossy: 3 hosts, 20 ms each way, 5% loss: {dropped} of {} packets dropped; job took {:.1} s",
        carried + dropped,
        start.elapsed().as_secs_f64()
    );
    assert!(dropped > 0, "the relay dropped nothing: the test did not test loss");
}

fn start_lossy(c: &Cluster, ready: &Path) -> Vec<Child> {
    start(c, "lossy", ready, &[("HCOMM_PEER_TIMEOUT", "10"), ("HCOMM_IFNAME", "hc*")])
}

#[test]
fn a_host_cut_off_is_failed_within_a_second() {
    let Some(c) = cluster() else { return };
    let ready = ready_file("cut");
    let children = start(&c, "cut", &ready, &[("HCOMM_IFNAME", "10.78.0.0/24,^lo")]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready.exists() {
        assert!(Instant::now() < deadline, "the ranks never got going");
        std::thread::sleep(Duration::from_millis(10));
    }
    let cut_at = now_us();
    c.isolate(HOSTS - 1, true);
    let outs = finish("cut", children);
    let _ = std::fs::remove_file(&ready);
    let mut worst = Duration::ZERO;
    for (r, out) in outs.iter().enumerate() {
        let line = out.lines().find_map(|l| l.split_once("FAILED_AT ").map(|(_, rest)| rest)).expect(out);
        let at: u128 = line.split_whitespace().next().unwrap().parse().unwrap();
        let delay = Duration::from_micros(at.saturating_sub(cut_at) as u64);
        println!("cut: rank {r} failed {delay:?} after host {} was cut off: {line}", HOSTS - 1);
        assert!(out.contains("SHRUNK"), "{out}");
        worst = worst.max(delay);
    }
    println!("cut: worst detection {worst:?} (peer timeout 0.6 s, the default)");
    assert!(worst < Duration::from_secs(1), "detection took {worst:?}");
}

/// Two hosts joined by two networks (planes), one rank each, two connections per peer,
/// one per plane. Plane 0 is cut between them in the middle of a stream of 64 MiB
/// allreduces, with data moving on both planes: packets are dropped, the connection
/// reports nothing, and only the stalled acknowledgements tell. Every allreduce must
/// come out right. The gap in
/// progress is reported two ways: the transport's (from the last acknowledgement
/// progress before a failover to the first after it, asserted under 1 s), and the
/// relay's (the longest pause in packets delivered between the hosts from the cut to
/// the end of the allreduce it interrupted).
#[test]
fn a_path_cut_during_large_allreduces_loses_nothing() {
    path_cut(false);
}

/// The same over io_uring.
#[cfg(all(feature = "uring", target_os = "linux"))]
#[test]
fn a_path_cut_during_large_allreduces_loses_nothing_uring() {
    path_cut(true);
}

/// As above, but plane 0 is cut while the ranks are idle (heartbeats only), for
/// longer than the peer timeout, and the large allreduces start after. A rank's next
/// heartbeat may go into the cut connection while the other carries nothing: it must
/// tell a cut path from a dead peer (it probes the idle connection; the peer's answer
/// shows it alive), move the stranded bytes, and run the allreduces on the other
/// plane. The failover gap is printed (without the probe, the next heartbeat on the
/// other connection told, 150 ms later).
#[test]
fn a_path_cut_while_idle_is_not_taken_for_a_dead_peer() {
    idle_path_cut(false);
}

/// The same over io_uring.
#[cfg(all(feature = "uring", target_os = "linux"))]
#[test]
fn a_path_cut_while_idle_is_not_taken_for_a_dead_peer_uring() {
    idle_path_cut(true);
}

fn idle_path_cut(uring: bool) {
    let Some((c, ready, cut_file, children)) = two_planes("idle-paths", uring, true) else { return };
    let cut_at = now_us();
    c.cut(0, 0, 1, true);
    // Longer than the peer timeout (0.6 s): a cut taken for a dead peer shows.
    std::thread::sleep(Duration::from_millis(1500));
    std::fs::write(&cut_file, b"cut").unwrap();
    let outs = finish("idle paths", children);
    let _ = std::fs::remove_file(&ready);
    let _ = std::fs::remove_file(&cut_file);
    let mut failovers = 0;
    for (r, out) in outs.iter().enumerate() {
        let line = out.lines().find_map(|l| l.split_once("LINKS ").map(|(_, rest)| rest)).expect(out);
        println!("idle paths: {line}");
        for l in out.lines().filter_map(|l| l.split_once("FAILOVER ").map(|(_, rest)| rest)) {
            let f: Vec<u128> = l.split_whitespace().skip(1).map(|x| x.parse().unwrap()).collect();
            if f[1] >= cut_at {
                failovers += 1;
                println!(
                    "idle paths: rank {r}: progress stopped for {:.1} ms, {:.1} ms after the cut",
                    f[2] as f64 / 1e3,
                    (f[1] - cut_at) as f64 / 1e3
                );
            }
        }
    }
    assert!(failovers >= 1, "no rank moved its bytes off the cut path");
}

/// Two hosts on two planes (1 ms each way on both: connections that see real round
/// trips), one `paths` rank each with a connection per plane, started and past their
/// first allreduce; `idle`: they then wait for the cut file before the large ones.
fn two_planes(name: &str, uring: bool, idle: bool) -> Option<(Cluster, PathBuf, PathBuf, Vec<Child>)> {
    let c = cluster_of(2, 2)?;
    for p in 0..2 {
        c.set_path(p, 0, 1, netem::Path { delay: Duration::from_millis(1), ..netem::Path::default() });
    }
    let name = format!("{name}{}", if uring { "-uring" } else { "" });
    let ready = ready_file(&name);
    let cut_file = ready_file(&format!("{name}-cut"));
    let mut env = vec![("HCOMM_LINKS", "10.78.0.0/24;10.79.0.0/24"), ("NETFAULT_CUT", cut_file.to_str().unwrap())];
    if uring {
        env.push(("NETFAULT_URING", "1"));
    }
    if idle {
        env.push(("NETFAULT_IDLE", "1"));
    }
    let children = start_on(&c, 2, "paths", &ready, &env);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready.exists() {
        assert!(Instant::now() < deadline, "the ranks never got going");
        std::thread::sleep(Duration::from_millis(10));
    }
    Some((c, ready, cut_file, children))
}

fn path_cut(uring: bool) {
    let Some((c, ready, cut_file, children)) = two_planes("paths", uring, false) else { return };
    // Into the first large allreduce, with data in flight on both connections: once
    // each plane has carried 2 MiB more between the hosts (a fixed pause after
    // `ready` could end before the data starts to move, as the ranks first fill 64
    // MiB, slowly on a loaded machine).
    let moved = |p| c.plane_bytes(p, 0, 1) + c.plane_bytes(p, 1, 0);
    let base = [moved(0), moved(1)];
    let deadline = Instant::now() + Duration::from_secs(60);
    while (0..2).any(|p| moved(p) < base[p] + (2 << 20)) {
        assert!(Instant::now() < deadline, "the allreduces never used both planes");
        std::thread::sleep(Duration::from_millis(1));
    }
    let log_from = c.start_delivery_log(0, 1);
    let cut_at = now_us();
    c.cut(0, 0, 1, true);
    std::fs::write(&cut_file, b"cut").unwrap();
    println!("paths: cut at {:.6} s past the minute", (cut_at % 60_000_000) as f64 / 1e6);
    let outs = finish("paths", children);
    let log = c.delivery_log();
    let _ = std::fs::remove_file(&ready);
    let _ = std::fs::remove_file(&cut_file);
    let mut cut_inside = 0;
    let mut worst_gap = Duration::ZERO;
    let mut failovers = 0u64;
    let mut end_of_cut_op = 0u128;
    for (r, out) in outs.iter().enumerate() {
        for l in out.lines().filter_map(|l| l.split_once("ALLREDUCE ").map(|(_, rest)| rest)) {
            let f: Vec<u128> = l.split_whitespace().skip(1).map(|x| x.parse().unwrap()).collect();
            if f[2] <= cut_at && cut_at <= f[3] {
                cut_inside += 1;
                end_of_cut_op = end_of_cut_op.max(f[3]);
                println!(
                    "paths: rank {r}: allreduce {} ran {:.3} s, the cut came {:.3} s into it",
                    f[1],
                    (f[3] - f[2]) as f64 / 1e6,
                    (cut_at - f[2]) as f64 / 1e6
                );
            }
        }
        let line = out.lines().find_map(|l| l.split_once("LINKS ").map(|(_, rest)| rest)).expect(out);
        println!("paths: {line}");
        // Failovers that ended after the cut are the cut's (their stall begins with the
        // last progress before it); one that ended before is not (once, a rank's
        // executor held up by the checking that now runs on the blocking pool):
        // reported, not asserted.
        for l in out.lines().filter_map(|l| l.split_once("FAILOVER ").map(|(_, rest)| rest)) {
            let f: Vec<u128> = l.split_whitespace().skip(1).map(|x| x.parse().unwrap()).collect();
            let (back_at, gap) = (f[1], f[2]);
            let ours = back_at >= cut_at;
            println!(
                "paths: rank {r}: progress stopped for {:.1} ms, {:.1} ms {} the cut{}",
                gap as f64 / 1e3,
                back_at.abs_diff(cut_at) as f64 / 1e3,
                if back_at >= cut_at { "after" } else { "before" },
                if ours { "" } else { " (not the cut's)" }
            );
            if ours {
                failovers += 1;
                worst_gap = worst_gap.max(Duration::from_micros(gap as u64));
            }
        }
    }
    assert_eq!(cut_inside, 2, "the cut fell between two allreduces: the test did not test what it says");
    assert!(failovers >= 1, "no rank moved data off the cut path after the cut");
    // The relay's view: deliveries between the hosts, from the cut to the end of the
    // allreduce it interrupted.
    let until = log_from + Duration::from_micros((end_of_cut_op - cut_at) as u64);
    let mut last = log_from;
    let mut relay_gap = Duration::ZERO;
    for &t in log.iter().filter(|&&t| t <= until) {
        relay_gap = relay_gap.max(t - last);
        last = t;
    }
    println!(
        "paths: longest wait for acknowledgement progress that a failover ended: {worst_gap:?} (transport); \
         longest pause in packets delivered between the hosts after the cut: {relay_gap:?} (relay); {failovers} \
         failovers"
    );
    // A bound that only a missing failover breaks (the data would then wait for TCP
    // to give up on the cut path, seconds): how fast the failover is, is a measured
    // figure, not an assertion. CI caught a loaded run whose relay
    // itself stopped delivering for 171 ms after the cut, and the transport's gap
    // then was 200 ms.
    assert!(worst_gap < Duration::from_secs(1), "progress stopped for {worst_gap:?}");
}
