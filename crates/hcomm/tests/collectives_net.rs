//! The collectives over loopback TCP (tokio and io_uring) and shared memory, a smaller matrix than over
//! the in-process transport, and 64 collectives of different kinds in flight at once.

mod common;

use std::time::Duration;

use common::{check_against_reference, colls, inputs};
use futures::future::join_all;
use hcomm::{ArgCheck, BcastAlgo, Communicator, LocalTransport, ReduceOp};

async fn suite<T: LocalTransport>(comms: &[Communicator<T>]) {
    let n = comms.len();
    for (i, &count) in [0usize, 13, 65_537].iter().enumerate() {
        let seed = (n * 10 + i) as u64;
        for algo in BcastAlgo::ALL {
            colls::broadcast::<_, f32>(comms, count * 11, n - 1, algo, seed).await;
        }
        colls::reduce::<_, f64>(comms, count, ReduceOp::Sum, n / 2, seed).await;
        colls::gather_scatter::<_, u32>(comms, count, 0, seed).await;
        for algo in hcomm::ReduceScatterAlgo::ALL {
            colls::reduce_scatter::<_, f32>(comms, count, ReduceOp::Max, algo, seed).await;
        }
        colls::all_to_all::<_, i16>(comms, count, seed).await;
        for algo in hcomm::AllgatherAlgo::ALL {
            colls::all_gather::<_, f32>(comms, count, algo, seed).await;
            colls::all_gather_v::<_, u8>(comms, count, algo, seed).await;
        }
        colls::scans::<_, i64>(comms, count, ReduceOp::Sum, seed).await;
    }
}

/// 64 collectives of eight kinds, started in the same order on every rank and all in
/// flight at once on one communicator per rank.
async fn mixed_in_flight<T: LocalTransport>(comms: &[Communicator<T>]) {
    let n = comms.len();
    let ins: Vec<Vec<Vec<f64>>> = (0..64).map(|k| inputs::<f64>(n, 100 + k * 37, ReduceOp::Sum, k as u64)).collect();
    // outs[rank][k]
    let mut outs: Vec<Vec<Vec<f64>>> = (0..n).map(|r| (0..64).map(|k| ins[k][r].clone()).collect()).collect();
    let mut gathered: Vec<Vec<Vec<f64>>> =
        (0..n).map(|_| (0..64).map(|k| vec![0.0; n * (100 + k * 37)]).collect()).collect();
    let results = join_all(comms.iter().zip(outs.iter_mut()).zip(gathered.iter_mut()).map(|((c, mine), gath)| {
        let r = c.rank();
        let ins = &ins;
        let futs: Vec<std::pin::Pin<Box<dyn std::future::Future<Output = hcomm::Result<()>> + '_>>> = mine
            .iter_mut()
            .zip(gath.iter_mut())
            .enumerate()
            .map(|(k, (buf, g))| -> std::pin::Pin<Box<dyn std::future::Future<Output = hcomm::Result<()>> + '_>> {
                match k % 8 {
                    0 => Box::pin(c.all_reduce(buf, ReduceOp::Sum)),
                    1 => Box::pin(c.broadcast(buf, k % n)),
                    2 => Box::pin(c.reduce(buf, ReduceOp::Sum, k % n)),
                    3 => Box::pin(c.all_gather(&ins[k][r], g)),
                    4 => Box::pin(c.scan(buf, ReduceOp::Sum)),
                    5 => Box::pin(c.barrier()),
                    6 => Box::pin(c.gather(&ins[k][r], g, k % n)),
                    _ => Box::pin(c.exscan(buf, ReduceOp::Sum)),
                }
            })
            .collect();
        join_all(futs)
    }))
    .await;
    results.into_iter().flatten().for_each(|r| r.unwrap());
    for k in 0..64 {
        let root = k % n;
        let what = format!("in-flight collective {k}");
        for r in 0..n {
            match k % 8 {
                0 => check_against_reference(&ins[k], ReduceOp::Sum, &outs[r][k], &what),
                1 => assert!(outs[r][k] == ins[k][root], "{what}"),
                2 if r == root => check_against_reference(&ins[k], ReduceOp::Sum, &outs[r][k], &what),
                3 => assert!(gathered[r][k] == ins[k].concat(), "{what}"),
                4 => check_against_reference(&ins[k][..=r], ReduceOp::Sum, &outs[r][k], &what),
                6 if r == root => assert!(gathered[r][k] == ins[k].concat(), "{what}"),
                7 if r > 0 => check_against_reference(&ins[k][..r], ReduceOp::Sum, &outs[r][k], &what),
                _ => {}
            }
        }
    }
}

