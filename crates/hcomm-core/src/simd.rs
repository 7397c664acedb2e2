//! The reduction kernels' loops, compiled twice on x86-64: for the baseline (SSE2, what
//! a release build targets) and for AVX2 with F16C, chosen at run time by what the
//! processor has (as OpenMPI's AVX reduction component does). Same results either
//! way: every element is computed alone, by the same Rust operation, so the vector
//! width changes no bit (the half-precision conversions round to nearest even in both
//! paths; a NaN stays a NaN, with its payload truncated alike).
//!
//! `cargo bench -p hcomm-core --bench kernels` measures them; the half-precision
//! types gain the most, since their conversions vectorise with F16C.
#![allow(unsafe_code)] // `#[target_feature]` functions, called once the CPU is known to have them

use half::{bf16, f16};

use crate::dtype::ReduceOp;

/// Elements converted to `f32` at a time by the half-precision kernels (two blocks of
/// 16 KiB: within a core's first-level cache beside the data).
const HALF_BLOCK: usize = 4096;

/// Whether this processor has AVX2 and F16C (detected once; `is_x86_feature_detected`
/// caches too, but this is one load on the reduction's path).
#[cfg(target_arch = "x86_64")]
pub(crate) fn wide() -> bool {
    use std::sync::atomic::{AtomicU8, Ordering};
    static WIDE: AtomicU8 = AtomicU8::new(0);
    match WIDE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let has = std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c");
            WIDE.store(if has { 2 } else { 1 }, Ordering::Relaxed);
            has
        }
    }
}

/// `dst[i] = f(dst[i], src[i])` over the shorter of the two.
#[inline(always)]
fn zip_in<T: Copy>(dst: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = f(*d, *s);
    }
}

/// [`zip_in`] compiled for AVX2.
///
/// # Safety
/// The processor must have AVX2 ([`wide`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn zip_avx2<T: Copy>(dst: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    zip_in(dst, src, f)
}

/// `dst[i] = f(dst[i], src[i])`, with AVX2 where the processor has it.
#[inline]
pub(crate) fn zip<T: Copy>(dst: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    #[cfg(target_arch = "x86_64")]
    if wide() {
        // SAFETY: `wide` found AVX2.
        return unsafe { zip_avx2(dst, src, f) };
    }
    zip_in(dst, src, f)
}

/// `bf16` to `f32`: exact (the upper half of the `f32`).
#[inline(always)]
fn bf16_to_f32(b: bf16) -> f32 {
    f32::from_bits(u32::from(b.to_bits()) << 16)
}

/// `f32` to `bf16`, rounded to nearest even, as `bf16::from_f32` does (a NaN keeps its
/// sign and upper payload and becomes quiet), written without branches so that the
/// loop around it is vectorized.
#[inline(always)]
fn f32_to_bf16(f: f32) -> bf16 {
    let x = f.to_bits();
    let upper = (x >> 16) as u16;
    let nan = (x & 0x7FFF_FFFF) > 0x7F80_0000;
    // Round up when the dropped half is above a half, or exactly a half and the kept
    // part odd.
    let up = (x & 0x8000) != 0 && (x & 0x1_7FFF) != 0;
    bf16::from_bits(if nan { upper | 0x0040 } else { upper.wrapping_add(u16::from(up)) })
}

/// The `bf16` reduction through `f32`: each element converted, combined by `f`, and
/// rounded back once.
#[inline(always)]
fn bf16_in(dst: &mut [bf16], src: &[bf16], f: impl Fn(f32, f32) -> f32) {
    zip_in(dst, src, |d, s| f32_to_bf16(f(bf16_to_f32(d), bf16_to_f32(s))))
}

/// [`bf16_in`] compiled for AVX2.
///
/// # Safety
/// The processor must have AVX2 ([`wide`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn bf16_avx2(dst: &mut [bf16], src: &[bf16], f: impl Fn(f32, f32) -> f32) {
    bf16_in(dst, src, f)
}

