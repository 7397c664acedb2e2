//! Object collectives against a sequential reference: every rank's copy equals what
//! the root (or each rank) put in, for structures of strings, maps, options and
//! vectors of random contents, empty to over a MiB, from every root, on 1 to 5 ranks
//! and over tcp and shared memory; a root without an object fails every rank with a
//! clear error, and a rank that asks for another type finds a mismatch.

mod common;

use std::collections::BTreeMap;

use futures::future::join_all;
use hcomm::{Communicator, LocalTransport};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Record {
    name: String,
    values: Vec<f64>,
    tags: BTreeMap<String, u32>,
    parent: Option<Box<Record>>,
    flag: bool,
}

/// A record whose size grows with `scale` (0: nearly empty; 5: over a MiB).
fn record(seed: u64, scale: usize) -> Record {
    let mut rng = StdRng::seed_from_u64(seed);
    let len = [0, 1, 7, 97, 4099, 150_001][scale % 6];
    let tags = (0..rng.random_range(0..5)).map(|i| (format!("t{i}-{}", rng.random::<u16>()), rng.random())).collect();
    let parent = (scale % 2 == 1).then(|| Box::new(record(seed ^ 0xabc, 0)));
    Record {
        name: "ω".repeat(scale) + &seed.to_string(),
        values: (0..len).map(|_| rng.random::<f64>() * 1e6 - 5e5).collect(),
        tags,
        parent,
        flag: seed.is_multiple_of(3),
    }
}

async fn matrix<T: LocalTransport>(comms: &[Communicator<T>]) {
    let n = comms.len();
    for scale in 0..6 {
        for root in 0..n {
            let seed = (scale * 31 + root) as u64;
            let sent = record(seed, scale);
            let got = join_all(comms.iter().map(|c| {
                let mine = (c.rank() == root).then(|| sent.clone());
                async move { c.broadcast_object(mine.as_ref(), root).await }
            }))
            .await;
            for (r, g) in got.into_iter().enumerate() {
                assert_eq!(g.unwrap(), sent, "broadcast from {root}, scale {scale}, rank {r}");
            }
        }
        let each: Vec<Record> = (0..n).map(|r| record((scale * 7 + r) as u64, (scale + r) % 6)).collect();
        let got = join_all(comms.iter().map(|c| c.all_gather_object(&each[c.rank()]))).await;
        for (r, g) in got.into_iter().enumerate() {
            assert_eq!(g.unwrap(), each, "all_gather, scale {scale}, rank {r}");
        }
    }
    // Plain values too: a vector of strings, a tuple, unit.
    let got = join_all(comms.iter().map(|c| c.all_gather_object(&(c.rank() as u8, format!("r{}", c.rank()))))).await;
    let want: Vec<(u8, String)> = (0..n).map(|r| (r as u8, format!("r{r}"))).collect();
    for g in got {
        assert_eq!(g.unwrap(), want);
    }
    for g in join_all(comms.iter().map(|c| c.broadcast_object(Some(&()), 0))).await {
        g.unwrap();
    }
}

async fn errors<T: LocalTransport>(comms: &[Communicator<T>]) {
    let n = comms.len();
    // The root passes None: it fails with an invalid argument, and the others with
    // the same error, from the abort it sends them.
    let got = join_all(comms.iter().map(|c| c.broadcast_object::<String>(None, 0))).await;
    for (r, g) in got.into_iter().enumerate() {
        let e = g.expect_err("a root without an object fails every rank");
        assert_eq!(e.kind(), hcomm::ErrorKind::InvalidArgument, "rank {r}: {e}");
        assert!(r == 0 || e.peer() == Some(0), "rank {r} names the root: {e}");
    }
    // Another type on the last rank: it finds a mismatch.
    let got = join_all(comms.iter().map(|c| async move {
        if c.rank() == n - 1 {
            c.broadcast_object::<Vec<u64>>(None, 0).await.map(|_| ())
        } else {
            c.broadcast_object(Some(&"text".to_string()), 0).await.map(|_| ())
        }
    }))
    .await;
    let e = got[n - 1].as_ref().expect_err("the last rank decodes another type");
    assert!(e.is_mismatch() && e.peer() == Some(0), "{e}");
    // The communicator still works afterwards.
    let got = join_all(comms.iter().map(|c| c.all_gather_object(&c.rank()))).await;
    for g in got {
        assert_eq!(g.unwrap(), (0..n).collect::<Vec<usize>>());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_collectives_over_mem() {
    for n in 1..=5 {
        let comms = hcomm::local(n);
        matrix(&comms).await;
        if n > 1 {
            errors(&comms).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_collectives_over_tcp_and_shm() {
    matrix(&hcomm::local_tcp(3).await.unwrap()).await;
    errors(&hcomm::local_tcp(3).await.unwrap()).await;
    matrix(&hcomm::local_shm(3).await.unwrap()).await;
}
