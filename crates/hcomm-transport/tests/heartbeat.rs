//! Heartbeats: idle links stay up, and a peer that hangs (its sockets open, nothing
//! sent) is failed after the peer timeout, over both TCP backends.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hcomm_core::{Header, MatchKey, OpKind, Signature, Transport};
use hcomm_transport::{MeshOptions, StreamOptions, StreamTransport, connect_mesh};
use tokio::net::{TcpListener, TcpStream};

const TIMEOUT: Duration = Duration::from_millis(400);

fn opts() -> StreamOptions {
    StreamOptions { peer_timeout: Some(TIMEOUT), ..StreamOptions::default() }
}

/// The connections of a full mesh of `n` ranks on loopback, per rank.
async fn mesh(n: usize) -> Vec<Vec<Option<TcpStream>>> {
    let mut ls = Vec::new();
    for _ in 0..n {
        ls.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let addrs: Vec<SocketAddr> = ls.iter().map(|l| l.local_addr().unwrap()).collect();
    let opts = MeshOptions { job: 9, ..MeshOptions::default() };
    futures::future::join_all(ls.into_iter().enumerate().map(|(r, l)| {
        let (addrs, opts) = (addrs.clone(), opts.clone());
        async move { connect_mesh(r, n, l, &addrs, &opts).await.unwrap() }
    }))
    .await
}

fn key(src: usize) -> MatchKey {
    MatchKey { src, comm: 0, seq: 0, tag: 1 }
}

fn message(src: usize, len: usize) -> (Header, Bytes) {
    (Header::data(src, 0, 0, 1, &Signature::bare(OpKind::Send, len as u64), len), Bytes::from(vec![src as u8; len]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_links_stay_up() {
    let ts: Vec<StreamTransport> =
        mesh(3).await.into_iter().enumerate().map(|(r, s)| StreamTransport::tokio(r, s, &opts())).collect();
    // Idle for several peer timeouts: heartbeats keep every link alive.
    tokio::time::sleep(TIMEOUT * 5).await;
    for (r, t) in ts.iter().enumerate() {
        for p in (0..3).filter(|&p| p != r) {
            assert!(t.mailbox().peer_failure(p).is_none(), "rank {r} failed rank {p} while both were idle");
            let (h, b) = message(r, 10);
            t.send(p, h, b).await.unwrap();
        }
    }
    for (r, t) in ts.iter().enumerate() {
        for p in (0..3).filter(|&p| p != r) {
            assert_eq!(t.mailbox().recv(key(p)).await.unwrap().payload.len(), 10);
        }
    }
}

/// Ranks 0 and 1 run transports; rank 2 holds its sockets and does nothing, as a
/// hung process does. Returns, for rank 0: how long a receive from rank 2 took to
/// fail, its error, and the error of a send to rank 2 that could not complete. Checks
/// that ranks 0 and 1 still talk.
async fn hung_peer(t0: StreamTransport, t1: StreamTransport) -> (Duration, hcomm_core::Error, hcomm_core::Error) {
    let start = Instant::now();
    // A send too large for the socket buffers: it can only finish when rank 2 reads.
    let (h, big) = message(0, 32 << 20);
    let send = t0.send(2, h, big);
    let recv = t0.mailbox().recv(key(2));
    let recv_err = tokio::time::timeout(Duration::from_secs(10), recv).await.expect("hang").unwrap_err();
    let detected = start.elapsed();
    let send_err = tokio::time::timeout(Duration::from_secs(10), send).await.expect("hang").unwrap_err();
    // The healthy pair is unaffected.
    let (h, b) = message(1, 100);
    t1.send(0, h, b).await.unwrap();
    assert_eq!(t0.mailbox().recv(key(1)).await.unwrap().payload.len(), 100);
    assert!(t1.mailbox().peer_failure(0).is_none());
    (detected, recv_err, send_err)
}

fn check(backend: &str, detected: Duration, recv_err: &hcomm_core::Error, send_err: &hcomm_core::Error) {
    println!("{backend}: hung rank 2 detected by rank 0 after {detected:?} (peer timeout {TIMEOUT:?})");
    println!("  receive: {recv_err}\n  send: {send_err}");
    for e in [recv_err, send_err] {
        assert!(e.is_peer_failed(), "{e}");
        assert_eq!(e.peer(), Some(2), "{e}");
    }
    assert!(recv_err.to_string().contains("nothing from rank 2"), "{recv_err}");
    assert!(detected >= TIMEOUT, "failed before the timeout: {detected:?}");
    // Generous: the check runs every quarter timeout; a loaded machine delays it.
    assert!(detected < TIMEOUT * 10, "detection took {detected:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_peer_is_failed_after_the_timeout_tokio() {
    let mut m = mesh(3).await;
    let hung = m.pop().unwrap();
    let t1 = StreamTransport::tokio(1, m.pop().unwrap(), &opts());
    let t0 = StreamTransport::tokio(0, m.pop().unwrap(), &opts());
    let (detected, re, se) = hung_peer(t0, t1).await;
    check("tcp", detected, &re, &se);
    drop(hung);
}

#[cfg(target_os = "linux")]
#[test]
fn a_hung_peer_is_failed_after_the_timeout_uring() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut m = rt.block_on(mesh(3));
    let hung = m.pop().unwrap();
    let std_streams = |v: Vec<Option<TcpStream>>| -> Vec<Option<std::net::TcpStream>> {
        v.into_iter().map(|s| s.map(|s| s.into_std().unwrap())).collect()
    };
    let (s1, s0) = (std_streams(m.pop().unwrap()), std_streams(m.pop().unwrap()));
    drop(rt);
    tokio_uring::start(async move {
        let t0 = StreamTransport::uring(0, s0, &opts());
        let t1 = StreamTransport::uring(1, s1, &opts());
        let (detected, re, se) = hung_peer(t0, t1).await;
        check("uring", detected, &re, &se);
    });
    drop(hung);
}

/// Blocks this thread in slices of `slice` for `total`, yielding to the executor
/// between slices, as a compute-heavy task that forgets to yield often does.
async fn busy(slice: Duration, total: Duration) {
    let start = Instant::now();
    while start.elapsed() < total {
        std::thread::sleep(slice);
        tokio::task::yield_now().await;
    }
}

/// Three ranks share one thread with a task that blocks it in slices of several tick
/// lengths: heartbeats then take several slices to travel, but a rank whose own
/// executor lagged must not blame its peers for the silence. Every link is still up
/// afterwards and carries a message each way.
async fn busy_executor(ts: &[StreamTransport]) {
    for slice in [120, 160, 190, 250, 500].map(Duration::from_millis) {
        busy(slice, TIMEOUT * 5).await;
        for (r, t) in ts.iter().enumerate() {
            for p in (0..ts.len()).filter(|&p| p != r) {
                assert!(
                    t.mailbox().peer_failure(p).is_none(),
                    "rank {r} failed rank {p} while their shared thread was busy in {slice:?} slices: {}",
                    t.mailbox().peer_failure(p).unwrap()
                );
                let (h, b) = message(r, 10);
                t.send(p, h, b).await.unwrap();
            }
        }
        for (r, t) in ts.iter().enumerate() {
            for p in (0..ts.len()).filter(|&p| p != r) {
                assert_eq!(t.mailbox().recv(key(p)).await.unwrap().payload.len(), 10, "rank {r} from {p}");
            }
        }
    }
}

#[test]
fn a_busy_executor_does_not_fail_its_peers_tokio() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let ts: Vec<StreamTransport> =
            mesh(3).await.into_iter().enumerate().map(|(r, s)| StreamTransport::tokio(r, s, &opts())).collect();
        busy_executor(&ts).await;
    });
}

#[cfg(target_os = "linux")]
#[test]
fn a_busy_executor_does_not_fail_its_peers_uring() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let m = rt.block_on(mesh(3));
    let m: Vec<Vec<Option<std::net::TcpStream>>> =
        m.into_iter().map(|v| v.into_iter().map(|s| s.map(|s| s.into_std().unwrap())).collect()).collect();
    drop(rt);
    tokio_uring::start(async move {
        let ts: Vec<StreamTransport> =
            m.into_iter().enumerate().map(|(r, s)| StreamTransport::uring(r, s, &opts())).collect();
        busy_executor(&ts).await;
    });
}