/// `dst[i] = bf16(f(f32(dst[i]), f32(src[i])))`, with AVX2 where the processor has it.
pub(crate) fn bf16_zip(dst: &mut [bf16], src: &[bf16], f: impl Fn(f32, f32) -> f32) {
    #[cfg(target_arch = "x86_64")]
    if wide() {
        // SAFETY: `wide` found AVX2.
        return unsafe { bf16_avx2(dst, src, f) };
    }
    bf16_in(dst, src, f)
}

/// `dst[i] = f16(f(f32(dst[i]), f32(src[i])))`: with F16C's conversions and AVX2
/// where the processor has them, otherwise through `half`'s slice conversions, a
/// block at a time.
pub(crate) fn f16_zip(dst: &mut [f16], src: &[f16], f: impl Fn(f32, f32) -> f32) {
    #[cfg(target_arch = "x86_64")]
    if wide() {
        // SAFETY: `wide` found AVX2 and F16C.
        return unsafe { f16_avx2(dst, src, f) };
    }
    use half::slice::HalfFloatSliceExt;
    let mut a = [0f32; HALF_BLOCK];
    let mut b = [0f32; HALF_BLOCK];
    for (d, s) in dst.chunks_mut(HALF_BLOCK).zip(src.chunks(HALF_BLOCK)) {
        let n = d.len().min(s.len());
        let (a, b) = (&mut a[..n], &mut b[..n]);
        d[..n].convert_to_f32_slice(a);
        s[..n].convert_to_f32_slice(b);
        zip_in(a, b, &f);
        d[..n].convert_from_f32_slice(a);
    }
}

/// [`f16_zip`] with F16C's conversions, eight elements at a time, and the `f32`
/// combination compiled for AVX2.
///
/// # Safety
/// The processor must have AVX2 and F16C ([`wide`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn f16_avx2(dst: &mut [f16], src: &[f16], f: impl Fn(f32, f32) -> f32) {
    use std::arch::x86_64::{
        __m128i, _MM_FROUND_TO_NEAREST_INT, _mm_loadu_si128, _mm_storeu_si128, _mm256_cvtph_ps, _mm256_cvtps_ph,
        _mm256_loadu_ps, _mm256_storeu_ps,
    };
    let mut a = [0f32; HALF_BLOCK];
    let mut b = [0f32; HALF_BLOCK];
    for (d, s) in dst.chunks_mut(HALF_BLOCK).zip(src.chunks(HALF_BLOCK)) {
        let n = d.len().min(s.len());
        let (a, b) = (&mut a[..n], &mut b[..n]);
        let whole = n - n % 8;
        let mut i = 0;
        while i < whole {
            // SAFETY: `i + 8 <= n`, within `d`, `s`, `a` and `b`; unaligned loads and
            // stores; F16C and AVX are enabled on this function.
            unsafe {
                let x = _mm_loadu_si128(d.as_ptr().add(i).cast::<__m128i>());
                let y = _mm_loadu_si128(s.as_ptr().add(i).cast::<__m128i>());
                _mm256_storeu_ps(a.as_mut_ptr().add(i), _mm256_cvtph_ps(x));
                _mm256_storeu_ps(b.as_mut_ptr().add(i), _mm256_cvtph_ps(y));
            }
            i += 8;
        }
        for j in whole..n {
            a[j] = d[j].to_f32();
            b[j] = s[j].to_f32();
        }
        zip_in(a, b, &f);
        let mut i = 0;
        while i < whole {
            // SAFETY: as above.
            unsafe {
                let v = _mm256_loadu_ps(a.as_ptr().add(i));
                _mm_storeu_si128(
                    d.as_mut_ptr().add(i).cast::<__m128i>(),
                    _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v),
                );
            }
            i += 8;
        }
        for j in whole..n {
            d[j] = f16::from_f32(a[j]);
        }
    }
}

/// An `f32` operation of eight lanes at once that gives, lane by lane, the bits of the
/// Rust operation it stands for (`+` or `*`: IEEE arithmetic, rounded to nearest).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
enum Lanes {
    Add,
    Mul,
}

