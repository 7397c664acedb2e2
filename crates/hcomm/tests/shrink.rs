//! `Communicator::shrink` over the in-process transport: ranks leave (their
//! communicators are dropped, as a process that exits closes its connections), the
//! others agree on a smaller communicator and compute on it. Failures of the
//! coordinator itself, before and during the agreement, and shrinking twice. The
//! multi-process version, with killed and hung processes over TCP and io_uring, is in
//! `failure.rs`.

use std::time::Duration;

use futures::future::join_all;
use hcomm::{Communicator, MemTransport, ReduceOp};

/// Drops the communicators of `gone`; the others shrink and run an allreduce whose
/// result must be the sum over the survivors.
async fn shrink_without(n: usize, gone: &[usize]) -> Vec<Communicator<MemTransport>> {
    let mut comms: Vec<Option<Communicator<MemTransport>>> = hcomm::local(n).into_iter().map(Some).collect();
    for &g in gone {
        comms[g] = None;
    }
    let survivors: Vec<usize> = (0..n).filter(|r| !gone.contains(r)).collect();
    let small = join_all(comms.iter().flatten().map(|c| async move {
        let r = c.rank();
        // An operation that needs the gone ranks fails first, naming one of them.
        if !gone.is_empty() {
            let mut v = vec![1u32; 100];
            let e = c.all_reduce(&mut v, ReduceOp::Sum).await.unwrap_err();
            assert!(e.is_peer_failed() || e.kind() == hcomm::ErrorKind::Aborted, "rank {r}: {e}");
        }
        let s = c.shrink().await.unwrap_or_else(|e| panic!("rank {r}: {e}"));
        let mut v = vec![r as u64 + 1; 1001];
        s.all_reduce(&mut v, ReduceOp::Sum).await.unwrap_or_else(|e| panic!("rank {r} after shrink: {e}"));
        (r, s, v)
    }))
    .await;
    let want: u64 = survivors.iter().map(|&r| r as u64 + 1).sum();
    let mut out = Vec::new();
    for (i, (r, s, v)) in small.into_iter().enumerate() {
        assert_eq!(survivors[i], r);
        assert_eq!(s.size(), survivors.len(), "rank {r}");
        assert_eq!(s.rank(), i, "rank {r} keeps its order among the survivors");
        assert!(v.iter().all(|&x| x == want), "rank {r}: {} instead of {want}", v[0]);
        out.push(s);
    }
    out
}

#[tokio::test(flavor = "current_thread")]
async fn shrink_leaves_out_the_gone_ranks() {
    for (n, gone) in [
        (1, &[][..]),
        (2, &[][..]),
        (3, &[1][..]),
        (4, &[3][..]),
        // The coordinator would be rank 0.
        (4, &[0][..]),
        (5, &[0, 1][..]),
        (8, &[2, 5, 7][..]),
        (16, &[0, 3, 4, 9, 15][..]),
    ] {
        shrink_without(n, gone).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn shrink_twice() {
    // 6 ranks lose rank 1; the 5 survivors then lose their rank 0 (world rank 0).
    let mut small: Vec<Option<_>> = shrink_without(6, &[1]).await.into_iter().map(Some).collect();
    small[0] = None;
    let res = join_all(small.iter().flatten().map(|c| async move {
        let s = c.shrink().await.unwrap();
        let mut v = vec![1i32; 10];
        s.all_reduce(&mut v, ReduceOp::Sum).await.unwrap();
        (s.size(), v[0])
    }))
    .await;
    assert_eq!(res, vec![(4, 4); 4]);
}

#[tokio::test(flavor = "current_thread")]
async fn the_coordinator_fails_during_the_agreement() {
    // Rank 1 leaves; rank 0 (the coordinator) leaves while the others wait for its
    // decision. They move on to rank 2 as coordinator.
    let mut comms: Vec<Option<Communicator<MemTransport>>> = hcomm::local(5).into_iter().map(Some).collect();
    comms[1] = None;
    let coordinator = comms[0].take().unwrap();
    let others = join_all(comms.iter().flatten().map(|c| async move {
        let s = c.shrink().await.unwrap_or_else(|e| panic!("rank {}: {e}", c.rank()));
        let mut v = vec![c.rank() as f64; 33];
        s.all_reduce(&mut v, ReduceOp::Sum).await.unwrap();
        (s.size(), s.rank(), v[0])
    }));
    let leave = async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(coordinator);
    };
    let (res, ()) = tokio::join!(others, leave);
    assert_eq!(res, vec![(3, 0, 9.0), (3, 1, 9.0), (3, 2, 9.0)]);
}

#[tokio::test(flavor = "current_thread")]
async fn shrink_works_on_an_aborted_communicator() {
    let comms = hcomm::local(4);
    comms[2].abort("giving up");
    let res = join_all(comms.iter().map(|c| async move {
        let s = c.shrink().await.unwrap();
        let mut v = vec![1u8; 5];
        s.all_reduce(&mut v, ReduceOp::Sum).await.unwrap();
        (s.size(), v[0])
    }))
    .await;
    // Nobody failed: everyone stays.
    assert_eq!(res, vec![(4, 4); 4]);
}
