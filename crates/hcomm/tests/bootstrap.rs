//! Bootstrap through the rendezvous store: strangers are refused while the job goes
//! on, and ranks that never arrive are named.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::check_allreduce;
use hcomm::store::{StoreClient, StoreServer};
use hcomm::{Config, JobKey, ReduceOp};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SECRET: &str = "bootstrap-test-secret";

fn key() -> JobKey {
    JobKey::from_secret(SECRET)
}

fn configs(n: usize, addr: SocketAddr, job: &str) -> Vec<Config> {
    (0..n)
        .map(|r| {
            let mut c = Config::new(r, n, addr.to_string());
            c.job_id = job.to_owned();
            c.secret = Some(String::from(SECRET));
            c.serve_store = false;
            c.connect_timeout = Duration::from_secs(20);
            c
        })
        .collect()
}

/// Sends junk of several kinds to `addr` and checks the other end hangs up (or never
/// answers) rather than serving us.
async fn pester(addr: SocketAddr) {
    let junk: Vec<Vec<u8>> = vec![
        rand::random::<[u8; 64]>().to_vec(),
        (u32::MAX).to_le_bytes().to_vec(),
        b"\x20\x00\x00\x00{\"Hello\":{\"job\":1,\"rank\":0,\"size\":3}}".to_vec(),
        b"\x05\x00\x00\x00{{{{{".to_vec(),
    ];
    for j in junk {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&j).await.unwrap();
        let mut buf = vec![0u8; 4096];
        // Either a refusal and a close, or a close: never a served session.
        let mut total = 0;
        while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf[total..])).await {
            if n == 0 {
                break;
            }
            total += n;
        }
        let text = String::from_utf8_lossy(&buf[..total]);
        assert!(total == 0 || text.contains("Refused"), "stranger got {text:?}");
    }
    // And one that connects and stalls.
    let _stall = TcpStream::connect(addr).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_at_the_store_do_not_disturb_the_job() {
    let job = "store-test";
    let store = StoreServer::start("127.0.0.1:0".parse().unwrap(), key(), hash(job), 3).await.unwrap();
    let addr = store.addr();
    let (comms, (), ()) = tokio::join!(
        futures::future::try_join_all(configs(3, addr, job).into_iter().map(Config::connect)),
        pester(addr),
        without_the_secret(addr, job)
    );
    let comms = comms.unwrap();
    check_allreduce::<_, f32>(&comms, 10_007, ReduceOp::Sum, 1).await;
    // While the job runs.
    let (_, (), ()) = tokio::join!(
        check_allreduce::<_, i32>(&comms, 50_000, ReduceOp::Max, 2),
        pester(addr),
        without_the_secret(addr, job)
    );
}

/// A client that knows the job id and a rank but not the secret: the store refuses
/// it, and a whole rank configured so cannot join.
async fn without_the_secret(addr: SocketAddr, job: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let wrong = JobKey::from_secret("a guess");
    let e = StoreClient::connect(&addr.to_string(), &wrong, hash(job), 1, 3, deadline).await.unwrap_err();
    assert!(e.to_string().contains("could not prove the job key"), "{e}");
    let mut c = configs(3, addr, job).remove(2);
    c.secret = Some(String::from("a guess"));
    c.connect_timeout = Duration::from_secs(2);
    let e = c.connect().await.unwrap_err();
    assert!(e.to_string().contains("could not prove the job key"), "{e}");
}

