//! The rendezvous store: a small key-value server that rank 0 runs during bootstrap,
//! through which ranks exchange their addresses.
//!
//! Messages are length-prefixed JSON (a `u32` little-endian length, at most
//! [`MAX_MESSAGE`] bytes). A client starts with a hello naming the job, its rank and
//! a nonce; the store answers with its own nonce and its proof of the job key, the
//! client checks it and sends its own proof (see `hcomm_core::auth`). A connection
//! whose hello or proof is missing, malformed, late, wrong or for another job is
//! closed and logged, and the store carries on. A waiting get answers with the keys still
//! missing when its wait runs out, so that a bootstrap failure can name the ranks that
//! never arrived.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hcomm_core::auth::{JobKey, hex, unhex};
use hcomm_core::{Error, ErrorKind, OpKind, Result};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::AbortHandle;
use tokio::time::{Instant, timeout};

/// Largest store message.
pub const MAX_MESSAGE: u32 = 1 << 20;
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Serialize, Deserialize)]
enum Request {
    Hello { job: u64, rank: usize, size: usize, nonce: String },
    Proof(String),
    Set { key: String, value: String },
    Get { keys: Vec<String>, wait_ms: u64 },
}

#[derive(Debug, Serialize, Deserialize)]
enum Response {
    Ok,
    Challenge { nonce: String, proof: String },
    Values(Vec<String>),
    Missing(Vec<String>),
    Refused(String),
}

fn boot(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Bootstrap, msg).in_op(OpKind::Bootstrap, None)
}

async fn write_msg<M: Serialize>(s: &mut TcpStream, m: &M) -> std::io::Result<()> {
    let body = serde_json::to_vec(m).map_err(std::io::Error::other)?;
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    s.write_all(&out).await
}

async fn read_msg<M: for<'de> Deserialize<'de>>(s: &mut TcpStream) -> std::io::Result<M> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await?;
    let len = u32::from_le_bytes(len);
    if len > MAX_MESSAGE {
        return Err(std::io::Error::other(format!("store message of {len} bytes exceeds {MAX_MESSAGE}")));
    }
    let mut body = vec![0u8; len as usize];
    s.read_exact(&mut body).await?;
    serde_json::from_slice(&body).map_err(std::io::Error::other)
}

/// What [`StoreServer::on_conflict`] installs.
type ConflictHook = Box<dyn Fn(&str) + Send + Sync>;

#[derive(Default)]
struct State {
    map: parking_lot::Mutex<HashMap<String, String>>,
    changed: Notify,
    /// Set when a second process claimed a key (a rank) already registered: every
    /// later request is refused with it, and `on_conflict` is told.
    conflict: parking_lot::Mutex<Option<String>>,
    on_conflict: std::sync::OnceLock<ConflictHook>,
}

impl State {
    fn conflict(&self) -> Option<String> {
        self.conflict.lock().clone()
    }
}

/// A running store; dropping it stops the server.
pub struct StoreServer {
    addr: SocketAddr,
    task: AbortHandle,
    state: Arc<State>,
}

