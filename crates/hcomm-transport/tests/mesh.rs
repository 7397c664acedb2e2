//! Mesh setup refuses strangers without disturbing the job, and the stream transport
//! carries messages over the connections it made.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use hcomm_core::{Header, JobKey, MatchKey, OpKind, Signature, Transport};
use hcomm_transport::{Congestion, MeshOptions, StreamOptions, StreamTransport, connect_mesh};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A handshake hello (version 6, link 0 of 1) and a nonce.
fn hello(job: u64, src: u32, dst: u32, size: u32) -> [u8; 64] {
    let mut b = [0u8; 64];
    b[0..4].copy_from_slice(b"HCMH");
    b[4] = 6;
    b[5] = 1;
    b[7] = 1;
    b[8..16].copy_from_slice(&job.to_le_bytes());
    b[16..20].copy_from_slice(&src.to_le_bytes());
    b[20..24].copy_from_slice(&dst.to_le_bytes());
    b[24..28].copy_from_slice(&size.to_le_bytes());
    b[32..].copy_from_slice(&rand::random::<[u8; 32]>());
    b
}

async fn listeners(n: usize) -> (Vec<TcpListener>, Vec<SocketAddr>) {
    let mut ls = Vec::new();
    for _ in 0..n {
        ls.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let addrs = ls.iter().map(|l| l.local_addr().unwrap()).collect();
    (ls, addrs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_are_refused_and_the_mesh_completes() {
    let n = 4;
    let (ls, addrs) = listeners(n).await;
    let opts = MeshOptions {
        job: 42,
        key: JobKey::from_secret("the job's secret"),
        timeout: Duration::from_secs(20),
        handshake_timeout: Duration::from_millis(500),
        ..MeshOptions::default()
    };

    // Before any rank runs: random bytes, a connection that says nothing, a hello for
    // another job, and one claiming to be rank 0 connecting to rank 0.
    let mut strangers = Vec::new();
    for (i, a) in addrs.iter().enumerate() {
        let mut s = TcpStream::connect(a).await.unwrap();
        match i % 4 {
            0 => s.write_all(&rand::random::<[u8; 64]>()).await.unwrap(),
            1 => {}
            2 => s.write_all(&hello(7, 3, i as u32, 4)).await.unwrap(),
            _ => s.write_all(&[0u8; 5]).await.unwrap(),
        }
        strangers.push(s);
    }
    // Impostors who know the job id and the ranks but not the secret: each claims to
    // be rank 3 and answers the challenge with a guess. They are refused, and rank 3
    // still gets in.
    let impostors = futures::future::join_all(addrs[..3].iter().enumerate().map(|(dst, a)| async move {
        let mut s = TcpStream::connect(a).await.unwrap();
        s.write_all(&hello(42, 3, dst as u32, 4)).await.unwrap();
        let mut reply = [0u8; 96];
        s.read_exact(&mut reply).await.unwrap();
        s.write_all(&rand::random::<[u8; 32]>()).await.unwrap();
        // The acceptor hangs up: read returns 0 (or the connection is reset).
        let mut b = [0u8; 1];
        matches!(tokio::time::timeout(Duration::from_secs(5), s.read(&mut b)).await, Ok(Ok(0) | Err(_)))
    }));

    let meshes = futures::future::join_all(ls.into_iter().enumerate().map(|(r, l)| {
        let addrs = addrs.clone();
        let opts = opts.clone();
        async move {
            // The impostors get in first.
            tokio::time::sleep(Duration::from_millis(if r == 3 { 300 } else { 0 })).await;
            connect_mesh(r, n, l, &addrs, &opts).await
        }
    }));
    let (meshes, refused) = tokio::join!(meshes, impostors);
    assert!(refused.iter().all(|r| *r), "an impostor was not hung up on: {refused:?}");
    let transports: Vec<StreamTransport> = meshes
        .into_iter()
        .enumerate()
        .map(|(r, m)| {
            StreamTransport::tokio(r, m.unwrap(), &StreamOptions { fragment: 1000, ..StreamOptions::default() })
        })
        .collect();

    // Every pair exchanges a multi-fragment message.
    let sig = Signature::bare(OpKind::Send, 0);
    let mut recvs = Vec::new();
    for (r, t) in transports.iter().enumerate() {
        for p in 0..n {
            let payload = Bytes::from(vec![(r * 16 + p) as u8; 5000]);
            t.send(p, Header::data(r, 0, 0, 3, &sig, payload.len()), payload).await.unwrap();
            recvs.push((r, p));
        }
    }
    for (src, dst) in recvs {
        let f = transports[dst].mailbox().recv(MatchKey { src, comm: 0, seq: 0, tag: 3 }).await.unwrap();
        assert_eq!(f.payload, Bytes::from(vec![(src * 16 + dst) as u8; 5000]));
    }
    drop(strangers);
}

#[tokio::test(flavor = "current_thread")]
async fn a_rank_that_never_comes_is_named() {
    let (mut ls, mut addrs) = listeners(3).await;
    // Rank 2 never runs; its address points at a port nobody serves.
    drop(ls.pop());
    addrs[2] = "127.0.0.1:9".parse().unwrap();
    let opts = MeshOptions {
        job: 1,
        timeout: Duration::from_millis(800),
        handshake_timeout: Duration::from_millis(200),
        ..MeshOptions::default()
    };
    let ls: Vec<TcpListener> = ls;
    let res = futures::future::join_all(ls.into_iter().enumerate().map(|(r, l)| {
        let addrs = addrs.clone();
        let opts = opts.clone();
        async move { connect_mesh(r, 3, l, &addrs, &opts).await }
    }))
    .await;
    for (r, m) in res.into_iter().enumerate() {
        let e = m.err().unwrap_or_else(|| panic!("rank {r} must fail"));
        assert!(e.to_string().contains("ranks 2 never connected") || e.peer() == Some(2), "rank {r}: {e}");
    }
}

/// The congestion control the mesh's connections end up with, both ends of each.
async fn mesh_congestion(congestion: Congestion) -> Vec<String> {
    let (ls, addrs) = listeners(2).await;
    let opts = MeshOptions { timeout: Duration::from_secs(10), congestion, ..MeshOptions::default() };
    let meshes = futures::future::join_all(ls.into_iter().enumerate().map(|(r, l)| {
        let (addrs, opts) = (addrs.clone(), opts.clone());
        async move { connect_mesh(r, 2, l, &addrs, &opts).await.unwrap() }
    }))
    .await;
    let streams = meshes.iter().flatten().flatten();
    let name = |s: &tokio::net::TcpStream| socket2::SockRef::from(s).tcp_congestion().unwrap();
    // The kernel pads the name with NULs.
    streams.map(|s| String::from_utf8_lossy(&name(s)).trim_end_matches('\0').to_owned()).collect()
}

#[tokio::test(flavor = "current_thread")]
async fn connections_take_the_chosen_congestion_control() {
    let system = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control").unwrap().trim().to_owned();
    assert_eq!(mesh_congestion(Congestion::System).await, vec![system.clone(); 2]);
    assert_eq!(mesh_congestion(Congestion::Named("reno".into())).await, vec!["reno"; 2]);
    let auto = mesh_congestion(Congestion::Auto).await;
    assert_eq!(auto.len(), 2);
    for cc in auto {
        // BBR and CUBIC give way to Reno (see `Congestion::Auto`); any other default
        // is kept.
        match system.starts_with("bbr") || system == "cubic" {
            true => assert_eq!(cc, "reno", "auto where the system has {system}"),
            false => assert_eq!(cc, system),
        }
    }
}
