//! The allreduce matrix, point-to-point and concurrency over real sockets: loopback TCP
//! with tokio, and loopback TCP driven by io_uring. Ranks are tasks of this process,
//! each with its own connections.

mod common;

use std::time::Duration;

use common::*;
use futures::future::join_all;
use hcomm::{Communicator, LocalTransport, ReduceOp};

async fn suite<T: LocalTransport>(comms: &[Communicator<T>]) {
    matrix(comms, NET_SIZES).await;
    // Multi-fragment messages (fragments are 512 KiB) and pipelined columns.
    check_allreduce::<T, f32>(comms, 1_500_007, ReduceOp::Sum, 99).await;
    for count in [0, 1, 13, 100_003, 700_001] {
        p2p_all_pairs(comms, count, count as u64).await;
    }
    // Owned byte messages, from one byte to several fragments read straight into
    // pooled buffers.
    for len in [0, 1, 31, 32_768, 65_537, 1_048_583] {
        p2p_bytes_all_pairs(comms, len, len as u64).await;
    }
}

async fn hundred_in_flight<T: LocalTransport>(comms: &[Communicator<T>]) {
    let sizes: Vec<usize> = (0..100).map(|i| [0, 3, 1000, 65_537, 200_003][i % 5] + i).collect();
    in_flight::<T, i64>(comms, &sizes, ReduceOp::Sum).await;
}

