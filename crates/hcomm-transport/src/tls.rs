//! Encryption of the TCP data path (cargo feature `tls`, per job `HCOMM_TLS=1`):
//! TLS 1.3 with rustls, after the job-key handshake of [`crate::connect_mesh`].
//!
//! Trust comes from the job key, not from certificates: each process makes a
//! throw-away self-signed certificate, the dialer accepts any certificate whose
//! handshake signature checks out, and then both ends prove the job key over the TLS
//! session's exported keying material (RFC 8446 §7.5), each in its own role. A
//! machine in the middle holds two different sessions, so it can relay neither proof
//! without the key; the job-key handshake before TLS already refused strangers, and
//! this binds the encrypted session to the same two ranks.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hcomm_core::auth::{JobKey, PROOF_LEN};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls13_signature};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector, TlsStream};

const EXPORT_LABEL: &[u8] = b"EXPORTER-hcomm-job-binding";

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Accepts any server certificate, as long as the handshake is signed by its key:
/// the job-key proofs over the session (see the module documentation) authenticate
/// the peer.
#[derive(Debug)]
struct JobBound(Arc<CryptoProvider>);

impl ServerCertVerifier for JobBound {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        // Only TLS 1.3 is offered.
        Err(rustls::Error::General(String::from("TLS 1.2 is not used")))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

struct Configs {
    acceptor: TlsAcceptor,
    connector: TlsConnector,
}

/// This process's certificate and TLS configurations, made once.
fn configs() -> std::io::Result<&'static Configs> {
    static CONFIGS: OnceLock<Result<Configs, String>> = OnceLock::new();
    let made = CONFIGS.get_or_init(|| {
        let cert = rcgen::generate_simple_self_signed(vec![String::from("hcomm")]).map_err(|e| e.to_string())?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.key_pair.serialize_der()));
        let server = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert.der().clone()], key)
            .map_err(|e| e.to_string())?;
        let client = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| e.to_string())?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(JobBound(provider())))
            .with_no_client_auth();
        Ok(Configs { acceptor: TlsAcceptor::from(Arc::new(server)), connector: TlsConnector::from(Arc::new(client)) })
    });
    made.as_ref().map_err(|e| std::io::Error::other(format!("cannot set up TLS: {e}")))
}

/// Runs TLS over `stream` (an authenticated mesh connection; `dialer`: this end
/// dialed it) and the job-key proofs over the session, within `timeout`.
///
/// # Errors
/// The TLS handshake failed, the peer's proof is wrong (`InvalidData`), or time ran out.
pub async fn secure(
    stream: TcpStream,
    dialer: bool,
    key: &JobKey,
    timeout: Duration,
) -> std::io::Result<TlsStream<TcpStream>> {
    let c = configs()?;
    let work = async {
        let mut tls: TlsStream<TcpStream> = if dialer {
            let name = ServerName::try_from("hcomm").map_err(std::io::Error::other)?;
            c.connector.connect(name, stream).await?.into()
        } else {
            c.acceptor.accept(stream).await?.into()
        };
        let mut exported = [0u8; 32];
        match &tls {
            TlsStream::Client(s) => s.get_ref().1.export_keying_material(&mut exported, EXPORT_LABEL, None),
            TlsStream::Server(s) => s.get_ref().1.export_keying_material(&mut exported, EXPORT_LABEL, None),
        }
        .map_err(std::io::Error::other)?;
        let (mine, theirs): (&[u8], &[u8]) =
            if dialer { (b"hcomm tls dial", b"hcomm tls accept") } else { (b"hcomm tls accept", b"hcomm tls dial") };
        tls.write_all(&key.prove(mine, &[&exported])).await?;
        tls.flush().await?;
        let mut proof = [0u8; PROOF_LEN];
        tls.read_exact(&mut proof).await?;
        if !key.verify(theirs, &[&exported], &proof) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "the peer could not prove the job key over the TLS session",
            ));
        }
        Ok(tls)
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS setup timed out"))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A client and a server joined through a proxy that keeps every byte it forwards.
    async fn through_proxy(
        client_key: JobKey,
        server_key: JobKey,
        plaintext: &'static [u8],
    ) -> (std::io::Result<()>, Vec<u8>) {
        let server_l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy_l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (server_addr, proxy_addr) = (server_l.local_addr().unwrap(), proxy_l.local_addr().unwrap());
        let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let tap = seen.clone();
        tokio::spawn(async move {
            let (mut a, _) = proxy_l.accept().await.unwrap();
            let mut b = TcpStream::connect(server_addr).await.unwrap();
            let mut buf = vec![0u8; 65536];
            let mut back = vec![0u8; 65536];
            loop {
                tokio::select! {
                    n = a.read(&mut buf) => match n { Ok(0) | Err(_) => break, Ok(n) => {
                        tap.lock().extend_from_slice(&buf[..n]);
                        if b.write_all(&buf[..n]).await.is_err() { break }
                    }},
                    n = b.read(&mut back) => match n { Ok(0) | Err(_) => break, Ok(n) => {
                        tap.lock().extend_from_slice(&back[..n]);
                        if a.write_all(&back[..n]).await.is_err() { break }
                    }},
                }
            }
        });
        let t = Duration::from_secs(10);
        let server = async {
            let (s, _) = server_l.accept().await?;
            let mut tls = secure(s, false, &server_key, t).await?;
            let mut got = vec![0u8; plaintext.len()];
            tls.read_exact(&mut got).await?;
            assert_eq!(got, plaintext);
            Ok::<_, std::io::Error>(())
        };
        let client = async {
            let s = TcpStream::connect(proxy_addr).await?;
            let mut tls = secure(s, true, &client_key, t).await?;
            tls.write_all(plaintext).await?;
            tls.flush().await?;
            Ok::<_, std::io::Error>(())
        };
        let res = tokio::try_join!(server, client).map(drop);
        let tapped = seen.lock().clone();
        (res, tapped)
    }

    #[tokio::test]
    async fn the_wire_carries_no_plaintext() {
        const SECRET: &[u8] = b"the plaintext every rank sends, which an eavesdropper must not see";
        let key = JobKey::from_secret("tls test");
        let (res, tapped) = through_proxy(key.clone(), key, SECRET).await;
        res.unwrap();
        assert!(tapped.len() > SECRET.len(), "the proxy saw the exchange");
        assert!(!tapped.windows(16).any(|w| SECRET.windows(16).any(|s| s == w)), "plaintext on the wire");
    }

    #[tokio::test]
    async fn another_job_key_is_refused() {
        let (res, _) =
            through_proxy(JobKey::from_secret("one job"), JobKey::from_secret("another job"), b"never read").await;
        let e = res.expect_err("different keys must not agree");
        assert!(e.kind() == std::io::ErrorKind::InvalidData || e.kind() == std::io::ErrorKind::UnexpectedEof, "{e}");
    }
}
