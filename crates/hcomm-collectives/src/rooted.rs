//! Rooted collectives: broadcast, reduce, gather(v), scatter(v).

use futures::future::try_join_all;
use hcomm_core::keys::Phase;
use hcomm_core::{Element, Error, LocalTransport, OpKind, ReduceOp, Result, Signature};

use crate::{OpCtx, agreed, check_reduce_op, counts_hash, offsets, reduce_in};

/// Piece size of the pipelined chain broadcast.
pub const BCAST_CHAIN_CHUNK_BYTES: usize = 256 << 10;

algo_enum! {
    /// Broadcast algorithms.
    BcastAlgo, "broadcast" {
        /// `ceil(log2 n)` rounds; each round doubles the ranks that hold the data.
        Binomial = 1 => "binomial",
        /// Ranks in a chain from the root; the message travels in pieces, so every link
        /// is busy at once.
        Chain = 2 => "chain",
        /// The root sends each rank one segment, then the ranks allgather the segments
        /// around the ring (van de Geijn).
        ScatterAllgather = 3 => "scatter_allgather",
    }
}

pub(crate) fn check_root(root: usize, n: usize) -> Result<()> {
    if root < n { Ok(()) } else { Err(Error::invalid(format!("root {root} out of range for {n} ranks"))) }
}

/// Signature of a rooted collective (`algo`: the algorithm's code, or 0).
pub fn rooted_signature<E: Element>(
    op: OpKind,
    count: u64,
    reduce: Option<ReduceOp>,
    root: usize,
    algo: u8,
) -> Signature {
    Signature { op, dtype: Some(E::DTYPE), reduce, count, root: Some(root as u32), algo }
}

/// Broadcast of `buf` from `root` to every rank.
///
/// # Errors
/// Root out of range; mismatched signatures; peer failure; timeout; abort.
pub async fn broadcast<T: LocalTransport, E: Element>(
    ctx: OpCtx<'_, T>,
    buf: &mut [E],
    root: usize,
    algo: BcastAlgo,
) -> Result<()> {
    let body = async {
        let n = ctx.size();
        check_root(root, n)?;
        // On the heap, as allreduce's algorithms.
        match algo {
            BcastAlgo::Binomial => Box::pin(bcast_binomial(&ctx, buf, root, 0)).await,
            BcastAlgo::Chain => Box::pin(bcast_chain(&ctx, buf, root)).await,
            BcastAlgo::ScatterAllgather => Box::pin(bcast_scatter_allgather(&ctx, buf, root)).await,
        }
    };
    let r = ctx.deadline(std::pin::pin!(agreed(&ctx, body))).await;
    ctx.finish(r)
}

pub(crate) async fn bcast_binomial<T: LocalTransport, E: Element>(
    ctx: &OpCtx<'_, T>,
    buf: &mut [E],
    root: usize,
    tag: u32,
) -> Result<()> {
    let n = ctx.size();
    let order = ctx.tree_order(root);
    let vr = order.iter().position(|&r| r == ctx.rank()).expect("the tree holds every rank");
    let real = |v: usize| order[v];
    let mut mask = 1;
    while mask < n {
        if vr & mask != 0 {
            ctx.recv_into(real(vr - mask), tag, buf).await?;
            break;
        }
        mask <<= 1;
    }
    // From here `buf` is only read: the children's messages are sent out of it (over
    // shared memory, each child copies it straight from this rank's buffer).
    let buf: &[E] = buf;
    let mut sends = Vec::new();
    mask >>= 1;
    while mask > 0 {
        if vr + mask < n {
            sends.push(ctx.send_slice(real(vr + mask), tag, buf));
        }
        mask >>= 1;
    }
    try_join_all(sends).await?;
    Ok(())
}

