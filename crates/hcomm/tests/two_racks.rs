//! An emulated two-rack cluster: four hosts (network namespaces joined by the relay
//! in `netem`), two per rack, the racks joined by a spine with a tenth of the
//! bandwidth the relay gives inside a rack, shared by every path across it. Eight
//! ranks, two per host, placed so that neighbours in rank order share neither host
//! nor rack (rank `r` on host `r % 4`, host `h` in rack `h % 2`).
//!
//! The test runs allreduces with a flat ring in rank order (`HCOMM_TOPO_AWARE=0`),
//! with the topology-aware ring, with the hierarchical allreduce, and with the
//! algorithm the cost model selects when told the spine is slow, and asserts on the
//! bytes that crossed the spine (counted by the relay, headers and acknowledgements
//! included): the topology-aware algorithms must send at least 60% fewer. Times are
//! printed, not asserted; `two_racks_benchmark` (ignored, run by hand) times 16 MiB.
//!
//! The ranks are processes: this test binary running the ignored `two_rack_rank`
//! inside a namespace. Without root or `ip`, the tests print why and pass without
//! running.

#[allow(unsafe_code)] // namespaces and TUN devices are system calls
mod netem;

use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use hcomm::{AllreduceAlgo, ReduceOp};
use netem::Cluster;

const HOSTS: usize = 4;
const RANKS: usize = 8;
/// Spine bandwidth, bytes per second (each direction).
const SPINE_RATE: f64 = 40e6;
const SPINE_DELAY: Duration = Duration::from_millis(1);

fn host_of(r: usize) -> usize {
    r % HOSTS
}

fn rack_of_host(h: usize) -> usize {
    h % 2
}

/// Element `k` of rank `r`'s contribution to allreduce `i`: small integers, exact in
/// f32 sums whatever the order.
fn value(r: usize, i: usize, k: usize) -> f32 {
    ((r * 7 + i + k) % 11) as f32
}

/// One rank (started by the tests below inside a namespace): `TWO_RACK_ITERS`
/// checked allreduces of `TWO_RACK_BYTES` after one warm-up, printing the chosen
/// algorithm and each iteration's time.
#[test]
#[ignore = "a rank of the two-rack tests, started by them"]
fn two_rack_rank() {
    let bytes: usize = std::env::var("TWO_RACK_BYTES").unwrap().parse().unwrap();
    let iters: usize = std::env::var("TWO_RACK_ITERS").unwrap().parse().unwrap();
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
        let mut comm = hcomm::Config::from_env().unwrap().connect().await.unwrap();
        let (r, n) = (comm.rank(), comm.size());
        if std::env::var_os("TWO_RACK_CALIBRATE").is_some() {
            let c = comm.calibrate().await.unwrap_or_else(|e| panic!("rank {r}: calibrate: {e}"));
            println!(
                "COST {r} {} {} {} {} {} {}",
                c.host.alpha, c.host.beta, c.alpha, c.beta, c.spine.alpha, c.spine.beta
            );
        }
        let count = bytes / 4;
        let algo = comm.allreduce_algo_for(bytes, true);
        println!(
            "RANK {r} algo {} stages {} ring {:?} racks {}",
            algo.name(),
            comm.hierarchical_stages(),
            comm.ring_order(),
            comm.topology().rack_count()
        );
        for i in 0..=iters {
            let mut v: Vec<f32> = (0..count).map(|k| value(r, i, k)).collect();
            comm.barrier().await.unwrap();
            let t = Instant::now();
            comm.all_reduce(&mut v, ReduceOp::Sum).await.unwrap_or_else(|e| panic!("rank {r}: {e}"));
            let secs = t.elapsed().as_secs_f64();
            for (k, x) in v.iter().enumerate().step_by(97) {
                let want: f32 = (0..n).map(|q| value(q, i, k)).sum();
                assert_eq!(*x, want, "rank {r}: element {k} of allreduce {i}");
            }
            if i > 0 {
                println!("TIME {r} {i} {secs:.6}");
            }
        }
        // Without it, a rank done first could reset connections that still carry the
        // others' last bytes across the slow spine.
        comm.finalize().await.unwrap_or_else(|e| panic!("rank {r}: {e}"));
    });
}

