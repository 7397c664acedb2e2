//! Moving typed elements in and out of byte payloads.

use hcomm_core::{Element, Error, ErrorKind, ReduceOp, Result};

fn check_len<E: Element>(dst: &[E], src: &[u8]) -> Result<()> {
    let want = std::mem::size_of_val(dst);
    if src.len() != want {
        return Err(Error::new(
            ErrorKind::Protocol,
            format!("payload of {} bytes where {want} bytes ({} x {}) were expected", src.len(), dst.len(), E::DTYPE),
        ));
    }
    Ok(())
}

/// Bytes of copying that count as one unit of tokio's cooperative budget in
/// [`cooperate`].
pub const COOP_BYTES: usize = 256 << 10;

/// Takes part in tokio's cooperative budget for `bytes` of copying this poll is about
/// to do: one unit per [`COOP_BYTES`], yielding (the task deferred, so that the
/// runtime polls its driver: timers, I/O) once the task's budget is spent. One poll of
/// a future that joins many large receives (a window of `recv_into`) otherwise copied
/// every completed one before returning, hundreds of MiB into freshly mapped pages on
/// one thread, with no heartbeat sent meanwhile. Outside a tokio runtime, and below
/// [`COOP_BYTES`], it does nothing.
pub async fn cooperate(bytes: usize) {
    for _ in 0..bytes / COOP_BYTES {
        tokio::task::coop::consume_budget().await;
    }
}

/// Copies a received payload into `dst`.
pub fn copy_in<E: Element>(dst: &mut [E], src: &[u8]) -> Result<()> {
    check_len(dst, src)?;
    bytemuck::cast_slice_mut::<E, u8>(dst).copy_from_slice(src);
    Ok(())
}

/// `dst = dst op src` for a received payload (copied to aligned memory first when the
/// payload is not aligned for `E`).
pub fn reduce_in<E: Element>(op: ReduceOp, dst: &mut [E], src: &[u8]) -> Result<()> {
    check_len(dst, src)?;
    match bytemuck::try_cast_slice::<u8, E>(src) {
        Ok(s) => E::reduce(op, dst, s),
        Err(_) => E::reduce(op, dst, &bytemuck::pod_collect_to_vec::<u8, E>(src)),
    }
    Ok(())
}

/// A payload as a vector of elements.
pub fn to_vec<E: Element>(src: &[u8]) -> Result<Vec<E>> {
    if !src.len().is_multiple_of(std::mem::size_of::<E>()) {
        return Err(Error::new(
            ErrorKind::Protocol,
            format!("payload of {} bytes is not a whole number of {}", src.len(), E::DTYPE),
        ));
    }
    Ok(bytemuck::pod_collect_to_vec(src))
}
