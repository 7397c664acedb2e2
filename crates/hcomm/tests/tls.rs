//! The data path under TLS (cargo feature `tls`, `HCOMM_TLS=1`): the usual checks over
//! encrypted connections, tokio and io_uring, and the settings that cannot go with
//! it. That the wire carries no plaintext, and that another job's key is refused, is
//! tested in `hcomm_transport::tls`.
#![cfg(feature = "tls")]

mod common;

use common::*;
use hcomm::{Communicator, LocalTransport, ReduceOp, StreamTransport};

async fn suite<T: LocalTransport>(comms: &[Communicator<T>]) {
    matrix(comms, NET_SIZES).await;
    check_allreduce::<T, f32>(comms, 1_500_007, ReduceOp::Sum, 99).await;
    for count in [0, 1, 13, 100_003] {
        p2p_all_pairs(comms, count, count as u64).await;
    }
    for len in [0, 1, 65_537, 1_048_583] {
        p2p_bytes_all_pairs(comms, len, len as u64).await;
    }
    let sizes: Vec<usize> = (0..32).map(|i| [0, 3, 1000, 65_537][i % 4] + i).collect();
    in_flight::<T, i64>(comms, &sizes, ReduceOp::Sum).await;
}

fn assert_encrypted(comms: &[Communicator<StreamTransport>]) {
    for c in comms {
        for peer in (0..comms.len()).filter(|&p| p != c.rank()) {
            assert!(c.transport().is_encrypted(peer), "rank {} to {peer} is not encrypted", c.rank());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_under_tls() {
    for n in [2, 3, 5] {
        let comms = hcomm::local_tcp_with(n, |c| c.tls = true).await.unwrap();
        assert_encrypted(&comms);
        suite(&comms).await;
        for r in futures::future::join_all(comms.iter().map(Communicator::finalize)).await {
            r.unwrap();
        }
    }
}

#[cfg(all(feature = "uring", target_os = "linux"))]
#[test]
fn uring_under_tls() {
    tokio_uring::start(async {
        let comms = hcomm::local_uring_with(3, |c| c.tls = true).await.unwrap();
        assert_encrypted(&comms);
        suite(&comms).await;
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_several_links_is_refused() {
    let e = hcomm::local_tcp_with(2, |c| {
        c.tls = true;
        c.links = 2;
    })
    .await
    .expect_err("not supported together");
    assert!(e.to_string().contains("HCOMM_TLS"), "{e}");
}
