//! Collectives where every rank gives and gets a block: reduce-scatter(v),
//! alltoall(v), allgatherv.

use futures::future::try_join;
use hcomm_core::keys::{Phase, step_tag};
use hcomm_core::{Element, Error, ErrorKind, LocalTransport, OpKind, ReduceOp, Result, Signature};

use crate::allreduce::{FOLD_TAG, UNFOLD_TAG, pow2_floor, unfolded};

use crate::rooted::{check_counts, split_blocks};
use crate::{OpCtx, check_reduce_op, copy_in, counts_hash, offsets, reduce_in};

algo_enum! {
    /// Reduce-scatter algorithms.
    ReduceScatterAlgo, "reduce_scatter" {
        /// `n - 1` steps around the host-contiguous ring, each sending one block:
        /// bandwidth-optimal, latency linear in `n`.
        Ring = 1 => "ring",
        /// Recursive halving: `log2 p` exchanges, each of half the remaining range
        /// (`p` the largest power of two not above `n`; the other ranks fold in first).
        RecursiveHalving = 2 => "recursive_halving",
    }
}

/// Signature of a reduce-scatter: equal blocks of `count` elements (`counts` `None`)
/// or per-rank counts.
pub fn reduce_scatter_signature<E: Element>(
    count: usize,
    counts: Option<&[usize]>,
    op: ReduceOp,
    algo: ReduceScatterAlgo,
) -> Signature {
    let (kind, count) = match counts {
        None => (OpKind::ReduceScatter, count as u64),
        Some(c) => (OpKind::ReduceScatterV, counts_hash(c)),
    };
    Signature { op: kind, dtype: Some(E::DTYPE), reduce: Some(op), count, root: None, algo: algo as u8 }
}

/// Reduce-scatter: block `g` of the element-wise reduction of every rank's `send`
/// lands in rank `g`'s `recv` (`counts[g]` elements; `send` holds the sum of
/// `counts`), by `algo`.
///
/// # Errors
/// Wrong buffer lengths or counts; operator undefined for `E`; mismatched signatures;
/// peer failure; timeout; abort.
pub async fn reduce_scatter<T: LocalTransport, E: Element>(
    ctx: OpCtx<'_, T>,
    send: &[E],
    recv: &mut [E],
    counts: &[usize],
    op: ReduceOp,
    algo: ReduceScatterAlgo,
) -> Result<()> {
    let body = async {
        let n = ctx.size();
        check_reduce_op::<E>(op)?;
        check_counts(counts, n, recv.len(), ctx.rank())?;
        let off = offsets(counts);
        if send.len() != off[n] {
            return Err(Error::invalid(format!(
                "reduce_scatter send buffer holds {}, {} expected",
                send.len(),
                off[n]
            )));
        }
        match algo {
            ReduceScatterAlgo::Ring => ring_reduce_scatter(&ctx, send, recv, &off, op).await?,
            ReduceScatterAlgo::RecursiveHalving => halving_reduce_scatter(&ctx, send, recv, &off, op).await?,
        }
        if op == ReduceOp::Avg {
            E::div_count(recv, n);
        }
        Ok(())
    };
    let r = ctx.deadline(body).await;
    ctx.finish(r)
}

/// `n - 1` ring steps; `off` are the block offsets.
async fn ring_reduce_scatter<T: LocalTransport, E: Element>(
    ctx: &OpCtx<'_, T>,
    send: &[E],
    recv: &mut [E],
    off: &[usize],
    op: ReduceOp,
) -> Result<()> {
    let (n, me) = (ctx.size(), ctx.rank());
    let mut acc = send.to_vec();
    let ring = ctx.ring();
    let pos = ring.iter().position(|&r| r == me).expect("the ring holds every rank");
    let (left, right) = (ring[(pos + n - 1) % n], ring[(pos + 1) % n]);
    for s in 0..n.saturating_sub(1) {
        // Position p ends owning block ring[p]: at step s it passes on block
        // ring[p - s - 1] and folds the incoming partial of ring[p - s - 2] into its own.
        let (sb, rb) = (ring[(pos + 2 * n - s - 1) % n], ring[(pos + 2 * n - s - 2) % n]);
        let payload = ctx.payload(&acc[off[sb]..off[sb + 1]]);
        let incoming = ctx.recv(left, s as u32);
        let dst = &mut acc[off[rb]..off[rb + 1]];
        try_join(ctx.send(right, s as u32, payload), async move { reduce_in(op, dst, &incoming.await?) }).await?;
    }
    recv.copy_from_slice(&acc[off[me]..off[me + 1]]);
    Ok(())
}