fn set_check<T: LocalTransport>(comms: &mut [Communicator<T>], check: ArgCheck) {
    for c in comms.iter_mut() {
        let mut t = c.tuning().clone();
        t.check_args = check;
        c.set_tuning(t);
    }
}

/// With the synchronous argument check (`HCOMM_CHECK_ARGS=sync`), every rank of a
/// rooted collective (and of a scan) called with different arguments on different
/// ranks fails with a mismatch error, the ranks that only send (a broadcast's root, a
/// gather's leaves, a scan's rank 0) included; then the communicator carries on.
async fn mismatched_rooted<T: LocalTransport>(comms: &mut [Communicator<T>]) {
    comms.iter_mut().for_each(|c| c.set_timeout(Duration::from_secs(20)));
    set_check(comms, ArgCheck::Sync);
    let n = comms.len();
    let all_mismatch = |what: &str, res: Vec<hcomm::Result<()>>| {
        for (r, res) in res.into_iter().enumerate() {
            let e = res.expect_err(&format!("{what}: rank {r} must fail"));
            assert!(e.is_mismatch(), "{what}: rank {r}: {e}");
        }
    };
    // Broadcast, the last rank with a longer buffer (the root only sends).
    let mut bufs: Vec<Vec<u32>> = (0..n).map(|r| vec![1; if r == n - 1 { 11 } else { 10 }]).collect();
    let res = join_all(comms.iter().zip(bufs.iter_mut()).map(|(c, b)| c.broadcast(b, 0))).await;
    all_mismatch("broadcast, lengths", res);
    // Broadcast, rank 1 naming itself the root.
    let mut bufs = vec![vec![1u32; 10]; n];
    let res =
        join_all(comms.iter().zip(bufs.iter_mut()).map(|(c, b)| c.broadcast(b, usize::from(c.rank() == 1)))).await;
    all_mismatch("broadcast, roots", res);
    // Reduce, the last rank with another operator (every other rank only sends or
    // receives from a subtree that may not hold it).
    let mut bufs = vec![vec![1.0f64; 10]; n];
    let res = join_all(
        comms
            .iter()
            .zip(bufs.iter_mut())
            .map(|(c, b)| c.reduce(b, if c.rank() == n - 1 { ReduceOp::Max } else { ReduceOp::Sum }, 0)),
    )
    .await;
    all_mismatch("reduce, operators", res);
    // Gather, rank 2 with another element count (the other leaves only send).
    let sends: Vec<Vec<i32>> = (0..n).map(|r| vec![r as i32; if r == 2 { 3 } else { 4 }]).collect();
    let mut recvs = vec![vec![0i32; 4 * n]; n];
    let res = join_all(comms.iter().zip(sends.iter().zip(recvs.iter_mut())).map(|(c, (s, r))| c.gather(s, r, 0))).await;
    all_mismatch("gather, lengths", res);
    // Scatter, rank 1 with another element type (the root only sends).
    let send = vec![0u32; 4 * n];
    let res = join_all(comms.iter().map(|c| {
        let send = &send;
        async move {
            if c.rank() == 1 {
                // The send buffer is used at the root only.
                c.scatter(&[] as &[i32], &mut [0i32; 4], 0).await
            } else {
                c.scatter(send, &mut [0u32; 4], 0).await
            }
        }
    }))
    .await;
    all_mismatch("scatter, element types", res);
    // Inclusive scan, the last rank with another operator (rank 0 only sends).
    let mut bufs = vec![vec![2i64; 7]; n];
    let res = join_all(
        comms
            .iter()
            .zip(bufs.iter_mut())
            .map(|(c, b)| c.scan(b, if c.rank() == n - 1 { ReduceOp::Min } else { ReduceOp::Sum })),
    )
    .await;
    all_mismatch("scan, operators", res);
    // The communicator still works.
    let mut bufs = vec![vec![3u32; 10]; n];
    let res = join_all(comms.iter().zip(bufs.iter_mut()).map(|(c, b)| c.broadcast(b, n - 1))).await;
    res.into_iter().for_each(|r| r.unwrap());
    // With the check off (`HCOMM_CHECK_ARGS=0`), the rank that receives the other
    // length still fails; the root, which only sends, returns Ok.
    set_check(comms, ArgCheck::Off);
    let mut bufs: Vec<Vec<u32>> = (0..n).map(|r| vec![1; if r == n - 1 { 11 } else { 10 }]).collect();
    let res =
        join_all(comms.iter().zip(bufs.iter_mut()).map(|(c, b)| c.broadcast_with(b, 0, BcastAlgo::Binomial))).await;
    assert!(res[0].is_ok(), "{:?}", res[0]);
    assert!(res[n - 1].as_ref().is_err_and(hcomm::Error::is_mismatch), "{:?}", res[n - 1]);
    set_check(comms, ArgCheck::Deferred);
    mismatched_deferred(comms).await;
}