async fn bcast_scatter_allgather<T: LocalTransport, E: Element>(
    ctx: &OpCtx<'_, T>,
    buf: &mut [E],
    root: usize,
) -> Result<()> {
    let (n, me, count) = (ctx.size(), ctx.rank(), buf.len());
    let counts: Vec<usize> = (0..n).map(|g| crate::bound(count, n, g + 1) - crate::bound(count, n, g)).collect();
    let off = offsets(&counts);
    if me == root {
        let whole: &[E] = buf;
        try_join_all((0..n).filter(|&g| g != root).map(|g| ctx.send_slice(g, 0, &whole[off[g]..off[g + 1]]))).await?;
    } else {
        ctx.recv_into(root, 0, &mut buf[off[me]..off[me + 1]]).await?;
    }
    crate::exchange::ring_allgatherv_in(ctx, buf, &counts, Phase::Allgather).await
}

async fn bcast_chain<T: LocalTransport, E: Element>(ctx: &OpCtx<'_, T>, buf: &mut [E], root: usize) -> Result<()> {
    let n = ctx.size();
    let order = ctx.tree_order(root);
    let vr = order.iter().position(|&r| r == ctx.rank()).expect("the chain holds every rank");
    let (prev, next) = (order[(vr + n - 1) % n], order[(vr + 1) % n]);
    let per = (BCAST_CHAIN_CHUNK_BYTES / std::mem::size_of::<E>()).max(1);
    let mut pieces: Vec<&mut [E]> = buf.chunks_mut(per).collect();
    if pieces.is_empty() {
        // An empty buffer still travels as one empty piece, so that every rank hears
        // from its predecessor (and checks its signature).
        pieces.push(&mut []);
    }
    // Receives are posted up front, each into its piece; each piece is forwarded,
    // out of this rank's buffer, as soon as it is in (sends are queued when called),
    // so the pieces stream down the chain. Over shared memory a piece is copied once
    // per hop, by the receiver, straight from the sender's buffer.
    let mut sends = Vec::new();
    let last = vr + 1 == n;
    if vr == 0 {
        for (k, piece) in pieces.into_iter().enumerate().filter(|_| !last) {
            sends.push(ctx.send_slice(next, k as u32, &*piece));
        }
    } else {
        let recvs: Vec<_> = pieces.into_iter().enumerate().map(|(k, p)| ctx.recv_into(prev, k as u32, p)).collect();
        for (k, r) in recvs.into_iter().enumerate() {
            let piece: &[E] = r.await?;
            if !last {
                sends.push(ctx.send_slice(next, k as u32, piece));
            }
        }
    }
    try_join_all(sends).await?;
    Ok(())
}

/// Binomial-tree reduction of every rank's `buf` into `buf` at `root`. The other
/// ranks' buffers are left as they were.
///
/// # Errors
/// Root out of range; operator undefined for `E`; mismatched signatures; peer
/// failure; timeout; abort.
pub async fn reduce<T: LocalTransport, E: Element>(
    ctx: OpCtx<'_, T>,
    buf: &mut [E],
    op: ReduceOp,
    root: usize,
) -> Result<()> {
    let body = async {
        let n = ctx.size();
        check_root(root, n)?;
        check_reduce_op::<E>(op)?;
        if ctx.rank() == root {
            reduce_binomial(&ctx, buf, op, root, 0).await?;
            if op == ReduceOp::Avg {
                E::div_count(buf, n);
            }
        } else {
            // The caller's buffer stays as it was: reduce in a copy.
            reduce_binomial(&ctx, &mut buf.to_vec(), op, root, 0).await?;
        }
        Ok(())
    };
    let r = ctx.deadline(std::pin::pin!(agreed(&ctx, body))).await;
    ctx.finish(r)
}

/// Binomial-tree reduction towards `root`, accumulating in `acc` (the full result at
/// the root; a partial elsewhere). No division for `Avg`.
pub(crate) async fn reduce_binomial<T: LocalTransport, E: Element>(
    ctx: &OpCtx<'_, T>,
    acc: &mut [E],
    op: ReduceOp,
    root: usize,
    tag: u32,
) -> Result<()> {
    let n = ctx.size();
    let order = ctx.tree_order(root);
    let vr = order.iter().position(|&r| r == ctx.rank()).expect("the tree holds every rank");
    let real = |v: usize| order[v];
    let mut mask = 1;
    while mask < n {
        if vr & mask == 0 {
            let child = vr | mask;
            if child < n {
                reduce_in(op, acc, &ctx.recv(real(child), tag).await?)?;
            }
        } else {
            return ctx.send_slice(real(vr - mask), tag, &*acc).await;
        }
        mask <<= 1;
    }
    Ok(())
}