/// The first group rank whose block virtual rank `v` holds after the fold (see
/// `fold_in` in the allreduce module): ranks `2v` and `2v + 1` for the first `n - p`,
/// then `v + n - p`. Consecutive virtual ranks hold consecutive blocks, so a range
/// of virtual ranks is a contiguous range of the buffer.
fn first_block(v: usize, n: usize) -> usize {
    let rem = n - pow2_floor(n);
    if v < rem { 2 * v } else { v + rem }
}

/// Recursive halving over the largest power of two `p` of ranks: the first `2(n - p)`
/// ranks pair up, the even one of each pair handing its whole buffer to the odd one,
/// which then stands for both blocks and sends the even one its block at the end.
async fn halving_reduce_scatter<T: LocalTransport, E: Element>(
    ctx: &OpCtx<'_, T>,
    send: &[E],
    recv: &mut [E],
    off: &[usize],
    op: ReduceOp,
) -> Result<()> {
    let (n, me) = (ctx.size(), ctx.rank());
    let (p, rem) = (pow2_floor(n), n - pow2_floor(n));
    if me < 2 * rem && me % 2 == 0 {
        ctx.send(me + 1, FOLD_TAG, ctx.payload(send)).await?;
        return copy_in(recv, &ctx.recv(me + 1, UNFOLD_TAG).await?);
    }
    let mut acc = send.to_vec();
    let v = if me < 2 * rem {
        reduce_in(op, &mut acc, &ctx.recv(me - 1, FOLD_TAG).await?)?;
        me / 2
    } else {
        me - rem
    };
    let range = |lo: usize, hi: usize| off[first_block(lo, n)]..off[first_block(hi, n)];
    let (mut lo, mut hi) = (0, p);
    let (mut mask, mut step) = (p >> 1, 0u32);
    while mask > 0 {
        let partner = unfolded(v ^ mask, n);
        let mid = (lo + hi) / 2;
        let (keep, give) = if v & mask == 0 { ((lo, mid), (mid, hi)) } else { ((mid, hi), (lo, mid)) };
        let payload = ctx.payload(&acc[range(give.0, give.1)]);
        let incoming = ctx.recv(partner, step);
        let dst = &mut acc[range(keep.0, keep.1)];
        try_join(ctx.send(partner, step, payload), async move { reduce_in(op, dst, &incoming.await?) }).await?;
        (lo, hi) = keep;
        mask >>= 1;
        step += 1;
    }
    if me < 2 * rem {
        ctx.send(me - 1, UNFOLD_TAG, ctx.payload(&acc[off[me - 1]..off[me]])).await?;
    }
    recv.copy_from_slice(&acc[off[me]..off[me + 1]]);
    Ok(())
}

