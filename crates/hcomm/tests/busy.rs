//! A rank whose executor is busy computing is not taken for dead: its process's
//! liveness beacon keeps beating while its current-thread runtime runs nothing else.

mod common;

use std::time::Duration;

use hcomm::ReduceOp;

/// The transports a busy rank is tried over.
#[derive(Clone, Copy, Debug)]
enum Over {
    Tcp,
    Shm,
    #[cfg(all(feature = "uring", target_os = "linux"))]
    Uring,
    #[cfg(all(feature = "uring", target_os = "linux"))]
    UringShm,
}

async fn two_allreduces<T: hcomm::Transport>(comm: hcomm::Communicator<T>, busy: Duration) -> hcomm::Result<()> {
    let rank = comm.rank();
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
}

/// Three ranks, each on its own thread with its own current-thread runtime (tokio's,
/// or tokio-uring's), over `over`; rank 1 blocks its runtime for `busy` (over five
/// peer timeouts) between two allreduces.
fn busy_rank_survives(over: Over, busy: Duration) {
    let port = common::free_port();
    let ranks: Vec<_> = (0..3)
        .map(|rank| {
            std::thread::spawn(move || {
                let mut cfg = hcomm::Config::new(rank, 3, format!("127.0.0.1:{port}"));
                cfg.job_id = format!("busy-{over:?}-{port}");
                cfg.secret = Some(String::from("busy test"));
                cfg.stream.peer_timeout = Some(Duration::from_millis(300));
                match over {
                    Over::Tcp | Over::Shm => {
                        cfg.shm = matches!(over, Over::Shm);
                        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                        rt.block_on(async { two_allreduces(cfg.connect().await?, busy).await })
                    }
                    #[cfg(all(feature = "uring", target_os = "linux"))]
                    Over::Uring | Over::UringShm => {
                        cfg.shm = matches!(over, Over::UringShm);
                        tokio_uring::start(async { two_allreduces(cfg.connect_uring().await?, busy).await })
                    }
                }
            })
        })
        .collect();
    for (r, t) in ranks.into_iter().enumerate() {
        t.join().unwrap().unwrap_or_else(|e| panic!("rank {r} ({over:?}): {e}"));
    }
}

#[test]
fn a_busy_rank_is_not_failed_over_tcp() {
    busy_rank_survives(Over::Tcp, Duration::from_secs(2));
}

#[test]
fn a_busy_rank_is_not_failed_over_shared_memory() {
    busy_rank_survives(Over::Shm, Duration::from_secs(2));
}

#[cfg(all(feature = "uring", target_os = "linux"))]
#[test]
fn a_busy_rank_is_not_failed_over_io_uring() {
    busy_rank_survives(Over::Uring, Duration::from_secs(2));
}

#[cfg(all(feature = "uring", target_os = "linux"))]
#[test]
fn a_busy_rank_is_not_failed_over_io_uring_and_shared_memory() {
    busy_rank_survives(Over::UringShm, Duration::from_secs(2));
}
