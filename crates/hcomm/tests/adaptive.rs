//! The adaptive selection (`hcomm_collectives::adapt`) on real allreduces,
//! broadcasts, allgathers, reduce-scatters and alltoalls over the in-process transport: results against
//! the sequential reference while the ranks time and switch algorithms, calls in
//! flight at once, owned and borrowed calls mixed across ranks, and dropped calls.

mod common;

use std::sync::Arc;

use common::*;
use futures::future::join_all;
use hcomm::{
    AllgatherAlgo, AllreduceAlgo, AlltoallAlgo, BcastAlgo, Communicator, ErrorKind, ReduceOp, ReduceScatterAlgo,
};
use hcomm_collectives::adapt::{MAX_EPOCH, WINDOW};

/// Calls of a class enough for the first possible switch (three epochs: the first
/// decision, at epoch 2, only proposes one, and the next confirms it; the 64 KiB
/// allreduce and broadcast classes, and on up to 3 ranks the 16 KiB-block allgather,
/// reduce-scatter and alltoall classes here, have epochs of [`MAX_EPOCH`] windows),
/// and a window more.
const DECIDED: usize = ((3 * MAX_EPOCH + 1) * WINDOW) as usize;

/// Element counts of f32 in the 64 KiB class: the class's size, primes, and sizes
/// not divisible by any rank count here.
const COUNTS_64K: [usize; 5] = [16_384, 16_411, 20_011, 9_973 * 2 + 1, 50_021];

#[tokio::test(flavor = "current_thread")]
async fn results_match_the_reference_while_the_selection_times_and_switches() {
    for n in [1, 2, 3, 4, 7, 16] {
        let mut comms = hcomm::local(n);
        contested(&mut comms);
        // Up to 4 ranks, past the first decision; above, three windows and more of
        // the class, so that every rank has run every algorithm; three element
        // types and operators.
        let calls = if n <= 4 { DECIDED + 3 } else { 3 * WINDOW as usize + 3 };
        for k in 0..calls {
            let count = COUNTS_64K[k % COUNTS_64K.len()];
            let seed = (n * 1000 + k) as u64;
            match k % 3 {
                0 => check_allreduce::<_, f32>(&comms, count, ReduceOp::Sum, seed).await,
                1 => check_allreduce::<_, f64>(&comms, count / 2, ReduceOp::Avg, seed).await,
                _ => check_allreduce::<_, i32>(&comms, count, ReduceOp::Max, seed).await,
            }
        }
        let algos: Vec<AllreduceAlgo> = comms.iter().map(|c| c.allreduce_algo_for(64 << 10, true)).collect();
        assert!(algos.iter().all(|a| *a == algos[0]), "n={n}: incumbents differ: {algos:?}");
        assert!(
            matches!(algos[0], AllreduceAlgo::Rabenseifner | AllreduceAlgo::Tree | AllreduceAlgo::Ring),
            "n={n}: {:?}",
            algos[0]
        );
    }
}

/// Element counts of 4-byte blocks in the 16 KiB class of the allgather and the
/// reduce-scatter (4 KiB blocks and more adapt): the class's size, primes, and
/// sizes not divisible by the rank counts here.
const COUNTS_16K: [usize; 5] = [4096, 4099, 1031, 3001 * 2 + 1, 9_973];

/// Allgathers and reduce-scatters (equal blocks, and per-rank counts, which the
/// table alone decides) of the 16 KiB class, between allreduces of theirs, on 1-16
/// ranks: every result against the reference while each family times its
/// alternatives and switches on its own, and every rank ends on the same algorithms.
#[tokio::test(flavor = "current_thread")]
async fn allgathers_and_reduce_scatters_adapt_alike() {
    for n in [1, 2, 3, 5, 16] {
        let mut comms = hcomm::local(n);
        contested(&mut comms);
        let calls = if n <= 3 { DECIDED + 3 } else { 3 * WINDOW as usize + 3 };
        for k in 0..calls {
            let count = COUNTS_16K[k % COUNTS_16K.len()];
            let seed = (n * 1000 + k) as u64;
            colls::all_gather::<_, f32>(&comms, count, None, seed).await;
            match k % 3 {
                0 => colls::reduce_scatter::<_, f32>(&comms, count, ReduceOp::Sum, None, seed).await,
                1 => colls::reduce_scatter::<_, f64>(&comms, count / 2, ReduceOp::Avg, None, seed).await,
                _ => colls::reduce_scatter::<_, i32>(&comms, count, ReduceOp::Max, None, seed).await,
            }
            if k % 4 == 0 {
                check_allreduce::<_, f32>(&comms, COUNTS_64K[k % COUNTS_64K.len()], ReduceOp::Sum, seed).await;
            }
        }
        let ag: Vec<AllgatherAlgo> = comms.iter().map(|c| c.algo_for(16 << 10, false)).collect();
        let rs: Vec<ReduceScatterAlgo> = comms.iter().map(|c| c.algo_for(16 << 10, true)).collect();
        assert!(ag.iter().all(|a| *a == ag[0]), "n={n}: allgather incumbents differ: {ag:?}");
        assert!(rs.iter().all(|a| *a == rs[0]), "n={n}: reduce-scatter incumbents differ: {rs:?}");
    }
}

