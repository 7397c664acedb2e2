//! Several connections per peer (`HCOMM_LINKS`) over loopback: the usual suite over
//! striped links (tokio and io_uring), a connection broken in the middle of large
//! allreduces (nothing lost, duplicated or reordered; the others carry on), every
//! connection broken (a peer-failed error, not a hang), and ranks that disagree on
//! the number of links (a clear bootstrap error).
//!
//! A path that stalls without breaking (a cut cable, packets dropped) is tested on
//! emulated hosts in `netfaults.rs`.

mod common;

use std::time::Duration;

use common::*;
use futures::future::join_all;
use hcomm::{Communicator, LocalTransport, ReduceOp, StreamTransport};

async fn suite<T: LocalTransport>(comms: &[Communicator<T>]) {
    matrix(comms, NET_SIZES).await;
    check_allreduce::<T, f32>(comms, 1_500_007, ReduceOp::Sum, 99).await;
    for count in [0, 1, 13, 100_003, 700_001] {
        p2p_all_pairs(comms, count, count as u64).await;
    }
    for len in [0, 1, 31, 65_537, 3_000_017] {
        p2p_bytes_all_pairs(comms, len, len as u64).await;
    }
    let sizes: Vec<usize> = (0..64).map(|i| [0, 3, 1000, 65_537, 400_003][i % 5] + i).collect();
    in_flight::<T, i64>(comms, &sizes, ReduceOp::Sum).await;
}

/// Every peer's data came over every one of its links (the messages were striped).
fn assert_striped(comms: &[Communicator<StreamTransport>], links: usize) {
    for c in comms {
        for peer in (0..comms.len()).filter(|&p| p != c.rank()) {
            let s = c.transport().link_stats(peer).expect("a bundle per peer");
            assert_eq!((s.links, s.alive), (links, links), "rank {} to {peer}: {s:?}", c.rank());
            assert!(s.received.iter().all(|&b| b > 0), "rank {} from {peer}: a link carried nothing: {s:?}", c.rank());
            // A failover can happen here without a fault: ranks that share two cores
            // can leave acknowledgements unsent for longer than the stall limit. It
            // only costs a resend.
            if s.failovers > 0 {
                println!("rank {} to {peer}: {} failovers without a fault ({s:?})", c.rank(), s.failovers);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_links_suite() {
    for (n, links) in [(2, 2), (3, 3), (5, 2)] {
        let comms = hcomm::local_tcp_with(n, |c| c.links = links).await.unwrap();
        suite(&comms).await;
        assert_striped(&comms, links);
    }
}

#[cfg(all(feature = "uring", target_os = "linux"))]
#[test]
fn uring_links_suite() {
    tokio_uring::start(async {
        for (n, links) in [(2, 3), (4, 2)] {
            let comms = hcomm::local_uring_with(n, |c| c.links = links).await.unwrap();
            suite(&comms).await;
            assert_striped(&comms, links);
        }
    });
}

/// Rank 0 breaks one of its connections to rank 1 `after` into a stream of large
/// allreduces; every allreduce still comes out right on every rank.
async fn break_one_link(comms: &[Communicator<StreamTransport>], after: Duration, seed: u64) {
    let count = 3_000_017;
    let n = comms.len();
    let inputs = inputs::<f64>(n, count, ReduceOp::Sum, seed);
    let mut bufs = inputs.clone();
    let ops = join_all(comms.iter().zip(bufs.iter_mut()).map(|(c, b)| c.all_reduce(b, ReduceOp::Sum)));
    let cut = async {
        tokio::time::sleep(after).await;
        comms[0].transport().break_link(1, 0).unwrap();
    };
    let (res, ()) = tokio::join!(ops, cut);
    for (r, res) in res.into_iter().enumerate() {
        res.unwrap_or_else(|e| panic!("rank {r}, link broken after {after:?}: {e}"));
    }
    for (r, b) in bufs.iter().enumerate() {
        check_against_reference(&inputs, ReduceOp::Sum, b, &format!("rank {r}, link broken after {after:?}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_link_loses_nothing() {
    let mut failovers = 0;
    for (k, after) in [Duration::ZERO, Duration::from_millis(2), Duration::from_millis(15)].into_iter().enumerate() {
        let comms = hcomm::local_tcp_with(3, |c| {
            c.links = 2;
            c.timeout = Duration::from_secs(30);
        })
        .await
        .unwrap();
        break_one_link(&comms, after, k as u64).await;
        let s0 = comms[0].transport().link_stats(1).unwrap();
        assert_eq!(s0.alive, 1, "rank 0's link 0 to rank 1 is gone: {s0:?}");
        failovers += s0.failovers;
        // Rank 1 saw it end too, and both carry on over the other link.
        let s1 = comms[1].transport().link_stats(0).unwrap();
        assert_eq!(s1.alive, 1, "{s1:?}");
        check_allreduce::<StreamTransport, i32>(&comms, 100_003, ReduceOp::Sum, 7).await;
        for res in join_all(comms.iter().map(Communicator::finalize)).await {
            res.unwrap();
        }
        println!("link 0 broken after {after:?}: rank 0 moved {} bytes in {} failovers", s0.resent_bytes, s0.failovers);
    }
    // Broken at once, the link may have held nothing yet; 15 ms into 24 MB it does.
    assert!(failovers >= 1, "no break found data to move: the test did not test failover");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_link_broken_fails_the_peer() {
    let mut comms = hcomm::local_tcp_with(2, |c| c.links = 2).await.unwrap();
    comms.iter_mut().for_each(|c| c.set_timeout(Duration::from_secs(30)));
    for link in 0..2 {
        comms[0].transport().break_link(1, link).unwrap();
    }
    let mut bufs = vec![vec![1.0f32; 100_000]; 2];
    let res = join_all(comms.iter().zip(bufs.iter_mut()).map(|(c, b)| c.all_reduce(b, ReduceOp::Sum))).await;
    for (r, e) in res.into_iter().enumerate() {
        let e = e.expect_err("no link left");
        assert!(e.is_peer_failed(), "rank {r}: {e}");
        assert_eq!(e.peer(), Some(1 - r), "rank {r}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranks_that_disagree_on_links_get_a_clear_error() {
    let res = hcomm::local_tcp_with(2, |c| {
        c.links = if c.rank == 0 { 2 } else { 1 };
        c.connect_timeout = Duration::from_secs(10);
    })
    .await;
    let e = res.expect_err("links differ");
    assert!(e.to_string().contains("HCOMM_LINKS"), "{e}");
}