/// With the deferred argument check (the default), a rooted collective called with
/// different arguments: the ranks whose neighbour in rank order called otherwise
/// find it, in the operation or, when it had already returned here, later (in their
/// next collective, or in `settle_checks`); no rank waits for its
/// deadline for a message that never comes, and a rank that returns `Ok` holds the
/// root's data.
async fn mismatched_deferred<T: LocalTransport>(comms: &mut [Communicator<T>]) {
    let n = comms.len();
    assert!(n >= 3);
    // Two cases: the last rank with a longer buffer (the root only sends, its
    // neighbour is the last rank), and rank 1 naming itself the root (its message to
    // rank 2 matches no receive there).
    for case in 0..2 {
        let mut bufs: Vec<Vec<u32>> = (0..n)
            .map(|r| {
                let len = if case == 0 && r == n - 1 { 11 } else { 10 };
                vec![if r == 0 { 7 } else { r as u32 + 100 }; len]
            })
            .collect();
        let root = |r: usize| if case == 1 && r == 1 { 1 } else { 0 };
        let first = join_all(comms.iter().zip(bufs.iter_mut()).map(|(c, b)| c.broadcast(b, root(c.rank())))).await;
        let next = join_all(comms.iter().map(|c| c.barrier())).await;
        let later = join_all(comms.iter().map(|c| c.settle_checks())).await;
        // The ranks that must find the difference: the odd one and the one after it.
        let finders: &[usize] = if case == 0 { &[n - 1, 0] } else { &[1, 2] };
        for r in 0..n {
            let what = format!("case {case}, rank {r}: {:?}, {:?}, {:?}", first[r], next[r], later[r]);
            let mut found = false;
            for res in [&first[r], &next[r], &later[r]] {
                if let Err(e) = res {
                    // A barrier fails when a rank found the broadcast's mismatch as it began.
                    assert!(e.is_mismatch(), "{what}: only mismatches, no timeout");
                    assert!(matches!(e.op(), Some(hcomm::OpKind::Broadcast | hcomm::OpKind::Barrier)), "{what}");
                    found |= e.op() == Some(hcomm::OpKind::Broadcast);
                }
            }
            if finders.contains(&r) {
                assert!(found, "{what}: must report the broadcast");
            }
            if first[r].is_ok() && root(r) == 0 {
                assert!(bufs[r] == vec![7; 10], "{what}: Ok with the root's data");
            }
        }
        // Afterwards, every rank's check is settled and the communicator carries on.
        let mut bufs = vec![vec![5u16; 3]; n];
        let res = join_all(comms.iter().zip(bufs.iter_mut()).map(|(c, b)| c.broadcast(b, n - 1))).await;
        res.into_iter().for_each(|r| r.unwrap());
    }
}

