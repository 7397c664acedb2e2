//! Two launches that share a job id, secret and rendezvous address (a fixed
//! torchrun-style port, a relaunch while the old job still runs): the second launch's
//! ranks are refused with a clear error, and the first job, which a stranger may
//! have joined, is aborted with one, rather than either computing with the other's
//! ranks.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hcomm::ReduceOp;

/// The exit code of a rank that saw a wrong sum.
const WRONG: i32 = 3;

/// One rank (started by the test below): allreduces its launch's value until an error
/// ends it; exits with [`WRONG`] if a sum is not its own launch's.
#[test]
#[ignore = "a rank of the duplicate-launch test, started by it"]
fn duplicate_launch_rank() {
    let value: f64 = std::env::var("DUP_VALUE").unwrap().parse().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let code = rt.block_on(async {
        let comm = match hcomm::init().await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("init failed: {e}");
                return 1;
            }
        };
        println!("formed");
        let want = value * comm.size() as f64;
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(60) {
            let mut v = [value; 16];
            if let Err(e) = comm.all_reduce(&mut v, ReduceOp::Sum).await {
                eprintln!("allreduce failed: {e}");
                return 1;
            }
            if v != [want; 16] {
                eprintln!("wrong sum: {v:?}, not {want}");
                return WRONG;
            }
        }
        0
    });
    std::process::exit(code);
}

fn rank(r: usize, port: u16, value: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["duplicate_launch_rank", "--exact", "--ignored", "--nocapture", "--test-threads", "1"])
        .env("HCOMM_RANK", r.to_string())
        .env("HCOMM_SIZE", "2")
        .env("HCOMM_ADDR", format!("127.0.0.1:{port}"))
        .env("HCOMM_JOB_ID", "fixed-id")
        .env("HCOMM_JOB_SECRET", "one secret for both launches")
        .env("HCOMM_CONNECT_TIMEOUT", "20")
        .env("HCOMM_TIMEOUT", "30")
        .env("DUP_VALUE", value)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for a rank's exit (at most 60 s) and returns its code and what it wrote.
fn finish(mut c: Child) -> (Option<i32>, String) {
    let t0 = Instant::now();
    while c.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = c.kill();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = c.wait_with_output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

/// Launch A forms and computes; launch B, with the same id, secret and address,
/// starts beside it. B's rank 0 cannot serve the store (A's holds the port), B's
/// rank 1 is refused as a second claim of rank 1, and A is aborted, naming why. No
/// rank of either computes a wrong sum or hangs.
#[test]
fn a_second_launch_with_the_same_identity_is_refused_and_no_sum_is_wrong() {
    let port = common::free_port();
    let mut a: Vec<Child> = (0..2).map(|r| rank(r, port, "1")).collect();
    // Launch A has formed once its rank 0 says so.
    let mut seen = String::new();
    let mut out = BufReader::new(a[0].stdout.as_mut().unwrap());
    while !seen.contains("formed") {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() == 0 {
            panic!("launch A did not form: {seen:?}");
        }
        seen += &line;
    }
    let b: Vec<Child> = (0..2).map(|r| rank(r, port, "100")).collect();
    let outs: Vec<(Option<i32>, String)> = a.into_iter().chain(b).map(finish).collect();
    for (i, (code, out)) in outs.iter().enumerate() {
        let who = format!("launch {} rank {}", if i < 2 { 'A' } else { 'B' }, i % 2);
        assert_ne!(*code, Some(WRONG), "{who} computed with a stranger: {out}");
        assert_eq!(*code, Some(1), "{who} should have failed with an error: {out}");
    }
    let says = |i: usize, what: &str| assert!(outs[i].1.contains(what), "{i}: {}", outs[i].1);
    // A's ranks: aborted by rank 0, which serves the store.
    says(0, "registered already by another process");
    says(1, "registered already by another process");
    // B's rank 0 finds the port taken; B's rank 1 is refused.
    says(2, "could not serve the rendezvous store");
    says(3, "rank/1 was registered already by another process");
}