/// Pairwise-exchange alltoall(v): rank `r` sends block `g` of `send`
/// (`send_counts[g]` elements) to rank `g`, and receives rank `g`'s block for it into
/// block `g` of `recv` (`recv_counts[g]` elements). Step `s` exchanges with ranks
/// `r + s` and `r - s`, so every rank sends to one peer and receives from one per step.
///
/// # Errors
/// Wrong buffer lengths or counts; a peer's block of another length than
/// `recv_counts` says (mismatch); peer failure; timeout; abort.
pub async fn pairwise_alltoallv<T: LocalTransport, E: Element>(
    ctx: OpCtx<'_, T>,
    send: &[E],
    send_counts: &[usize],
    recv: &mut [E],
    recv_counts: &[usize],
) -> Result<()> {
    let body = async {
        let (n, me) = (ctx.size(), ctx.rank());
        if send_counts.len() != n || recv_counts.len() != n {
            return Err(Error::invalid(format!(
                "{} send counts and {} receive counts for {n} ranks",
                send_counts.len(),
                recv_counts.len()
            )));
        }
        let (so, ro) = (offsets(send_counts), offsets(recv_counts));
        if send.len() != so[n] || recv.len() != ro[n] {
            return Err(Error::invalid(format!(
                "alltoall buffers hold {} and {} elements, the counts say {} and {}",
                send.len(),
                recv.len(),
                so[n],
                ro[n]
            )));
        }
        if send_counts[me] != recv_counts[me] {
            return Err(Error::invalid(format!(
                "this rank sends itself {} elements but expects {}",
                send_counts[me], recv_counts[me]
            )));
        }
        let mut blocks = split_blocks(recv, &ro);
        blocks[me].copy_from_slice(&send[so[me]..so[me + 1]]);
        for s in 1..n {
            let (dst, src) = ((me + s) % n, (me + n - s) % n);
            let incoming = ctx.recv(src, 0);
            let blk = &mut *blocks[src];
            let payload = ctx.payload(&send[so[dst]..so[dst + 1]]);
            try_join(ctx.send(dst, 0, payload), async move {
                let data = incoming.await?;
                let want = std::mem::size_of_val(blk);
                if data.len() != want {
                    return Err(Error::new(
                        ErrorKind::Mismatch,
                        format!(
                            "rank {src} sent {} elements, this rank expected {}",
                            data.len() / std::mem::size_of::<E>(),
                            blk.len()
                        ),
                    )
                    .with_peer(src));
                }
                copy_in(blk, &data)
            })
            .await?;
        }
        Ok(())
    };
    let r = ctx.deadline(body).await;
    ctx.finish(r)
}

/// Allgatherv: block `g` of `recv` (`counts[g]` elements) receives rank `g`'s
/// `send`, by ring or recursive doubling (`Bruck` is for equal blocks: it runs the
/// ring here).
///
/// # Errors
/// Wrong buffer lengths or counts; mismatched signatures; peer failure; timeout;
/// abort.
pub async fn allgatherv<T: LocalTransport, E: Element>(
    ctx: OpCtx<'_, T>,
    send: &[E],
    recv: &mut [E],
    counts: &[usize],
    algo: AllgatherAlgo,
) -> Result<()> {
    let body = async {
        let (n, me) = (ctx.size(), ctx.rank());
        check_counts(counts, n, send.len(), me)?;
        let off = offsets(counts);
        if recv.len() != off[n] {
            return Err(Error::invalid(format!("allgatherv receive buffer holds {}, {} expected", recv.len(), off[n])));
        }
        recv[off[me]..off[me + 1]].copy_from_slice(send);
        match algo {
            AllgatherAlgo::RecursiveDoubling => doubling_allgatherv_in(&ctx, recv, counts).await,
            AllgatherAlgo::Ring | AllgatherAlgo::Bruck => ring_allgatherv_in(&ctx, recv, counts, Phase::Steps).await,
        }
    };
    let r = ctx.deadline(body).await;
    ctx.finish(r)
}

/// Ring allgatherv within `buf`, where this rank's block (`counts[rank]` elements at
/// its offset) is already in place; its steps are tagged in `phase`.
pub(crate) async fn ring_allgatherv_in<T: LocalTransport, E: Element>(
    ctx: &OpCtx<'_, T>,
    buf: &mut [E],
    counts: &[usize],
    phase: Phase,
) -> Result<()> {
    let (n, me) = (ctx.size(), ctx.rank());
    let off = offsets(counts);
    let ring = ctx.ring();
    let pos = ring.iter().position(|&r| r == me).expect("the ring holds every rank");
    let (left, right) = (ring[(pos + n - 1) % n], ring[(pos + 1) % n]);
    for s in 0..n.saturating_sub(1) {
        let (sb, rb) = (ring[(pos + n - s) % n], ring[(pos + 2 * n - s - 1) % n]);
        let payload = ctx.payload(&buf[off[sb]..off[sb + 1]]);
        let tag = step_tag(phase, s as u32);
        let incoming = ctx.recv(left, tag);
        let dst = &mut buf[off[rb]..off[rb + 1]];
        try_join(ctx.send(right, tag, payload), async move { copy_in(dst, &incoming.await?) }).await?;
    }
    Ok(())
}

