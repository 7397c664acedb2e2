//! Element types and reduction operators, and the kernels that apply one to the other.

use std::fmt;

use half::{bf16, f16};

use crate::simd::zip;

/// The element type of a buffer, as it travels on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DType {
    U8 = 1,
    I8 = 2,
    U16 = 3,
    I16 = 4,
    U32 = 5,
    I32 = 6,
    U64 = 7,
    I64 = 8,
    F16 = 9,
    BF16 = 10,
    F32 = 11,
    F64 = 12,
}

impl DType {
    /// Every element type, in wire-code order.
    pub const ALL: [DType; 12] = [
        DType::U8,
        DType::I8,
        DType::U16,
        DType::I16,
        DType::U32,
        DType::I32,
        DType::U64,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::U8 | DType::I8 => 1,
            DType::U16 | DType::I16 | DType::F16 | DType::BF16 => 2,
            DType::U32 | DType::I32 | DType::F32 => 4,
            DType::U64 | DType::I64 | DType::F64 => 8,
        }
    }

    /// Whether this is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// Lower-case name, as in `f32`.
    pub const fn name(self) -> &'static str {
        match self {
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::U16 => "u16",
            DType::I16 => "i16",
            DType::U32 => "u32",
            DType::I32 => "i32",
            DType::U64 => "u64",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }

    /// Decodes a wire code; `None` for an unknown one.
    pub fn from_code(code: u8) -> Option<DType> {
        DType::ALL.get(usize::from(code).checked_sub(1)?).copied()
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A reduction operator.
///
/// `Avg` is defined for floating-point types only; the bitwise operators for integer
/// types only. [`ReduceOp::supports`] tells which pairs are valid; collectives reject
/// the others with an invalid-argument error before any communication.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReduceOp {
    Sum = 1,
    Prod = 2,
    Min = 3,
    Max = 4,
    Avg = 5,
    BAnd = 6,
    BOr = 7,
    BXor = 8,
}

impl ReduceOp {
    /// Every operator, in wire-code order.
    pub const ALL: [ReduceOp; 8] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
        ReduceOp::BAnd,
        ReduceOp::BOr,
        ReduceOp::BXor,
    ];

    /// Whether the operator is defined for `dtype`.
    pub const fn supports(self, dtype: DType) -> bool {
        match self {
            ReduceOp::Sum | ReduceOp::Prod | ReduceOp::Min | ReduceOp::Max => true,
            ReduceOp::Avg => dtype.is_float(),
            ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => !dtype.is_float(),
        }
    }

    /// Lower-case name, as in `sum`.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
            ReduceOp::BAnd => "band",
            ReduceOp::BOr => "bor",
            ReduceOp::BXor => "bxor",
        }
    }

    /// Decodes a wire code; `None` for an unknown one.
    pub fn from_code(code: u8) -> Option<ReduceOp> {
        ReduceOp::ALL.get(usize::from(code).checked_sub(1)?).copied()
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A type that can be sent and reduced: the primitive integers, `f32`, `f64`, and
/// [`half::f16`] / [`half::bf16`].
///
/// Sealed: the wire format and the reduction kernels know each type.
pub trait Element: bytemuck::Pod + Send + Sync + PartialEq + fmt::Debug + sealed::Sealed {
    /// The wire element type.
    const DTYPE: DType;

    /// `dst[i] = dst[i] op src[i]` for every `i`. `op` must support `Self::DTYPE`, and
    /// the slices must have equal lengths; `Avg` reduces as `Sum` (the division happens
    /// once, in [`Element::div_count`]).
    fn reduce(op: ReduceOp, dst: &mut [Self], src: &[Self]);

    /// Divides every element by `n`: the second half of `Avg`. Integers are left as
    /// they are, since `Avg` is defined for floats only.
    fn div_count(dst: &mut [Self], n: usize);
}

macro_rules! int_element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;

            fn reduce(op: ReduceOp, dst: &mut [Self], src: &[Self]) {
                assert_eq!(dst.len(), src.len(), "reduce: slice lengths differ");
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => zip(dst, src, <$t>::wrapping_add),
                    ReduceOp::Prod => zip(dst, src, <$t>::wrapping_mul),
                    ReduceOp::Min => zip(dst, src, Ord::min),
                    ReduceOp::Max => zip(dst, src, Ord::max),
                    ReduceOp::BAnd => zip(dst, src, |d, s| d & s),
                    ReduceOp::BOr => zip(dst, src, |d, s| d | s),
                    ReduceOp::BXor => zip(dst, src, |d, s| d ^ s),
                }
            }

            fn div_count(_dst: &mut [Self], _n: usize) {}
        }
    )*};
}