impl std::fmt::Debug for StoreServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreServer").field("addr", &self.addr).field("conflict", &self.state.conflict()).finish()
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StoreServer {
    /// Serves a store for job `job` of `size` ranks with key `key` on `bind` (port 0
    /// picks one). Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// A bootstrap error if the address cannot be bound.
    pub async fn start(bind: SocketAddr, key: JobKey, job: u64, size: usize) -> Result<StoreServer> {
        let listener = TcpListener::bind(bind)
            .await
            .map_err(|e| boot(format!("rank 0 could not serve the rendezvous store on {bind}")).with_source(e))?;
        let addr = listener.local_addr().map_err(|e| Error::io("store address", e))?;
        let state = Arc::new(State::default());
        let served = state.clone();
        let task = tokio::spawn(async move {
            let state = served;
            loop {
                match listener.accept().await {
                    Ok((s, from)) => {
                        let (state, key) = (state.clone(), key.clone());
                        tokio::spawn(async move {
                            if let Err(why) = serve(s, &state, &key, job, size).await {
                                tracing::warn!(%from, "rendezvous store closed a connection: {why}");
                            }
                        });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "rendezvous store accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
        });
        Ok(StoreServer { addr, task: task.abort_handle(), state })
    }

    /// Calls `tell` with the reason when a second process claims a registered key
    /// (once; the first call to this wins). The job that served the store then knows
    /// that a stranger may have joined it.
    pub fn on_conflict(&self, tell: impl Fn(&str) + Send + Sync + 'static) {
        let _ = self.state.on_conflict.set(Box::new(tell));
    }

    /// The conflict the store saw, if any (see [`StoreServer::on_conflict`]).
    pub fn conflict(&self) -> Option<String> {
        self.state.conflict()
    }

    /// The address the store listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// What both proofs of a store connection cover.
fn store_parts(job: u64, rank: usize, size: usize, client: &[u8], server: &[u8]) -> Vec<Vec<u8>> {
    vec![
        job.to_le_bytes().to_vec(),
        (rank as u64).to_le_bytes().to_vec(),
        (size as u64).to_le_bytes().to_vec(),
        client.to_vec(),
        server.to_vec(),
    ]
}

fn proves(key: &JobKey, role: &[u8], parts: &[Vec<u8>], proof: &str) -> bool {
    let parts: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
    unhex(proof).is_some_and(|p| key.verify(role, &parts, &p))
}

fn prove(key: &JobKey, role: &[u8], parts: &[Vec<u8>]) -> String {
    let parts: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
    hex(&key.prove(role, &parts))
}

/// The hello and the proofs: `Ok` once the client proved the key.
async fn authenticate(s: &mut TcpStream, key: &JobKey, job: u64, size: usize) -> std::result::Result<(), String> {
    let (rank, client) = match read_msg::<Request>(s).await {
        Err(e) => return Err(format!("bad hello: {e}")),
        Ok(Request::Hello { job: j, rank, size: n, nonce }) if j == job && n == size && rank < size => {
            match unhex(&nonce).filter(|n| n.len() == hcomm_core::auth::PROOF_LEN) {
                Some(n) => (rank, n),
                None => return Err(String::from("hello with a malformed nonce")),
            }
        }
        Ok(other) => {
            let why = format!("hello does not match this job ({other:?})");
            let _ = write_msg(s, &Response::Refused(why.clone())).await;
            return Err(why);
        }
    };
    let mine = JobKey::nonce();
    let parts = store_parts(job, rank, size, &client, &mine);
    let challenge = Response::Challenge { nonce: hex(&mine), proof: prove(key, b"hcomm store server", &parts) };
    write_msg(s, &challenge).await.map_err(|e| e.to_string())?;
    match read_msg::<Request>(s).await {
        Ok(Request::Proof(p)) if proves(key, b"hcomm store client", &parts, &p) => Ok(()),
        Ok(Request::Proof(_)) => {
            let why = format!("rank {rank}'s connection could not prove the job key (HCOMM_JOB_SECRET differs)");
            let _ = write_msg(s, &Response::Refused(why.clone())).await;
            Err(why)
        }
        Ok(other) => Err(format!("{other:?} where a proof was expected")),
        Err(e) => Err(format!("bad proof: {e}")),
    }
}

async fn serve(
    mut s: TcpStream,
    state: &State,
    key: &JobKey,
    job: u64,
    size: usize,
) -> std::result::Result<(), String> {
    match timeout(HELLO_TIMEOUT, authenticate(&mut s, key, job, size)).await {
        Err(_) => return Err(format!("no hello and proof within {HELLO_TIMEOUT:?}")),
        Ok(Err(why)) => return Err(why),
        Ok(Ok(())) => {}
    }
    write_msg(&mut s, &Response::Ok).await.map_err(|e| e.to_string())?;
    loop {
        let req = match read_msg::<Request>(&mut s).await {
            Ok(r) => r,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(format!("bad request: {e}")),
        };
        let resp = match req {
            Request::Hello { .. } | Request::Proof(_) => Response::Refused(String::from("second hello")),
            Request::Set { key, value } => {
                // The first registration holds for the life of the job. A second,
                // different one is another process claiming the same rank: another
                // launch with this job's id, secret and address.
                let clash = match state.map.lock().entry(key.clone()) {
                    std::collections::hash_map::Entry::Vacant(v) => {
                        v.insert(value);
                        None
                    }
                    std::collections::hash_map::Entry::Occupied(o) => (o.get() != &value).then(|| {
                        format!(
                            "{key} was registered already by another process: two launches share this job's id, \
                             secret and rendezvous address (give each launch its own HCOMM_JOB_ID)"
                        )
                    }),
                };
                state.changed.notify_waiters();
                match clash {
                    None => Response::Ok,
                    Some(why) => {
                        let first = state.conflict.lock().get_or_insert_with(|| why.clone()).clone();
                        if first == why
                            && let Some(tell) = state.on_conflict.get()
                        {
                            tell(&why);
                        }
                        Response::Refused(why)
                    }
                }
            }
            _ if state.conflict().is_some() => Response::Refused(state.conflict().unwrap_or_default()),
            Request::Get { keys, wait_ms } => {
                // A client's wait, bounded so that no value it sends overflows the clock.
                let deadline = Instant::now() + Duration::from_millis(wait_ms).min(hcomm_core::NEVER);
                loop {
                    let notified = state.changed.notified();
                    tokio::pin!(notified);
                    notified.as_mut().enable();
                    let (values, missing) = {
                        let map = state.map.lock();
                        let missing: Vec<String> = keys.iter().filter(|k| !map.contains_key(*k)).cloned().collect();
                        let values: Vec<String> = keys.iter().filter_map(|k| map.get(k).cloned()).collect();
                        (values, missing)
                    };
                    if let Some(why) = state.conflict() {
                        break Response::Refused(why);
                    }
                    if missing.is_empty() {
                        break Response::Values(values);
                    }
                    if tokio::time::timeout_at(deadline, notified).await.is_err() {
                        break Response::Missing(missing);
                    }
                }
            }
        };
        write_msg(&mut s, &resp).await.map_err(|e| e.to_string())?;
    }
}

/// Whether `s` is connected to itself (see [`StoreClient::connect`]).
fn met_itself(s: &TcpStream) -> bool {
    matches!((s.local_addr(), s.peer_addr()), (Ok(a), Ok(b)) if a == b)
}

/// A connection to the store.
#[derive(Debug)]
pub struct StoreClient {
    stream: TcpStream,
    addr: String,
}

impl StoreClient {
    /// Connects to the store at `addr`, retrying until `deadline` (rank 0 may not be
    /// up yet), says hello, and proves the job key (after checking the store's proof).
    ///
    /// # Errors
    /// A bootstrap error if no store answered before the deadline, or it refused us,
    /// or it could not prove the job key.
    pub async fn connect(
        addr: &str,
        key: &JobKey,
        job: u64,
        rank: usize,
        size: usize,
        deadline: Instant,
    ) -> Result<StoreClient> {
        let mut delay = Duration::from_millis(10);
        let mut last = String::from("no attempt");
        while Instant::now() < deadline {
            match tokio::time::timeout_at(deadline, TcpStream::connect(addr)).await {
                // A connection to itself: with nothing listening yet on a port in the
                // ephemeral range, the kernel may give this socket that very port as its
                // own and join it to itself (TCP's simultaneous open). It is no store.
                Ok(Ok(s)) if met_itself(&s) => {
                    last = String::from("the connection met itself (nothing listened there yet)");
                }
                Ok(Ok(mut s)) => {
                    let _ = s.set_nodelay(true);
                    let mine = JobKey::nonce();
                    write_msg(&mut s, &Request::Hello { job, rank, size, nonce: hex(&mine) })
                        .await
                        .map_err(|e| Error::io("store hello", e))?;
                    let handshake = async {
                        let Response::Challenge { nonce, proof } = read_msg::<Response>(&mut s).await? else {
                            return Ok::<_, std::io::Error>(Err(String::from("no challenge from the store")));
                        };
                        let theirs = unhex(&nonce).unwrap_or_default();
                        let parts = store_parts(job, rank, size, &mine, &theirs);
                        if !proves(key, b"hcomm store server", &parts, &proof) {
                            return Ok(Err(String::from("it could not prove the job key (HCOMM_JOB_SECRET differs)")));
                        }
                        write_msg(&mut s, &Request::Proof(prove(key, b"hcomm store client", &parts))).await?;
                        read_msg::<Response>(&mut s).await.map(Ok)
                    };
                    return match timeout(HELLO_TIMEOUT, handshake).await {
                        Ok(Ok(Err(why))) => Err(boot(format!("the rendezvous store at {addr} was refused: {why}"))),
                        Ok(Ok(Ok(Response::Ok))) => Ok(StoreClient { stream: s, addr: addr.to_owned() }),
                        Ok(Ok(Ok(Response::Refused(why)))) => {
                            Err(boot(format!("the rendezvous store at {addr} refused rank {rank}: {why}")))
                        }
                        Ok(Ok(Ok(other))) => Err(boot(format!("unexpected store reply {other:?}"))),
                        Ok(Err(e)) => {
                            Err(boot(format!("the rendezvous store at {addr} failed the hello")).with_source(e))
                        }
                        Err(_) => Err(boot(format!("the rendezvous store at {addr} did not answer the hello"))),
                    };
                }
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => {
                    last = String::from(
                        "a connection attempt got no answer at all until the deadline (a wrong address, or a \
                         firewall that drops the packets)",
                    );
                    break;
                }
            }
            tokio::time::sleep(delay.min(deadline.saturating_duration_since(Instant::now()))).await;
            delay = (delay * 2).min(Duration::from_millis(500));
        }
        Err(boot(format!("could not reach the rendezvous store at {addr} (rank 0 serves it): {last}")))
    }

    /// The address of the local end of the store connection: the interface through
    /// which this host reaches rank 0.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.stream.local_addr().map_err(|e| Error::io("store connection address", e))
    }

    async fn call(&mut self, req: &Request) -> Result<Response> {
        write_msg(&mut self.stream, req)
            .await
            .map_err(|e| boot(format!("lost the rendezvous store at {}", self.addr)).with_source(e))?;
        read_msg(&mut self.stream)
            .await
            .map_err(|e| boot(format!("lost the rendezvous store at {}", self.addr)).with_source(e))
    }

    /// Stores `value` under `key`. The first value of a key holds for the life of
    /// the store: setting it again to the same value is fine, to another is refused.
    ///
    /// # Errors
    /// A bootstrap error if the store connection fails, or the store refuses (the key
    /// has another value: another process registered this rank).
    pub async fn set(&mut self, key: &str, value: &str) -> Result<()> {
        match self.call(&Request::Set { key: key.to_owned(), value: value.to_owned() }).await? {
            Response::Ok => Ok(()),
            Response::Refused(why) => Err(boot(format!("the rendezvous store at {} refused: {why}", self.addr))),
            other => Err(boot(format!("unexpected store reply {other:?}"))),
        }
    }

    /// The values of `keys`, waiting up to `wait` for all of them. `Err(missing)` lists
    /// the keys that were still missing when the wait ran out.
    ///
    /// # Errors
    /// A bootstrap error if the store connection fails, or the store refuses: a
    /// second process claimed a rank of this job.
    pub async fn get(
        &mut self,
        keys: &[String],
        wait: Duration,
    ) -> Result<std::result::Result<Vec<String>, Vec<String>>> {
        let req = Request::Get { keys: keys.to_vec(), wait_ms: wait.as_millis() as u64 };
        match self.call(&req).await? {
            Response::Values(v) => Ok(Ok(v)),
            Response::Missing(m) => Ok(Err(m)),
            Response::Refused(why) => Err(boot(format!("the rendezvous store at {} refused: {why}", self.addr))),
            other => Err(boot(format!("unexpected store reply {other:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A socket that connects to its own address is joined to itself, as a client
    /// retrying a store not yet listening on a port in the ephemeral range may be;
    /// the client must see that, and must not take a real connection for it.
    #[tokio::test(flavor = "current_thread")]
    async fn a_connection_to_itself_is_recognised() {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.set_reuseaddr(true).unwrap();
        s.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let me = s.local_addr().unwrap();
        let itself = s.connect(me).await.unwrap();
        assert!(met_itself(&itself));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let other = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        assert!(!met_itself(&other));
    }
}
