//! The design leans on collectives over the tokio TCP transport being `Send`, so that
//! `tokio::spawn` accepts them: this file does not compile otherwise.

use hcomm::{Communicator, ReduceOp, StreamTransport};

fn assert_send<T: Send>(_: &T) {}

#[allow(dead_code)]
fn futures_over_tcp_are_send(c: &Communicator<StreamTransport>, buf: &mut [f32], out: &mut [f32]) {
    assert_send(&c.all_reduce(buf, ReduceOp::Sum));
    assert_send(&c.barrier());
    assert_send(&c.recv::<f64>(0, 1));
    assert_send(&c.send(0, 1, &[1u8]));
    assert_send(&c.split(Some(0), 0));
    assert_send(&c.all_gather(&[1.0f32], out));
}

/// The bound generic code names for `Send` futures: `T: hcomm::Transport + Sync`
/// (the `Send` variant of `LocalTransport`), with `E: Element` as usual. Every
/// transport of this crate meets it; this does not compile if an operation's future
/// stops being `Send` for such a `T`.
#[allow(dead_code)]
fn futures_over_any_send_transport_are_send<T: hcomm::Transport + Sync>(
    c: &Communicator<T>,
    buf: &mut [f32],
    out: &mut [f32],
    bytes: hcomm::Bytes,
) {
    assert_send(&c.all_reduce(buf, ReduceOp::Sum));
    assert_send(&c.broadcast(buf, 0));
    assert_send(&c.reduce(buf, ReduceOp::Max, 0));
    assert_send(&c.all_gather(&[1.0f32], out));
    assert_send(&c.reduce_scatter(&[1.0f32, 2.0], out, ReduceOp::Sum));
    assert_send(&c.all_to_all(&[1.0f32, 2.0], out));
    assert_send(&c.barrier());
    assert_send(&c.send(0, 1, &[1u8]));
    assert_send(&c.send_bytes(0, 1, bytes));
    assert_send(&c.recv::<f64>(0, 1));
    assert_send(&c.recv_bytes(0, 1));
    assert_send(&c.recv_into(0, 1, out));
    assert_send(&c.split(Some(0), 0));
    assert_send(&c.settle_checks());
    assert_send(&c.finalize());
    assert_send(&hcomm::deadline(None, c.barrier()));
    assert_send(&hcomm::quiet(c.barrier()));
}

