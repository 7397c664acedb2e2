//! `finalize(&self)` on a communicator shared between tasks: every rank's tasks keep
//! their clones of the `Arc`, any one of them finalizes, and the operations called
//! afterwards fail at once with an error (the communicator closed, or its peer
//! closed), never hang. A second `finalize` returns without waiting.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use hcomm::{Communicator, LocalTransport, ReduceOp};

/// How long an operation after `finalize` may take to fail: far beyond an
/// error returned at once, far below the communicators' deadline.
const FAILS_WITHIN: Duration = Duration::from_secs(20);

async fn after_finalize<T: LocalTransport>(comms: Vec<Communicator<T>>) {
    for c in &comms {
        c.set_timeout(Duration::from_secs(120));
    }
    let comms: Vec<Arc<Communicator<T>>> = comms.into_iter().map(Arc::new).collect();
    // The data path works before, from clones of the shared handle.
    let sums = join_all(comms.iter().map(|c| {
        let c = c.clone();
        async move {
            let mut v = vec![c.rank() as f64 + 1.0; 5];
            c.all_reduce(&mut v, ReduceOp::Sum).await.map(|()| v)
        }
    }))
    .await;
    for s in sums {
        assert_eq!(s.unwrap(), vec![3.0; 5]);
    }
    for r in join_all(comms.iter().map(|c| c.finalize())).await {
        r.expect("an orderly finalize");
    }
    let c = &comms[0];
    let expect_error = |what: &str, r: Result<hcomm::Result<()>, tokio::time::error::Elapsed>| {
        let e = r.unwrap_or_else(|_| panic!("{what} after finalize hung")).expect_err(what);
        assert!(e.is_closed() || e.is_peer_failed(), "{what}: {e}");
        assert_eq!(e.rank(), Some(0), "{what}: the error names this rank: {e}");
    };
    let mut v = vec![1.0f32; 4];
    expect_error("allreduce", tokio::time::timeout(FAILS_WITHIN, c.all_reduce(&mut v, ReduceOp::Sum)).await);
    let recv = tokio::time::timeout(FAILS_WITHIN, c.recv::<u8>(1, 1)).await;
    expect_error("recv", recv.map(|r| r.map(drop)));
    expect_error("send", tokio::time::timeout(FAILS_WITHIN, c.send(1, 1, &[1u8])).await);
    tokio::time::timeout(FAILS_WITHIN, c.finalize()).await.expect("a second finalize returns").unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mem() {
    after_finalize(hcomm::local(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp() {
    after_finalize(hcomm::local_tcp(2).await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shm() {
    after_finalize(hcomm::local_shm(2).await.unwrap()).await;
}
