//! Property tests: proptest draws rank counts, sizes, seeds, algorithms and roots;
//! every collective is checked against its sequential reference over the in-process
//! transport. (The seeded matrices in the other files cover the systematic grid; this
//! file explores between its points and shrinks any failure to a small case.)

mod common;

use common::{check_allreduce_with, colls};
use hcomm::{AllgatherAlgo, AllreduceAlgo, BcastAlgo, ReduceOp, ReduceScatterAlgo};
use proptest::prelude::*;

fn run<F: std::future::Future<Output = ()>>(f: F) {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f);
}

const ALLREDUCE: [AllreduceAlgo; 5] = [
    AllreduceAlgo::Ring,
    AllreduceAlgo::RecursiveDoubling,
    AllreduceAlgo::Rabenseifner,
    AllreduceAlgo::Tree,
    AllreduceAlgo::Ordered,
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn allreduce_matches_reference(n in 1usize..=16, count in 0usize..5000, seed in any::<u64>(),
                                   algo in 0usize..5, op in 0usize..8) {
        let op = ReduceOp::ALL[op];
        run(async move {
            let comms = hcomm::local(n);
            if op.supports(hcomm::DType::F32) {
                check_allreduce_with::<_, f32>(&comms, count, op, seed, Some(ALLREDUCE[algo])).await;
            }
            if op.supports(hcomm::DType::I32) {
                check_allreduce_with::<_, i32>(&comms, count, op, seed, Some(ALLREDUCE[algo])).await;
            }
        });
    }

    #[test]
    fn rooted_and_exchange_collectives_match_reference(n in 1usize..=16, count in 0usize..3000,
                                                       seed in any::<u64>(), root in any::<usize>(),
                                                       b in 0usize..3, g in 0usize..3, h in 0usize..2) {
        run(async move {
            let comms = hcomm::local(n);
            let root = root % n;
            colls::broadcast::<_, f64>(&comms, count, root, BcastAlgo::ALL[b], seed).await;
            colls::reduce::<_, f32>(&comms, count, ReduceOp::Sum, root, seed).await;
            colls::gather_scatter::<_, u16>(&comms, count, root, seed).await;
            colls::all_gather::<_, u8>(&comms, count, AllgatherAlgo::ALL[g], seed).await;
            colls::reduce_scatter::<_, i64>(&comms, count, ReduceOp::Max, ReduceScatterAlgo::ALL[h], seed).await;
            colls::reduce_scatter::<_, f32>(&comms, count, ReduceOp::Sum, ReduceScatterAlgo::ALL[h], seed).await;
            // Both alltoall algorithms and the automatic choice.
            colls::all_to_all::<_, f32>(&comms, count % 300, seed).await;
            colls::all_gather_v::<_, i8>(&comms, count, AllgatherAlgo::ALL[g], seed).await;
            colls::scans::<_, f64>(&comms, count, ReduceOp::Sum, seed).await;
        });
    }
}
