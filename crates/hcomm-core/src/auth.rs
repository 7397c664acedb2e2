//! The per-job secret and the challenge–response proofs that every connection of a
//! job (rendezvous store and mesh) exchanges before any data.
//!
//! Both ends draw a fresh 32-byte nonce; each proves knowledge of the job key with
//! an HMAC-SHA256 over both nonces and the connection's identity, under a role label
//! of its own, so that a proof can be neither replayed on another connection nor
//! reflected back by the other end. The key is SHA-256 of the secret
//! (`HCOMM_JOB_SECRET`).

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// Length of nonces and proofs.
pub const PROOF_LEN: usize = 32;

/// A job's key. Its `Debug` form does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct JobKey([u8; 32]);

impl std::fmt::Debug for JobKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JobKey(..)")
    }
}

impl Default for JobKey {
    /// The key of the empty secret.
    fn default() -> JobKey {
        JobKey::from_secret("")
    }
}

impl JobKey {
    /// The key of `secret`.
    pub fn from_secret(secret: &str) -> JobKey {
        let mut h = Sha256::new();
        h.update(b"hcomm job key v1\0");
        h.update(secret.as_bytes());
        JobKey(h.finalize().into())
    }

    /// A fresh random nonce.
    pub fn nonce() -> [u8; PROOF_LEN] {
        rand::random()
    }

    fn mac(&self, role: &[u8], parts: &[&[u8]]) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        m.update(&(role.len() as u32).to_le_bytes());
        m.update(role);
        for p in parts {
            // Length-prefixed, so that no two different part lists feed the same bytes.
            m.update(&(p.len() as u32).to_le_bytes());
            m.update(p);
        }
        m
    }

    /// The proof of knowing this key, for `role` over `parts`.
    pub fn prove(&self, role: &[u8], parts: &[&[u8]]) -> [u8; PROOF_LEN] {
        self.mac(role, parts).finalize().into_bytes().into()
    }

    /// Whether `proof` is this key's proof for `role` over `parts` (in constant time).
    pub fn verify(&self, role: &[u8], parts: &[&[u8]], proof: &[u8]) -> bool {
        self.mac(role, parts).verify_slice(proof).is_ok()
    }
}

/// Lower-case hex of `b`.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The bytes of lower- or upper-case hex `s`, or `None`.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| s.get(i..i + 2).and_then(|d| u8::from_str_radix(d, 16).ok())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_bind_key_role_and_parts() {
        let k = JobKey::from_secret("s3cret");
        let p = k.prove(b"dial", &[b"ab", b"c"]);
        assert!(k.verify(b"dial", &[b"ab", b"c"], &p));
        assert!(!k.verify(b"accept", &[b"ab", b"c"], &p), "another role");
        assert!(!k.verify(b"dial", &[b"a", b"bc"], &p), "the same bytes split otherwise");
        assert!(!JobKey::from_secret("other").verify(b"dial", &[b"ab", b"c"], &p), "another key");
        assert!(!k.verify(b"dial", &[b"ab", b"c"], &p[..31]));
        assert_ne!(JobKey::nonce(), JobKey::nonce());
        assert_eq!(format!("{k:?}"), "JobKey(..)");
    }

    #[test]
    fn hex_round_trip() {
        assert_eq!(hex(&[0, 0xab, 0x10]), "00ab10");
        assert_eq!(unhex("00AB10"), Some(vec![0, 0xab, 0x10]));
        assert_eq!(unhex("0"), None);
        assert_eq!(unhex("zz"), None);
        assert_eq!(unhex("é0"), None);
    }
}
