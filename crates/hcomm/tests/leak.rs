//! Leaked futures (`mem::forget`, which safe code may do) never let anyone touch the
//! memory they borrowed. For every transport here (in-process, tokio TCP, shared
//! memory, io_uring TCP): a large `send`, `recv_into`, broadcast (root and leaf) and
//! allreduce future is polled once and forgotten; its buffer is freed and the same
//! size allocated again, filled with a secret pattern; then the peers go on. The
//! peers must never receive the secret, and the new buffer must never be written.
//! A leaked operation may leave its peers waiting (they then fail at their
//! deadline): that is allowed, reading freed memory is not.
//!
//! Each scenario runs on a current-thread runtime, so that nothing but the test's
//! own polls runs between the leaked future's one poll and the free: a send is
//! queued behind a large one still being written, so that its bytes are left for
//! later (to a writer task, a peer's pull, the next poll).

use std::future::Future;
use std::task::{Context, Waker};
use std::time::Duration;

use hcomm::{Communicator, LocalTransport, ReduceOp};

/// What the leaked future's buffer held.
const MINE: u8 = 0x11;
/// What the memory allocated after the free holds.
const SECRET: u8 = 0xEE;
/// Below glibc's threshold for mapping an allocation of its own (so a freed buffer's
/// address comes back for the next one of the same size), at and above the sizes
/// from which the transports avoid copies (64 KiB), and a large one.
const SIZES: [usize; 2] = [100_003, 3 << 20];
/// How long a peer waits for a leaked operation's data.
const PATIENCE: Duration = Duration::from_millis(1500);

/// Polls `fut` once, then leaks it.
fn poll_once_and_forget<F: Future>(fut: F) {
    let mut fut = Box::pin(fut);
    let _ = fut.as_mut().poll(&mut Context::from_waker(Waker::noop()));
    std::mem::forget(fut);
}

/// Frees `buf` and allocates one of the same size holding [`SECRET`]: the address
/// the leaked future borrowed, most likely.
fn free_and_reuse(buf: Vec<u8>) -> Vec<u8> {
    let len = buf.len();
    drop(buf);
    vec![SECRET; len]
}

/// Lets every task of this thread run for a while.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(200)).await;
}

fn assert_untouched(secret: &[u8], what: &str) {
    assert!(secret.iter().all(|&b| b == SECRET), "{what}: memory allocated after the leak was written");
}

fn assert_no_secret(got: &[u8], what: &str) {
    assert!(!got.contains(&SECRET), "{what}: the peer received memory freed after the leak");
}

/// Rank 0 leaks a send queued behind a large one; rank 1 then receives both.
async fn leaked_send<T: LocalTransport>(comms: &[Communicator<T>], len: usize, what: &str) {
    let (a, b) = (&comms[0], &comms[1]);
    let big = vec![MINE; 8 << 20];
    let first = a.send(1, 1, &big);
    let data = vec![MINE; len];
    poll_once_and_forget(a.send(1, 2, &data));
    let secret = free_and_reuse(data);
    let (sent, got) = futures::join!(first, b.recv::<u8>(0, 1));
    sent.unwrap();
    assert!(got.unwrap() == big, "{what}: the message before the leaked one");
    if let Ok(Ok(got)) = tokio::time::timeout(PATIENCE, b.recv::<u8>(0, 2)).await {
        assert_eq!(got.len(), len, "{what}");
        assert_no_secret(&got, what);
    }
    settle().await;
    assert_untouched(&secret, what);
}

/// Rank 1 leaks a receive into its buffer; rank 0 then sends the message.
async fn leaked_recv_into<T: LocalTransport>(comms: &[Communicator<T>], len: usize, what: &str) {
    let (a, b) = (&comms[0], &comms[1]);
    let buf = vec![MINE; len];
    let mut buf = std::mem::ManuallyDrop::new(buf);
    poll_once_and_forget(b.recv_into(0, 3, &mut buf[..]));
    let secret = free_and_reuse(std::mem::ManuallyDrop::into_inner(buf));
    let data = vec![0x22u8; len];
    let _ = tokio::time::timeout(PATIENCE, a.send(1, 3, &data)).await;
    settle().await;
    assert_untouched(&secret, what);
}

