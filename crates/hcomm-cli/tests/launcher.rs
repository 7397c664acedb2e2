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

/// A rank that exits with success while the others run (a program that returns
/// without `finalize()`), after which another fails: the launcher names the one that
/// left first as the likely cause, not only the one that failed.
#[test]
fn a_rank_that_left_early_is_named_when_another_then_fails() {
    let out = hcomm()
        .args([
            "run",
            "-n",
            "3",
            "--",
            "sh",
            "-c",
            "if [ $HCOMM_RANK = 2 ]; then exit 0; fi; sleep 0.5; if [ $HCOMM_RANK = 1 ]; then exit 4; fi; sleep 60",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("rank 1 failed (exit status: 4) after rank 2 had exited with success"), "{stderr}");
    assert!(stderr.contains("rank 2 most likely returned without finalize()"), "{stderr}");
}

#[test]
fn bad_invocations_are_clear() {
    let out = hcomm().args(["run", "-n", "0", "--", "true"]).output().unwrap();
    assert!(!out.status.success());
    let out = hcomm().args(["run", "-n", "2", "--", "/nonexistent/program"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("could not start"));
}

/// `hcomm topo` as the ranks of a job: rank 0 prints the job's racks; a bad variable
/// stops every rank with an error that names it.
#[test]
fn topo_prints_the_job_and_bad_variables_are_named() {
    let dir = std::env::temp_dir().join(format!("hcomm-topo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let file = dir.join("racks.toml");
    std::fs::write(&file, format!("[[rack]]\nname = \"from-file\"\nhosts = [{:?}]\n", host.trim())).unwrap();
    let topo = |env: &[(&str, &str)]| {
        let mut c = hcomm();
        c.args(["run", "-n", "2", "--no-prefix", "--", env!("CARGO_BIN_EXE_hcomm"), "topo"]);
        for (k, v) in env {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, out) = topo(&[("HCOMM_TOPOLOGY", file.to_str().unwrap())]);
    assert!(ok, "{out}");
    assert!(out.contains("2 ranks on 1 hosts in 1 racks\nrack from-file\n"), "{out}");
    let (ok, out) = topo(&[("HCOMM_TOPOLOGY", file.to_str().unwrap()), ("HCOMM_RACK", "env-rack")]);
    assert!(ok && out.contains("rack env-rack\n"), "{out}");
    for (var, value, says) in [
        ("HCOMM_TCP_SPIN_US", "soon", "HCOMM_TCP_SPIN_US=\"soon\" is not a whole number of microseconds"),
        ("HCOMM_SHM_SPIN_US", "-1", "HCOMM_SHM_SPIN_US=\"-1\""),
        ("HCOMM_RECV_SPIN_US", "20000", "HCOMM_RECV_SPIN_US=\"20000\" is above 10000"),
        ("HCOMM_RACK", " ", "HCOMM_RACK is set but empty"),
        ("HCOMM_SHM_RING", "1K", "HCOMM_SHM_RING=\"1K\" is below 64K"),
        ("HCOMM_TOPOLOGY", "/nonexistent/racks.toml", "cannot read the topology file /nonexistent/racks.toml"),
        ("HCOMM_POOL_BYTES", "lots", "HCOMM_POOL_BYTES"),
        ("HCOMM_BIND", "cores", "HCOMM_BIND=\"cores\" is not 0 or 1"),
        ("HCOMM_TCP_EAGER", "128K", "HCOMM_TCP_EAGER=\"128K\" is above 64K"),
        ("HCOMM_TCP_EAGER", "small", "HCOMM_TCP_EAGER=\"small\" is not a size"),
    ] {
        let (ok, out) = topo(&[(var, value)]);
        assert!(!ok, "{var}={value} was accepted: {out}");
        assert!(out.contains(says), "{var}={value}: {out}");
    }
    // Waits beyond what the clock can add, and `off`: never, and no panic.
    for value in ["1e30", "1e19", "off"] {
        let waits: Vec<(&str, &str)> =
            ["HCOMM_TIMEOUT", "HCOMM_CONNECT_TIMEOUT", "HCOMM_PEER_TIMEOUT", "HCOMM_STALL_WARN"]
                .iter()
                .map(|v| (*v, value))
                .collect();
        let (ok, out) = topo(&waits);
        assert!(ok && out.contains("2 ranks on 1 hosts"), "waits of {value}: {out}");
    }
    // A misspelt variable is named, with the one meant.
    let (ok, out) = topo(&[(concat!("HCOMM_", "TIMOUT"), "5")]);
    assert!(ok && out.contains("is not a variable HComm reads (did you mean HCOMM_TIMEOUT?)"), "{out}");
    let (ok, out) = topo(&[("HCOMM_TIMEOUT", "-3")]);
    assert!(!ok && out.contains("HCOMM_TIMEOUT=\"-3\" is not a number of seconds, nor `off`"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Whether process `pid` is gone (or a zombie nobody has reaped yet).
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses.
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

/// A launcher stopped by SIGTERM, SIGHUP, SIGINT or SIGKILL (as `timeout`, Slurm,
/// systemd, a closed terminal or an out-of-memory kill stop it) leaves no rank
/// running 5 s later; with the first three it exits with 128 plus the signal.
#[test]
#[allow(unsafe_code)] // kill(2)
fn no_rank_outlives_its_launcher() {
    for sig in [libc::SIGTERM, libc::SIGHUP, libc::SIGINT, libc::SIGKILL] {
        let dir = std::env::temp_dir().join(format!("hcomm-launcher-{}-{sig}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let script = format!("echo $$ > {}/pid.$HCOMM_RANK; exec sleep 120", dir.display());
        let mut launcher = hcomm()
            .args(["run", "-n", "3", "--", "sh", "-c", &script])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        let pids: Vec<i32> = loop {
            let pids: Vec<i32> = (0..3)
                .filter_map(|r| std::fs::read_to_string(dir.join(format!("pid.{r}"))).ok())
                .filter_map(|s| s.trim().parse().ok())
                .collect();
            if pids.len() == 3 {
                break pids;
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "the ranks did not start");
            std::thread::sleep(Duration::from_millis(20));
        };
        // SAFETY: kill(2) takes no pointers; the pid is our child's, not yet reaped.
        assert_eq!(unsafe { libc::kill(launcher.id() as i32, sig) }, 0);
        let status = launcher.wait().unwrap();
        let t1 = Instant::now();
        while !pids.iter().all(|&p| gone(p)) && t1.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let left: Vec<i32> = pids.iter().copied().filter(|&p| !gone(p)).collect();
        for &p in &left {
            // Do not leave them to the next test.
            // SAFETY: kill(2) takes no pointers.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
        assert!(left.is_empty(), "signal {sig}: ranks {left:?} outlived the launcher by 5 s");
        use std::os::unix::process::ExitStatusExt;
        match sig {
            libc::SIGKILL => assert_eq!(status.signal(), Some(libc::SIGKILL)),
            _ => {
                assert_eq!(status.code(), Some(128 + sig), "signal {sig}");
                let mut err = String::new();
                std::io::Read::read_to_string(&mut launcher.stderr.take().unwrap(), &mut err).unwrap();
                assert!(err.contains("stopping every rank"), "signal {sig}: {err}");
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