#[allow(dead_code)]
fn any_send_transport_passes_the_bound() {
    fn bound<T: hcomm::Transport + Sync>() {}
    bound::<StreamTransport>();
    bound::<hcomm::MemTransport>();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawned_allreduce_over_tcp() {
    let comms = hcomm::local_tcp(3).await.unwrap();
    let handles: Vec<_> = comms
        .into_iter()
        .map(|c| {
            tokio::spawn(async move {
                let mut v = vec![c.rank() as f32; 1000];
                c.all_reduce(&mut v, ReduceOp::Sum).await.unwrap();
                v
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.await.unwrap(), vec![3.0f32; 1000]);
    }
}

#[allow(dead_code)]
fn owned_allreduce_is_send_and_static(c: &std::sync::Arc<Communicator<StreamTransport>>) {
    fn assert_static_send<F: std::future::Future + Send + 'static>(_: &F) {}
    assert_static_send(&c.all_reduce_owned(vec![1.0f32], ReduceOp::Sum));
    assert_static_send(&c.broadcast_owned(vec![1.0f32], 0));
}

/// Owned allreduces are numbered when called: tasks that start in another order (here
/// reversed on odd ranks) still match by call order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawned_owned_allreduces_match_by_call_order() {
    let comms: Vec<_> = hcomm::local_tcp(3).await.unwrap().into_iter().map(std::sync::Arc::new).collect();
    let per_rank = comms.iter().map(|c| {
        let futs: Vec<_> =
            (0..10).map(|k| c.all_reduce_owned(vec![(k * 10 + c.rank()) as u64; 100 + k], ReduceOp::Sum)).collect();
        let odd = c.rank() % 2 == 1;
        async move {
            let mut handles: Vec<_> = Vec::new();
            if odd {
                for f in futs.into_iter().rev() {
                    handles.push(tokio::spawn(f));
                }
                handles.reverse();
            } else {
                handles = futs.into_iter().map(tokio::spawn).collect();
            }
            let mut out = Vec::new();
            for h in handles {
                out.push(h.await.unwrap().unwrap());
            }
            out
        }
    });
    for out in futures::future::join_all(per_rank).await {
        for (k, v) in out.iter().enumerate() {
            assert_eq!(*v, vec![(30 * k + 3) as u64; 100 + k], "allreduce {k}");
        }
    }
}

/// An owned allreduce dropped before it starts aborts the operation on the peers.
#[tokio::test(flavor = "current_thread")]
async fn dropped_unstarted_owned_allreduce_aborts_on_peers() {
    let comms: Vec<_> = hcomm::local(2).into_iter().map(std::sync::Arc::new).collect();
    drop(comms[0].all_reduce_owned(vec![1i32; 4], ReduceOp::Sum));
    let e = comms[1].all_reduce_owned(vec![1i32; 4], ReduceOp::Sum).await.unwrap_err();
    assert!(e.is_aborted(), "{e}");
    assert_eq!(e.peer(), Some(0));
    // The next one works.
    let (a, b) = futures::join!(
        comms[0].all_reduce_owned(vec![1i32; 4], ReduceOp::Sum),
        comms[1].all_reduce_owned(vec![2i32; 4], ReduceOp::Sum)
    );
    assert_eq!((a.unwrap(), b.unwrap()), (vec![3; 4], vec![3; 4]));
}

/// Owned broadcasts from every root, numbered at the call and spawned in reverse on
/// odd ranks, over every transport: each rank gets the root's random data, at sizes
/// from empty to several fragments.
async fn spawned_owned_broadcasts<T: hcomm::Transport + Sync + 'static>(comms: Vec<Communicator<T>>) {
    const SIZES: [usize; 7] = [0, 1, 2, 13, 4099, 65_537, 300_007];
    let n = comms.len();
    let data = |k: usize| -> Vec<u32> {
        let mut x = (k as u32).wrapping_mul(2_654_435_761) | 1;
        (0..SIZES[k % SIZES.len()])
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x
            })
            .collect()
    };
    let ops = 3 * SIZES.len();
    let comms: Vec<_> = comms.into_iter().map(std::sync::Arc::new).collect();
    let per_rank = comms.iter().map(|c| {
        let futs: Vec<_> = (0..ops)
            .map(|k| {
                let root = k % n;
                let buf = if c.rank() == root { data(k) } else { vec![u32::MAX; SIZES[k % SIZES.len()]] };
                c.broadcast_owned(buf, root)
            })
            .collect();
        let odd = c.rank() % 2 == 1;
        async move {
            let mut handles: Vec<_> = if odd {
                futs.into_iter().rev().map(tokio::spawn).collect()
            } else {
                futs.into_iter().map(tokio::spawn).collect()
            };
            if odd {
                handles.reverse();
            }
            let mut out = Vec::new();
            for h in handles {
                out.push(h.await.unwrap().unwrap());
            }
            out
        }
    });
    for (r, out) in futures::future::join_all(per_rank).await.into_iter().enumerate() {
        for (k, v) in out.iter().enumerate() {
            assert!(*v == data(k), "rank {r}, broadcast {k} ({} elements)", v.len());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawned_owned_broadcasts_get_the_roots_data_over_every_transport() {
    for n in [1, 2, 3, 4] {
        spawned_owned_broadcasts(hcomm::local(n)).await;
    }
    spawned_owned_broadcasts(hcomm::local_tcp(3).await.unwrap()).await;
    spawned_owned_broadcasts(hcomm::local_shm(3).await.unwrap()).await;
}
