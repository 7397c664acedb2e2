//! Every collective against its sequential reference over the in-process transport:
//! rank counts 1..=16, sizes 0, 1, primes and sizes not divisible by the rank count,
//! several element types, every operator, every root position.

mod common;

use common::colls;
use hcomm::{BcastAlgo, ReduceOp, bf16};

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

#[tokio::test(flavor = "current_thread")]
async fn exchanges_and_scans() {
    for n in 1..=16 {
        let comms = hcomm::local(n);
        for (i, &count) in SIZES.iter().enumerate() {
            let seed = (n * 100 + i) as u64;
            colls::all_to_all::<_, u16>(&comms, count, seed).await;
            colls::all_gather_v::<_, f32>(&comms, count, seed).await;
            for algo in hcomm::AllgatherAlgo::ALL {
                colls::all_gather::<_, i16>(&comms, count, algo, seed).await;
                colls::all_gather::<_, f64>(&comms, count, algo, seed).await;
            }
            for op in ReduceOp::ALL {
                if op.supports(hcomm::DType::F64) {
                    colls::reduce_scatter::<_, f64>(&comms, count, op, seed).await;
                    colls::scans::<_, f32>(&comms, count, op, seed).await;
                }
                if op.supports(hcomm::DType::U32) {
                    colls::reduce_scatter::<_, u32>(&comms, count, op, seed).await;
                    colls::scans::<_, i8>(&comms, count, op, seed).await;
                }
            }
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn large_broadcasts_stream_through_the_chain() {
    for n in [3, 5] {
        let comms = hcomm::local(n);
        colls::broadcast::<_, f32>(&comms, 3_000_017, 1, BcastAlgo::Chain, 1).await;
        colls::broadcast::<_, f32>(&comms, 1_000_003, n - 1, BcastAlgo::Binomial, 2).await;
        colls::broadcast::<_, f32>(&comms, 2_000_029, 0, BcastAlgo::ScatterAllgather, 4).await;
        colls::all_gather::<_, u8>(&comms, 700_001, hcomm::AllgatherAlgo::Bruck, 5).await;
        colls::reduce_scatter::<_, f32>(&comms, 400_001, ReduceOp::Sum, 3).await;
    }
}