/// How a run chooses its allreduce.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// Ring in rank order over a flat network: the baseline.
    Flat,
    /// Ring in topology order.
    Ring,
    /// The hierarchical allreduce.
    Hier,
    /// Whatever the selection picks, told the spine's and hosts' link costs.
    Auto,
    /// The ring in topology order, the racks not given but probed
    /// (`HCOMM_TOPOLOGY=probe`).
    Probe,
    /// Whatever the selection picks after `Communicator::calibrate` measured each
    /// level's links (nothing configured).
    Calibrated,
}

impl Mode {
    fn env(self) -> Vec<(&'static str, String)> {
        let algo = |a: &str| ("HCOMM_ALGO_ALLREDUCE", a.to_string());
        match self {
            Mode::Flat => vec![("HCOMM_TOPO_AWARE", "0".into()), algo("ring")],
            Mode::Ring => vec![algo("ring")],
            Mode::Hier => vec![algo("hierarchical")],
            Mode::Auto => vec![
                ("HCOMM_COST_SPINE_GBPS", format!("{}", SPINE_RATE / 1e9)),
                ("HCOMM_COST_SPINE_US", "2000".into()),
                ("HCOMM_COST_GBPS", "0.4".into()),
                ("HCOMM_COST_HOST_GBPS", "2".into()),
            ],
            Mode::Probe => vec![algo("ring"), ("HCOMM_TOPOLOGY", "probe".into())],
            Mode::Calibrated => vec![("TWO_RACK_CALIBRATE", "1".into())],
        }
    }
}

struct Run {
    /// Bytes that crossed the spine, both directions.
    spine: u64,
    /// Slowest rank's median time per allreduce.
    secs: f64,
    /// The algorithm rank 0 ran.
    algo: String,
    /// The racks rank 0 saw.
    racks: usize,
    /// Rank 0's calibrated link costs (α in s, β in s/B): host, rack, spine.
    cost: Option<[f64; 6]>,
}

/// A command that runs `program` as rank `r` of a job on the cluster, its rendezvous
/// on `port` of host 0.
fn rank_command(c: &Cluster, r: usize, program: &std::path::Path, port: u16) -> std::process::Command {
    let h = host_of(r);
    let mut cmd = c.command(h, program);
    cmd.env("HCOMM_RANK", r.to_string())
        .env("HCOMM_SIZE", RANKS.to_string())
        .env("HCOMM_ADDR", format!("{}:{port}", netem::host_ip(0)))
        .env("HCOMM_JOB_ID", format!("two-racks-{port}"))
        .env("HCOMM_JOB_SECRET", "two racks test")
        .env("HCOMM_IFNAME", "10.78.0.0/24,^lo")
        // The namespaces share one hostname: each names its own host.
        .env("HCOMM_HOST", format!("h{h}"))
        .env("HCOMM_RACK", format!("rack{}", rack_of_host(h)))
        // Eight processes on this machine's two cores: no spinning.
        .env("HCOMM_TCP_SPIN_US", "0")
        .env("HCOMM_SHM_SPIN_US", "0")
        // A saturated spine delays heartbeats of idle connections behind its queue;
        // these runs are about bytes and time, not failure detection.
        .env("HCOMM_PEER_TIMEOUT", "5")
        .env("HCOMM_TIMEOUT", "300");
    cmd
}