algo_enum! {
    /// Allgather algorithms (equal blocks).
    AllgatherAlgo, "allgather" {
        /// `n - 1` steps around the host-contiguous ring, one block each.
        Ring = 1 => "ring",
        /// Bruck's algorithm: `ceil(log2 n)` steps, step `k` sends the `2^k` blocks held
        /// so far; for any rank count, at the price of a final local rotation.
        Bruck = 2 => "bruck",
        /// Recursive doubling: `log2 p` exchanges, the held range doubling each time
        /// (`p` the largest power of two not above `n`; the other ranks fold in first
        /// and get the whole result at the end).
        RecursiveDoubling = 3 => "recursive_doubling",
    }
}

/// Allgather: `recv[g*c..(g+1)*c]` receives rank `g`'s `send` (`c = send.len()`).
///
/// # Errors
/// `recv` not `n` times the length of `send`; mismatched signatures; peer failure;
/// timeout; abort.
pub async fn allgather<T: LocalTransport, E: Element>(
    ctx: OpCtx<'_, T>,
    send: &[E],
    recv: &mut [E],
    algo: AllgatherAlgo,
) -> Result<()> {
    let body = async {
        let (n, c, me) = (ctx.size(), send.len(), ctx.rank());
        if recv.len() != n * c {
            return Err(Error::invalid(format!(
                "allgather receive buffer holds {} elements, {n} ranks x {c} elements were expected",
                recv.len()
            )));
        }
        match algo {
            AllgatherAlgo::Ring => {
                recv[me * c..(me + 1) * c].copy_from_slice(send);
                ring_allgatherv_in(&ctx, recv, &vec![c; n], Phase::Steps).await
            }
            AllgatherAlgo::Bruck => bruck(&ctx, send, recv).await,
            AllgatherAlgo::RecursiveDoubling => {
                recv[me * c..(me + 1) * c].copy_from_slice(send);
                doubling_allgatherv_in(&ctx, recv, &vec![c; n]).await
            }
        }
    };
    let r = ctx.deadline(body).await;
    ctx.finish(r)
}

/// Recursive-doubling allgatherv within `buf`, where this rank's block is already in
/// place. Virtual rank `v` holds the blocks of group ranks
/// `first_block(v)..first_block(v + 1)`, so every exchange moves one contiguous range.
async fn doubling_allgatherv_in<T: LocalTransport, E: Element>(
    ctx: &OpCtx<'_, T>,
    buf: &mut [E],
    counts: &[usize],
) -> Result<()> {
    let (n, me) = (ctx.size(), ctx.rank());
    let (p, rem) = (pow2_floor(n), n - pow2_floor(n));
    let off = offsets(counts);
    if me < 2 * rem && me % 2 == 0 {
        ctx.send(me + 1, FOLD_TAG, ctx.payload(&buf[off[me]..off[me + 1]])).await?;
        return copy_in(buf, &ctx.recv(me + 1, UNFOLD_TAG).await?);
    }
    let v = if me < 2 * rem {
        copy_in(&mut buf[off[me - 1]..off[me]], &ctx.recv(me - 1, FOLD_TAG).await?)?;
        me / 2
    } else {
        me - rem
    };
    let range = |lo: usize, width: usize| off[first_block(lo, n)]..off[first_block(lo + width, n)];
    let (mut mask, mut step) = (1usize, 0u32);
    while mask < p {
        let partner = unfolded(v ^ mask, n);
        let (mine, theirs) = (v & !(mask - 1), (v ^ mask) & !(mask - 1));
        let payload = ctx.payload(&buf[range(mine, mask)]);
        let incoming = ctx.recv(partner, step);
        let dst = &mut buf[range(theirs, mask)];
        try_join(ctx.send(partner, step, payload), async move { copy_in(dst, &incoming.await?) }).await?;
        mask <<= 1;
        step += 1;
    }
    if me < 2 * rem {
        ctx.send(me - 1, UNFOLD_TAG, ctx.payload(buf)).await?;
    }
    Ok(())
}

