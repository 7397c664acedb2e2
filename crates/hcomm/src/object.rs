//! Collectives of serializable objects, as torch.distributed's `broadcast_object_list`
//! and `all_gather_object`: any `serde` type goes in, encoded with `postcard` (a
//! compact binary format) behind a fingerprint of its type, and comes out decoded on
//! every rank. Each
//! is two collectives underneath (the lengths, then the bytes), both numbered at the
//! call.

use std::future::Future;

use hcomm_collectives as coll;
use hcomm_core::wire::MAX_MESSAGE;
use hcomm_core::{Error, ErrorKind, LocalTransport, OpKind, Result};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::comm::{Communicator, traced_all_gather, traced_allgatherv, traced_broadcast};

/// A fingerprint of `O` (FNV-1a of its type name) that leads each encoding:
/// postcard's format does not describe itself, so bytes of another type could decode
/// as `O` without an error. Ranks built from the same source by the same compiler
/// agree on it.
fn fingerprint<O>() -> [u8; 8] {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in std::any::type_name::<O>().bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h.to_le_bytes()
}

/// Encodes `obj` for the wire, behind its type's fingerprint.
fn encode<O: Serialize>(obj: &O, op: OpKind, rank: usize) -> Result<Vec<u8>> {
    postcard::to_extend(obj, fingerprint::<O>().to_vec())
        .map_err(|e| Error::invalid(format!("the object cannot be encoded: {e}")).in_op(op, None).at_rank(rank))
}

/// Decodes what rank `from` encoded.
fn decode<O: DeserializeOwned>(bytes: &[u8], from: usize, op: OpKind, rank: usize) -> Result<O> {
    let fail = |why: String| {
        Error::new(ErrorKind::Mismatch, format!("rank {from}'s object {why}"))
            .with_peer(from)
            .in_op(op, None)
            .at_rank(rank)
    };
    match bytes.split_at_checked(8) {
        Some((print, body)) if print == fingerprint::<O>() => postcard::from_bytes(body)
            .map_err(|e| fail(format!("does not decode as {}: {e}", std::any::type_name::<O>()))),
        _ => Err(fail(format!("is not a {}", std::any::type_name::<O>()))),
    }
}

/// The length a peer announced, refused beyond what a message may carry.
fn announced(len: u64, from: usize, op: OpKind, rank: usize) -> Result<usize> {
    usize::try_from(len).ok().filter(|&n| n as u64 <= MAX_MESSAGE).ok_or_else(|| {
        Error::new(ErrorKind::Protocol, format!("rank {from} announced an object of {len} bytes"))
            .with_peer(from)
            .in_op(op, None)
            .at_rank(rank)
    })
}

/// Object collectives. Each is a collective: every rank calls it, in the same order
/// relative to the other collectives, with the same type `O`. Errors: those of
/// [`Communicator::broadcast`] and [`Communicator::all_gather`], an invalid-argument
/// error for an object `serde` cannot encode (the operation is then aborted on every
/// rank), and a mismatch error where the bytes do not decode as `O` (another type
/// on another rank). Cancel safety: as [`Communicator::broadcast`]; dropping the
/// future aborts the operation on every rank.
impl<T: LocalTransport> Communicator<T> {
    /// Sends `obj` from `root` to every rank; every rank gets it back decoded (the
    /// root too, so that every rank holds what the others decoded). The root passes
    /// `Some`, the others `None` (ignored). The object is encoded at the call: the
    /// future borrows the communicator only.
    ///
    /// # Errors
    /// See the impl block; also a root out of range, or `None` at the root.
    ///
    /// # Cancel safety
    /// See the impl block.
    pub fn broadcast_object<'a, O: Serialize + DeserializeOwned>(
        &'a self,
        obj: Option<&O>,
        root: usize,
    ) -> impl Future<Output = Result<O>> + use<'a, T, O> {
        let (me, op) = (self.rank(), OpKind::Broadcast);
        let encoded = (me == root).then(|| match obj {
            Some(o) => encode(o, op, me),
            None => Err(Error::invalid("the root of broadcast_object passes Some(object)").in_op(op, None).at_rank(me)),
        });
        let sig = move |count: usize, algo: coll::BcastAlgo| {
            coll::rooted_signature::<u8>(op, count as u64, None, root, algo as u8)
        };
        let lens = self.group.unstarted(self.group.reserve(), coll::rooted_signature::<u64>(op, 1, None, root, 0));
        let body = self.group.unstarted(self.group.reserve(), sig(0, coll::BcastAlgo::Binomial));
        async move {
            let encoded = match encoded.transpose() {
                Ok(e) => e,
                // Both operations are aborted on every rank (`body` as it drops).
                Err(e) => return lens.start(None).finish(Err(e)),
            };
            let mut len = [encoded.as_ref().map_or(0, |e| e.len() as u64)];
            traced_broadcast(lens.start(None), &mut len, root, coll::BcastAlgo::Binomial).await?;
            let n = announced(len[0], root, op, me)?;
            let mut bytes = encoded.unwrap_or_else(|| vec![0; n]);
            let algo = self.group.bcast_algo(n);
            traced_broadcast(body.start(Some(sig(n, algo))), &mut bytes, root, algo).await?;
            decode(&bytes, root, op, me)
        }
    }

    /// Gathers every rank's `obj` to every rank, in rank order. The object is
    /// encoded at the call: the future borrows the communicator only.
    ///
    /// # Errors
    /// See the impl block.
    ///
    /// # Cancel safety
    /// See the impl block.
    pub fn all_gather_object<'a, O: Serialize + DeserializeOwned>(
        &'a self,
        obj: &O,
    ) -> impl Future<Output = Result<Vec<O>>> + use<'a, T, O> {
        let (me, n, op) = (self.rank(), self.size(), OpKind::AllGather);
        let encoded = encode(obj, op, me);
        let lens_algo = coll::AllgatherAlgo::Ring;
        let lens = self.group.unstarted(self.group.reserve(), coll::allgather_signature::<u64>(1, lens_algo));
        let v_sig = |counts: &[usize], algo: coll::AllgatherAlgo| {
            let mut sig = coll::v_signature::<u8>(OpKind::AllGatherV, counts, None, None);
            sig.algo = algo as u8;
            sig
        };
        let body = self.group.unstarted(self.group.reserve(), v_sig(&vec![0; n], coll::AllgatherAlgo::Ring));
        async move {
            let mine = match encoded {
                Ok(e) => e,
                Err(e) => return lens.start(None).finish(Err(e)),
            };
            let mut all = vec![0u64; n];
            traced_all_gather(lens.start(None), &[mine.len() as u64], &mut all, lens_algo).await?;
            let counts =
                all.iter().enumerate().map(|(r, &len)| announced(len, r, op, me)).collect::<Result<Vec<usize>>>()?;
            let mut bytes = vec![0u8; counts.iter().sum()];
            // As `all_gather_v` chooses: by the mean block, Bruck running the ring.
            let algo = match self.group.allgather_algo(bytes.len() / n) {
                coll::AllgatherAlgo::RecursiveDoubling => coll::AllgatherAlgo::RecursiveDoubling,
                coll::AllgatherAlgo::Ring | coll::AllgatherAlgo::Bruck => coll::AllgatherAlgo::Ring,
            };
            traced_allgatherv(body.start(Some(v_sig(&counts, algo))), &mine, &mut bytes, &counts, algo).await?;
            let mut at = 0;
            counts
                .iter()
                .enumerate()
                .map(|(r, &c)| {
                    at += c;
                    decode(&bytes[at - c..at], r, op, me)
                })
                .collect()
        }
    }
}
