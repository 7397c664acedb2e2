//! `hcomm run`: environment, output prefixes, and stopping the job when a rank fails.

use std::process::Command;
use std::time::{Duration, Instant};

fn hcomm() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hcomm"))
}

#[test]
fn sets_the_environment_and_prefixes_output() {
    let out = hcomm()
        .args([
            "run",
            "-n",
            "3",
            "--",
            "sh",
            "-c",
            "echo rank=$HCOMM_RANK size=$HCOMM_SIZE addr=$HCOMM_ADDR; echo oops >&2",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    for r in 0..3 {
        assert!(stdout.contains(&format!("[{r}] rank={r} size=3 addr=127.0.0.1:")), "{stdout}");
    }
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.matches("] oops").count(), 3, "{stderr}");
}

#[test]
fn a_failing_rank_stops_the_others_and_sets_the_exit_code() {
    let t0 = Instant::now();
    let out = hcomm()
        .args(["run", "-n", "3", "--", "sh", "-c", "if [ $HCOMM_RANK = 1 ]; then exit 7; fi; sleep 60"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7));
    // The sleepers were killed, not waited for.
    assert!(t0.elapsed() < Duration::from_secs(30), "took {:?}", t0.elapsed());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("rank 1 failed"), "{stderr}");
}

#[test]
fn bad_invocations_are_clear() {
    let out = hcomm().args(["run", "-n", "0", "--", "true"]).output().unwrap();
    assert!(!out.status.success());
    let out = hcomm().args(["run", "-n", "2", "--", "/nonexistent/program"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("could not start"));
}