#[tokio::test(flavor = "current_thread")]
async fn mem_mixed_in_flight_and_mismatched_rooted() {
    for n in [1, 3, 4, 7] {
        mixed_in_flight(&hcomm::local(n)).await;
    }
    mismatched_rooted(&mut hcomm::local(4)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_collectives() {
    for n in [1, 2, 3, 5, 8] {
        suite(&hcomm::local_tcp(n).await.unwrap()).await;
    }
    let mut comms = hcomm::local_tcp(4).await.unwrap();
    mixed_in_flight(&comms).await;
    mismatched_rooted(&mut comms).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shm_collectives() {
    for n in [2, 3, 5, 8] {
        suite(&hcomm::local_shm(n).await.unwrap()).await;
    }
    let mut comms = hcomm::local_shm(4).await.unwrap();
    mixed_in_flight(&comms).await;
    mismatched_rooted(&mut comms).await;
}

#[cfg(all(feature = "uring", target_os = "linux"))]
#[test]
fn uring_collectives() {
    tokio_uring::start(async {
        for n in [1, 2, 3, 5, 8] {
            suite(&hcomm::local_uring(n).await.unwrap()).await;
        }
        let mut comms = hcomm::local_uring(4).await.unwrap();
        mixed_in_flight(&comms).await;
        mismatched_rooted(&mut comms).await;
    });
}

/// The deferred argument checks over a long run of small broadcasts on 4 ranks over
/// TCP, where the root runs ahead by more than `MAX_UNCHECKED` operations and the
/// records travel merged (one frame for many operations): every operation before a
/// mismatch returns `Ok` with the root's data; the mismatch (the last rank's buffer
/// one element longer in one operation) fails that operation on the last rank, and
/// the root, which checks the last rank's records, reports it by the operation's
/// sequence number in a later call; nothing times out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_deferred_checks_over_a_long_run() {
    const OPS: usize = 2600;
    const ODD: usize = 2100;
    let comms = hcomm::local_tcp(4).await.unwrap();
    let n = comms.len();
    let runs = comms.iter().map(|c| async move {
        let mut out = Vec::with_capacity(OPS);
        for i in 0..OPS {
            let len = if c.rank() == n - 1 && i == ODD { 3 } else { 2 };
            let mut buf = vec![if c.rank() == 0 { i as u32 } else { u32::MAX }; len];
            let r = c.broadcast(&mut buf, 0).await;
            out.push(r.map(|()| buf));
        }
        (out, c.settle_checks().await)
    });
    let results = join_all(runs).await;
    let odd_seq = match &results[n - 1].0[ODD] {
        Err(e) => {
            assert!(e.is_mismatch() && e.op() == Some(hcomm::OpKind::Broadcast), "{e}");
            e.seq().expect("the error names its operation")
        }
        Ok(_) => panic!("the last rank's odd operation returned Ok"),
    };
    for (r, (out, settled)) in results.iter().enumerate() {
        for (i, res) in out.iter().enumerate() {
            match res {
                Ok(buf) => assert_eq!(buf, &vec![i as u32; 2], "rank {r}, operation {i}: Ok with the root's data"),
                Err(e) => {
                    assert!(i >= ODD, "rank {r}, operation {i} failed before the odd one: {e}");
                    assert!(e.is_mismatch(), "rank {r}, operation {i}: only mismatches: {e}");
                }
            }
        }
        if let Err(e) = settled {
            assert!(e.is_mismatch(), "rank {r}, settle_checks: {e}");
        }
    }
    // The root found it from the last rank's record (in a later broadcast, or in
    // `settle_checks`), under the odd operation's number.
    let (out, settled) = &results[0];
    let found = out.iter().filter_map(|r| r.as_ref().err()).chain(settled.as_ref().err());
    assert!(
        found.into_iter().any(|e| e.seq() == Some(odd_seq)),
        "the root did not report operation {odd_seq}: {:?}",
        out.iter().filter_map(|r| r.as_ref().err()).map(|e| e.to_string()).collect::<Vec<_>>()
    );
    // The communicator carries on.
    let mut bufs = vec![vec![5u16; 3]; n];
    let res = join_all(comms.iter().zip(bufs.iter_mut()).map(|(c, b)| c.broadcast(b, n - 1))).await;
    res.into_iter().for_each(|r| r.unwrap());
}

/// A rank whose deferred check finds a mismatch after its call returned fails its
/// next rooted collective before that one does anything; it still sends its
/// argument check record of it, so the next rank (a root that returned at once and
/// waits for that record) settles its checks instead of waiting for its deadline.
#[tokio::test(flavor = "current_thread")]
async fn a_rank_failed_by_a_late_mismatch_still_sends_its_record() {
    let comms = hcomm::local(3);
    // Operation A: rank 1's buffer is longer. Rank 2 (checking rank 1's record) is
    // polled before rank 1, so that it returns before the record comes.
    let mut bufs: Vec<Vec<u32>> = (0..3).map(|r| vec![r as u32; if r == 1 { 11 } else { 10 }]).collect();
    let mut a: Vec<_> = bufs.iter_mut().enumerate().map(|(r, b)| Some((r, b))).collect();
    let order = [0, 2, 1];
    let first = join_all(order.iter().map(|&r| {
        let (r, b) = a[r].take().unwrap();
        comms[r].broadcast(b, 0)
    }))
    .await;
    assert!(first[0].is_ok() && first[1].is_ok(), "ranks 0 and 2 returned: {first:?}");
    assert!(first[2].as_ref().is_err_and(hcomm::Error::is_mismatch), "rank 1 failed: {:?}", first[2]);
    // Operation B: rank 2 finds A's mismatch as B begins, and fails it.
    let mut bufs = vec![vec![7u32; 4]; 3];
    let second = join_all(comms.iter().zip(bufs.iter_mut()).map(|(c, b)| c.broadcast(b, 0))).await;
    let e = second[2].as_ref().expect_err("rank 2 fails B with A's mismatch");
    assert!(e.is_mismatch() && e.seq() == first[2].as_ref().unwrap_err().seq(), "{e}");
    // Every rank's checks settle: the root's wait for rank 2's record of B ends.
    let settled = tokio::time::timeout(Duration::from_secs(20), join_all(comms.iter().map(|c| c.settle_checks())))
        .await
        .expect("the checks settled");
    for (r, s) in settled.iter().enumerate() {
        if let Err(e) = s {
            assert!(e.is_mismatch(), "rank {r}: {e}");
        }
    }
}

/// The rank at fault reports its own mismatch even when the abort of the finder
/// comes before the record its check needs: rank 1 names itself the broadcast's
/// root and returns at once; rank 2 finds the difference in rank 1's record and
/// aborts the operation on every rank; only then does rank 0 (whose record rank 1
/// checks) start it. Rank 1's check waits for that record instead of giving up at
/// the abort (`MISMATCH_RECORD_WAIT`). Over TCP the two arrive in either order, and
/// `tcp_collectives` failed in 6 of 120 runs when the abort won.
#[tokio::test(flavor = "current_thread")]
async fn the_rank_at_fault_reports_its_mismatch_when_the_abort_comes_first() {
    let comms = hcomm::local(3);
    let mut bufs = vec![vec![9u32; 6]; 3];
    let [b0, b1, b2] = &mut bufs[..] else { unreachable!() };
    let late = comms[0].broadcast(b0, 0);
    comms[1].broadcast(b1, 1).await.expect("rank 1, the root in its view, sends and returns");
    let e2 = comms[2].broadcast(b2, 0).await.expect_err("rank 2 finds the difference in rank 1's record");
    assert!(e2.is_mismatch(), "{e2}");
    let (settled, r0) = tokio::join!(comms[1].settle_checks(), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        late.await
    });
    let e1 = settled.expect_err("rank 1 reports the mismatch it caused");
    assert!(e1.is_mismatch() && e1.op() == Some(hcomm::OpKind::Broadcast) && e1.seq() == e2.seq(), "{e1}");
    // Rank 0, a root in its view too, only sends: aborted or not, it has nothing to
    // receive, and any error of its is the mismatch's.
    assert!(r0.as_ref().is_ok() || r0.as_ref().is_err_and(hcomm::Error::is_mismatch), "{r0:?}");
    // The communicator carries on.
    let mut bufs = vec![vec![5u16; 3]; 3];
    let res = join_all(comms.iter().zip(bufs.iter_mut()).map(|(c, b)| c.broadcast(b, 2))).await;
    res.into_iter().for_each(|r| r.unwrap());
}

/// A rooted collective dropped before its first poll on one rank is aborted on every
/// rank; a root that had already returned from it stops waiting for that rank's
/// argument check record, which never comes.
#[tokio::test(flavor = "current_thread")]
async fn a_root_stops_waiting_for_the_record_of_an_operation_dropped_elsewhere() {
    let comms = hcomm::local(3);
    let mut bufs = vec![vec![3u64; 5]; 3];
    let [b0, b1, b2] = &mut bufs[..] else { unreachable!() };
    comms[0].broadcast(b0, 0).await.expect("the root sends and returns");
    comms[1].broadcast(b1, 0).await.expect("rank 1 has the root's data");
    // Rank 2, whose record the root checks, drops its call unpolled.
    drop(comms[2].broadcast(b2, 0));
    let settled = tokio::time::timeout(Duration::from_secs(20), comms[0].settle_checks()).await;
    assert!(matches!(settled, Ok(Ok(()))), "the root's checks settle: {settled:?}");
    // The communicator carries on.
    let mut bufs = vec![vec![5u16; 3]; 3];
    let res = join_all(comms.iter().zip(bufs.iter_mut()).map(|(c, b)| c.broadcast(b, 2))).await;
    res.into_iter().for_each(|r| r.unwrap());
}
