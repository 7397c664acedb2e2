//! `finalize`: a rank that sends a large message and exits at once must not cut it
//! off on its way to a slower receiver, and a peer that never finalizes makes
//! `finalize` fail by its deadline, naming that peer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::free_port;
use hcomm::{Config, Transport};

mod common;

fn config(rank: usize, port: u16) -> Config {
    config_shm(rank, port, false)
}

fn config_shm(rank: usize, port: u16, shm: bool) -> Config {
    let mut c = Config::new(rank, 2, format!("127.0.0.1:{port}"));
    c.job_id = format!("finalize-{port}");
    c.secret = Some(String::from("finalize test secret"));
    c.shm = shm;
    c
}

/// Rank 0, as rank 1's transport knows it, closed its communicator and did not fail
/// (as a link that broke under a write would have it).
fn closed_not_failed(comm: &hcomm::Communicator) {
    if let Some(e) = comm.transport().mailbox().peer_failure(0) {
        assert!(e.to_string().contains("closed its communicator"), "rank 0 counted as failed: {e}");
    }
}

fn data(len: usize) -> Vec<u64> {
    (0..len as u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).collect()
}

/// Each rank on a thread and a runtime of its own, as a process would have them.
/// Rank 0 sends 48 MiB and finalizes; its runtime then ends, which kills its tasks
/// and closes its sockets as a process exit does. Rank 1 only starts receiving after
/// a pause. `finalize` on rank 0 must not return before rank 1 has the whole message
/// (rank 1 finalizes only after receiving it): a process that exits before that can
/// cut off what is still in flight (a socket closed with unread bytes is reset and
/// the kernel drops what it had not sent; the emulated two-rack cluster, whose slow
/// spine keeps megabytes in flight for seconds, lost a gather's tail that way). On
/// loopback the kernel hands the bytes over too fast to show the loss itself, so the
/// test checks the ordering that prevents it.
#[test]
fn finalize_waits_until_the_peer_has_what_was_sent() {
    let port = free_port();
    let len = 6 << 20;
    let received = Arc::new(AtomicBool::new(false));
    let seen = received.clone();
    let sender = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let comm = config(0, port).connect().await.unwrap();
            comm.send(1, 7, &data(len)).await.unwrap();
            comm.finalize().await.unwrap();
            assert!(seen.load(Ordering::Acquire), "finalize returned before rank 1 had the message");
        });
        // The runtime drops here, with every task of the transport.
    });
    let receiver = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let comm = config(1, port).connect().await.unwrap();
            tokio::time::sleep(Duration::from_millis(400)).await;
            let got: Vec<u64> = comm.recv(0, 7).await.unwrap();
            assert!(got == data(len), "the message arrived altered");
            received.store(true, Ordering::Release);
            comm.finalize().await.unwrap();
        });
    });
    sender.join().unwrap();
    receiver.join().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finalize_names_a_peer_that_never_finalizes() {
    let mut comms = hcomm::local_tcp(3).await.unwrap();
    let lazy = comms.pop().unwrap();
    for c in &mut comms {
        c.set_timeout(Duration::from_millis(500));
    }
    let t = Instant::now();
    let res = futures::future::join_all(comms.iter().map(|c| c.finalize())).await;
    assert!(t.elapsed() < Duration::from_secs(5), "finalize overran its deadline: {:?}", t.elapsed());
    for e in res {
        let e = e.unwrap_err();
        assert!(e.to_string().contains("ranks [2] had not closed"), "{e}");
    }
    // Rank 2 finalizes late: ranks 0 and 1 have closed, so it does not wait.
    let t = Instant::now();
    lazy.finalize().await.unwrap();
    assert!(t.elapsed() < Duration::from_secs(5));
}

/// Rank 0 finalizes at once; rank 1 goes on working for longer than the peer timeout
/// before it finalizes. Rank 0, closed, sends nothing more, but rank 1 must not count
/// its silence as a failure and drop it: rank 0 waits for rank 1's close frame,
/// which rank 1's writer still owes it. Both finalize without error.
#[test]
fn a_rank_that_finalized_first_is_not_dropped_as_silent() {
    finalized_first(false);
}

/// As [`a_rank_that_finalized_first_is_not_dropped_as_silent`], over shared memory:
/// rank 0's finalize ends its side of the doorbell connection, and rank 1, which
/// still writes (heartbeats, then its close frame), must take that for "the peer
/// rings no more", not for a dead peer.
#[test]
fn a_rank_that_finalized_first_is_not_dropped_as_silent_shm() {
    finalized_first(true);
}

fn finalized_first(shm: bool) {
    two_ranks(shm, |rank, comm| async move {
        let mut v = vec![rank as u32 + 1; 10];
        comm.all_reduce(&mut v, hcomm::ReduceOp::Sum).await.unwrap();
        assert_eq!(v, vec![3; 10]);
        if rank == 1 {
            // Work that sends nothing, past the peer timeout.
            tokio::time::sleep(Duration::from_millis(1200)).await;
            // Its heartbeats went on to rank 0, which had closed.
            closed_not_failed(&comm);
        }
        // A rank that waited for a close frame never written fails by its deadline
        // in the finalize that follows.
        comm
    });
}

/// Over shared memory, rank 0 sends two messages (a small one through the ring and
/// a large one lent out of its memory) and finalizes at once; rank 1 receives them
/// only after a pause longer than its heartbeat period, so that its writer has
/// written to rank 0 after rank 0 ended its side of the doorbell connection. Both
/// receives and both finalizes succeed.
#[test]
fn messages_from_a_rank_that_finalized_are_still_received_shm() {
    let big = 1 << 20;
    two_ranks(true, move |rank, comm| async move {
        if rank == 0 {
            comm.send(1, 1, &data(10)).await.unwrap();
            comm.send(1, 2, &data(big)).await.unwrap();
        } else {
            tokio::time::sleep(Duration::from_millis(600)).await;
            let small: Vec<u64> = comm.recv(0, 1).await.unwrap_or_else(|e| panic!("rank 1: {e}"));
            assert!(small == data(10));
            let large: Vec<u64> = comm.recv(0, 2).await.unwrap_or_else(|e| panic!("rank 1: {e}"));
            assert!(large == data(big));
            closed_not_failed(&comm);
        }
        comm
    });
}

/// Two ranks, each on a thread and a runtime of its own (as processes), with a
/// 300 ms peer timeout: each connects, runs `body`, and finalizes the communicator
/// `body` hands back, which must succeed.
fn two_ranks<F, Fut>(shm: bool, body: F)
where
    F: Fn(usize, hcomm::Communicator) -> Fut + Send + Copy + 'static,
    Fut: std::future::Future<Output = hcomm::Communicator>,
{
    let port = free_port();
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                rt.block_on(async {
                    let mut c = config_shm(rank, port, shm);
                    c.stream.peer_timeout = Some(Duration::from_millis(300));
                    c.timeout = Duration::from_secs(20);
                    let comm = body(rank, c.connect().await.unwrap()).await;
                    comm.finalize().await.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
                })
            })
        })
        .collect();
    ranks.into_iter().for_each(|r| r.join().unwrap());
}
