//! Point-to-point semantics over the in-process transport.

mod common;

use std::time::Duration;

use common::*;
use futures::future::join_all;

#[tokio::test(flavor = "current_thread")]
async fn all_pairs_for_rank_counts_1_to_8() {
    for n in 1..=8 {
        let comms = hcomm::local(n);
        for count in [0, 1, 2, 13, 1024, 65_537] {
            p2p_all_pairs(&comms, count, n as u64).await;
            p2p_bytes_all_pairs(&comms, count * 3, n as u64).await;
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn same_tag_messages_keep_their_order() {
    let comms = hcomm::local(2);
    let recvs: Vec<_> = (0..50).map(|_| comms[1].recv::<u32>(0, 9)).collect();
    for i in 0..50u32 {
        comms[0].send(1, 9, &[i; 3]).await.unwrap();
    }
    for (i, r) in join_all(recvs).await.into_iter().enumerate() {
        assert_eq!(r.unwrap(), vec![i as u32; 3]);
    }
}

#[tokio::test(flavor = "current_thread")]
async fn sends_are_queued_at_the_call() {
    sends_queue_at_the_call(&hcomm::local(2)).await;
}

#[tokio::test(flavor = "current_thread")]
async fn type_and_length_mismatches_are_errors() {
    let comms = hcomm::local(2);
    comms[1].set_timeout(Duration::from_secs(5));
    comms[0].send(1, 1, &[1.0f32, 2.0]).await.unwrap();
    let e = comms[1].recv::<i32>(0, 1).await.unwrap_err();
    assert!(e.is_mismatch(), "{e}");
    // Bytes are typed u8: a typed receive of another type refuses them.
    comms[0].send_bytes(1, 1, hcomm::Bytes::from_static(&[1, 2, 3, 4])).await.unwrap();
    assert!(comms[1].recv::<f32>(0, 1).await.unwrap_err().is_mismatch());
    assert!(e.to_string().contains("f32"), "{e}");

    comms[0].send(1, 2, &[1u8, 2, 3]).await.unwrap();
    let mut small = [0u8; 2];
    let e = comms[1].recv_into(0, 2, &mut small).await.unwrap_err();
    assert!(e.is_mismatch(), "{e}");

    let e = comms[0].send(5, 0, &[1u8]).await.unwrap_err();
    assert!(e.is_invalid_argument(), "{e}");
}

#[tokio::test(flavor = "current_thread")]
async fn recv_without_send_times_out_naming_the_peer() {
    tokio::time::pause();
    let comms = hcomm::local(2);
    comms[0].set_timeout(Duration::from_secs(3));
    let e = comms[0].recv::<u8>(1, 0).await.unwrap_err();
    assert!(e.is_timeout(), "{e}");
    assert_eq!(e.peer(), Some(1));
}

#[tokio::test(flavor = "current_thread")]
async fn sendrecv_ring_shift() {
    for n in 1..=7 {
        let comms = hcomm::local(n);
        let data: Vec<[u64; 4]> = (0..n).map(|r| [r as u64; 4]).collect();
        let got = join_all(comms.iter().map(|c| {
            let r = c.rank();
            c.sendrecv((r + 1) % n, 0, &data[r], (r + n - 1) % n, 0)
        }))
        .await;
        for (r, g) in got.into_iter().enumerate() {
            assert_eq!(g.unwrap(), vec![((r + n - 1) % n) as u64; 4]);
        }
    }
}