/// Broadcasts of the 64 KiB class (from every root in turn) and alltoalls of the
/// 16 KiB-block class, between allgathers of theirs, on 1-16 ranks: every result
/// against the root's data or the reference while each family times its
/// alternatives and switches on its own, and every rank ends on the same algorithms.
#[tokio::test(flavor = "current_thread")]
async fn broadcasts_and_alltoalls_adapt_alike() {
    for n in [1, 2, 3, 6, 16] {
        let mut comms = hcomm::local(n);
        contested(&mut comms);
        let calls = if n <= 3 { DECIDED + 3 } else { 3 * WINDOW as usize + 3 };
        for k in 0..calls {
            let seed = (n * 1000 + k) as u64;
            let root = k % n;
            match k % 3 {
                0 => colls::broadcast::<_, f32>(&comms, COUNTS_64K[k % COUNTS_64K.len()], root, None, seed).await,
                1 => colls::broadcast::<_, u8>(&comms, 4 * COUNTS_64K[k % COUNTS_64K.len()], root, None, seed).await,
                _ => colls::broadcast::<_, f64>(&comms, COUNTS_64K[k % COUNTS_64K.len()] / 2, root, None, seed).await,
            }
            let count = COUNTS_16K[k % COUNTS_16K.len()];
            let ins = inputs::<i32>(n, n * count, ReduceOp::Sum, seed);
            colls::all_to_all_auto(&comms, &ins, count).await;
            if k % 4 == 0 {
                colls::all_gather::<_, f32>(&comms, count, None, seed).await;
            }
        }
        let bc: Vec<BcastAlgo> = comms.iter().map(|c| c.algo_for(64 << 10, false)).collect();
        let aa: Vec<AlltoallAlgo> = comms.iter().map(|c| c.algo_for(16 << 10, false)).collect();
        assert!(bc.iter().all(|a| *a == bc[0]), "n={n}: broadcast incumbents differ: {bc:?}");
        assert!(aa.iter().all(|a| *a == aa[0]), "n={n}: alltoall incumbents differ: {aa:?}");
    }
}

