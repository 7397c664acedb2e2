//! `HCOMM_STATS`: four processes started by `hcomm run` with statistics at level 2
//! and a file pattern; the files must count exactly what the ranks did, and
//! `hcomm stats` must merge them.
//!
//! The ranks are this test binary itself, running the ignored `stats_rank` function
//! under `hcomm run`'s environment.

use std::process::Command;

use hcomm::{AllreduceAlgo, BcastAlgo, ReduceOp};

const ALLREDUCES: u64 = 5;
const COUNT: usize = 1000;
const BCASTS: u64 = 3;
const BCAST_BYTES: usize = 256;
const BARRIERS: u64 = 2;
const SENDS: u64 = 2;
const SEND_COUNT: usize = 100;

/// One rank's part (run by `stats_files_count_what_the_ranks_did` through
/// `hcomm run`).
#[tokio::test(flavor = "current_thread")]
#[ignore = "a rank of the HCOMM_STATS test, started by it"]
async fn stats_rank() {
    let comm = hcomm::init().await.unwrap();
    let r = comm.rank();
    for _ in 0..ALLREDUCES {
        let mut v = vec![r as f32; COUNT];
        comm.all_reduce_with(&mut v, ReduceOp::Sum, AllreduceAlgo::Ring).await.unwrap();
        assert_eq!(v[0], 6.0);
    }
    for _ in 0..BCASTS {
        let mut b = vec![r as u8; BCAST_BYTES];
        comm.broadcast_with(&mut b, 1, BcastAlgo::Binomial).await.unwrap();
        assert_eq!(b[0], 1);
    }
    for _ in 0..BARRIERS {
        comm.barrier().await.unwrap();
    }
    for _ in 0..SENDS {
        match r {
            0 => comm.send(1, 7, &[1.5f64; SEND_COUNT]).await.unwrap(),
            1 => assert_eq!(comm.recv::<f64>(0, 7).await.unwrap(), vec![1.5; SEND_COUNT]),
            _ => {}
        }
    }
}

#[test]
fn stats_files_count_what_the_ranks_did() {
    let dir = std::env::temp_dir().join(format!("hcomm-stats-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pattern = dir.join("stats.%r.json");
    let me = std::env::current_exe().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hcomm"))
        .args(["run", "-n", "4", "--"])
        .arg(&me)
        .args(["stats_rank", "--exact", "--ignored", "--test-threads", "1"])
        .env("HCOMM_STATS", "1")
        .env("HCOMM_STATS_LEVEL", "2")
        .env("HCOMM_STATS_FILE", &pattern)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let files: Vec<_> = (0..4).map(|r| dir.join(format!("stats.{r}.json"))).collect();
    let ranks = hcomm::stats::read_files(&files).unwrap();
    let elem = std::mem::size_of::<f32>() as u64;
    for (r, st) in ranks.iter().enumerate() {
        assert_eq!(st.rank as usize, r);
        assert_eq!(st.level, 2);
        let op = |name: &str| st.ops.get(name).unwrap_or_else(|| panic!("rank {r}: no {name} in {:?}", st.ops.keys()));
        let ar = op("allreduce");
        assert_eq!((ar.count, ar.errors, ar.bytes), (ALLREDUCES, 0, ALLREDUCES * COUNT as u64 * elem), "rank {r}");
        assert!(ar.min_ns > 0 && ar.min_ns <= ar.mean_ns() && ar.mean_ns() <= ar.max_ns, "{ar:?}");
        let bc = op("broadcast");
        assert_eq!((bc.count, bc.bytes), (BCASTS, BCASTS * BCAST_BYTES as u64), "rank {r}");
        assert_eq!(op("barrier").count, BARRIERS);
        let p2p = SENDS * SEND_COUNT as u64 * 8;
        match r {
            0 => assert_eq!((op("send").count, op("send").bytes), (SENDS, p2p)),
            1 => {
                assert_eq!((op("recv").count, op("recv").bytes), (SENDS, p2p));
                // Timed (a stopwatch that asked the statistics' filter wrongly read 0).
                assert!(op("recv").min_ns > 0, "{:?}", op("recv"));
            }
            _ => assert!(!st.ops.contains_key("send") && !st.ops.contains_key("recv")),
        }
        // Level 2: algorithms, sizes, peers, hotspots.
        assert_eq!(st.algos["allreduce/ring"].count, ALLREDUCES);
        assert_eq!(st.algos["broadcast/binomial"].count, BCASTS);
        assert_eq!(st.sizes["allreduce"].get(&11), Some(&ALLREDUCES), "4000 bytes fall in [2048, 4096)");
        assert_eq!(st.sizes["broadcast"].get(&8), Some(&BCASTS));
        assert_eq!(st.sizes["barrier"].get(&-1), Some(&BARRIERS));
        // The ring passes 2(n-1) pieces of a quarter each to the next rank.
        let right = st.peers.get(&((r as u32 + 1) % 4)).expect("the ring's right neighbour");
        assert!(right.sent_bytes >= ALLREDUCES * 6 * (COUNT as u64 / 4) * elem, "rank {r}: {right:?}");
        assert!(!st.hot_ops.is_empty() && !st.hot_peers.is_empty());
    }
    // Every byte sent was received, link by link.
    for a in &ranks {
        for (p, x) in &a.peers {
            let back = &ranks[*p as usize].peers[&a.rank];
            assert_eq!((x.sent_bytes, x.sent_msgs), (back.recv_bytes, back.recv_msgs), "{} -> {p}", a.rank);
        }
    }
    let merged = Command::new(env!("CARGO_BIN_EXE_hcomm")).arg("stats").args(&files).output().unwrap();
    assert!(merged.status.success());
    let report = String::from_utf8(merged.stdout).unwrap();
    assert!(report.contains("hcomm stats: 4 ranks"), "{report}");
    let line = report.lines().find(|l| l.trim_start().starts_with("allreduce")).expect("an allreduce row");
    assert!(line.contains(&format!(" {} ", 4 * ALLREDUCES)), "{line}");
    assert!(report.contains("busiest links") && report.contains("0 -> 1"), "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}
