//! What the adaptive allreduce selection runs, window by window, read from the
//! operations' `tracing` events. A test binary of its own: a subscriber set for one
//! thread while other tests emit events on theirs can leave the events' callsites
//! disabled for it.

mod common;

use common::*;
use hcomm::ReduceOp;
use hcomm_collectives::adapt::WINDOW;

/// The operations' events show what ran: in the first two windows, which the
/// table's choice holds whatever the times, the last two calls of each ran an
/// alternative (the first, then the second), on every rank.
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
        }
    });
    let log = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    let count = |rank: u32, algo: &str| {
        log.lines()
            .filter(|l| {
                l.contains(&format!("rank={rank} "))
                    && l.contains("op=\"allreduce\"")
                    && l.contains(&format!("algo=\"{algo}\""))
            })
            .count()
    };
    for rank in 0..2 {
        assert_eq!(count(rank, "tree"), 2, "rank {rank}:\n{log}");
        assert_eq!(count(rank, "ring"), 2, "rank {rank}:\n{log}");
        assert_eq!(count(rank, "rabenseifner"), 2 * WINDOW as usize - 4, "rank {rank}:\n{log}");
    }
}