fn run(c: &Cluster, mode: Mode, bytes: usize, iters: usize, port: u16) -> Run {
    c.reset_bytes();
    let me = std::env::current_exe().unwrap();
    let children: Vec<Child> = (0..RANKS)
        .map(|r| {
            let mut cmd = rank_command(c, r, &me, port);
            cmd.args(["two_rack_rank", "--exact", "--ignored", "--nocapture", "--test-threads", "1"])
                .env("TWO_RACK_BYTES", bytes.to_string())
                .env("TWO_RACK_ITERS", iters.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for (k, v) in mode.env() {
                cmd.env(k, v);
            }
            if mode == Mode::Probe {
                cmd.env_remove("HCOMM_RACK");
            }
            cmd.spawn().unwrap()
        })
        .collect();
    let done: Vec<Output> = children.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
    // Every failed rank's output: the first in rank order often only reports a peer
    // that failed before it.
    let failed: Vec<String> = done
        .iter()
        .enumerate()
        .filter(|(_, o)| !o.status.success())
        .map(|(r, o)| {
            let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
            format!("rank {r} failed:\n{out}\n{err}")
        })
        .collect();
    assert!(failed.is_empty(), "{mode:?}: {}", failed.join("\n"));
    let outs: Vec<String> = done.into_iter().map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).collect();
    let mut worst = 0.0f64;
    for out in &outs {
        let mut t: Vec<f64> = out
            .lines()
            .filter_map(|l| l.split_once("TIME ").map(|(_, rest)| rest))
            .map(|rest| rest.split_whitespace().nth(2).unwrap().parse().unwrap())
            .collect();
        assert_eq!(t.len(), iters, "{out}");
        t.sort_by(f64::total_cmp);
        worst = worst.max(t[t.len() / 2]);
    }
    let algo = outs[0]
        .lines()
        .find_map(|l| l.split_once(" algo ").map(|(_, rest)| rest.split_whitespace().next().unwrap().to_owned()))
        .unwrap();
    let seen = outs[0]
        .lines()
        .find_map(|l| l.split_once(" racks ").map(|(_, rest)| rest.split_whitespace().next().unwrap().parse().unwrap()))
        .unwrap_or_else(|| panic!("no racks line in rank 0's output:\n{}", outs[0]));
    let spine = spine_bytes(c);
    let cost = outs[0].lines().find_map(|l| l.split_once("COST 0 ").map(|(_, rest)| rest)).map(|rest| {
        let v: Vec<f64> = rest.split_whitespace().map(|x| x.parse().unwrap()).collect();
        <[f64; 6]>::try_from(v).unwrap()
    });
    Run { spine, secs: worst, algo, racks: seen, cost }
}

/// Bytes the relay carried between hosts of different racks, both directions, since
/// its counters were last reset.
fn spine_bytes(c: &Cluster) -> u64 {
    (0..HOSTS)
        .flat_map(|a| (0..HOSTS).map(move |b| (a, b)))
        .filter(|&(a, b)| rack_of_host(a) != rack_of_host(b))
        .map(|(a, b)| c.bytes(a, b))
        .sum()
}

fn cluster() -> Option<Cluster> {
    let c = netem::or_skip(Cluster::new(HOSTS))?;
    let racks: Vec<usize> = (0..HOSTS).map(rack_of_host).collect();
    c.set_spine(
        &racks,
        netem::Path {
            delay: SPINE_DELAY,
            rate: Some(SPINE_RATE),
            // A 2 MB switch buffer in front of the spine.
            queue: Some(Duration::from_secs_f64(2e6 / SPINE_RATE)),
            ..netem::Path::default()
        },
    );
    Some(c)
}

fn report(label: &str, bytes: usize, runs: &[(Mode, Run)]) {
    let flat = &runs[0].1;
    for (mode, r) in runs {
        println!(
            "{label} {bytes} B: {mode:?} ({}): spine {:.1} MB ({:.0}% of flat), {:.3} s per allreduce ({:.2}x flat's speed)",
            r.algo,
            r.spine as f64 / 1e6,
            100.0 * r.spine as f64 / flat.spine as f64,
            r.secs,
            flat.secs / r.secs
        );
    }
}

#[test]
fn topology_aware_allreduce_crosses_the_spine_less() {
    let Some(c) = cluster() else { return };
    let (bytes, iters) = (4 << 20, 2);
    let runs: Vec<(Mode, Run)> = [Mode::Flat, Mode::Ring, Mode::Hier, Mode::Auto, Mode::Probe]
        .into_iter()
        .enumerate()
        .map(|(i, m)| (m, run(&c, m, bytes, iters, 29600 + i as u16)))
        .collect();
    report("two racks", bytes, &runs);
    let flat = runs[0].1.spine as f64;
    for (mode, r) in &runs[1..] {
        assert!(
            (r.spine as f64) <= 0.4 * flat,
            "{mode:?} ({}) sent {} bytes across the spine, flat {flat}: not 60% fewer",
            r.algo,
            r.spine
        );
    }
    assert_eq!(runs[0].1.algo, AllreduceAlgo::Ring.name());
    assert_eq!(runs[3].1.algo, AllreduceAlgo::Hierarchical.name(), "told the spine is slow, the selection");
    // Probing finds the two racks (1 ms each way across the spine, nothing inside).
    assert_eq!(runs[4].1.racks, 2, "probed racks");
    assert_eq!(runs[0].1.racks, 2, "racks given");

    // Calibration measures each level (its ping-pongs cross the spine too, so its
    // spine bytes are not compared): the spine (1 ms each way, 40 MB/s) slower than
    // the links inside a rack (the relay, unshaped), those slower than shared memory.
    let cal = run(&c, Mode::Calibrated, bytes, iters, 29610);
    let [ha, hb, ra, rb, sa, sb] = cal.cost.expect("rank 0 printed its calibrated costs");
    println!(
        "two racks: calibrated: host {:.1} us {:.2} GB/s, rack {:.1} us {:.2} GB/s, spine {:.1} us {:.3} GB/s; \
         picks {} ({:.3} s per allreduce)",
        ha * 1e6,
        1e-9 / hb,
        ra * 1e6,
        1e-9 / rb,
        sa * 1e6,
        1e-9 / sb,
        cal.algo,
        cal.secs
    );
    assert!(sa > ra && sb > rb, "spine not measured slower than the rack: {:?}", cal.cost);
    assert!(hb < rb, "shared memory not measured faster than the rack: {:?}", cal.cost);
}

