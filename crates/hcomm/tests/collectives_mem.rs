//! Every collective against its sequential reference over the in-process transport:
//! rank counts 1..=16, sizes 0, 1, primes and sizes not divisible by the rank count,
//! several element types, every operator, every root position.

mod common;

use common::colls;
use hcomm::{AllgatherAlgo, BcastAlgo, ReduceOp, ReduceScatterAlgo, bf16};

const SIZES: &[usize] = &[0, 1, 7, 97, 1000];

#[tokio::test(flavor = "current_thread")]
async fn rooted_collectives() {
    for n in 1..=16 {
        let comms = hcomm::local(n);
        for (i, &count) in SIZES.iter().enumerate() {
            let seed = (n * 100 + i) as u64;
            let roots = [0, n / 2, n - 1];
            for &root in &roots {
                for algo in BcastAlgo::ALL {
                    colls::broadcast::<_, f64>(&comms, count, root, algo, seed).await;
                    colls::broadcast::<_, u8>(&comms, count, root, algo, seed).await;
                }
                colls::gather_scatter::<_, i32>(&comms, count, root, seed).await;
            }
            for op in ReduceOp::ALL {
                let root = (i + op as usize) % n;
                if op.supports(hcomm::DType::F32) {
                    colls::reduce::<_, f32>(&comms, count, op, root, seed).await;
                    colls::reduce::<_, bf16>(&comms, count, op, root, seed).await;
                }
                if op.supports(hcomm::DType::I64) {
                    colls::reduce::<_, i64>(&comms, count, op, root, seed).await;
                }
            }
        }
    }
}

/// Broadcast (every algorithm) and reduce on placements over hosts and racks, where
/// trees and chains follow the topology rather than rank order: every root.
#[tokio::test(flavor = "current_thread")]
async fn rooted_collectives_on_placements() {
    for n in [3, 6, 8, 12] {
        for (hosts, racks) in [(2, 2), (3, 1), (4, 2)] {
            let p: Vec<hcomm::Placement> = (0..n)
                .map(|r| hcomm::Placement {
                    host: format!("h{}", r % hosts),
                    rack: Some(format!("r{}", r % hosts % racks)),
                    numa: None,
                })
                .collect();
            let comms = hcomm::local_placed(&p);
            for root in 0..n {
                let seed = (n * 1000 + hosts * 10 + root) as u64;
                for algo in BcastAlgo::ALL {
                    colls::broadcast::<_, f64>(&comms, 1000, root, algo, seed).await;
                }
                colls::reduce::<_, i64>(&comms, 97, ReduceOp::Sum, root, seed).await;
                colls::reduce::<_, f32>(&comms, 1000, ReduceOp::Max, root, seed).await;
            }
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn exchanges_and_scans() {
    for n in 1..=16 {
        let comms = hcomm::local(n);
        for (i, &count) in SIZES.iter().enumerate() {
            let seed = (n * 100 + i) as u64;
            colls::all_to_all::<_, u16>(&comms, count, seed).await;
            for algo in AllgatherAlgo::ALL {
                colls::all_gather::<_, i16>(&comms, count, algo, seed).await;
                colls::all_gather::<_, f64>(&comms, count, algo, seed).await;
                colls::all_gather_v::<_, f32>(&comms, count, algo, seed).await;
            }
            for op in ReduceOp::ALL {
                for algo in ReduceScatterAlgo::ALL {
                    if op.supports(hcomm::DType::F64) {
                        colls::reduce_scatter::<_, f64>(&comms, count, op, algo, seed).await;
                    }
                    if op.supports(hcomm::DType::U32) {
                        colls::reduce_scatter::<_, u32>(&comms, count, op, algo, seed).await;
                    }
                }
                if op.supports(hcomm::DType::F64) {
                    colls::scans::<_, f32>(&comms, count, op, seed).await;
                }
                if op.supports(hcomm::DType::U32) {
                    colls::scans::<_, i8>(&comms, count, op, seed).await;
                }
            }
        }
    }
}

/// Several MiB per collective and algorithm (sizes prime, so never divisible by the
/// rank count).
#[tokio::test(flavor = "current_thread")]
async fn several_mebibytes_per_collective() {
    for n in [3, 5, 8] {
        let comms = hcomm::local(n);
        colls::broadcast::<_, f32>(&comms, 3_000_017, 1, BcastAlgo::Chain, 1).await;
        colls::broadcast::<_, f32>(&comms, 1_000_003, n - 1, BcastAlgo::Binomial, 2).await;
        colls::broadcast::<_, f32>(&comms, 2_000_029, 0, BcastAlgo::ScatterAllgather, 4).await;
        for algo in AllgatherAlgo::ALL {
            colls::all_gather::<_, u8>(&comms, 700_001, algo, 5).await;
            colls::all_gather_v::<_, f32>(&comms, 300_007, algo, 6).await;
        }
        for algo in ReduceScatterAlgo::ALL {
            colls::reduce_scatter::<_, f32>(&comms, 400_009, ReduceOp::Sum, algo, 3).await;
            colls::reduce_scatter::<_, i64>(&comms, 200_003, ReduceOp::Max, algo, 3).await;
        }
        colls::reduce::<_, f64>(&comms, 1_000_003, ReduceOp::Sum, n / 2, 7).await;
        colls::gather_scatter::<_, f32>(&comms, 500_009, n - 1, 8).await;
        colls::all_to_all::<_, f32>(&comms, 200_003, 9).await;
        colls::scans::<_, f64>(&comms, 700_001, ReduceOp::Sum, 10).await;
    }
}
