//! Prefix reductions.

use futures::future::try_join;
use hcomm_core::{Element, LocalTransport, ReduceOp, Result};

use crate::{OpCtx, agreed, check_reduce_op, reduce_in};

/// Inclusive (`exclusive == false`: rank `r` gets `x_0 op … op x_r`) or exclusive
/// (rank `r` gets `x_0 op … op x_{r-1}`; rank 0's buffer is left as it was) prefix
/// reduction, by recursive doubling: `ceil(log2 n)` steps, in step `k` each rank sends
/// its partial to rank `r + 2^k`. `Avg` divides by the number of ranks reduced.
///
/// # Errors
/// Operator undefined for `E`; mismatched signatures; peer failure; timeout; abort.
pub async fn scan<T: LocalTransport, E: Element>(
    ctx: OpCtx<'_, T>,
    buf: &mut [E],
    op: ReduceOp,
    exclusive: bool,
) -> Result<()> {
    let body = async {
        check_reduce_op::<E>(op)?;
        let (n, r) = (ctx.size(), ctx.rank());
        // `acc` is the reduction of x_{r-d+1..=r} so far; `below` that of the ranks
        // below r received so far (the exclusive prefix).
        let mut acc = buf.to_vec();
        let mut below: Option<Vec<E>> = None;
        let mut dist = 1;
        let mut step = 0u32;
        while dist < n {
            let send = (r + dist < n).then(|| ctx.send(r + dist, step, ctx.payload(&acc)));
            let recv = (r >= dist).then(|| ctx.recv(r - dist, step));
            let (_, got) = try_join(
                async {
                    match send {
                        Some(s) => s.await,
                        None => Ok(()),
                    }
                },
                async {
                    match recv {
                        Some(f) => f.await.map(Some),
                        None => Ok(None),
                    }
                },
            )
            .await?;
            if let Some(data) = got {
                // Everything received covers ranks below everything held: fold it in.
                reduce_in(op, &mut acc, &data)?;
                match &mut below {
                    Some(b) => reduce_in(op, b, &data)?,
                    None => below = Some(crate::to_vec(&data)?),
                }
            }
            dist <<= 1;
            step += 1;
        }
        if exclusive {
            if let Some(mut b) = below {
                if op == ReduceOp::Avg {
                    E::div_count(&mut b, r);
                }
                buf.copy_from_slice(&b);
            }
        } else {
            if op == ReduceOp::Avg {
                E::div_count(&mut acc, r + 1);
            }
            buf.copy_from_slice(&acc);
        }
        Ok(())
    };
    let r = ctx.deadline(std::pin::pin!(agreed(&ctx, body))).await;
    ctx.finish(r)
}
