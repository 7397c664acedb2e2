//! What the adaptive selection runs, window by window, read from the
//! operations' `tracing` events. A test binary of its own: a subscriber set for one
//! thread while other tests emit events on theirs can leave the events' callsites
//! disabled for it.

mod common;

use common::*;
use hcomm::ReduceOp;
use hcomm_collectives::adapt::WINDOW;

/// The operations' events show what ran: in the first two windows, which the
/// table's choice holds whatever the times, the last two calls of each ran an
/// alternative (the first, then the second), on every rank; for the allreduce, and
/// for the allgather and the reduce-scatter called between its calls.
#[test]
fn the_last_two_calls_of_a_window_run_the_alternatives_in_turn() {
    let out = Captured::default();
    let w = out.clone();
    let sub = tracing_subscriber::fmt()
        .with_writer(move || w.clone())
        .with_ansi(false)
        .with_env_filter(tracing_subscriber::EnvFilter::new("hcomm::op=debug"))
        .finish();
    let _guard = tracing::subscriber::set_default(sub);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut comms = hcomm::local(2);
        contested(&mut comms);
        for k in 0..2 * WINDOW {
            check_allreduce::<_, f32>(&comms, 16_411, ReduceOp::Sum, k).await;
            colls::all_gather::<_, f32>(&comms, 4099, None, k).await;
            let mut outs = vec![vec![0f32; 4099]; 2];
            let ins = inputs::<f32>(2, 2 * 4099, ReduceOp::Sum, k);
            let rs =
                comms.iter().zip(&ins).zip(outs.iter_mut()).map(|((c, i), o)| c.reduce_scatter(i, o, ReduceOp::Sum));
            for r in futures::future::join_all(rs).await {
                r.unwrap();
            }
        }
    });
    let log = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    let count = |rank: u32, op: &str, algo: &str| {
        log.lines()
            .filter(|l| {
                l.contains(&format!("rank={rank} "))
                    && l.contains(&format!("op=\"{op}\""))
                    && l.contains(&format!("algo=\"{algo}\""))
            })
            .count()
    };
    let w = WINDOW as usize;
    for rank in 0..2 {
        assert_eq!(count(rank, "allreduce", "tree"), 2, "rank {rank}:\n{log}");
        assert_eq!(count(rank, "allreduce", "ring"), 2, "rank {rank}:\n{log}");
        assert_eq!(count(rank, "allreduce", "rabenseifner"), 2 * w - 4, "rank {rank}:\n{log}");
        assert_eq!(count(rank, "allgather", "recursive_doubling"), 2, "rank {rank}:\n{log}");
        assert_eq!(count(rank, "allgather", "bruck"), 2, "rank {rank}:\n{log}");
        assert_eq!(count(rank, "allgather", "ring"), 2 * w - 4, "rank {rank}:\n{log}");
        assert_eq!(count(rank, "reduce_scatter", "ring"), 4, "rank {rank}:\n{log}");
        assert_eq!(count(rank, "reduce_scatter", "recursive_halving"), 2 * w - 4, "rank {rank}:\n{log}");
    }
}