async fn bruck<T: LocalTransport, E: Element>(ctx: &OpCtx<'_, T>, send: &[E], recv: &mut [E]) -> Result<()> {
    let (n, me, c) = (ctx.size(), ctx.rank(), send.len());
    // `held[i*c..]` is the block of rank `me + i`.
    let mut held: Vec<E> = Vec::with_capacity(n * c);
    held.extend_from_slice(send);
    let (mut have, mut step) = (1usize, 0u32);
    while have < n {
        let cnt = have.min(n - have);
        let (to, from) = ((me + n - have) % n, (me + have) % n);
        let payload = ctx.payload(&held[..cnt * c]);
        let incoming = ctx.recv(from, step);
        let (_, data) = try_join(ctx.send(to, step, payload), incoming).await?;
        let old = held.len();
        held.resize(old + cnt * c, E::zeroed());
        copy_in(&mut held[old..], &data)?;
        have += cnt;
        step += 1;
    }
    for i in 0..n {
        let g = (me + i) % n;
        recv[g * c..(g + 1) * c].copy_from_slice(&held[i * c..(i + 1) * c]);
    }
    Ok(())
}

algo_enum! {
    /// Alltoall algorithms (equal blocks).
    AlltoallAlgo, "alltoall" {
        /// `n - 1` steps; in step `s` rank `r` sends to `r + s` and receives from `r - s`.
        Pairwise = 1 => "pairwise",
        /// Bruck's algorithm: `ceil(log2 n)` steps, each moving about half the blocks:
        /// fewer messages, more bytes; for small blocks.
        Bruck = 2 => "bruck",
    }
}

/// Bruck alltoall of equal blocks of `c` elements (`send` and `recv` hold `n` blocks).
///
/// # Errors
/// Buffers that are not `n` blocks of `c`; mismatched signatures; peer failure;
/// timeout; abort.
pub async fn bruck_alltoall<T: LocalTransport, E: Element>(
    ctx: OpCtx<'_, T>,
    send: &[E],
    recv: &mut [E],
    c: usize,
) -> Result<()> {
    let body = async {
        let (n, me) = (ctx.size(), ctx.rank());
        if send.len() != n * c || recv.len() != n * c {
            return Err(Error::invalid(format!(
                "alltoall buffers of {} and {} elements are not {n} blocks of {c}",
                send.len(),
                recv.len()
            )));
        }
        // Rotate so that slot i holds the block for rank me + i.
        let mut slots: Vec<E> = Vec::with_capacity(n * c);
        for i in 0..n {
            let d = (me + i) % n;
            slots.extend_from_slice(&send[d * c..(d + 1) * c]);
        }
        // Step k moves every block whose slot has bit k set 2^k ranks on; a block in
        // slot i travels i ranks in all, to its destination, and stays in slot i.
        let (mut dist, mut step) = (1usize, 0u32);
        while dist < n {
            let moving: Vec<usize> = (0..n).filter(|i| i & dist != 0).collect();
            let mut out: Vec<E> = Vec::with_capacity(moving.len() * c);
            for &i in &moving {
                out.extend_from_slice(&slots[i * c..(i + 1) * c]);
            }
            let incoming = ctx.recv((me + n - dist) % n, step);
            let (_, data) = try_join(ctx.send((me + dist) % n, step, ctx.payload(&out)), incoming).await?;
            let data: Vec<E> = crate::to_vec(&data)?;
            if data.len() != moving.len() * c {
                return Err(Error::new(
                    ErrorKind::Protocol,
                    format!("bruck step {step}: {} elements for {} blocks", data.len(), moving.len()),
                ));
            }
            for (k, &i) in moving.iter().enumerate() {
                slots[i * c..(i + 1) * c].copy_from_slice(&data[k * c..(k + 1) * c]);
            }
            dist <<= 1;
            step += 1;
        }
        // Slot i now holds the block that rank me - i sent here.
        for i in 0..n {
            let src = (me + n - i) % n;
            recv[src * c..(src + 1) * c].copy_from_slice(&slots[i * c..(i + 1) * c]);
        }
        Ok(())
    };
    let r = ctx.deadline(body).await;
    ctx.finish(r)
}