#[cfg(target_arch = "x86_64")]
impl Lanes {
    #[inline(always)]
    fn scalar(self, a: f32, b: f32) -> f32 {
        match self {
            Lanes::Add => a + b,
            Lanes::Mul => a * b,
        }
    }

    /// # Safety
    /// The processor must have AVX.
    #[inline]
    #[target_feature(enable = "avx")]
    unsafe fn apply(self, a: std::arch::x86_64::__m256, b: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::{_mm256_add_ps, _mm256_mul_ps};
        match self {
            Lanes::Add => _mm256_add_ps(a, b),
            Lanes::Mul => _mm256_mul_ps(a, b),
        }
    }
}

/// `dst[i] = f16(f32(dst[i]) op f32(src[i]))` in one pass, eight elements at a time
/// (F16C's conversions round to nearest even, as `f16::from_f32` does).
///
/// # Safety
/// The processor must have AVX2 and F16C ([`wide`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn f16_fused(dst: &mut [f16], src: &[f16], op: Lanes) {
    use std::arch::x86_64::{
        __m128i, _MM_FROUND_TO_NEAREST_INT, _mm_loadu_si128, _mm_storeu_si128, _mm256_cvtph_ps, _mm256_cvtps_ph,
    };
    let n = dst.len().min(src.len());
    let whole = n - n % 8;
    let mut i = 0;
    while i < whole {
        // SAFETY: `i + 8 <= n`: eight elements of each slice; unaligned loads and
        // stores; AVX2 and F16C are enabled on this function.
        unsafe {
            let x = _mm256_cvtph_ps(_mm_loadu_si128(dst.as_ptr().add(i).cast::<__m128i>()));
            let y = _mm256_cvtph_ps(_mm_loadu_si128(src.as_ptr().add(i).cast::<__m128i>()));
            let r = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(op.apply(x, y));
            _mm_storeu_si128(dst.as_mut_ptr().add(i).cast::<__m128i>(), r);
        }
        i += 8;
    }
    for j in whole..n {
        dst[j] = f16::from_f32(op.scalar(dst[j].to_f32(), src[j].to_f32()));
    }
}

/// `dst[i] = bf16(f32(dst[i]) op f32(src[i]))` in one pass, sixteen elements at a
/// time, rounded as [`f32_to_bf16`] rounds.
///
/// # Safety
/// The processor must have AVX2 ([`wide`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn bf16_fused(dst: &mut [bf16], src: &[bf16], op: Lanes) {
    use std::arch::x86_64::{
        __m128i, __m256i, _mm_loadu_si128, _mm256_add_epi32, _mm256_and_si256, _mm256_castps_si256,
        _mm256_castsi256_ps, _mm256_cvtepu16_epi32, _mm256_packus_epi32, _mm256_permute4x64_epi64, _mm256_set1_epi32,
        _mm256_slli_epi32, _mm256_srli_epi32, _mm256_storeu_si256,
    };
    let n = dst.len().min(src.len());
    let whole = n - n % 16;
    let (one, half_less) = (_mm256_set1_epi32(1), _mm256_set1_epi32(0x7FFF));
    // Eight elements from `p` widened to `f32` bits.
    let widen = |p: *const bf16| {
        // SAFETY: the callers below read eight elements within their slices; AVX2 is
        // enabled on this function, into which the closure is inlined.
        unsafe { _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast::<__m128i>()))) }
    };
    // Eight `f32` results to `bf16` bits in their 32-bit lanes: round to nearest even
    // (add just under a half, plus the kept part's last bit). A NaN needs no case of
    // its own here, unlike in `f32_to_bf16`: the sum or product of two widened
    // `bf16` is a NaN only as one of them made quiet or as the default NaN, both with
    // the lower half zero and the quiet bit set, so the addition leaves the upper half
    // as it is, `upper | 0x0040`, what `bf16::from_f32` gives.
    let narrow = |r: __m256i| {
        let upper = _mm256_srli_epi32::<16>(r);
        _mm256_srli_epi32::<16>(_mm256_add_epi32(r, _mm256_add_epi32(half_less, _mm256_and_si256(upper, one))))
    };
    let mut i = 0;
    while i < whole {
        // SAFETY: `i + 16 <= n`: sixteen elements of each slice; unaligned loads and
        // stores; AVX2 is enabled on this function.
        unsafe {
            let (d, s) = (dst.as_ptr().add(i), src.as_ptr().add(i));
            let lo = _mm256_castps_si256(op.apply(_mm256_castsi256_ps(widen(d)), _mm256_castsi256_ps(widen(s))));
            let hi = _mm256_castps_si256(
                op.apply(_mm256_castsi256_ps(widen(d.add(8))), _mm256_castsi256_ps(widen(s.add(8)))),
            );
            // Sixteen 32-bit lanes, each below 2^16, to sixteen 16-bit ones: the pack
            // interleaves the halves' 128-bit lanes, the permutation puts them in order.
            let packed = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(narrow(lo), narrow(hi)));
            _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast::<__m256i>(), packed);
        }
        i += 16;
    }
    for j in whole..n {
        dst[j] = f32_to_bf16(op.scalar(bf16_to_f32(dst[j]), bf16_to_f32(src[j])));
    }
}

