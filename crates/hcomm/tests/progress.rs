//! Receives that spin on their link, park, or are not posted yet, on a multi-thread
//! runtime with each rank's work on its own task: whatever the pattern, every
//! message arrives intact. The links wake their reader task only when no receive
//! spins on them, and after a run of receives only once the run has paused (see
//! `hcomm_transport`'s `arm` module), so these patterns cover each way back to a
//! woken reader: a receive that parks, a writer that waits for room in a ring nobody
//! reads, a message that waits for its receive, and two receives from one peer in
//! different tasks.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::random_bytes;
use hcomm::{Communicator, StreamTransport};

/// Larger than the default shared-memory ring (4 MiB), so that the writer waits for
/// room while the receiver sleeps.
const OVER_A_RING: usize = 6 << 20;

async fn patterns(comms: Vec<Communicator<StreamTransport>>) {
    let mut comms = comms;
    for c in &mut comms {
        c.set_timeout(Duration::from_secs(60));
    }
    let mut it = comms.into_iter();
    let (a, b) = (Arc::new(it.next().unwrap()), Arc::new(it.next().unwrap()));
    let ranks = [tokio::spawn(rank0(a.clone())), tokio::spawn(rank1(b.clone()))];
    for r in ranks {
        tokio::time::timeout(Duration::from_secs(120), r).await.expect("no hang").expect("no panic");
    }
}

async fn rank0(c: Arc<Communicator<StreamTransport>>) {
    // Ping-pong: each receive spins for its reply.
    for i in 0..300u64 {
        let len = [0, 1, 8, 97, 4099][i as usize % 5];
        c.send(1, 1, &random_bytes(len, i)).await.unwrap();
        assert_eq!(c.recv::<u8>(1, 2).await.unwrap(), random_bytes(len, i + 1000), "pong {i}");
    }
    // Messages sent while no receive is posted, one of them larger than a ring.
    tokio::time::sleep(Duration::from_millis(30)).await;
    for (k, len) in [1usize, 65_537, OVER_A_RING].into_iter().enumerate() {
        assert_eq!(c.recv::<u8>(1, 3).await.unwrap(), random_bytes(len, 3000 + k as u64), "unposted {k}");
    }
    // A receive that parks well before its message comes.
    assert_eq!(c.recv::<u8>(1, 4).await.unwrap(), random_bytes(13, 4000), "parked");
    // Two receives from one peer in two tasks, satisfied in the other order.
    let (c1, c2) = (c.clone(), c.clone());
    let first = tokio::spawn(async move { c1.recv::<u8>(1, 5).await.unwrap() });
    let second = tokio::spawn(async move { c2.recv::<u8>(1, 6).await.unwrap() });
    assert_eq!(second.await.unwrap(), random_bytes(31, 6000), "second task");
    assert_eq!(first.await.unwrap(), random_bytes(257, 5000), "first task");
    c.barrier().await.unwrap();
}

async fn rank1(c: Arc<Communicator<StreamTransport>>) {
    for i in 0..300u64 {
        let len = [0, 1, 8, 97, 4099][i as usize % 5];
        assert_eq!(c.recv::<u8>(0, 1).await.unwrap(), random_bytes(len, i), "ping {i}");
        c.send(0, 2, &random_bytes(len, i + 1000)).await.unwrap();
    }
    for (k, len) in [1usize, 65_537, OVER_A_RING].into_iter().enumerate() {
        c.send(0, 3, &random_bytes(len, 3000 + k as u64)).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    c.send(0, 4, &random_bytes(13, 4000)).await.unwrap();
    c.send(0, 6, &random_bytes(31, 6000)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    c.send(0, 5, &random_bytes(257, 5000)).await.unwrap();
    c.barrier().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shm_links_deliver_in_every_pattern() {
    patterns(hcomm::local_shm(2).await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_links_deliver_in_every_pattern() {
    patterns(hcomm::local_tcp(2).await.unwrap()).await;
}
