//! A failure that travels from rank to rank keeps naming where it began.
//!
//! Four ranks in a chain: rank 3 goes away; rank 2, waiting for rank 3, fails and
//! gives up (drops its communicator); rank 1, waiting for rank 2, does the same; rank
//! 0 waits for rank 1. Rank 0's error names rank 1 as the peer that went away and
//! rank 3 as the rank where the failure began, and so does every rank's error.

use std::time::Duration;

use futures::future::join_all;
use hcomm::{Communicator, LocalTransport};

const N: usize = 4;

async fn chain<T: LocalTransport>(comms: Vec<Communicator<T>>, how: &str) {
    let results = join_all(comms.into_iter().enumerate().map(|(r, c)| async move {
        // Without the failure the receives would wait: fail with a timeout, not a hang.
        c.set_timeout(Duration::from_secs(20));
        if r == N - 1 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            // Gone without a word about why (as a killed process is).
            drop(c);
            return None;
        }
        let e = c.recv::<u8>(r + 1, 7).await.expect_err("the rank above went away");
        // Giving up drops the communicator, as a program that returns its error does.
        drop(c);
        Some(e)
    }))
    .await;
    for (r, e) in results.into_iter().enumerate().take(N - 1) {
        let e = e.unwrap();
        assert!(e.is_peer_failed(), "{how}: rank {r}: {e}");
        assert_eq!(e.peer(), Some(r + 1), "{how}: rank {r}: {e}");
        assert_eq!(e.origin(), Some(N - 1), "{how}: rank {r}: {e}");
        if r + 1 < N - 1 {
            let text = e.to_string();
            assert!(text.contains(&format!("it began at rank {}", N - 1)), "{how}: rank {r}: {text}");
            assert!(text.contains(&format!("rank {} closed its communicator after a failure", r + 1)), "{text}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_knock_on_failure_names_its_origin_in_process() {
    chain(hcomm::local(N), "in process").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_knock_on_failure_names_its_origin_over_tcp() {
    chain(hcomm::local_tcp(N).await.unwrap(), "tcp").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_knock_on_failure_names_its_origin_over_shm() {
    chain(hcomm::local_shm(N).await.unwrap(), "shm").await;
}