/// A root that broadcasts alone gets at most two epochs of the 64 KiB class ahead
/// (the epochs before the first agreement; over the in-process transport its own
/// flow control stops the root sooner, after about 2 MiB), then waits; once the
/// others call too, every broadcast arrives, in order, and the root's calls end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_running_ahead_waits_then_completes() {
    let n = 3;
    let mut comms = hcomm::local(n);
    contested(&mut comms);
    let e = (MAX_EPOCH * WINDOW) as usize;
    let calls = 3 * e;
    let count = COUNTS_64K[0];
    let data = move |k: usize| (0..count).map(|i| (k * count + i) as f32).collect::<Vec<f32>>();
    let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut comms = comms.into_iter();
    let root = comms.next().unwrap();
    let counter = sent.clone();
    let root_task = tokio::spawn(async move {
        for k in 0..calls {
            let mut buf = data(k);
            root.broadcast(&mut buf, 0).await.unwrap_or_else(|e| panic!("root, call {k}: {e}"));
            counter.store(k + 1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    // Alone, the root gets no further than epochs 0 and 1, which the table decides.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let alone = sent.load(std::sync::atomic::Ordering::SeqCst);
    assert!(alone > 0 && alone <= 2 * e, "the root made {alone} calls alone");
    let others = join_all(comms.map(|c| async move {
        for k in 0..calls {
            let mut buf = vec![0.0f32; count];
            c.broadcast(&mut buf, 0).await.unwrap_or_else(|e| panic!("rank {}, call {k}: {e}", c.rank()));
            assert!(buf == data(k), "rank {}, call {k}: not the root's data", c.rank());
        }
    }));
    let (root, _) = tokio::join!(root_task, others);
    root.unwrap();
    assert_eq!(sent.load(std::sync::atomic::Ordering::SeqCst), calls);
}

/// Over TCP, whose links carry the timings lazily (with the next data write, or
/// after a short delay): past the first decision, with the rank order of arrival
/// varied by running ranks as tasks of one runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tcp() {
    let mut comms = hcomm::local_tcp(3).await.unwrap();
    contested(&mut comms);
    for k in 0..DECIDED + 8 {
        let count = COUNTS_64K[k % COUNTS_64K.len()];
        check_allreduce::<_, f32>(&comms, count, ReduceOp::Sum, k as u64).await;
    }
    for r in join_all(comms.iter().map(Communicator::finalize)).await {
        r.unwrap();
    }
}

#[tokio::test(flavor = "current_thread")]
async fn large_messages_of_the_1mib_class() {
    let mut comms = hcomm::local(3);
    contested(&mut comms);
    for k in 0..(2 * WINDOW as usize + 2) {
        let count = [262_144, 262_147, 300_007][k % 3];
        check_allreduce::<_, f32>(&comms, count, ReduceOp::Sum, k as u64).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn reproducible_float_reductions_and_forced_algorithms_do_not_adapt() {
    let mut comms = hcomm::local(2);
    contested(&mut comms);
    assert_eq!(comms[0].allreduce_algo_for(64 << 10, true), AllreduceAlgo::Rabenseifner);
    for c in comms.iter_mut() {
        let mut t = c.tuning().clone();
        t.reproducible = true;
        c.set_tuning(t);
    }
    assert_eq!(comms[0].allreduce_algo_for(64 << 10, true), AllreduceAlgo::Ordered);
    // Integers are exact in any order: they still adapt.
    assert_eq!(comms[0].allreduce_algo_for(64 << 10, false), AllreduceAlgo::Rabenseifner);
    for c in comms.iter_mut() {
        let mut t = c.tuning().clone();
        (t.reproducible, t.adaptive) = (false, false);
        c.set_tuning(t);
    }
    // Off: the table decides; 3 windows of calls keep its choice.
    for k in 0..3 * WINDOW {
        check_allreduce::<_, f32>(&comms, 16_411, ReduceOp::Sum, k).await;
    }
    assert_eq!(comms[0].allreduce_algo_for(64 << 10, true), AllreduceAlgo::Rabenseifner);
}

/// 64 allreduces in flight at once on every rank, of sizes in both contested classes
/// and below them, over four windows' worth of calls of the 64 KiB class.
#[tokio::test(flavor = "current_thread")]
async fn sixty_four_in_flight_at_once() {
    let n = 4;
    let mut comms = hcomm::local(n);
    contested(&mut comms);
    let counts: Vec<usize> = (0..64).map(|i| [16_411, 7, 20_011, 262_147, 16_384, 1000][i % 6]).collect();
    let inputs: Vec<Vec<Vec<f32>>> =
        counts.iter().enumerate().map(|(i, &c)| inputs(n, c, ReduceOp::Sum, i as u64)).collect();
    let mut bufs: Vec<Vec<Vec<f32>>> = (0..n).map(|r| inputs.iter().map(|v| v[r].clone()).collect()).collect();
    let results = join_all(
        comms
            .iter()
            .zip(bufs.iter_mut())
            .map(|(c, mine)| async move { join_all(mine.iter_mut().map(|b| c.all_reduce(b, ReduceOp::Sum))).await }),
    )
    .await;
    for (r, rs) in results.into_iter().enumerate() {
        for (i, res) in rs.into_iter().enumerate() {
            res.unwrap_or_else(|e| panic!("rank {r}, allreduce {i}: {e}"));
        }
    }
    for (i, inp) in inputs.iter().enumerate() {
        for r in 1..n {
            assert!(bufs[r][i] == bufs[0][i], "allreduce {i}: rank {r} differs from rank 0");
        }
        check_against_reference(inp, ReduceOp::Sum, &bufs[0][i], &format!("allreduce {i} of {}", counts[i]));
    }
}

/// Rank 0 spawns owned allreduces while the others await borrowed ones: both count
/// the class's calls alike, so every call lines up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_and_borrowed_calls_line_up() {
    let n = 3;
    let mut comms = hcomm::local(n);
    contested(&mut comms);
    let mut comms = comms.into_iter();
    let first = Arc::new(comms.next().unwrap());
    let rest: Vec<Communicator<_>> = comms.collect();
    for k in 0..(3 * WINDOW as usize) {
        let count = COUNTS_64K[k % COUNTS_64K.len()];
        let inputs = inputs::<f32>(n, count, ReduceOp::Sum, k as u64);
        let owned = tokio::spawn(first.all_reduce_owned(inputs[0].clone(), ReduceOp::Sum));
        let mut bufs: Vec<Vec<f32>> = inputs[1..].to_vec();
        let borrowed = join_all(rest.iter().zip(bufs.iter_mut()).map(|(c, b)| c.all_reduce(b, ReduceOp::Sum)));
        let (got, others) = tokio::join!(owned, borrowed);
        let got = got.unwrap().unwrap_or_else(|e| panic!("call {k}, rank 0: {e}"));
        for (r, o) in others.into_iter().enumerate() {
            o.unwrap_or_else(|e| panic!("call {k}, rank {}: {e}", r + 1));
        }
        check_against_reference(&inputs, ReduceOp::Sum, &got, &format!("call {k}"));
        assert!(bufs.iter().all(|b| *b == got), "call {k}: ranks differ");
    }
}

/// An allgather of the contested class dropped on one rank, unpolled and polled,
/// at an epoch's first call (where the timings are sent) and elsewhere: that call
/// fails on the others, and every later one runs and is right.
#[tokio::test(flavor = "current_thread")]
async fn dropped_allgathers_fail_alone() {
    let n = 3;
    let mut comms = hcomm::local(n);
    contested(&mut comms);
    let w = WINDOW as usize;
    let e = (MAX_EPOCH * WINDOW) as usize;
    let drops = [(w, false), (w + 5, true), (e, true), (e + w, false)];
    for k in 0..(e + 2 * w) {
        let count = COUNTS_16K[k % COUNTS_16K.len()];
        let Some(&(_, polled)) = drops.iter().find(|(at, _)| *at == k) else {
            colls::all_gather::<_, f32>(&comms, count, None, k as u64).await;
            continue;
        };
        let ins = inputs::<f32>(n, count, ReduceOp::Sum, k as u64);
        let mut outs = vec![vec![0f32; n * count]; n];
        let (first, rest) = outs.split_first_mut().unwrap();
        let mut dropped = Box::pin(comms[1].all_gather(&ins[1], first));
        if polled {
            assert!(futures::poll!(dropped.as_mut()).is_pending());
        }
        let others = join_all(
            [(&comms[0], &ins[0]), (&comms[2], &ins[2])]
                .into_iter()
                .zip(rest.iter_mut())
                .map(|((c, i), o)| c.all_gather(i, o)),
        );
        drop(dropped);
        for r in others.await {
            let e = r.expect_err("the dropped call fails elsewhere");
            assert_eq!(e.kind(), ErrorKind::Aborted, "call {k}: {e}");
        }
    }
}

/// A call dropped on one rank, before its first poll or in the middle, at an epoch's
/// first call (where the timings are sent) and elsewhere: that call fails on the
/// other ranks, and every later call of the class runs and is right.
#[tokio::test(flavor = "current_thread")]
async fn dropped_calls_fail_alone() {
    let n = 3;
    let mut comms = hcomm::local(n);
    contested(&mut comms);
    let w = WINDOW as usize;
    let e = (MAX_EPOCH * WINDOW) as usize;
    let drops = [(w, false), (w + 3, true), (e, false), (2 * e, true), (2 * e + w - 1, false)];
    for k in 0..(2 * e + 2 * w) {
        let count = COUNTS_64K[k % COUNTS_64K.len()];
        let Some(&(_, polled)) = drops.iter().find(|(at, _)| *at == k) else {
            check_allreduce::<_, f32>(&comms, count, ReduceOp::Sum, k as u64).await;
            continue;
        };
        let mut bufs = inputs::<f32>(n, count, ReduceOp::Sum, k as u64);
        let (first, rest) = bufs.split_first_mut().unwrap();
        let mut dropped = Box::pin(comms[1].all_reduce(first, ReduceOp::Sum));
        if polled {
            assert!(futures::poll!(dropped.as_mut()).is_pending());
        }
        let others = join_all(
            [&comms[0], &comms[2]].into_iter().zip(rest.iter_mut()).map(|(c, b)| c.all_reduce(b, ReduceOp::Sum)),
        );
        drop(dropped);
        for r in others.await {
            let e = r.expect_err("the dropped call fails elsewhere");
            assert_eq!(e.kind(), ErrorKind::Aborted, "call {k}: {e}");
        }
    }
}
