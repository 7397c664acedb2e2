//! Shrinking a group after failures: the surviving ranks agree on who failed and form
//! a new group of the others (MPI ULFM's `MPI_Comm_shrink`, NCCL's `ncclCommShrink`).
//!
//! The agreement has a coordinator: the lowest-ranked member this rank does not know
//! to have failed. Every other survivor sends it the set of members it knows to have
//! failed; the coordinator waits for a proposal from every member it does not know to
//! have failed (learning of new failures as its receives fail), takes the union and
//! sends it back as the decision. A member that learns its coordinator failed moves to
//! the next one. Messages to coordinator `c` carry tag `2c` (proposal) and `2c + 1`
//! (decision), so members that learn of failures in different orders still meet at
//! the same coordinator with the same tags.
//!
//! The messages travel on a communicator id of their own, so that shrink works on a
//! group whose operations were aborted (or that was aborted as a whole).

use std::collections::BTreeSet;

use bytes::Bytes;
use hcomm_core::{Error, ErrorKind, Header, LocalTransport, MatchKey, OpKind, Rank, Result, Signature};
use tokio::time::Instant;

use crate::group::Group;

/// Distinguishes the shrink protocol's communicator id from the group's.
const SHRINK_SALT: u64 = 0x5348_5249_4e4b_0001;

fn sig(n: usize) -> Signature {
    Signature::bare(OpKind::Shrink, n as u64)
}

/// The communicator id of the group that shrink number `round` of communicator
/// `comm` makes, with members `failed` left out.
pub(crate) fn comm_id(comm: u64, round: u64, failed: &[bool]) -> u64 {
    let set = failed.iter().enumerate().filter(|(_, f)| **f).fold(0u64, |h, (r, _)| crate::mix(h ^ r as u64));
    crate::mix(comm ^ crate::mix(round ^ SHRINK_SALT) ^ crate::mix(set).rotate_left(17))
}

/// The failed set as a message: one byte per member, 1 for failed.
fn encode(failed: &[bool]) -> Bytes {
    failed.iter().map(|&f| u8::from(f)).collect::<Vec<u8>>().into()
}

fn decode(payload: &[u8], n: usize, from: usize) -> Result<Vec<bool>> {
    if payload.len() != n || payload.iter().any(|&b| b > 1) {
        return Err(Error::new(
            ErrorKind::Protocol,
            format!("rank {from} sent a malformed shrink message ({} bytes for {n} ranks)", payload.len()),
        )
        .with_peer(from));
    }
    Ok(payload.iter().map(|&b| b == 1).collect())
}

/// Runs the agreement of shrink number `round` of group `g` and returns the members
/// that failed (by group rank), or an error if this rank was itself counted as failed.
pub(crate) async fn agree<T: LocalTransport>(g: &Group<T>, round: u64, deadline: Instant) -> Result<Vec<bool>> {
    let (n, me) = (g.size(), g.rank());
    let t = g.transport();
    let mailbox = t.mailbox();
    let comm = crate::mix(g.comm_id() ^ SHRINK_SALT);
    let me_world = g.world_rank(me);
    let known = |failed: &mut Vec<bool>| {
        for (r, f) in failed.iter_mut().enumerate() {
            if r != me && mailbox.peer_failure(g.world_rank(r)).is_some() {
                *f = true;
            }
        }
    };
    let key = |from: usize, tag: u32| MatchKey { src: g.world_rank(from), comm, seq: round, tag };
    let header = |tag: u32| Header::data(me_world, comm, round, tag, &sig(n), n);
    let timeout = |waiting: &BTreeSet<usize>| {
        let w: Vec<String> = waiting.iter().map(|r| r.to_string()).collect();
        Error::new(ErrorKind::Timeout, format!("shrink: no answer from ranks [{}] within the deadline", w.join(", ")))
    };
    let mut failed = vec![false; n];
    loop {
        known(&mut failed);
        let coord = (0..n).find(|&r| !failed[r]).expect("this rank is not failed in its own view");
        let (propose, decide) = (2 * coord as u32, 2 * coord as u32 + 1);
        if coord == me {
            // Collect a proposal from every member not known to have failed.
            let mut from: Vec<usize> = Vec::new();
            let mut waiting: BTreeSet<usize> = (0..n).filter(|&r| r != me && !failed[r]).collect();
            let mut pending: futures::stream::FuturesUnordered<_> = waiting
                .iter()
                .map(|&r| {
                    let rx = mailbox.recv(key(r, propose));
                    async move { (r, rx.await) }
                })
                .collect();
            while !waiting.is_empty() {
                use futures::StreamExt;
                let next = tokio::time::timeout_at(deadline, pending.next()).await.map_err(|_| timeout(&waiting))?;
                let Some((r, res)) = next else { break };
                waiting.remove(&r);
                match res {
                    Ok(frame) => {
                        for (x, f) in decode(&frame.payload, n, r)?.into_iter().enumerate() {
                            failed[x] |= f;
                        }
                        from.push(r);
                    }
                    Err(e) if e.is_peer_failed() => failed[r] = true,
                    Err(e) => return Err(e),
                }
            }
            // Everyone who proposed learns the decision, including a member that
            // others counted as failed (it then returns an error).
            let decision = encode(&failed);
            for r in from {
                t.post(g.world_rank(r), header(decide), decision.clone());
            }
            return Ok(failed);
        }
        // A member: propose, then wait for the decision; on to the next coordinator if
        // this one fails.
        let coord_world: Rank = g.world_rank(coord);
        let sent = tokio::time::timeout_at(deadline, t.send(coord_world, header(propose), encode(&failed)))
            .await
            .map_err(|_| timeout(&BTreeSet::from([coord])))?;
        let answer = match sent {
            Ok(()) => tokio::time::timeout_at(deadline, mailbox.recv(key(coord, decide)))
                .await
                .map_err(|_| timeout(&BTreeSet::from([coord])))?,
            Err(e) => Err(e),
        };
        match answer {
            Ok(frame) => {
                let decision = decode(&frame.payload, n, coord)?;
                if decision[me] {
                    return Err(Error::new(
                        ErrorKind::PeerFailed,
                        "other ranks counted this rank as failed: it is not in the shrunk communicator",
                    ));
                }
                return Ok(decision);
            }
            Err(e) if e.is_peer_failed() => failed[coord] = true,
            Err(e) => return Err(e),
        }
    }
}
