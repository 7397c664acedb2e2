//! HComm collectives: algorithms written once against [`OpCtx`] (sends, receives and
//! a deadline within one numbered operation) and so run unchanged over every transport.
//!
//! Each collective is an `async fn` that the communicator awaits, joins or spawns;
//! inside, the parts of an algorithm that can proceed independently (the columns of a
//! pipelined ring, the send and the receive of one step) are joined futures, so one
//! task drives them all without a thread of ours.

mod elem;
mod exchange;
mod group;
mod rooted;
mod scan;

use futures::future::{try_join, try_join_all};
use hcomm_core::{Element, Error, LocalTransport, OpKind, ReduceOp, Result, Signature};

pub use elem::{copy_in, reduce_in, to_vec};
pub use exchange::{pairwise_alltoallv, ring_allgatherv, ring_reduce_scatter};
pub use group::{Group, OpCtx};
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

/// Target size of one pipelined piece of a ring allreduce. A segment larger than this
/// is cut into columns that travel the ring independently, so that reducing one piece
/// overlaps sending the next.
pub const RING_CHUNK_BYTES: usize = 256 << 10;
/// Most columns a ring allreduce uses.
pub const RING_MAX_COLUMNS: usize = 64;

/// Signature of an allreduce of `count` elements of `E` with `op`.
pub fn allreduce_signature<E: Element>(count: usize, op: ReduceOp) -> Signature {
    Signature { op: OpKind::AllReduce, dtype: Some(E::DTYPE), reduce: Some(op), count: count as u64, root: None }
}

/// Checks the arguments every rank can check alone.
pub fn check_reduce_op<E: Element>(op: ReduceOp) -> Result<()> {
    if op.supports(E::DTYPE) {
        Ok(())
    } else {
        Err(Error::invalid(format!("reduce operator {op} is not defined for {}", E::DTYPE)))
    }
}

/// Start of part `i` of `total` cut into `parts` near-equal parts.
fn bound(total: usize, parts: usize, i: usize) -> usize {
    (total as u128 * i as u128 / parts as u128) as usize
}

fn ring_tag(step: usize, column: usize) -> u32 {
    ((step as u32) << 8) | column as u32
}

/// Cuts `buf` into `n` segments of `m` pieces each and returns them by column:
/// `cols[c][j]` is piece `c` of segment `j`.
fn carve<E>(buf: &mut [E], n: usize, m: usize) -> Vec<Vec<&mut [E]>> {
    let count = buf.len();
    let mut cols: Vec<Vec<&mut [E]>> = (0..m).map(|_| Vec::with_capacity(n)).collect();
    let mut rest = buf;
    for j in 0..n {
        let (mut seg, tail) = std::mem::take(&mut rest).split_at_mut(bound(count, n, j + 1) - bound(count, n, j));
        rest = tail;
        let seg_len = seg.len();
        for (c, col) in cols.iter_mut().enumerate() {
            let (piece, t) = std::mem::take(&mut seg).split_at_mut(bound(seg_len, m, c + 1) - bound(seg_len, m, c));
            seg = t;
            col.push(piece);
        }
    }
    cols
}

/// Ring allreduce: reduce-scatter then allgather around a ring in host-contiguous
/// order, `2(n-1)/n · S` bytes sent per rank. Segments above [`RING_CHUNK_BYTES`] are
/// cut into columns that go round the ring concurrently (pipelining). Every rank ends
/// with bitwise identical results: each segment is reduced once, by its owner, and
/// copied to the others.
///
/// # Errors
/// Invalid operator for the element type; mismatched signatures; peer failure;
/// timeout; abort by another rank.
pub async fn ring_allreduce<T: LocalTransport, E: Element>(
    ctx: OpCtx<'_, T>,
    buf: &mut [E],
    op: ReduceOp,
) -> Result<()> {
    let body = async {
        check_reduce_op::<E>(op)?;
        let n = ctx.size();
        if n == 1 {
            return Ok(());
        }
        let ring = ctx.ring();
        let pos = ring.iter().position(|&r| r == ctx.rank()).expect("the ring holds every rank");
        let (left, right) = (ring[(pos + n - 1) % n], ring[(pos + 1) % n]);
        let seg_bytes = buf.len().div_ceil(n) * std::mem::size_of::<E>();
        let m = seg_bytes.div_ceil(RING_CHUNK_BYTES).clamp(1, RING_MAX_COLUMNS);
        tracing::trace!(seq = ctx.seq(), n, count = buf.len(), columns = m, "ring allreduce");
        let ctx = &ctx;
        try_join_all(
            carve(buf, n, m)
                .into_iter()
                .enumerate()
                .map(|(c, pieces)| async move { ring_column(ctx, pieces, c, pos, left, right, op).await }),
        )
        .await?;
        Ok(())
    };
    let r = ctx.deadline(body).await;
    ctx.finish(r)
}

