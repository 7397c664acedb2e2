//! A rank whose executor is busy computing is not taken for dead: its process's
//! liveness beacon keeps beating while its current-thread runtime runs nothing else.

mod common;

use std::time::Duration;

use hcomm::ReduceOp;

/// Three ranks, each on its own thread with its own current-thread runtime, over
/// `transport` (plain TCP or shared memory); rank 1 blocks its runtime for `busy`
/// (over five peer timeouts) between two allreduces.
fn busy_rank_survives(shm: bool, busy: Duration) {
    let port = common::free_port();
    let ranks: Vec<_> = (0..3)
        .map(|rank| {
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                rt.block_on(async {
                    let mut cfg = hcomm::Config::new(rank, 3, format!("127.0.0.1:{port}"));
                    cfg.job_id = format!("busy-{shm}-{port}");
                    cfg.secret = Some(String::from("busy test"));
                    cfg.shm = shm;
                    cfg.stream.peer_timeout = Some(Duration::from_millis(300));
                    let comm = cfg.connect().await?;
                    let mut v = vec![rank as f64 + 1.0; 1000];
                    comm.all_reduce(&mut v, ReduceOp::Sum).await?;
                    assert_eq!(v, vec![6.0; 1000]);
                    if rank == 1 {
                        // A long computation that never yields to the runtime.
                        std::thread::sleep(busy);
                    }
                    let mut v = vec![rank as f64; 1000];
                    comm.all_reduce(&mut v, ReduceOp::Sum).await?;
                    assert_eq!(v, vec![3.0; 1000]);
                    comm.finalize().await
                })
            })
        })
        .collect();
    for (r, t) in ranks.into_iter().enumerate() {
        t.join().unwrap().unwrap_or_else(|e| panic!("rank {r} (shm {shm}): {e}"));
    }
}

#[test]
fn a_busy_rank_is_not_failed_over_tcp() {
    busy_rank_survives(false, Duration::from_secs(2));
}

#[test]
fn a_busy_rank_is_not_failed_over_shared_memory() {
    busy_rank_survives(true, Duration::from_secs(2));
}
