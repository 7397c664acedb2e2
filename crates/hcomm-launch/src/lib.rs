//! What `hcomm run` does, as a library: starts N ranks of a program on this host
//! with the environment that `hcomm::init` reads, prefixes their output with the
//! rank, and stops every rank when one fails (or when the launcher is told to stop).
//!
//! It is a crate of its own so that the `hcomm` library does not carry process
//! management; programs that start themselves as local ranks (the examples, the
//! benchmark) use it.

use std::ffi::OsString;
use std::io::Write;
use std::process::{ExitStatus, Stdio};

use futures::stream::{FuturesUnordered, StreamExt};
use hcomm_core::{Error, Result};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Command;
use tokio::sync::watch;

/// What to launch.
#[derive(Debug, Clone)]
pub struct Launch {
    /// Number of ranks.
    pub ranks: usize,
    pub program: OsString,
    pub args: Vec<OsString>,
    /// Prefix each output line with `[rank]`.
    pub prefix: bool,
    /// Extra environment for every rank.
    pub env: Vec<(OsString, OsString)>,
}

/// How a launch ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Exit code to return: 0 if every rank succeeded, else the first failed rank's
    /// code (128 + signal number for a signal).
    pub code: i32,
    /// The rank to blame, if any: the first that failed, or, if a rank had exited
    /// successfully while the others still ran before that, that rank (most likely
    /// it returned without `finalize()` and cut its peers off).
    pub failed_rank: Option<usize>,
}

/// How long a rank may take to exit after SIGTERM before its group gets SIGKILL.
const GRACE: Duration = Duration::from_secs(3);

/// Signals every process of a rank's process group (the rank and anything it started,
/// which may hold its output pipes open).
fn signal_group(pid: Option<u32>, sig: Signal) {
    if let Some(pid) = pid {
        let _ = killpg(Pid::from_raw(pid as i32), sig);
    }
}

fn code_of(st: &ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    st.code().or_else(|| st.signal().map(|s| 128 + s)).unwrap_or(1)
}

async fn pump(r: usize, width: usize, prefix: bool, src: impl AsyncRead + Unpin, to_stderr: bool) {
    let mut rd = BufReader::new(src);
    let mut line = Vec::new();
    loop {
        line.clear();
        match rd.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if !line.ends_with(b"\n") {
            line.push(b'\n');
        }
        let head = if prefix { format!("[{r:>width$}] ") } else { String::new() };
        let res = if to_stderr {
            let mut o = std::io::stderr().lock();
            o.write_all(head.as_bytes()).and_then(|_| o.write_all(&line))
        } else {
            let mut o = std::io::stdout().lock();
            o.write_all(head.as_bytes()).and_then(|_| o.write_all(&line)).and_then(|_| o.flush())
        };
        if res.is_err() {
            return;
        }
    }
}

/// Makes the rank `cmd` starts die (SIGKILL) when the thread that starts it ends,
/// which for the `hcomm` launcher is its process: a launcher killed outright
/// (SIGKILL, an out-of-memory kill) then leaves no rank behind.
#[allow(unsafe_code)]
fn die_with_launcher(cmd: &mut Command) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed: it makes two system calls (prctl,
    // getppid) and touches no memory but its own stack and the copied `parent`.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The launcher died before the line above: nobody would kill this rank.
            if libc::getppid() != parent {
                return Err(std::io::Error::other("the launcher exited"));
            }
            Ok(())
        });
    }
}

/// The signals that stop a job: SIGINT (ctrl-c), SIGTERM (`timeout`, `kill`, Slurm,
/// systemd, CI cancellation) and SIGHUP (a closed terminal).
struct Signals(Vec<(Signal, tokio::signal::unix::Signal)>);

impl Signals {
    fn new() -> Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        let kinds = [
            (Signal::SIGINT, SignalKind::interrupt()),
            (Signal::SIGTERM, SignalKind::terminate()),
            (Signal::SIGHUP, SignalKind::hangup()),
        ];
        let mut v = Vec::with_capacity(kinds.len());
        for (sig, kind) in kinds {
            v.push((sig, signal(kind).map_err(|e| Error::io(format!("handling {sig}"), e))?));
        }
        Ok(Signals(v))
    }

    /// The next of them to arrive.
    async fn next(&mut self) -> Signal {
        std::future::poll_fn(|cx| {
            for (sig, s) in &mut self.0 {
                if s.poll_recv(cx).is_ready() {
                    return std::task::Poll::Ready(*sig);
                }
            }
            std::task::Poll::Pending
        })
        .await
    }
}

