//! A process-wide pool of large byte buffers, reused across messages.
//!
//! Every large message needs a buffer on each side: the sender's payload and the
//! receiver's reassembly buffer. Freshly allocated, such a buffer costs more than the
//! copy into it: glibc serves large requests with `mmap` (or grows the heap and trims
//! it again on free), so every message takes one page fault per 4 KiB page it
//! touches, and the kernel clears each page first. A profile of a 1 MiB bandwidth run
//! spent more time in those faults than in the copies themselves.
//!
//! Buffers of [`MIN_POOLED`] bytes and more come from size classes (powers of two).
//! A [`PoolBuf`] is an ordinary [`BytesMut`] while it is filled; [`PoolBuf::freeze`]
//! turns it into [`Bytes`] whose last clone, when dropped, gives the memory back to
//! its class instead of to the allocator. The pool keeps at most [`limit`] bytes
//! (512 MiB unless [`set_limit`] says otherwise: 64 messages of 4 MiB in flight, an
//! osu_bw window, fit; at 256 MiB that window's bandwidth halved); buffers beyond
//! that are freed.
//! Pooled memory stays resident, as the registration caches of MPI libraries do.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;

/// Smaller buffers come from the allocator directly (its small-size bins do not
/// fault pages in and out).
pub const MIN_POOLED: usize = 64 << 10;
const MIN_SHIFT: u32 = MIN_POOLED.trailing_zeros();
/// Classes from 64 KiB to 1 GiB.
const CLASSES: usize = 15;
const DEFAULT_LIMIT: usize = 512 << 20;

struct Pool {
    classes: [Mutex<Vec<BytesMut>>; CLASSES],
    /// Bytes held in the classes.
    held: AtomicUsize,
    limit: AtomicUsize,
}

static POOL: Pool = Pool {
    classes: [const { Mutex::new(Vec::new()) }; CLASSES],
    held: AtomicUsize::new(0),
    limit: AtomicUsize::new(DEFAULT_LIMIT),
};

/// The class whose buffers hold at least `len` bytes.
fn class_for(len: usize) -> Option<usize> {
    let shift = len.max(MIN_POOLED).next_power_of_two().trailing_zeros();
    let c = (shift - MIN_SHIFT) as usize;
    (c < CLASSES).then_some(c)
}

/// The class a buffer of `capacity` bytes can serve (the largest not above it).
fn class_of(capacity: usize) -> Option<usize> {
    if capacity < MIN_POOLED {
        return None;
    }
    let c = (usize::BITS - 1 - capacity.leading_zeros() - MIN_SHIFT) as usize;
    Some(c.min(CLASSES - 1))
}

/// The most bytes the pool keeps for reuse.
pub fn limit() -> usize {
    POOL.limit.load(Ordering::Relaxed)
}

/// Sets the most bytes the pool keeps for reuse (0 turns reuse off). Buffers already
/// held stay until taken.
pub fn set_limit(bytes: usize) {
    POOL.limit.store(bytes, Ordering::Relaxed);
}

/// Bytes the pool holds for reuse now.
pub fn held() -> usize {
    POOL.held.load(Ordering::Relaxed)
}

/// An empty buffer with room for at least `len` bytes: from the pool when `len` is
/// at least [`MIN_POOLED`], else from the allocator. Its contents are not zeroed.
pub fn take(len: usize) -> PoolBuf {
    let c = match class_for(len) {
        Some(c) if len >= MIN_POOLED => c,
        // Small, or beyond the largest class: a plain allocation.
        _ => return PoolBuf { buf: BytesMut::with_capacity(len), pooled: false },
    };
    if let Some(buf) = POOL.classes[c].lock().pop() {
        POOL.held.fetch_sub(buf.capacity(), Ordering::Relaxed);
        return PoolBuf { buf, pooled: true };
    }
    PoolBuf { buf: BytesMut::with_capacity(MIN_POOLED << c), pooled: true }
}