/// Gathers `send` from every rank into `recv` at `root`, block `g` from rank `g`
/// (`counts[g]` elements; every rank passes the same `counts`). `recv` is used only at
/// the root, where it must hold the sum of `counts`.
///
/// # Errors
/// Root out of range; `send` not `counts[rank]` long; `recv` of the wrong length at
/// the root; mismatched signatures; peer failure; timeout; abort.
pub async fn gatherv<T: LocalTransport, E: Element>(
    ctx: OpCtx<'_, T>,
    send: &[E],
    recv: &mut [E],
    counts: &[usize],
    root: usize,
) -> Result<()> {
    let body = async {
        let (n, me) = (ctx.size(), ctx.rank());
        check_root(root, n)?;
        check_counts(counts, n, send.len(), me)?;
        if me != root {
            return ctx.send_slice(root, 0, send).await;
        }
        let off = offsets(counts);
        if recv.len() != off[n] {
            return Err(Error::invalid(format!("gather receive buffer holds {}, {} expected", recv.len(), off[n])));
        }
        let mut blocks = split_blocks(recv, &off);
        blocks[me].copy_from_slice(send);
        try_join_all(blocks.into_iter().enumerate().filter(|(g, _)| *g != me).map(|(g, blk)| ctx.recv_into(g, 0, blk)))
            .await?;
        Ok(())
    };
    let r = ctx.deadline(std::pin::pin!(agreed(&ctx, body))).await;
    ctx.finish(r)
}

/// Scatters `send` (at `root`: the sum of `counts` elements) so that rank `g`
/// receives block `g` (`counts[g]` elements) into `recv`. `send` is used only at the
/// root.
///
/// # Errors
/// As [`gatherv`], mirrored.
pub async fn scatterv<T: LocalTransport, E: Element>(
    ctx: OpCtx<'_, T>,
    send: &[E],
    recv: &mut [E],
    counts: &[usize],
    root: usize,
) -> Result<()> {
    let body = async {
        let (n, me) = (ctx.size(), ctx.rank());
        check_root(root, n)?;
        check_counts(counts, n, recv.len(), me)?;
        if me != root {
            return ctx.recv_into(root, 0, recv).await.map(drop);
        }
        let off = offsets(counts);
        if send.len() != off[n] {
            return Err(Error::invalid(format!("scatter send buffer holds {}, {} expected", send.len(), off[n])));
        }
        recv.copy_from_slice(&send[off[me]..off[me + 1]]);
        try_join_all((0..n).filter(|&g| g != me).map(|g| ctx.send_slice(g, 0, &send[off[g]..off[g + 1]]))).await?;
        Ok(())
    };
    let r = ctx.deadline(std::pin::pin!(agreed(&ctx, body))).await;
    ctx.finish(r)
}

pub(crate) fn check_counts(counts: &[usize], n: usize, mine: usize, me: usize) -> Result<()> {
    if counts.len() != n {
        return Err(Error::invalid(format!("{} counts for {n} ranks", counts.len())));
    }
    if counts[me] != mine {
        return Err(Error::invalid(format!("counts[{me}] is {} but this rank's buffer holds {mine}", counts[me])));
    }
    Ok(())
}

/// Cuts `buf` into consecutive blocks at `off` (prefix sums).
pub(crate) fn split_blocks<'b, E>(buf: &'b mut [E], off: &[usize]) -> Vec<&'b mut [E]> {
    let mut rest = buf;
    off.windows(2)
        .map(|w| {
            let (blk, tail) = std::mem::take(&mut rest).split_at_mut(w[1] - w[0]);
            rest = tail;
            blk
        })
        .collect()
}

/// Signature of a v-variant: the counts travel as a hash, so that ranks that pass
/// different counts find out.
pub fn v_signature<E: Element>(
    op: OpKind,
    counts: &[usize],
    reduce: Option<ReduceOp>,
    root: Option<usize>,
) -> Signature {
    Signature { op, dtype: Some(E::DTYPE), reduce, count: counts_hash(counts), root: root.map(|r| r as u32), algo: 0 }
}
