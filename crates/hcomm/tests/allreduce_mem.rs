//! Allreduce over the in-process transport: the full matrix of rank counts, sizes,
//! element types and operators, plus concurrency, errors and cancellation.

mod common;

use std::time::Duration;

use common::*;
use futures::future::join_all;
use hcomm::ReduceOp;

#[tokio::test(flavor = "current_thread")]
async fn matrix_ranks_1_to_8_and_11_and_16() {
    for n in (1..=8).chain([11, 16]) {
        let comms = hcomm::local(n);
        matrix(&comms, SIZES).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn large_buffers_use_pipelined_columns() {
    for (n, count) in [(3usize, 3_000_017usize), (4, 1 << 21), (5, 999_983)] {
        let comms = hcomm::local(n);
        check_allreduce::<_, f32>(&comms, count, ReduceOp::Sum, 7).await;
        check_allreduce::<_, i64>(&comms, count / 2, ReduceOp::BXor, 8).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn hundred_allreduces_in_flight_on_one_communicator() {
    let n = 4;
    let comms = hcomm::local(n);
    let sizes: Vec<usize> = (0..100).map(|i| [0, 1, 17, 1000, 65_537, 300_001][i % 6] + i).collect();
    in_flight::<_, f64>(&comms, &sizes, ReduceOp::Sum).await;
    assert_eq!(comms[0].collectives_called(), 100);
}

#[tokio::test(flavor = "current_thread")]
async fn mismatched_length_fails_on_every_rank_then_recovers() {
    let n = 4;
    let mut comms = hcomm::local(n);
    comms.iter_mut().for_each(|c| c.set_timeout(Duration::from_secs(20)));
    let mut bufs: Vec<Vec<f32>> = (0..n).map(|r| vec![1.0; if r == 2 { 1001 } else { 1000 }]).collect();
    let res = join_all(comms.iter().zip(bufs.iter_mut()).map(|(c, b)| c.all_reduce(b, ReduceOp::Sum))).await;
    for (r, res) in res.into_iter().enumerate() {
        let e = res.expect_err("a mismatched allreduce must fail");
        assert!(e.is_mismatch(), "rank {r}: {e}");
        assert_eq!(e.rank(), Some(r), "{e}");
        assert_eq!(e.seq(), Some(1), "{e}");
        assert!(e.to_string().contains("count=1001"), "rank {r}: {e}");
    }
    // The communicator is still good for the next operation.
    check_allreduce::<_, f32>(&comms, 1000, ReduceOp::Sum, 3).await;
}

#[tokio::test(flavor = "current_thread")]
async fn mismatched_dtype_or_op_fails_on_every_rank() {
    let comms = hcomm::local(3);
    let mut a = vec![1.0f32; 10];
    let mut b = vec![1.0f32; 10];
    let mut c = vec![1i32; 10];
    let (ra, rb, rc) = futures::join!(
        comms[0].all_reduce(&mut a, ReduceOp::Sum),
        comms[1].all_reduce(&mut b, ReduceOp::Max),
        comms[2].all_reduce(&mut c, ReduceOp::Sum)
    );
    for (r, e) in [ra, rb, rc].into_iter().enumerate() {
        let e = e.expect_err("must fail");
        assert!(e.is_mismatch(), "rank {r}: {e}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn invalid_operator_is_rejected_on_every_rank() {
    let comms = hcomm::local(3);
    let mut ints: Vec<Vec<i32>> = vec![vec![1; 5]; 3];
    let res = join_all(comms.iter().zip(ints.iter_mut()).map(|(c, b)| c.all_reduce(b, ReduceOp::Avg))).await;
    for e in res {
        assert!(e.unwrap_err().is_invalid_argument());
    }
    // One rank alone passing a bad operator: it gets invalid-argument, the others a
    // clear error, nobody hangs.
    let mut f: Vec<Vec<f32>> = vec![vec![1.0; 5]; 3];
    let mut it = f.iter_mut();
    let (b0, b1, b2) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
    let (r0, r1, r2) = futures::join!(
        comms[0].all_reduce(b0, ReduceOp::BXor),
        comms[1].all_reduce(b1, ReduceOp::BXor),
        comms[2].all_reduce(b2, ReduceOp::BXor)
    );
    for e in [r0, r1, r2] {
        assert!(e.unwrap_err().is_invalid_argument());
    }
}

#[tokio::test(flavor = "current_thread")]
async fn dropped_allreduce_aborts_on_peers_and_later_operations_work() {
    let n = 3;
    let comms = hcomm::local(n);
    let mut bufs: Vec<Vec<f32>> = vec![vec![1.0; 100_000]; n];
    {
        // Rank 0 starts allreduce #1 and abandons it after one poll.
        let mut f = Box::pin(comms[0].all_reduce(&mut bufs[0], ReduceOp::Sum));
        assert!(futures::poll!(f.as_mut()).is_pending());
    }
    let (_, rest) = bufs.split_at_mut(1);
    let res = join_all(comms[1..].iter().zip(rest.iter_mut()).map(|(c, b)| c.all_reduce(b, ReduceOp::Sum))).await;
    for e in res {
        let e = e.unwrap_err();
        assert!(e.is_aborted(), "{e}");
        assert_eq!(e.peer(), Some(0), "{e}");
        assert!(e.to_string().contains("cancelled"), "{e}");
    }
    // Allreduce #2 is unaffected.
    check_allreduce::<_, f32>(&comms, 100_000, ReduceOp::Sum, 11).await;
    check_allreduce::<_, u16>(&comms, 77, ReduceOp::Max, 12).await;
}

#[tokio::test(flavor = "current_thread")]
async fn timeout_names_the_missing_rank() {
    tokio::time::pause();
    // Whatever the algorithm (and so whoever waits on whom), the errors name rank 2,
    // the one that never called.
    for algo in [hcomm::AllreduceAlgo::Ring, hcomm::AllreduceAlgo::RecursiveDoubling, hcomm::AllreduceAlgo::Tree] {
        let mut comms = hcomm::local(3);
        comms.iter_mut().for_each(|c| c.set_timeout(Duration::from_secs(5)));
        let mut a = vec![1.0f32; 10];
        let mut b = vec![1.0f32; 10];
        let (ra, rb) = futures::join!(
            comms[0].all_reduce_with(&mut a, ReduceOp::Sum, algo),
            comms[1].all_reduce_with(&mut b, ReduceOp::Sum, algo)
        );
        let (ea, eb) = (ra.unwrap_err(), rb.unwrap_err());
        let texts = [ea.to_string(), eb.to_string()];
        assert!(texts.iter().any(|t| t.contains("ranks [2]")), "{algo:?}: {texts:?}");
        for e in [ea, eb] {
            assert!(e.is_timeout() || e.is_aborted(), "{algo:?}: {e}");
            assert_eq!(e.seq(), Some(1));
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn barrier_holds_every_rank_until_all_entered() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    for n in 1..=9 {
        let comms = hcomm::local(n);
        let entered = AtomicUsize::new(0);
        join_all(comms.iter().map(|c| {
            let entered = &entered;
            async move {
                tokio::time::sleep(Duration::from_millis((c.rank() * 7 % 5) as u64 * 3)).await;
                entered.fetch_add(1, Ordering::SeqCst);
                c.barrier().await.unwrap();
                assert_eq!(entered.load(Ordering::SeqCst), n, "rank {} left the barrier early", c.rank());
            }
        }))
        .await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn allgather_and_split() {
    for n in 1..=8 {
        let comms = hcomm::local(n);
        let mut outs: Vec<Vec<u32>> = vec![vec![0; 3 * n]; n];
        let ins: Vec<Vec<u32>> = (0..n).map(|r| vec![r as u32 * 10, r as u32 * 10 + 1, r as u32 * 10 + 2]).collect();
        let res = join_all(comms.iter().zip(outs.iter_mut()).zip(&ins).map(|((c, o), i)| c.all_gather(i, o))).await;
        res.into_iter().for_each(|r| r.unwrap());
        let want: Vec<u32> = ins.concat();
        assert!(outs.iter().all(|o| *o == want));

        // Split into even and odd ranks, reversed by key; rank 0 opts out when n > 2.
        let subs = join_all(comms.iter().map(|c| {
            let color = if c.rank() == 0 && n > 2 { None } else { Some((c.rank() % 2) as u32) };
            c.split(color, -(c.rank() as i64))
        }))
        .await;
        let subs: Vec<Option<hcomm::Communicator<hcomm::MemTransport>>> =
            subs.into_iter().map(|s| s.unwrap()).collect();
        for (r, s) in subs.iter().enumerate() {
            match s {
                None => assert!(r == 0 && n > 2),
                Some(s) => {
                    let members: Vec<usize> = (0..n).rev().filter(|&x| x % 2 == r % 2 && !(x == 0 && n > 2)).collect();
                    assert_eq!(s.size(), members.len());
                    assert_eq!(members[s.rank()], r);
                }
            }
        }
        // Each sub-communicator allreduces its own ranks' values, concurrently with a
        // world allreduce, and point-to-point tags do not leak between them.
        let mut sub_bufs: Vec<Vec<u64>> = (0..n).map(|r| vec![r as u64; 5]).collect();
        let mut world_bufs: Vec<Vec<u64>> = (0..n).map(|r| vec![1u64 << r; 5]).collect();
        join_all(subs.iter().zip(sub_bufs.iter_mut()).zip(comms.iter().zip(world_bufs.iter_mut())).map(
            |((s, sb), (c, wb))| async move {
                let w = c.all_reduce(wb, ReduceOp::BOr);
                match s {
                    Some(s) => {
                        let (a, b) = futures::join!(s.all_reduce(sb, ReduceOp::Sum), w);
                        a.unwrap();
                        b.unwrap();
                    }
                    None => w.await.unwrap(),
                }
            },
        ))
        .await;
        for r in 0..n {
            assert_eq!(world_bufs[r], vec![(1u64 << n) - 1; 5]);
            if subs[r].is_some() {
                let want: u64 = (0..n).filter(|&x| x % 2 == r % 2 && !(x == 0 && n > 2)).map(|x| x as u64).sum();
                assert_eq!(sub_bufs[r], vec![want; 5], "rank {r}");
            }
        }
    }
}

/// `grid`: on one host the placement is row-major, so grid rank = rank; a shift along
/// each dimension (periodic in the second) reaches the neighbours `Grid::shift` names,
/// and each receives the right coordinates. A grid of the wrong size is refused.
#[tokio::test(flavor = "current_thread")]
async fn grid_communicator_shifts_reach_the_neighbours() {
    let comms = hcomm::local(12);
    let grids = join_all(comms.iter().map(|c| c.grid(&[3, 4], &[false, true]))).await;
    let grids: Vec<(hcomm::Communicator<hcomm::MemTransport>, hcomm::Grid)> =
        grids.into_iter().map(|g| g.unwrap()).collect();
    for (r, (c, g)) in grids.iter().enumerate() {
        assert_eq!((c.size(), c.rank(), g.size()), (12, r, 12));
    }
    for dim in 0..2 {
        let got = join_all(grids.iter().map(|(c, g)| async move {
            let me = c.rank();
            let (from, to) = g.shift(me, dim, 1);
            let coords: Vec<u64> = g.coords(me).into_iter().map(|x| x as u64).collect();
            let send = async {
                match to {
                    Some(t) => c.send(t, 5, &coords).await,
                    None => Ok(()),
                }
            };
            let recv = async {
                match from {
                    Some(f) => c.recv::<u64>(f, 5).await.map(Some),
                    None => Ok(None),
                }
            };
            let (s, got) = futures::join!(send, recv);
            s.unwrap();
            (me, from, got.unwrap())
        }))
        .await;
        let g = &grids[0].1;
        for (me, from, got) in got {
            let want = from.map(|f| g.coords(f).into_iter().map(|x| x as u64).collect::<Vec<u64>>());
            assert_eq!(got, want, "grid rank {me}, dimension {dim}");
            // Dimension 1 is periodic: everyone has a source; dimension 0 is not.
            assert_eq!(from.is_none(), dim == 0 && me < 4, "grid rank {me}, dimension {dim}");
        }
    }
    let e = comms[0].grid(&[5, 5], &[]).await.unwrap_err();
    assert!(e.to_string().contains("25 positions for 12 ranks"), "{e}");
}