async fn mismatch<T: LocalTransport>(comms: &mut [Communicator<T>]) {
    comms.iter_mut().for_each(|c| c.set_timeout(Duration::from_secs(20)));
    let n = comms.len();
    let mut bufs: Vec<Vec<f64>> = (0..n).map(|r| vec![0.5; if r == n - 1 { 4096 } else { 4095 }]).collect();
    let res = join_all(comms.iter().zip(bufs.iter_mut()).map(|(c, b)| c.all_reduce(b, ReduceOp::Sum))).await;
    for (r, res) in res.into_iter().enumerate() {
        let e = res.expect_err("mismatch must fail");
        assert!(e.is_mismatch(), "rank {r}: {e}");
    }
    check_allreduce::<T, f64>(comms, 4095, ReduceOp::Sum, 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_ranks_1_to_8() {
    for n in 1..=8 {
        let comms = hcomm::local_tcp(n).await.unwrap();
        assert_eq!(comms[0].transport_name(), "tcp");
        suite(&comms).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_in_flight_and_mismatch() {
    let mut comms = hcomm::local_tcp(4).await.unwrap();
    hundred_in_flight(&comms).await;
    mismatch(&mut comms).await;
}

/// Over tcp, shared memory (where large `send`s lend the caller's buffer) and io_uring.
#[tokio::test(flavor = "current_thread")]
async fn sends_are_queued_at_the_call() {
    sends_queue_at_the_call(&hcomm::local_tcp(2).await.unwrap()).await;
    sends_queue_at_the_call(&hcomm::local_shm(2).await.unwrap()).await;
    #[cfg(all(feature = "uring", target_os = "linux"))]
    std::thread::spawn(|| {
        tokio_uring::start(async { sends_queue_at_the_call(&hcomm::local_uring(2).await.unwrap()).await })
    })
    .join()
    .unwrap();
}

/// The last rank's communicator goes: an allreduce of the others fails with a
/// peer-failed error naming it, on each of them.
async fn peer_that_closes<T: LocalTransport>(mut comms: Vec<Communicator<T>>) {
    comms.iter_mut().for_each(|c| c.set_timeout(Duration::from_secs(30)));
    let gone = comms.len() - 1;
    drop(comms.pop());
    let mut bufs = vec![vec![1.0f32; 1000]; 2];
    let res = join_all(comms.iter().zip(bufs.iter_mut()).map(|(c, b)| c.all_reduce(b, ReduceOp::Sum))).await;
    for e in res {
        let e = e.unwrap_err();
        assert!(e.is_peer_failed(), "{e}");
        assert_eq!(e.peer(), Some(gone), "{e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_peer_that_closes_fails_pending_operations() {
    peer_that_closes(hcomm::local_tcp(3).await.unwrap()).await;
}

#[cfg(all(feature = "uring", target_os = "linux"))]
#[test]
fn uring_ranks_1_to_8_in_flight_and_mismatch() {
    tokio_uring::start(async {
        for n in 1..=8 {
            let comms = hcomm::local_uring(n).await.unwrap();
            assert_eq!(comms[0].transport_name(), "uring");
            suite(&comms).await;
        }
        let mut comms = hcomm::local_uring(4).await.unwrap();
        hundred_in_flight(&comms).await;
        mismatch(&mut comms).await;
    });
}

/// The same suite over shared-memory rings (the TCP connections only ring doorbells),
/// where messages of several MB wrap and fill the 4 MiB rings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shm_ranks_1_to_8_in_flight_mismatch_and_close() {
    for n in 1..=8 {
        let comms = hcomm::local_shm(n).await.unwrap();
        if n > 1 {
            assert_eq!(comms[0].transport_name(), "shm");
        }
        suite(&comms).await;
    }
    let mut comms = hcomm::local_shm(4).await.unwrap();
    hundred_in_flight(&comms).await;
    mismatch(&mut comms).await;
    // A peer that goes: its close frame comes through the ring.
    peer_that_closes(hcomm::local_shm(3).await.unwrap()).await;
}

/// Shared memory with receives that read the ring once per poll and never spin
/// (`HCOMM_RECV_SPIN_US=0`; the default spins), on a multi-thread and on a
/// current-thread runtime: every message then comes through the reader task or a
/// later poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shm_receives_that_do_not_spin() {
    let polling = |c: &mut hcomm::Config| {
        c.shm = true;
        c.stream.recv_spin = Duration::ZERO;
    };
    for n in [2, 3, 5] {
        suite(&hcomm::local_tcp_with(n, polling).await.unwrap()).await;
    }
    let mut comms = hcomm::local_tcp_with(4, polling).await.unwrap();
    hundred_in_flight(&comms).await;
    mismatch(&mut comms).await;
    peer_that_closes(hcomm::local_tcp_with(3, polling).await.unwrap()).await;
}

#[tokio::test(flavor = "current_thread")]
async fn shm_receives_that_do_not_spin_on_one_thread() {
    let polling = |c: &mut hcomm::Config| {
        c.shm = true;
        c.stream.recv_spin = Duration::ZERO;
    };
    for n in [2, 3] {
        suite(&hcomm::local_tcp_with(n, polling).await.unwrap()).await;
    }
}

/// Small sends are written into the ring by the sending task when the writer task is
/// idle, larger ones by the writer task: a stream of both under one tag, issued without
/// waiting, still arrives whole and in order (a small message written directly while
/// the writer is in the middle of a large one would land inside its bytes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shm_direct_and_queued_sends_keep_their_order() {
    let comms = hcomm::local_shm(2).await.unwrap();
    assert_eq!(comms[0].transport_name(), "shm");
    let sizes: Vec<usize> = (0..400).map(|i| [8, 3 << 20, 0, 70_000, 1, 65_536, 200_003, 5][i % 8] + i % 3).collect();
    let message = |i: usize, len: usize| bytes::Bytes::from((0..len).map(|j| (i * 31 + j) as u8).collect::<Vec<u8>>());
    let sender = async {
        let sends: Vec<_> =
            sizes.iter().enumerate().map(|(i, &len)| comms[0].send_bytes(1, 7, message(i, len))).collect();
        futures::future::try_join_all(sends).await.unwrap();
    };
    let receiver = async {
        for (i, &len) in sizes.iter().enumerate() {
            let got = comms[1].recv_bytes(0, 7).await.unwrap();
            assert_eq!(got.len(), len, "message {i}");
            assert!(got == message(i, len), "message {i} ({len} bytes) differs");
        }
    };
    futures::join!(sender, receiver);
}
