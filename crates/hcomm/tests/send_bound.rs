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