/// Times 16 MiB allreduces in every mode, three runs each (by hand:
/// `cargo test --release -p hcomm --test two_racks -- --ignored --nocapture two_racks_benchmark`).
#[test]
#[ignore = "a benchmark, run by hand"]
fn two_racks_benchmark() {
    let Some(c) = cluster() else { return };
    let bytes = std::env::var("TWO_RACK_BENCH_BYTES").map_or(16 << 20, |v| v.parse().unwrap());
    let mut port = 29700;
    for round in 0..3 {
        let runs: Vec<(Mode, Run)> = [Mode::Flat, Mode::Ring, Mode::Hier, Mode::Auto]
            .into_iter()
            .map(|m| {
                port += 1;
                (m, run(&c, m, bytes, 5, port))
            })
            .collect();
        report(&format!("round {round}"), bytes, &runs);
    }
}

/// `examples/halo_exchange` on the two racks, with and without the grid hint, three
/// rounds, on a slower spine (4 MB/s, 2 ms: halos across it cost more than the
/// interior computation hides). By hand, after building the example:
/// `cargo build --release --example halo_exchange && cargo test --release -p hcomm --test two_racks -- --ignored --nocapture halo_benchmark`.
#[test]
#[ignore = "a benchmark, run by hand"]
fn halo_benchmark() {
    let Some(c) = cluster() else { return };
    let racks: Vec<usize> = (0..HOSTS).map(rack_of_host).collect();
    let rate = 4e6;
    c.set_spine(
        &racks,
        netem::Path {
            delay: Duration::from_millis(2),
            rate: Some(rate),
            queue: Some(Duration::from_secs_f64(2e6 / rate)),
            ..netem::Path::default()
        },
    );
    let exe = std::env::current_exe().unwrap();
    let example = exe.parent().unwrap().parent().unwrap().join("examples").join("halo_exchange");
    assert!(example.exists(), "{} is missing: build it with cargo build --example halo_exchange", example.display());
    let cells = std::env::var("HALO_CELLS").unwrap_or_else(|_| "512".into());
    let mut port = 29800;
    // Runs the example; returns the spine bytes and rank 0's report.
    let mut halo = |hint: &str, steps: usize| -> (u64, String) {
        port += 1;
        c.reset_bytes();
        let children: Vec<Child> = (0..RANKS)
            .map(|r| {
                let mut cmd = rank_command(&c, r, &example, port);
                cmd.args(["--grid", "2x4", "--cells", &cells, "--steps", &steps.to_string(), "--hint", hint])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
                cmd.spawn().unwrap()
            })
            .collect();
        let outs: Vec<Output> = children.into_iter().map(|ch| ch.wait_with_output().unwrap()).collect();
        let mut report = String::new();
        for (r, o) in outs.iter().enumerate() {
            let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
            if !o.status.success() {
                let all: Vec<String> = outs
                    .iter()
                    .enumerate()
                    .map(|(q, o)| format!("rank {q}: {}", String::from_utf8_lossy(&o.stderr)))
                    .collect();
                panic!("hint {hint}: rank {r} failed:\n{out}\n{err}\nall ranks:\n{}", all.join("\n"));
            }
            report.push_str(&out);
        }
        let spine = (0..HOSTS)
            .flat_map(|a| (0..HOSTS).map(move |b| (a, b)))
            .filter(|&(a, b)| racks[a] != racks[b])
            .map(|(a, b)| c.bytes(a, b))
            .sum();
        (spine, report)
    };
    for round in 0..3 {
        for hint in ["none", "grid"] {
            // The same job without steps: bootstrap, the final gather and checks.
            let (base, _) = halo(hint, 0);
            let (spine, report) = halo(hint, 100);
            println!(
                "round {round} hint {hint}: halo bytes across the spine {:.2} MB (job {:.2} MB, of which {:.2} MB without steps)\n{}",
                spine.saturating_sub(base) as f64 / 1e6,
                spine as f64 / 1e6,
                base as f64 / 1e6,
                report.trim_end()
            );
        }
    }
}

