//! An async service whose request handler awaits a collective while the same process
//! keeps serving other requests.
//!
//! ```text
//! cargo run --release --example tokio_service -- [--ranks 3] [--delay-ms 300]
//! ```
//!
//! Each rank (a set of tasks on one tokio multi-thread runtime, with its own loopback
//! TCP connections to the other ranks) serves a line protocol on a loopback port:
//! `ping` answers `pong` at once; `sum X` allreduces X across the ranks and answers the
//! total. A client sends one `sum` to every rank, the last rank's `delay-ms` late, so
//! the other ranks' handlers sit in the allreduce; meanwhile it pings every rank every
//! 5 ms and reports how fast the pings were answered. The totals are checked.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use hcomm::{Communicator, ReduceOp};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

#[derive(Parser, Debug)]
#[command(about = "A tokio service whose handler awaits an allreduce")]
struct Args {
    /// Number of ranks.
    #[arg(long, default_value_t = 3)]
    ranks: usize,
    /// How late the last rank's `sum` request is sent, in milliseconds.
    #[arg(long, default_value_t = 300)]
    delay_ms: u64,
}

async fn handle(stream: TcpStream, comm: Arc<Communicator>) -> std::io::Result<()> {
    let (rd, mut wr) = stream.into_split();
    let mut lines = BufReader::new(rd).lines();
    while let Some(line) = lines.next_line().await? {
        let reply = match line.split_once(' ') {
            None if line == "ping" => String::from("pong"),
            Some(("sum", x)) => match x.trim().parse::<i64>() {
                Ok(x) => {
                    let mut v = [x];
                    match comm.all_reduce(&mut v, ReduceOp::Sum).await {
                        Ok(()) => format!("sum={}", v[0]),
                        Err(e) => format!("error: {e}"),
                    }
                }
                Err(_) => format!("error: {x:?} is not an integer"),
            },
            _ => format!("error: unknown request {line:?}"),
        };
        wr.write_all(format!("{reply}\n").as_bytes()).await?;
    }
    Ok(())
}

async fn serve(listener: TcpListener, comm: Arc<Communicator>) {
    while let Ok((s, _)) = listener.accept().await {
        let comm = comm.clone();
        tokio::spawn(async move {
            if let Err(e) = handle(s, comm).await {
                eprintln!("connection error: {e}");
            }
        });
    }
}

async fn request(
    conn: &mut (BufReader<tokio::net::tcp::OwnedReadHalf>, tokio::net::tcp::OwnedWriteHalf),
    line: &str,
) -> String {
    conn.1.write_all(format!("{line}\n").as_bytes()).await.expect("service write");
    let mut reply = String::new();
    conn.0.read_line(&mut reply).await.expect("service read");
    reply.trim().to_owned()
}

async fn connect(
    addr: std::net::SocketAddr,
) -> (BufReader<tokio::net::tcp::OwnedReadHalf>, tokio::net::tcp::OwnedWriteHalf) {
    let (r, w) = TcpStream::connect(addr).await.expect("connect to service").into_split();
    (BufReader::new(r), w)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    let n = args.ranks.max(1);
    let comms = hcomm::local_tcp(n).await.unwrap_or_else(|e| {
        eprintln!("tokio_service: {e}");
        std::process::exit(1)
    });
    let mut addrs = Vec::new();
    for comm in comms {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind service port");
        addrs.push(l.local_addr().expect("service address"));
        tokio::spawn(serve(l, Arc::new(comm)));
    }

    let want = (n * (n + 1) / 2) as i64;
    let t0 = Instant::now();
    let sums = addrs.iter().enumerate().map(|(r, &a)| {
        let delay = if r == n - 1 { Duration::from_millis(args.delay_ms) } else { Duration::ZERO };
        async move {
            let mut c = connect(a).await;
            tokio::time::sleep(delay).await;
            let reply = request(&mut c, &format!("sum {}", r + 1)).await;
            (reply, t0.elapsed())
        }
    });
    let pings = addrs.iter().map(|&a| async move {
        let mut c = connect(a).await;
        let mut lat = Vec::new();
        while t0.elapsed() < Duration::from_millis(args.delay_ms + 100) {
            let t = Instant::now();
            assert_eq!(request(&mut c, "ping").await, "pong");
            lat.push(t.elapsed());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        lat
    });
    let (sums, pings) = futures::join!(futures::future::join_all(sums), futures::future::join_all(pings));

    let mut ok = true;
    for (r, ((reply, at), mut lat)) in sums.into_iter().zip(pings).enumerate() {
        lat.sort();
        let good = reply == format!("sum={want}");
        ok &= good;
        println!(
            "rank {r}: `sum {}` answered {reply} ({}) after {:.0} ms; meanwhile {} pings answered, median {:.3} ms, max {:.3} ms",
            r + 1,
            if good { "correct" } else { "WRONG" },
            at.as_secs_f64() * 1e3,
            lat.len(),
            lat[lat.len() / 2].as_secs_f64() * 1e3,
            lat[lat.len() - 1].as_secs_f64() * 1e3
        );
    }
    if !ok {
        eprintln!("tokio_service: a total was wrong");
        std::process::exit(1);
    }
    println!("every handler awaited its allreduce for ~{} ms while the service kept answering pings", args.delay_ms);
}