/// One rank leaks its part of a broadcast from `root`; the others go on.
async fn leaked_broadcast<T: LocalTransport>(
    comms: &[Communicator<T>],
    root: usize,
    leaker: usize,
    len: usize,
    what: &str,
) {
    let mut bufs: Vec<Vec<u8>> = (0..comms.len()).map(|r| vec![if r == root { MINE } else { 0 }; len]).collect();
    let leaked = std::mem::take(&mut bufs[leaker]);
    let mut leaked = std::mem::ManuallyDrop::new(leaked);
    poll_once_and_forget(comms[leaker].broadcast(&mut leaked[..], root));
    let secret = free_and_reuse(std::mem::ManuallyDrop::into_inner(leaked));
    let others = comms.iter().zip(bufs.iter_mut()).filter(|(c, _)| c.rank() != leaker);
    let ops = futures::future::join_all(others.map(|(c, b)| tokio::time::timeout(PATIENCE, c.broadcast(b, root))));
    for (r, res) in ops.await.into_iter().enumerate() {
        if let Ok(Ok(())) = res {
            assert_no_secret(&bufs[if r >= leaker { r + 1 } else { r }], what);
        }
    }
    settle().await;
    assert_untouched(&secret, what);
}

/// Rank 0 leaks its allreduce (max of bytes); the others go on.
async fn leaked_allreduce<T: LocalTransport>(comms: &[Communicator<T>], len: usize, what: &str) {
    let mut bufs: Vec<Vec<u8>> = (0..comms.len()).map(|_| vec![MINE; len]).collect();
    let mut leaked = std::mem::ManuallyDrop::new(std::mem::take(&mut bufs[0]));
    poll_once_and_forget(comms[0].all_reduce(&mut leaked[..], ReduceOp::Max));
    let secret = free_and_reuse(std::mem::ManuallyDrop::into_inner(leaked));
    let ops = comms[1..]
        .iter()
        .zip(bufs[1..].iter_mut())
        .map(|(c, b)| tokio::time::timeout(PATIENCE, c.all_reduce(b, ReduceOp::Max)));
    for (res, b) in futures::future::join_all(ops).await.into_iter().zip(&bufs[1..]) {
        if let Ok(Ok(())) = res {
            assert_no_secret(b, what);
        }
    }
    settle().await;
    assert_untouched(&secret, what);
}

/// Every scenario at every size, each on communicators of its own (a leak may leave
/// a connection waiting for good), made by `make`.
async fn all_scenarios<T, F, Fut>(name: &str, make: F)
where
    T: LocalTransport,
    F: Fn(usize) -> Fut,
    Fut: Future<Output = Vec<Communicator<T>>>,
{
    let quick = |mut comms: Vec<Communicator<T>>| {
        for c in &mut comms {
            c.set_timeout(PATIENCE);
        }
        comms
    };
    for len in SIZES {
        leaked_send(&quick(make(2).await), len, &format!("{name}: send of {len} B")).await;
        leaked_recv_into(&quick(make(2).await), len, &format!("{name}: recv_into of {len} B")).await;
        leaked_broadcast(&quick(make(3).await), 0, 0, len, &format!("{name}: broadcast root of {len} B")).await;
        leaked_broadcast(&quick(make(3).await), 0, 1, len, &format!("{name}: broadcast leaf of {len} B")).await;
        leaked_allreduce(&quick(make(2).await), len, &format!("{name}: allreduce of {len} B")).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn leaked_futures_over_mem() {
    all_scenarios("mem", |n| async move { hcomm::local(n) }).await;
}

#[tokio::test(flavor = "current_thread")]
async fn leaked_futures_over_tcp() {
    all_scenarios("tcp", |n| async move { hcomm::local_tcp(n).await.unwrap() }).await;
}

#[tokio::test(flavor = "current_thread")]
async fn leaked_futures_over_shm() {
    all_scenarios("shm", |n| async move {
        let comms = hcomm::local_shm(n).await.unwrap();
        assert_eq!(comms[0].transport_name(), "shm");
        comms
    })
    .await;
}

#[cfg(all(feature = "uring", target_os = "linux"))]
#[test]
fn leaked_futures_over_uring() {
    tokio_uring::start(all_scenarios("uring", |n| async move { hcomm::local_uring(n).await.unwrap() }));
}