/// Runs the job to the end. Must run inside a tokio runtime.
///
/// # Errors
/// A configuration error if `ranks` is 0 or the program cannot be started.
///
/// SIGINT, SIGTERM and SIGHUP sent to this process go to every rank's process
/// group, then SIGKILL after a grace period (at once on a second signal); the exit
/// code is then 128 plus the signal's number. Each rank is killed when the thread
/// that called this ends, so that a launcher killed outright leaves no rank behind:
/// call it from a thread that lives as long as the job (the main thread, or a
/// runtime's worker).
///
/// # Cancel safety
/// Dropping the future kills every rank (they are started with `kill_on_drop`).
pub async fn run(l: Launch) -> Result<Outcome> {
    if l.ranks == 0 {
        return Err(Error::config("hcomm run needs at least one rank (-n 1 or more)"));
    }
    let port = {
        let probe =
            std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| Error::io("picking a rendezvous port", e))?;
        probe.local_addr().map_err(|e| Error::io("picking a rendezvous port", e))?.port()
    };
    let job = format!("run-{:016x}", rand::random::<u64>());
    // The ranks' shared secret: the caller's, or a fresh one for this job.
    let secret = std::env::var("HCOMM_JOB_SECRET")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| hcomm_core::auth::hex(&hcomm_core::JobKey::nonce()));
    let width = (l.ranks - 1).to_string().len();
    let (kill_tx, kill_rx) = watch::channel(false);
    let mut waits = FuturesUnordered::new();
    let mut pumps = Vec::new();
    let mut pids = Vec::new();
    for r in 0..l.ranks {
        let mut cmd = Command::new(&l.program);
        cmd.args(&l.args)
            .env("HCOMM_RANK", r.to_string())
            .env("HCOMM_SIZE", l.ranks.to_string())
            .env("HCOMM_LOCAL_RANK", r.to_string())
            .env("HCOMM_ADDR", format!("127.0.0.1:{port}"))
            .env("HCOMM_JOB_ID", &job)
            .env("HCOMM_JOB_SECRET", &secret)
            .envs(l.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        die_with_launcher(&mut cmd);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                let _ = kill_tx.send(true);
                return Err(Error::config(format!("could not start {:?}: {e}", l.program)));
            }
        };
        if let Some(o) = child.stdout.take() {
            pumps.push(tokio::spawn(pump(r, width, l.prefix, o, false)));
        }
        if let Some(e) = child.stderr.take() {
            pumps.push(tokio::spawn(pump(r, width, l.prefix, e, true)));
        }
        let mut kill = kill_rx.clone();
        let pid = child.id();
        pids.push(pid);
        waits.push(tokio::spawn(async move {
            tokio::select! {
                st = child.wait() => (r, st),
                () = async { let _ = kill.wait_for(|k| *k).await; } => {
                    signal_group(pid, Signal::SIGTERM);
                    match tokio::time::timeout(GRACE, child.wait()).await {
                        Ok(st) => (r, st),
                        Err(_) => {
                            signal_group(pid, Signal::SIGKILL);
                            (r, child.wait().await)
                        }
                    }
                }
            }
        }));
    }
    let mut outcome = Outcome { code: 0, failed_rank: None };
    let mut signals = Signals::new()?;
    let mut signalled = false;
    // The first rank that exited successfully while others still ran: if another
    // then fails, that rank most likely left without `finalize()` and is the cause.
    let mut left: Option<usize> = None;
    while !waits.is_empty() {
        tokio::select! {
            Some(done) = waits.next() => {
                let Ok((r, st)) = done else { continue };
                let failed = match &st {
                    Ok(s) if s.success() => None,
                    Ok(s) => Some(code_of(s)),
                    Err(_) => Some(1),
                };
                if failed.is_none() && left.is_none() && !waits.is_empty() && !*kill_tx.borrow() {
                    left = Some(r);
                }
                if let (Some(code), None) = (failed, outcome.failed_rank)
                    && !*kill_tx.borrow() {
                        let how = st.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
                        match left {
                            Some(first) => {
                                eprintln!(
                                    "hcomm run: rank {r} failed ({how}) after rank {first} had exited with success \
                                     while the others ran: rank {first} most likely returned without finalize(), \
                                     cutting its peers off; stopping the other ranks"
                                );
                                outcome = Outcome { code, failed_rank: Some(first) };
                            }
                            None => {
                                eprintln!("hcomm run: rank {r} failed ({how}); stopping the other ranks");
                                outcome = Outcome { code, failed_rank: Some(r) };
                            }
                        }
                        let _ = kill_tx.send(true);
                    }
            }
            sig = signals.next() => {
                if signalled {
                    // A second signal: no more grace.
                    eprintln!("hcomm run: {sig} again; killing every rank");
                    pids.iter().for_each(|&p| signal_group(p, Signal::SIGKILL));
                    continue;
                }
                signalled = true;
                eprintln!("hcomm run: got {sig}; stopping every rank (SIGTERM, then SIGKILL after {GRACE:?})");
                outcome.code = 128 + sig as i32;
                let _ = kill_tx.send(true);
            }
        }
    }
    if outcome.code != 0 {
        // Whatever the ranks started goes with them.
        pids.iter().for_each(|&p| signal_group(p, Signal::SIGKILL));
    }
    // Drain the output the ranks left; a pipe held open by a stray process does not
    // hold the launcher.
    let drain = futures::future::join_all(pumps);
    let _ = tokio::time::timeout(GRACE, drain).await;
    Ok(outcome)
}