fn give_back(mut buf: BytesMut) {
    let Some(c) = class_of(buf.capacity()) else { return };
    let cap = buf.capacity();
    if POOL.held.fetch_add(cap, Ordering::Relaxed) + cap > limit() {
        POOL.held.fetch_sub(cap, Ordering::Relaxed);
        return;
    }
    buf.clear();
    POOL.classes[c].lock().push(buf);
}

/// A buffer from [`take`]: a [`BytesMut`] to fill, then [`freeze`](PoolBuf::freeze).
/// Dropped unfrozen, it goes back to the pool.
#[derive(Debug, Default)]
pub struct PoolBuf {
    buf: BytesMut,
    pooled: bool,
}

impl PoolBuf {
    /// The filled bytes as [`Bytes`]; the memory returns to the pool when the last
    /// clone is dropped.
    pub fn freeze(mut self) -> Bytes {
        let buf = std::mem::take(&mut self.buf);
        if std::mem::take(&mut self.pooled) { Bytes::from_owner(Owner(buf)) } else { buf.freeze() }
    }
}

impl Deref for PoolBuf {
    type Target = BytesMut;
    fn deref(&self) -> &BytesMut {
        &self.buf
    }
}

impl DerefMut for PoolBuf {
    fn deref_mut(&mut self) -> &mut BytesMut {
        &mut self.buf
    }
}

impl Drop for PoolBuf {
    fn drop(&mut self) {
        if self.pooled {
            give_back(std::mem::take(&mut self.buf));
        }
    }
}

/// Owns a pooled buffer behind a [`Bytes`].
struct Owner(BytesMut);

impl AsRef<[u8]> for Owner {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        give_back(std::mem::take(&mut self.0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_their_sizes() {
        assert_eq!(class_for(1), Some(0));
        assert_eq!(class_for(MIN_POOLED), Some(0));
        assert_eq!(class_for(MIN_POOLED + 1), Some(1));
        assert_eq!(class_for(1 << 30), Some(CLASSES - 1));
        assert_eq!(class_for((1 << 30) + 1), None);
        assert_eq!(class_of(MIN_POOLED - 1), None);
        assert_eq!(class_of(MIN_POOLED), Some(0));
        assert_eq!(class_of(3 * MIN_POOLED), Some(1));
        assert_eq!(class_of(usize::MAX / 2), Some(CLASSES - 1));
        for len in [MIN_POOLED, 100_000, 1 << 20, (1 << 20) + 3, 5 << 20] {
            let c = class_for(len).unwrap();
            assert!(MIN_POOLED << c >= len);
            assert_eq!(class_of(MIN_POOLED << c), Some(c));
        }
    }

    /// One test touches the global pool, so that counts are not disturbed by others.
    #[test]
    fn memory_is_reused_and_bounded() {
        // Small buffers are not pooled.
        let small = take(100);
        assert!(!small.pooled);
        drop(small.freeze());

        // A frozen buffer's memory comes back when its last clone goes.
        let len = 300_000;
        let mut b = take(len);
        assert!(b.capacity() >= len);
        b.extend_from_slice(&vec![7u8; len]);
        let ptr = b.as_ptr();
        let frozen = b.freeze();
        let clone = frozen.slice(10..20);
        assert_eq!(frozen.len(), len);
        assert!(frozen.iter().all(|&x| x == 7));
        drop(frozen);
        assert_eq!(clone[..], [7; 10]);
        let before = held();
        drop(clone);
        assert!(held() >= before + len);
        let again = take(len);
        assert_eq!(again.as_ptr(), ptr, "the same memory is handed out again");
        assert!(again.is_empty(), "a reused buffer starts empty");
        drop(again);

        // Over the limit, buffers are freed instead.
        let old = limit();
        set_limit(0);
        let b = take(len);
        let h = held();
        drop(b);
        assert_eq!(held(), h);
        set_limit(old);
    }
}