async fn ring_column<T: LocalTransport, E: Element>(
    ctx: &OpCtx<'_, T>,
    mut pieces: Vec<&mut [E]>,
    col: usize,
    pos: usize,
    left: usize,
    right: usize,
    op: ReduceOp,
) -> Result<()> {
    let n = pieces.len();
    // Reduce-scatter: after step s, the piece received is reduced over s + 2 ranks.
    for s in 0..n - 1 {
        let (send_seg, recv_seg) = ((pos + n - s) % n, (pos + 2 * n - s - 1) % n);
        let tag = ring_tag(s, col);
        let payload = ctx.payload(pieces[send_seg]);
        let recv = ctx.recv(left, tag);
        let dst = &mut *pieces[recv_seg];
        try_join(ctx.send(right, tag, payload), async move { reduce_in(op, dst, &recv.await?) }).await?;
    }
    let own = (pos + 1) % n;
    if op == ReduceOp::Avg {
        E::div_count(pieces[own], n);
    }
    // Allgather: pass the reduced pieces on.
    for s in 0..n - 1 {
        let (send_seg, recv_seg) = ((pos + 1 + n - s) % n, (pos + n - s) % n);
        let tag = ring_tag(n - 1 + s, col);
        let payload = ctx.payload(pieces[send_seg]);
        let recv = ctx.recv(left, tag);
        let dst = &mut *pieces[recv_seg];
        try_join(ctx.send(right, tag, payload), async move { copy_in(dst, &recv.await?) }).await?;
    }
    Ok(())
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

/// Signature of an allgather of `count` elements of `E` per rank.
pub fn allgather_signature<E: Element>(count: usize) -> Signature {
    Signature { op: OpKind::AllGather, dtype: Some(E::DTYPE), reduce: None, count: count as u64, root: None }
}

/// Ring allgather: `recv[g*c..(g+1)*c]` receives rank `g`'s `send` (`c = send.len()`),
/// in `n - 1` steps around the host-contiguous ring.
///
/// # Errors
/// `recv` not `n` times the length of `send`; mismatched signatures; peer failure;
/// timeout; abort by another rank.
pub async fn ring_allgather<T: LocalTransport, E: Element>(
    ctx: OpCtx<'_, T>,
    send: &[E],
    recv: &mut [E],
) -> Result<()> {
    let body = async {
        let (n, c) = (ctx.size(), send.len());
        if recv.len() != n * c {
            return Err(Error::invalid(format!(
                "allgather receive buffer holds {} elements, {n} ranks x {c} elements were expected",
                recv.len()
            )));
        }
        let me = ctx.rank();
        recv[me * c..(me + 1) * c].copy_from_slice(send);
        let ring = ctx.ring();
        let pos = ring.iter().position(|&r| r == me).expect("the ring holds every rank");
        let (left, right) = (ring[(pos + n - 1) % n], ring[(pos + 1) % n]);
        for s in 0..n.saturating_sub(1) {
            let (send_blk, recv_blk) = (ring[(pos + n - s) % n], ring[(pos + 2 * n - s - 1) % n]);
            let payload = ctx.payload(&recv[send_blk * c..(send_blk + 1) * c]);
            let incoming = ctx.recv(left, s as u32);
            let dst = &mut recv[recv_blk * c..(recv_blk + 1) * c];
            try_join(ctx.send(right, s as u32, payload), async move { copy_in(dst, &incoming.await?) }).await?;
        }
        Ok(())
    };
    let r = ctx.deadline(body).await;
    ctx.finish(r)
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
/// As [`ring_allgather`].
pub async fn split<'g, T: LocalTransport>(ctx: OpCtx<'g, T>, color: Option<u32>, key: i64) -> Result<Option<Group<T>>> {
    let (g, seq) = (ctx.group(), ctx.seq());
    let mine = [color.map_or(-1, i64::from), key];
    let mut all = vec![0i64; 2 * g.size()];
    ring_allgather(ctx, &mine, &mut all).await?;
    let Some(color) = color else { return Ok(None) };
    let mut members: Vec<usize> = (0..g.size()).filter(|&r| all[2 * r] == i64::from(color)).collect();
    members.sort_by_key(|&r| (all[2 * r + 1], r));
    let comm = mix(g.comm_id() ^ mix(seq) ^ mix(u64::from(color) | (1 << 40)));
    Ok(g.subgroup(comm, &members))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carve_covers_everything_once() {
        for count in [0usize, 1, 7, 64, 1001] {
            for n in 1..6 {
                for m in 1..4 {
                    let mut buf: Vec<usize> = (0..count).collect();
                    let cols = carve(&mut buf, n, m);
                    assert_eq!(cols.len(), m);
                    let mut seen: Vec<usize> = cols.iter().flatten().flat_map(|p| p.iter().copied()).collect();
                    seen.sort();
                    assert_eq!(seen, (0..count).collect::<Vec<_>>());
                }
            }
        }
    }
}
