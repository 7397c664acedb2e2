//! HComm collectives: algorithms written once against [`OpCtx`] (sends, receives and
//! a deadline within one numbered operation) and so run unchanged over every transport.
//!
//! Each collective is an `async fn` that the communicator awaits, joins or spawns;
//! inside, the parts of an algorithm that can proceed independently (the columns of a
//! pipelined ring, the send and the receive of one step) are joined futures, so one
//! task drives them all without a thread of ours.

/// Declares an algorithm enum: its wire codes (`repr(u8)`, carried in signatures),
/// names, `ALL`, `Display` and `FromStr`.
macro_rules! algo_enum {
    (
        $(#[$meta:meta])*
        $name:ident, $what:literal {
            $( $(#[$vmeta:meta])* $var:ident = $code:literal => $text:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum $name {
            $( $(#[$vmeta])* $var = $code ),+
        }

        impl $name {
            /// Every algorithm of this kind.
            pub const ALL: [$name; [$($code),+].len()] = [$($name::$var),+];

            pub fn name(self) -> &'static str {
                match self {
                    $( $name::$var => $text ),+
                }
            }
        }

        impl From<$name> for u8 {
            fn from(a: $name) -> u8 {
                a as u8
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl std::str::FromStr for $name {
            type Err = hcomm_core::Error;

            fn from_str(s: &str) -> hcomm_core::Result<$name> {
                crate::parse_algo(s, &$name::ALL, $name::name, $what)
            }
        }
    };
}

pub mod adapt;
mod allreduce;
mod checks;
mod elem;
mod exchange;
mod group;
mod rooted;
mod scan;
mod shrink;

use futures::future::try_join;
use hcomm_core::keys::{Phase, step_tag};
use hcomm_core::{Element, Error, LocalTransport, OpKind, ReduceOp, Result, Signature};

pub use adapt::{AdaptChoice, AdaptTicket, AlgoFamily, Contest};
pub use allreduce::{
    AllreduceAlgo, ArgCheck, CROWDED_RING_BYTES, CostModel, Crowded, HierPlan, Layout, LinkCost, Measured,
    RING_CHUNK_BYTES, RING_MAX_COLUMNS, RING_MAX_COLUMNS_CROWDED, Stage, Tuning, allreduce, allreduce_signature,
};
pub use elem::{COOP_BYTES, cooperate, copy_in, reduce_in, to_vec};
pub use exchange::{
    AllgatherAlgo, AlltoallAlgo, ReduceScatterAlgo, allgather, allgatherv, bruck_alltoall, pairwise_alltoallv,
    reduce_scatter, reduce_scatter_signature,
};
pub use group::{
    AlgoPlan, DEFAULT_STALL_WARN, Deadline, Group, OpCtx, P2pDeadline, Quiet, Unstarted, abort_comm, deadline, quiet,
};
pub use rooted::{BcastAlgo, broadcast, gatherv, reduce, rooted_signature, scatterv, v_signature};
pub use scan::scan;

/// Prefix sums of `counts`: `off[g]..off[g + 1]` is block `g`.
pub fn offsets(counts: &[usize]) -> Vec<usize> {
    let mut off = Vec::with_capacity(counts.len() + 1);
    off.push(0);
    for c in counts {
        off.push(off[off.len() - 1] + c);
    }
    off
}

/// FNV-1a of a counts vector: the signature field of the v-variants, equal on ranks
/// that agree on the counts.
pub fn counts_hash(counts: &[usize]) -> u64 {
    counts
        .iter()
        .flat_map(|c| (*c as u64).to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// Dissemination barrier: `ceil(log2 n)` rounds; in round `k` each rank signals rank
/// `r + 2^k` and waits for rank `r - 2^k`. No rank leaves before every rank entered.
///
/// # Errors
/// Peer failure, timeout, abort by another rank.
pub async fn barrier<T: LocalTransport>(ctx: OpCtx<'_, T>) -> Result<()> {
    let body = async {
        let (n, r) = (ctx.size(), ctx.rank());
        let mut dist = 1;
        let mut round = 0;
        while dist < n {
            let recv = ctx.recv((r + n - dist) % n, round);
            try_join(ctx.send((r + dist) % n, round, bytes::Bytes::new()), recv).await?;
            dist <<= 1;
            round += 1;
        }
        Ok(())
    };
    let r = ctx.deadline(body).await;
    ctx.finish(r)
}

/// Signature of an allgather of `count` elements of `E` per rank by `algo`.
pub fn allgather_signature<E: Element>(count: usize, algo: AllgatherAlgo) -> Signature {
    Signature {
        op: OpKind::AllGather,
        dtype: Some(E::DTYPE),
        reduce: None,
        count: count as u64,
        root: None,
        algo: algo as u8,
    }
}

/// [`algo_name`] for signatures ([`hcomm_core::op::name_algorithms`]): `None` for a
/// code no algorithm has, which then shows as a number.
fn signature_algo(op: OpKind, code: u8) -> Option<&'static str> {
    Some(algo_name(op, code)).filter(|&n| n != "unknown")
}

/// The name of the algorithm an operation of kind `op` ran, from the code its
/// signature carries.
pub fn algo_name(op: OpKind, code: u8) -> &'static str {
    fn find<A: Copy + Into<u8>>(all: &[A], code: u8, name: fn(A) -> &'static str) -> &'static str {
        all.iter().find(|a| (**a).into() == code).map_or("unknown", |a| name(*a))
    }
    match op {
        OpKind::AllReduce => find(&AllreduceAlgo::ALL, code, AllreduceAlgo::name),
        OpKind::Broadcast => find(&BcastAlgo::ALL, code, BcastAlgo::name),
        OpKind::AllGather | OpKind::AllGatherV => find(&AllgatherAlgo::ALL, code, AllgatherAlgo::name),
        OpKind::ReduceScatter | OpKind::ReduceScatterV => find(&ReduceScatterAlgo::ALL, code, ReduceScatterAlgo::name),
        OpKind::AllToAll => find(&AlltoallAlgo::ALL, code, AlltoallAlgo::name),
        OpKind::AllToAllV => "pairwise",
        OpKind::Barrier => "dissemination",
        OpKind::Reduce => "binomial",
        OpKind::Scan | OpKind::ExScan => "recursive_doubling",
        OpKind::Gather | OpKind::GatherV | OpKind::Scatter | OpKind::ScatterV => "linear",
        OpKind::Split => "allgather",
        _ => "direct",
    }
}

/// Parses an algorithm name among `all`.
pub(crate) fn parse_algo<A: Copy>(s: &str, all: &[A], name: fn(A) -> &'static str, what: &str) -> Result<A> {
    all.iter().copied().find(|a| name(*a) == s.trim()).ok_or_else(|| {
        let names: Vec<&str> = all.iter().map(|a| name(*a)).collect();
        Error::config(format!("unknown {what} algorithm {s:?} ({})", names.join(", ")))
    })
}

fn mix(mut x: u64) -> u64 {
    // SplitMix64 finaliser.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Signature of a communicator split.
pub fn split_signature() -> Signature {
    Signature::bare(OpKind::Split, 2)
}

/// Splits the group of `ctx` (begun with [`split_signature`]; see
/// `Communicator::split`): ranks with the same `color` form a new group, ordered by
/// `key` then by their rank in the parent; `None` as colour leaves this rank out. The
/// new group's communicator id is derived from the parent's, the split's sequence
/// number and the colour, so that its tags never meet the parent's.
///
/// # Errors
/// As [`allgather`].
pub async fn split<'g, T: LocalTransport>(ctx: OpCtx<'g, T>, color: Option<u32>, key: i64) -> Result<Option<Group<T>>> {
    let (g, seq) = (ctx.group(), ctx.seq());
    let mine = [color.map_or(-1, i64::from), key];
    let mut all = vec![0i64; 2 * g.size()];
    exchange::allgather(ctx, &mine, &mut all, AllgatherAlgo::Ring).await?;
    let Some(color) = color else { return Ok(None) };
    let mut members: Vec<usize> = (0..g.size()).filter(|&r| all[2 * r] == i64::from(color)).collect();
    members.sort_by_key(|&r| (all[2 * r + 1], r));
    let comm = mix(g.comm_id() ^ mix(seq) ^ mix(u64::from(color) | (1 << 40)));
    Ok(g.subgroup(comm, &members))
}

/// Checks the arguments every rank can check alone.
pub fn check_reduce_op<E: Element>(op: ReduceOp) -> Result<()> {
    if op.supports(E::DTYPE) {
        Ok(())
    } else {
        Err(Error::invalid(format!("reduce operator {op} is not defined for {}", E::DTYPE)))
    }
}

/// The tag of the deferred argument checks' record frames (their sequence number,
/// [`RECORDS_SEQ`](hcomm_core::keys::RECORDS_SEQ), sets them apart).
pub(crate) const RECORDS_TAG: u32 = step_tag(Phase::Agree, 0);

/// At most this many operations of a group may have returned before their
/// argument check ended ([`ArgCheck::Deferred`]); the next one waits for the oldest
/// check first, so that a root running ahead of its receivers keeps a bounded lead.
/// Check records may wait a millisecond or two to leave (see `post_lazy`), or
/// over TCP until a few hundred have gathered, so the bound is a few times that
/// gathering: a smaller one makes a fast root wait here for records still held back.
pub const MAX_UNCHECKED: usize = 1024;

/// Runs `body`, an operation in which some ranks only send (so that they alone would
/// never see a peer's different signature), with the argument check the group's
/// tuning asks for ([`ArgCheck`]). Under the deferred check, this rank's record goes
/// to the next rank at this call, before anything can fail the operation here (a
/// mismatch an earlier check found, say): the next rank may have finished the
/// operation already, and its check waits for the record.
pub(crate) fn agreed<'c, T: LocalTransport, R>(
    ctx: &'c OpCtx<'_, T>,
    body: impl std::future::Future<Output = Result<R>> + 'c,
) -> impl std::future::Future<Output = Result<R>> + 'c {
    let check = if ctx.size() == 1 { ArgCheck::Off } else { ctx.group().tuning().check_args };
    if check == ArgCheck::Deferred {
        // Posted lazily: it leaves with this rank's next write to the next rank (the
        // data, when that goes there too), or within a millisecond or two
        // (`LocalTransport::post_lazy`), merged with the records of the operations
        // around it. Nobody waits for it: a rank that only receives does not pay a
        // system call per operation to send it.
        ctx.post_check_lazy((ctx.rank() + 1) % ctx.size(), RECORDS_TAG);
    }
    async move {
        match check {
            ArgCheck::Off => body.await,
            ArgCheck::Deferred => checked_later(ctx, body).await,
            ArgCheck::Sync => checked_now(ctx, body).await,
        }
    }
}

/// [`ArgCheck::Deferred`]: each rank sends a record of the operation's number and
/// signature to the next rank and checks the previous one's (see `checks`). If
/// every rank compares equal with its predecessor around the ring, every signature
/// is the same; otherwise at least one rank finds a difference. The records go
/// under a key of their own, so they meet whatever algorithm, root or length either
/// side chose. A difference found while the operation runs fails it here (and
/// `OpCtx::finish` aborts it on the others); a record that has not arrived when
/// the operation's own work is done is matched later, and a difference then fails
/// the next collective ([`Group::late_error`]).
async fn checked_later<T: LocalTransport, R>(
    ctx: &OpCtx<'_, T>,
    body: impl std::future::Future<Output = Result<R>>,
) -> Result<R> {
    use std::task::Poll;
    let g = ctx.group();
    if g.checks_over(MAX_UNCHECKED - 1) {
        // Rare, and on the heap, as other rare waits in every operation's future
        // (see `OpCtx::deadline`, which has asked `late_error` just before).
        Box::pin(g.settle_checks(MAX_UNCHECKED - 1)).await?;
    }
    let mut work = std::pin::pin!(body);
    let r = std::future::poll_fn(|cx| {
        let done = work.as_mut().poll(cx);
        // While the work waits, so does the check, woken by the records' arrival.
        if done.is_pending()
            && ctx.check_pending()
            && let Poll::Ready(r) = ctx.poll_check(cx)
        {
            r?;
        }
        done
    })
    .await?;
    if ctx.check_pending() {
        // Done now if the record is here, else when it comes (a broadcast's root,
        // done in its first poll, looks again only when records arrive).
        ctx.defer_check()?;
    }
    Ok(r)
}

/// [`ArgCheck::Sync`]: a dissemination exchange of empty messages under the
/// operation's signature beside `body`: in round `k` each rank sends to `r + 2^k`
/// and receives from `r - 2^k` (mod `n`), `ceil(log2 n)` rounds. (One round of every
/// pair was no faster on 4 ranks: the cost is the wait for every rank, not the
/// rounds.) Every receive compares the sender's signature with this rank's and stops
/// at a difference. A rank finishes only after its receives, and those its senders
/// made before sending, which together form a tree over every rank: so no rank
/// finishes unless every signature equals its own. A rank that finds a difference
/// fails with a mismatch error and aborts the operation on the others, which then
/// fail with it too (instead of the senders returning `Ok`).
async fn checked_now<T: LocalTransport, R>(
    ctx: &OpCtx<'_, T>,
    body: impl std::future::Future<Output = Result<R>>,
) -> Result<R> {
    let n = ctx.size();
    let agree = async {
        let me = ctx.rank();
        let (mut dist, mut round) = (1, 0);
        while dist < n {
            let tag = step_tag(Phase::Agree, round);
            let incoming = ctx.recv((me + n - dist) % n, tag);
            try_join(ctx.send((me + dist) % n, tag, bytes::Bytes::new()), incoming).await?;
            dist <<= 1;
            round += 1;
        }
        Ok(())
    };
    // The agreement on the heap, as the algorithms (see `allreduce`).
    let mut both = std::pin::pin!(try_join(body, Box::pin(agree)));
    // The first poll sends the data and the first round's empty message, often to the
    // same peer (always on 2 ranks): gathered, they leave in one write. Written one
    // by one, each by the sending task in its call (TCP's `tcp_direct`), the second
    // waited for the writer task all the same.
    let first =
        std::future::poll_fn(|cx| std::task::Poll::Ready(hcomm_core::transport::gather(|| both.as_mut().poll(cx))))
            .await;
    match first {
        std::task::Poll::Ready(r) => r,
        std::task::Poll::Pending => both.await,
    }
    .map(|(r, ())| r)
}

pub(crate) fn bound(total: usize, parts: usize, i: usize) -> usize {
    (total as u128 * i as u128 / parts as u128) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_name_their_algorithm() {
        hcomm_core::op::name_algorithms(signature_algo);
        let sig = allreduce_signature::<f32>(10, ReduceOp::Sum, AllreduceAlgo::Ring);
        assert!(sig.to_string().ends_with(", algorithm=ring)"), "{sig}");
        let sig = rooted_signature::<u8>(OpKind::Broadcast, 3, None, 0, BcastAlgo::Binomial as u8);
        assert!(sig.to_string().ends_with(", algorithm=binomial)"), "{sig}");
        for algo in AlltoallAlgo::ALL {
            assert_eq!(signature_algo(OpKind::AllToAll, algo as u8), Some(algo.name()));
        }
        // A code no algorithm has (a peer of another version) shows as a number.
        let mut sig = allreduce_signature::<f32>(10, ReduceOp::Sum, AllreduceAlgo::Ring);
        sig.algo = 200;
        assert!(sig.to_string().ends_with(", algorithm=200)"), "{sig}");
    }
}
