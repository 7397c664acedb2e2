//! Every allreduce algorithm against the sequential reference, over every rank count
//! from 1 to 16 (powers of two and not), and reproducible mode.

mod common;

use common::*;
use futures::future::join_all;
use hcomm::{AllreduceAlgo, Communicator, LocalTransport, Placement, ReduceOp};

const ALGOS: [AllreduceAlgo; 6] = [
    AllreduceAlgo::Ring,
    AllreduceAlgo::RecursiveDoubling,
    AllreduceAlgo::Rabenseifner,
    AllreduceAlgo::Tree,
    AllreduceAlgo::Ordered,
    AllreduceAlgo::Hierarchical,
];

/// Rank `r` of `n` on host `r % hosts`; host `h` in rack `h % racks`: neighbours in
/// rank order share neither host nor rack.
fn interleaved(n: usize, hosts: usize, racks: usize) -> Vec<Placement> {
    (0..n)
        .map(|r| Placement {
            host: format!("h{}", r % hosts),
            rack: Some(format!("r{}", r % hosts % racks)),
            numa: None,
        })
        .collect()
}

/// The hierarchical allreduce (and the default selection, and the ring in
/// topology order) on emulated placements: equal hosts in one or two racks, which
/// give it one or two stages, and unequal ones, where it falls back to a ring; every
/// rank count to 16, sizes not divisible by the stage sizes.
#[tokio::test(flavor = "current_thread")]
async fn hierarchical_over_placements() {
    for n in 1..=16 {
        for (hosts, racks) in [(1, 1), (2, 1), (2, 2), (3, 1), (4, 2), (4, 1), (8, 2)] {
            let comms = hcomm::local_placed(&interleaved(n, hosts, racks));
            let stages = comms[0].hierarchical_stages();
            if n % hosts == 0 && n > hosts && hosts > 1 {
                assert!(stages >= 1, "n={n} hosts={hosts}: {stages} stages");
            }
            for algo in [Some(AllreduceAlgo::Hierarchical), Some(AllreduceAlgo::Ring)] {
                matrix_with(&comms, &[0, 1, 2, 7, 97, 1000], algo).await;
            }
        }
    }
    for (n, hosts, racks) in [(8, 4, 2), (12, 3, 1), (16, 4, 2), (6, 3, 3)] {
        let comms = hcomm::local_placed(&interleaved(n, hosts, racks));
        for algo in [Some(AllreduceAlgo::Hierarchical), None] {
            check_allreduce_with::<_, f32>(&comms, 1_000_003, ReduceOp::Sum, 9, algo).await;
            check_allreduce_with::<_, f64>(&comms, 65_537, ReduceOp::Avg, 11, algo).await;
            check_allreduce_with::<_, i32>(&comms, 300_007, ReduceOp::Max, 12, algo).await;
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn every_algorithm_every_rank_count() {
    for n in 1..=16 {
        let comms = hcomm::local(n);
        for algo in ALGOS {
            matrix_with(&comms, &[0, 1, 2, 7, 97, 1000], Some(algo)).await;
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn every_algorithm_large() {
    for n in [3, 4, 6] {
        let comms = hcomm::local(n);
        for algo in ALGOS {
            check_allreduce_with::<_, f32>(&comms, 1_000_003, ReduceOp::Sum, 9, Some(algo)).await;
            check_allreduce_with::<_, u64>(&comms, 300_007, ReduceOp::BXor, 10, Some(algo)).await;
            check_allreduce_with::<_, f64>(&comms, 65_537, ReduceOp::Avg, 11, Some(algo)).await;
        }
    }
}

/// Ranks that crowd their host: the default from 16 MiB is the ring, with at most
/// `RING_MAX_COLUMNS_CROWDED` columns (more pieces per column past 32 MiB on 4
/// ranks), against the reference, and bitwise alike on every rank.
#[tokio::test(flavor = "current_thread")]
async fn crowded_ranks_ring_with_fewer_columns() {
    use hcomm::Crowded;
    let mut comms = hcomm::local(4);
    for c in &mut comms {
        let mut t = c.tuning().clone();
        t.crowded = Some(Crowded { processors: 2, blocks: true });
        c.set_tuning(t);
    }
    let count = (33 << 20) / 4 + 5;
    assert_eq!(comms[0].tuning().allreduce_algo(4, count * 4, false, None), AllreduceAlgo::Ring);
    check_allreduce_with::<_, i32>(&comms, count, ReduceOp::Sum, 21, None).await;
    check_allreduce_with::<_, f32>(&comms, (16 << 20) / 4 + 3, ReduceOp::Sum, 22, None).await;
}

/// The sequential fold in rank order, which reproducible mode must equal bit for bit.
fn rank_order_fold<E: TestElem>(inputs: &[Vec<E>], op: ReduceOp) -> Vec<E> {
    let mut acc = inputs[0].clone();
    for x in &inputs[1..] {
        E::reduce(op, &mut acc, x);
    }
    if op == ReduceOp::Avg {
        E::div_count(&mut acc, inputs.len());
    }
    acc
}

async fn reproducible<T: LocalTransport, E: TestElem>(comms: &[Communicator<T>], op: ReduceOp) {
    let n = comms.len();
    let big = inputs::<E>(n, 70_001, op, 5);
    let want = rank_order_fold(&big, op);
    // Whatever algorithm is asked for and whatever the message size, every rank gets
    // the rank-order fold, bit for bit.
    for algo in [None, Some(AllreduceAlgo::Ring), Some(AllreduceAlgo::RecursiveDoubling), Some(AllreduceAlgo::Tree)] {
        for count in [1usize, 13, 4099, 70_001] {
            let mut bufs: Vec<Vec<E>> = big.iter().map(|v| v[..count].to_vec()).collect();
            let res = join_all(comms.iter().zip(bufs.iter_mut()).map(|(c, b)| async move {
                match algo {
                    Some(a) => c.all_reduce_with(b, op, a).await,
                    None => c.all_reduce(b, op).await,
                }
            }))
            .await;
            res.into_iter().for_each(|r| r.unwrap());
            for (r, b) in bufs.iter().enumerate() {
                let same = bytemuck::cast_slice::<E, u8>(b) == bytemuck::cast_slice::<E, u8>(&want[..count]);
                assert!(
                    same,
                    "reproducible {} {op} n={n} count={count} {algo:?}: rank {r} differs from the rank-order fold",
                    E::DTYPE
                );
            }
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn reproducible_mode_is_bitwise_the_rank_order_fold() {
    for n in [2, 3, 5, 8, 13] {
        let mut comms = hcomm::local(n);
        comms.iter_mut().for_each(|c| c.set_reproducible(true));
        reproducible::<_, f32>(&comms, ReduceOp::Sum).await;
        reproducible::<_, f64>(&comms, ReduceOp::Avg).await;
        reproducible::<_, hcomm::bf16>(&comms, ReduceOp::Sum).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn algorithms_over_tcp_and_reproducible_mode() {
    for n in [2, 3, 5, 8] {
        let mut comms = hcomm::local_tcp(n).await.unwrap();
        for algo in ALGOS {
            matrix_with(&comms, &[0, 7, 4099], Some(algo)).await;
            check_allreduce_with::<_, f32>(&comms, 300_001, ReduceOp::Sum, 3, Some(algo)).await;
        }
        comms.iter_mut().for_each(|c| c.set_reproducible(true));
        reproducible::<_, f32>(&comms, ReduceOp::Sum).await;
    }
}

#[cfg(all(feature = "uring", target_os = "linux"))]
#[test]
fn algorithms_over_uring() {
    tokio_uring::start(async {
        for n in [3, 4] {
            let comms = hcomm::local_uring(n).await.unwrap();
            for algo in ALGOS {
                matrix_with(&comms, &[0, 7, 4099], Some(algo)).await;
            }
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calibration_agrees_on_every_rank_and_allreduce_still_works() {
    let mut comms = hcomm::local_tcp(3).await.unwrap();
    let models = join_all(comms.iter_mut().map(|c| c.calibrate())).await;
    let models: Vec<hcomm::CostModel> = models.into_iter().map(|m| m.unwrap()).collect();
    assert!(models.iter().all(|m| *m == models[0]), "{models:?}");
    let m = models[0];
    assert!(m.alpha > 0.0 && m.beta > 0.0 && m.gamma > 0.0, "{m:?}");
    for c in &comms {
        assert_eq!(c.tuning().cost, m);
    }
    // Whatever the calibrated model now picks, it agrees across ranks and is correct.
    for count in [1, 1000, 200_003] {
        check_allreduce::<_, f32>(&comms, count, ReduceOp::Sum, count as u64).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tuning_table_agrees_on_every_rank_and_collectives_still_work() {
    let mut comms = hcomm::local_tcp(3).await.unwrap();
    let opts = hcomm::TuneOptions { max_bytes: 64 << 10, reps: 2, passes: 2, step: 4, primed: true };
    let tables = join_all(comms.iter_mut().map(|c| c.tune(&opts))).await;
    let tables: Vec<hcomm::Measured> = tables.into_iter().map(|m| m.unwrap()).collect();
    assert!(tables.iter().all(|m| *m == tables[0]), "{tables:?}");
    let m = &tables[0];
    assert_eq!(m.ranks, 3);
    let sizes = hcomm::tune_sizes(64 << 10, 4);
    assert_eq!(m.allreduce.iter().map(|e| e.0).collect::<Vec<_>>(), sizes);
    assert_eq!(m.broadcast.len(), sizes.len());
    let block_sizes = hcomm::tune_sizes((64 << 10) / 3, 4);
    for len in [m.allgather.len(), m.reduce_scatter.len(), m.alltoall.len()] {
        assert_eq!(len, block_sizes.len());
    }
    for c in &comms {
        assert_eq!(&c.tuning().measured, m);
    }
    for count in [1, 1000, 200_003] {
        check_allreduce::<_, f32>(&comms, count, ReduceOp::Sum, count as u64).await;
        common::colls::reduce_scatter::<_, f32>(
            &comms,
            count / 3,
            ReduceOp::Sum,
            comms[0].tuning().reduce_scatter_algo(3, count / 3 * 4, None),
            5,
        )
        .await;
    }
}

#[test]
fn round_order_is_a_permutation_that_varies() {
    let orders: Vec<Vec<usize>> = (0..20).map(|r| hcomm::round_order(5, r)).collect();
    for o in &orders {
        let mut s = o.clone();
        s.sort();
        assert_eq!(s, vec![0, 1, 2, 3, 4]);
    }
    // Every contender is preceded by more than one other over the rounds.
    for k in 0..5 {
        let before: std::collections::HashSet<usize> =
            orders.iter().filter_map(|o| o.iter().position(|&x| x == k).filter(|&p| p > 0).map(|p| o[p - 1])).collect();
        assert!(before.len() > 1, "{k} always follows {before:?}");
    }
}