int_element!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, u64 => U64, i64 => I64);

macro_rules! float_element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;

            fn reduce(op: ReduceOp, dst: &mut [Self], src: &[Self]) {
                assert_eq!(dst.len(), src.len(), "reduce: slice lengths differ");
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => zip(dst, src, |d, s| d + s),
                    ReduceOp::Prod => zip(dst, src, |d, s| d * s),
                    ReduceOp::Min => zip(dst, src, <$t>::min),
                    ReduceOp::Max => zip(dst, src, <$t>::max),
                    ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => {
                        unreachable!("bitwise reduction of a float type is rejected before this point")
                    }
                }
            }

            fn div_count(dst: &mut [Self], n: usize) {
                let n = n as $t;
                dst.iter_mut().for_each(|d| *d /= n);
            }
        }
    )*};
}

float_element!(f32 => F32, f64 => F64);

/// Block size of the half-precision division of `Avg` (the reductions have their own, in
/// `crate::simd`).
const HALF_BLOCK: usize = 256;

/// Half-precision types reduce through `f32` (as NCCL and Gloo do on CPUs) and round
/// once per step: `bf16` by its exact widening and a branch-free rounding, `f16` by the
/// CPU's conversion instructions (F16C) where it has them; sums and products in one
/// pass with AVX2 where the CPU has it (`crate::simd`).
macro_rules! half_element {
    ($($t:ty => $d:ident, $reduce:path),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;

            fn reduce(op: ReduceOp, dst: &mut [Self], src: &[Self]) {
                assert_eq!(dst.len(), src.len(), "reduce: slice lengths differ");
                $reduce(op, dst, src)
            }

            fn div_count(dst: &mut [Self], n: usize) {
                use half::slice::HalfFloatSliceExt;
                let mut a = [0f32; HALF_BLOCK];
                for d in dst.chunks_mut(HALF_BLOCK) {
                    let a = &mut a[..d.len()];
                    d.convert_to_f32_slice(a);
                    f32::div_count(a, n);
                    d.convert_from_f32_slice(a);
                }
            }
        }
    )*};
}

half_element!(f16 => F16, crate::simd::f16_reduce, bf16 => BF16, crate::simd::bf16_reduce);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_code(d as u8), Some(d));
        }
        for op in ReduceOp::ALL {
            assert_eq!(ReduceOp::from_code(op as u8), Some(op));
        }
        assert_eq!(DType::from_code(0), None);
        assert_eq!(DType::from_code(13), None);
        assert_eq!(ReduceOp::from_code(0), None);
        assert_eq!(ReduceOp::from_code(9), None);
    }

    #[test]
    fn support_matrix() {
        assert!(ReduceOp::Avg.supports(DType::BF16));
        assert!(!ReduceOp::Avg.supports(DType::I32));
        assert!(ReduceOp::BXor.supports(DType::U8));
        assert!(!ReduceOp::BXor.supports(DType::F64));
    }

    #[test]
    fn kernels() {
        let mut a = [1i32, -5, 7, i32::MAX];
        i32::reduce(ReduceOp::Sum, &mut a, &[2, 5, -7, 1]);
        assert_eq!(a, [3, 0, 0, i32::MIN]);
        let mut b = [1.5f32, 2.0];
        f32::reduce(ReduceOp::Max, &mut b, &[1.0, 3.0]);
        assert_eq!(b, [1.5, 3.0]);
        let mut h = [f16::from_f32(1.0), f16::from_f32(4.0)];
        f16::reduce(ReduceOp::Avg, &mut h, &[f16::from_f32(3.0), f16::from_f32(0.0)]);
        f16::div_count(&mut h, 2);
        assert_eq!(h, [f16::from_f32(2.0), f16::from_f32(2.0)]);
        let mut u = [0b1100u8];
        u8::reduce(ReduceOp::BXor, &mut u, &[0b1010]);
        assert_eq!(u, [0b0110]);
    }
}