/// OpenMPI (Debian's 4.1, its default components, `mpi_yield_when_idle 1`) on the same
/// cluster with the same interleaved placement (`--map-by node`: rank `r` on host
/// `r % 4`), running `benches/compare/mpi_allreduce` (rank 0's median of 4
/// barrier-timed f32 sum allreduces after 2 untimed: 6 in all, as the HComm runs
/// above), beside the spine bytes it sends; `mpirun` runs on host 0 and
/// reaches the other hosts through a launch agent that enters their namespaces. By
/// hand, after building the MPI program (`benches/compare/run.sh` builds it into
/// `target/compare`):
/// `cargo test --release -p hcomm --test two_racks -- --ignored --nocapture two_racks_openmpi`
/// (`MPI_ALLREDUCE=path` for another build, `TWO_RACK_BENCH_BYTES` for another size).
#[test]
#[ignore = "a benchmark, run by hand"]
fn two_racks_openmpi() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let bin = std::env::var("MPI_ALLREDUCE")
        .map_or_else(|_| root.join("target/compare/mpi_allreduce"), std::path::PathBuf::from);
    if !bin.exists() || std::process::Command::new("mpirun.openmpi").arg("--version").output().is_err() {
        println!("SKIPPED: needs mpirun.openmpi and {} (benches/compare/run.sh builds it)", bin.display());
        return;
    }
    let Some(c) = cluster() else { return };
    let bytes = std::env::var("TWO_RACK_BENCH_BYTES").map_or(16 << 20, |v| v.parse().unwrap());
    let dir = std::env::temp_dir().join(format!("hcomm-two-racks-ompi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The launch agent gets the host (a namespace) and the daemon's command line. The
    // namespaces share this machine's hostname and /dev/shm, where OpenMPI's shared
    // memory names its segments by hostname: each daemon gets the namespace's name as
    // its own hostname (a UTS namespace), or ranks of two hosts would map one segment.
    let agent = dir.join("agent.sh");
    std::fs::write(
        &agent,
        "#!/bin/sh\nhost=$1\nshift\nexec ip netns exec \"$host\" unshare --uts sh -c \"hostname $host && $*\"\n",
    )
    .unwrap();
    std::process::Command::new("chmod").arg("+x").arg(&agent).status().unwrap();
    let hostfile = dir.join("hosts");
    std::fs::write(&hostfile, (0..HOSTS).map(|h| format!("{} slots=2\n", c.ns(h))).collect::<String>()).unwrap();
    for round in 0..3 {
        c.reset_bytes();
        let mut cmd = c.command(0, "mpirun.openmpi");
        cmd.args(["--allow-run-as-root", "--oversubscribe", "-n", &RANKS.to_string(), "--map-by", "node"])
            .arg("--hostfile")
            .arg(&hostfile)
            .args(["--mca", "plm_rsh_agent"])
            .arg(&agent)
            .args(["--mca", "oob_tcp_if_include", "10.78.0.0/24", "--mca", "btl_tcp_if_include", "10.78.0.0/24"])
            .args(["--mca", "mpi_yield_when_idle", "1"])
            .arg(&bin)
            .args([bytes.to_string(), "4".to_string()]);
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "mpirun failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        let ms: f64 = stdout
            .lines()
            .find_map(|l| l.strip_prefix("median_ms "))
            .unwrap_or_else(|| panic!("no median in:\n{stdout}"))
            .trim()
            .parse()
            .unwrap();
        let spine = spine_bytes(&c);
        println!(
            "round {round} {bytes} B: OpenMPI: spine {:.1} MB, {:.3} s per allreduce (rank 0's median)",
            spine as f64 / 1e6,
            ms / 1e3
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