fn hash(job: &str) -> u64 {
    // The same FNV-1a the bootstrap uses for job ids.
    job.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranks_that_never_arrive_are_named() {
    let store = StoreServer::start("127.0.0.1:0".parse().unwrap(), key(), hash("j"), 4).await.unwrap();
    let cs = configs(4, store.addr(), "j");
    // Ranks 1 and 3 never start.
    let started: Vec<Config> = cs
        .into_iter()
        .filter(|c| c.rank % 2 == 0)
        .map(|mut c| {
            c.connect_timeout = Duration::from_secs(1);
            c
        })
        .collect();
    let res = futures::future::join_all(started.into_iter().map(Config::connect)).await;
    for r in res {
        let e = r.unwrap_err();
        assert!(e.to_string().contains("ranks [1, 3] never reached the rendezvous store"), "{e}");
    }
}

/// A rank registers once per job: a second process claiming a registered rank (a
/// second launch with the same job id, secret and address) is refused with an error
/// naming the rank, the store's owner is told, and from then on the store refuses
/// every rank that still waits, instead of pairing the two launches' ranks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_registers_once_and_a_second_claim_stops_the_bootstrap() {
    let store = StoreServer::start("127.0.0.1:0".parse().unwrap(), key(), hash("twice"), 3).await.unwrap();
    let told = std::sync::Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    let t = told.clone();
    store.on_conflict(move |why| t.lock().push(why.to_owned()));
    let addr = store.addr().to_string();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut first = StoreClient::connect(&addr, &key(), hash("twice"), 1, 3, deadline).await.unwrap();
    first.set("rank/1", "launch A").await.unwrap();
    // The same value again (a retry) is fine.
    first.set("rank/1", "launch A").await.unwrap();
    assert_eq!(store.conflict(), None);
    let mut second = StoreClient::connect(&addr, &key(), hash("twice"), 1, 3, deadline).await.unwrap();
    let e = second.set("rank/1", "launch B").await.unwrap_err();
    assert!(e.to_string().contains("rank/1 was registered already by another process"), "{e}");
    assert!(e.to_string().contains("give each launch its own HCOMM_JOB_ID"), "{e}");
    assert_eq!(told.lock().len(), 1, "told once: {:?}", told.lock());
    // A rank still bootstrapping is refused too, rather than left to pair up.
    let mut waiting = StoreClient::connect(&addr, &key(), hash("twice"), 2, 3, deadline).await.unwrap();
    let e = waiting.get(&[String::from("rank/0")], Duration::from_secs(5)).await.unwrap_err();
    assert!(e.to_string().contains("registered already by another process"), "{e}");
    // And ranks of the job that connect whole fail with it, naming the store.
    let cs = configs(3, store.addr(), "twice");
    let res = futures::future::join_all(cs.into_iter().map(Config::connect)).await;
    for r in res {
        let e = r.unwrap_err();
        assert!(e.to_string().contains("refused"), "{e}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn rank_zero_serves_the_store_and_a_busy_port_is_a_clear_error() {
    // Rank 0 serving the store itself, with a second rank on the derived address.
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = probe.local_addr().unwrap();
    drop(probe);
    let mk = |r| {
        let mut c = Config::new(r, 2, addr.to_string());
        c.job_id = String::from("own-store");
        c
    };
    let (a, b) = tokio::join!(mk(0).connect(), mk(1).connect());
    let comms = vec![a.unwrap(), b.unwrap()];
    check_allreduce::<_, u64>(&comms, 999, ReduceOp::Sum, 4).await;

    // The port is now taken by rank 0's store: another job's rank 0 cannot serve there.
    let mut c = mk(0);
    c.connect_timeout = Duration::from_secs(1);
    let e = c.connect().await.unwrap_err();
    assert!(e.to_string().contains("could not serve the rendezvous store"), "{e}");
}

/// Three consecutive ports that are free now.
fn free_ports() -> u16 {
    for _ in 0..50 {
        let base = 20_000 + rand::random::<u16>() % 40_000;
        if (base..base + 3).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            return base;
        }
    }
    panic!("no three consecutive free ports");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listeners_take_their_ports_from_the_range() {
    let base = free_ports();
    // The range's first port is taken: the two ranks take the next two.
    let _taken = std::net::TcpListener::bind(("127.0.0.1", base)).unwrap();
    let store = StoreServer::start("127.0.0.1:0".parse().unwrap(), key(), hash("ports"), 2).await.unwrap();
    let cs: Vec<Config> = configs(2, store.addr(), "ports")
        .into_iter()
        .map(|mut c| {
            c.port_range = Some((base, base + 2));
            c
        })
        .collect();
    let comms = futures::future::try_join_all(cs.into_iter().map(Config::connect)).await.unwrap();
    check_allreduce::<_, f32>(&comms, 1000, ReduceOp::Sum, 9).await;
    // The ports the ranks registered in the store (their listeners are closed once
    // the mesh stands).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut client =
        StoreClient::connect(&store.addr().to_string(), &key(), hash("ports"), 0, 2, deadline).await.unwrap();
    let keys = vec![String::from("rank/0"), String::from("rank/1")];
    let mut ports: Vec<u16> = client
        .get(&keys, Duration::from_secs(1))
        .await
        .unwrap()
        .unwrap()
        .iter()
        .map(|v| {
            let info: serde_json::Value = serde_json::from_str(v).unwrap();
            info["paths"][0].as_str().unwrap().parse::<SocketAddr>().unwrap().port()
        })
        .collect();
    ports.sort();
    assert_eq!(ports, vec![base + 1, base + 2]);
    // A range with no free port is a clear error, not a random port.
    let store = StoreServer::start("127.0.0.1:0".parse().unwrap(), key(), hash("full"), 1).await.unwrap();
    let mut c = configs(1, store.addr(), "full").remove(0);
    c.port_range = Some((base, base));
    let e = c.connect().await.unwrap_err();
    assert!(e.to_string().contains(&format!("no free port on 127.0.0.1 in HCOMM_PORT_RANGE {base}-{base}")), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hcomm_ifname_chooses_the_listener_or_says_why_not() {
    use hcomm::ifname::IfSpec;
    // Loopback, by name and by network: the job runs.
    for spec in ["lo", "127.0.0.0/8,^docker*"] {
        let store = StoreServer::start("127.0.0.1:0".parse().unwrap(), key(), hash("ifname"), 2).await.unwrap();
        let cs: Vec<Config> = configs(2, store.addr(), "ifname")
            .into_iter()
            .map(|mut c| {
                c.ifname = Some(IfSpec::parse(spec).unwrap());
                c
            })
            .collect();
        let comms = futures::future::try_join_all(cs.into_iter().map(Config::connect)).await.unwrap();
        check_allreduce::<_, f32>(&comms, 100, ReduceOp::Sum, 3).await;
    }
    // Nothing matches: a configuration error that lists the interfaces, no fallback.
    let store = StoreServer::start("127.0.0.1:0".parse().unwrap(), key(), hash("noif"), 1).await.unwrap();
    let mut c = configs(1, store.addr(), "noif").remove(0);
    c.ifname = Some(IfSpec::parse("nosuchif*").unwrap());
    let e = c.connect().await.unwrap_err();
    assert_eq!(e.kind(), hcomm::ErrorKind::Config, "{e}");
    let text = e.to_string();
    assert!(
        text.contains("HCOMM_IFNAME=\"nosuchif*\" matches no interface") && text.contains("lo 127.0.0.1"),
        "{text}"
    );
}

/// Racks reach every rank's topology: rank 0 and 2 name theirs directly
/// (`HCOMM_RACK`'s field), 1 and 3 find theirs in a topology file listing this host.
/// All ranks run on this one host, so the host has one rack: the first named (rank
/// 0's); the ring stays host-contiguous, and every rank sees the same topology.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racks_from_config_and_topology_file_reach_every_rank() {
    let server = StoreServer::start("127.0.0.1:0".parse().unwrap(), key(), hash("racks"), 4).await.unwrap();
    let me = hcomm::local_placement().unwrap().host;
    let hostname = me.split('/').next().unwrap().to_owned();
    let file = hcomm::TopologyFile::parse(&format!("[[rack]]\nname = \"file-rack\"\nhosts = [{hostname:?}]\n"), false)
        .unwrap();
    assert_eq!(file.rack_of(&me), Some("file-rack"));
    let mut cs = configs(4, server.addr(), "racks");
    let _keep = &server;
    for (r, c) in cs.iter_mut().enumerate() {
        c.shm = false;
        if r % 2 == 0 {
            c.rack = Some(format!("rack-{r}"));
        } else {
            c.topology = Some(file.clone());
        }
    }
    let comms = futures::future::try_join_all(cs.into_iter().map(Config::connect)).await.unwrap();
    for c in &comms {
        let t = c.topology();
        assert_eq!((t.size(), t.host_count(), t.rack_count()), (4, 1, 1));
        assert_eq!(t.rack_name(0), Some("rack-0"));
        assert_eq!(t.placement(1).rack.as_deref(), Some("file-rack"));
        assert_eq!(t.placement(2).rack.as_deref(), Some("rack-2"));
        assert_eq!(t.placement(3).host, me);
        assert_eq!(t.level(0, 3), hcomm::Level::Host);
        assert_eq!(t.ring_order(), vec![0, 1, 2, 3]);
        assert_eq!(*t, *comms[0].topology());
    }
    check_allreduce::<_, f32>(&comms, 1001, ReduceOp::Sum, 3).await;
}