/// The half-precision reduction by `op` (`Avg` as `Sum`) of `$t`: sums and products in
/// one pass (`$fused`) where the processor has AVX2 and F16C, the rest (and everything
/// elsewhere) combined in `f32` by `$zip`.
macro_rules! half_reduce {
    ($(#[$doc:meta])* $name:ident, $t:ty, $fused:ident, $zip:ident) => {
        $(#[$doc])*
        pub(crate) fn $name(op: ReduceOp, dst: &mut [$t], src: &[$t]) {
            #[cfg(target_arch = "x86_64")]
            if wide() && matches!(op, ReduceOp::Sum | ReduceOp::Avg | ReduceOp::Prod) {
                let lanes = if op == ReduceOp::Prod { Lanes::Mul } else { Lanes::Add };
                // SAFETY: `wide` found AVX2 and F16C.
                return unsafe { $fused(dst, src, lanes) };
            }
            match op {
                ReduceOp::Sum | ReduceOp::Avg => $zip(dst, src, |d, s| d + s),
                ReduceOp::Prod => $zip(dst, src, |d, s| d * s),
                ReduceOp::Min => $zip(dst, src, f32::min),
                ReduceOp::Max => $zip(dst, src, f32::max),
                ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => {
                    unreachable!("bitwise reduction of a float type is rejected before this point")
                }
            }
        }
    };
}

half_reduce!(
    /// The `f16` reduction by `op` (`Avg` as `Sum`): sums and products in one pass with
    /// F16C where the processor has it and AVX2, the rest through `f32` blocks
    /// ([`f16_zip`]).
    f16_reduce, f16, f16_fused, f16_zip
);
half_reduce!(
    /// The `bf16` reduction by `op` (`Avg` as `Sum`), as [`f16_reduce`].
    bf16_reduce, bf16, bf16_fused, bf16_zip
);

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Bit patterns of every kind: random, and the special values around them.
    fn patterns16(n: usize, seed: u64) -> Vec<u16> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let special = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0x7C00, 0xFC00, 0x7C01, 0x7E00, 0xFFFF];
        let special_bf = [0x0000, 0x8000, 0x0001, 0x007F, 0x0080, 0x7F7F, 0x7F80, 0xFF80, 0x7F81, 0x7FC0, 0xFFFF];
        (0..n)
            .map(|i| match i % 7 {
                0 => special[i / 7 % special.len()],
                1 => special_bf[i / 7 % special_bf.len()],
                _ => rng.random(),
            })
            .collect()
    }

    fn same_f32(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    /// Every f32 a bf16 conversion can meet, near the rounding boundaries above all:
    /// the branch-free conversion gives `half`'s bits.
    #[test]
    fn bf16_rounding_matches_half() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let check = |x: u32| {
            let f = f32::from_bits(x);
            let (ours, theirs) = (f32_to_bf16(f), bf16::from_f32(f));
            assert!(ours.to_bits() == theirs.to_bits() || (ours.is_nan() && theirs.is_nan()), "{x:#010x}");
            assert_eq!(ours.is_nan(), theirs.is_nan(), "{x:#010x}");
        };
        for _ in 0..200_000 {
            let x: u32 = rng.random();
            check(x);
            // The same upper half with the lower half at and around one half.
            for low in [0x0000, 0x7FFF, 0x8000, 0x8001, 0xFFFF] {
                check((x & 0xFFFF_0000) | low);
            }
        }
        for x in [0x7F7F_FFFF, 0x7F80_0000, 0xFF80_0000, 0x7F80_0001, 0x7FC0_0000, 0xFFFF_FFFF, 0x0000_8000] {
            check(x);
        }
    }

    /// Both half-precision paths, on every length to a few blocks and across a block's
    /// end, against the per-element reference (`half`'s conversions, `f32` arithmetic).
    #[test]
    fn half_kernels_match_the_per_element_reference() {
        type Pair = (ReduceOp, fn(f32, f32) -> f32);
        let ops: [Pair; 5] = [
            (ReduceOp::Sum, |a, b| a + b),
            (ReduceOp::Avg, |a, b| a + b),
            (ReduceOp::Prod, |a, b| a * b),
            (ReduceOp::Min, f32::min),
            (ReduceOp::Max, f32::max),
        ];
        for len in (0..40).chain([HALF_BLOCK - 1, HALF_BLOCK, HALF_BLOCK + 9, 3 * HALF_BLOCK + 5]) {
            let x = patterns16(len, len as u64);
            let y = patterns16(len, 1000 + len as u64);
            for (op, f) in ops {
                let mut d: Vec<f16> = x.iter().map(|&b| f16::from_bits(b)).collect();
                let s: Vec<f16> = y.iter().map(|&b| f16::from_bits(b)).collect();
                let want: Vec<f16> = d.iter().zip(&s).map(|(a, b)| f16::from_f32(f(a.to_f32(), b.to_f32()))).collect();
                f16_reduce(op, &mut d, &s);
                for i in 0..len {
                    assert!(same_f32(d[i].to_f32(), want[i].to_f32()), "f16 {op} len {len} at {i}");
                }
                let mut d: Vec<bf16> = x.iter().map(|&b| bf16::from_bits(b)).collect();
                let s: Vec<bf16> = y.iter().map(|&b| bf16::from_bits(b)).collect();
                let want: Vec<bf16> =
                    d.iter().zip(&s).map(|(a, b)| bf16::from_f32(f(a.to_f32(), b.to_f32()))).collect();
                bf16_reduce(op, &mut d, &s);
                for i in 0..len {
                    assert!(same_f32(d[i].to_f32(), want[i].to_f32()), "bf16 {op} len {len} at {i}");
                }
            }
        }
    }

    /// The AVX2 and the baseline loops give the same bits (where this processor has
    /// AVX2; elsewhere there is one path).
    #[test]
    fn wide_and_baseline_agree() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for len in [0, 1, 7, 8, 9, 31, 1000, 4099] {
            let a: Vec<f32> = (0..len).map(|_| f32::from_bits(rng.random())).collect();
            let b: Vec<f32> = (0..len).map(|_| f32::from_bits(rng.random())).collect();
            for f in [|x: f32, y: f32| x + y, |x: f32, y: f32| x * y, f32::min, f32::max] {
                let (mut p, mut q) = (a.clone(), a.clone());
                zip_in(&mut p, &b, f);
                zip(&mut q, &b, f);
                assert!(p.iter().zip(&q).all(|(x, y)| same_f32(*x, *y)), "len {len}");
            }
            let (mut p, mut q) = (a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), Vec::new());
            q.clone_from(&p);
            let bits: Vec<u32> = b.iter().map(|x| x.to_bits()).collect();
            zip_in(&mut p, &bits, u32::wrapping_add);
            zip(&mut q, &bits, u32::wrapping_add);
            assert_eq!(p, q);
        }
    }
}
