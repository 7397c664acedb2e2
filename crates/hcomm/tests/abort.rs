//! `Communicator::abort`: one rank aborts, and every pending and later operation on
//! every rank fails with its reason.

use std::time::Duration;

use futures::future::join_all;
use hcomm::{Communicator, ErrorKind, LocalTransport, ReduceOp};

async fn one_rank_aborts<T: LocalTransport>(mut comms: Vec<Communicator<T>>) {
    // Short deadlines: without the abort the test fails with timeouts, not a hang.
    comms.iter_mut().for_each(|c| c.set_timeout(Duration::from_secs(10)));
    let comms = &comms;
    let n = comms.len();
    let victim = n / 2;
    let results = join_all(comms.iter().enumerate().map(|(r, c)| async move {
        if r == victim {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let e = c.abort("out of memory in the data loader");
            assert_eq!(e.kind(), ErrorKind::Aborted);
            return None;
        }
        let mut v = vec![1.0f32; 10_000];
        // Waits for the victim, which never joins: the abort ends it.
        let allreduce = c.all_reduce(&mut v, ReduceOp::Sum).await;
        // A point-to-point receive from the victim fails too.
        let recv = c.recv::<u8>(victim, 5).await;
        Some((allreduce, recv))
    }))
    .await;
    for (r, res) in results.into_iter().enumerate() {
        let Some((allreduce, recv)) = res else { continue };
        for e in [allreduce.unwrap_err(), recv.unwrap_err()] {
            assert_eq!(e.kind(), ErrorKind::Aborted, "rank {r}: {e}");
            let text = e.to_string();
            assert!(
                text.contains(&format!("communicator aborted by rank {victim}: out of memory")),
                "rank {r}: {text}"
            );
        }
    }
    // Later operations fail at once on every rank, the aborting one included, sends
    // and collectives alike.
    for (r, c) in comms.iter().enumerate() {
        let e = c.barrier().await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Aborted, "rank {r}: {e}");
        let e = c.send((r + 1) % n, 1, &[1u8]).await.unwrap_err();
        assert!(e.to_string().contains("out of memory"), "rank {r}: {e}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn abort_reaches_every_rank_in_process() {
    one_rank_aborts(hcomm::local(4)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_reaches_every_rank_over_tcp() {
    one_rank_aborts(hcomm::local_tcp(3).await.unwrap()).await;
}
