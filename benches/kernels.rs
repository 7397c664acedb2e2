//! Criterion benches of the hot kernels: the reduction of each element type, beside a
//! plain copy of the same bytes (the memory-bandwidth bound), and the wire header codec.
//! Two sizes: 256 KiB, a ring allreduce's piece, reduced while in the cache, and 4 MiB,
//! beyond a core's cache.
//!
//! cargo bench -p hcomm-core --bench kernels

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use hcomm_core::wire::Header;
use hcomm_core::{DType, Element, OpKind, ReduceOp, Signature, bf16, f16};

const SIZES: [usize; 2] = [256 << 10, 4 << 20];

fn reduce_one<E: Element + Default>(c: &mut Criterion, op: ReduceOp, bytes: usize) {
    let n = bytes / std::mem::size_of::<E>();
    let src: Vec<E> = vec![E::default(); n];
    let mut dst: Vec<E> = vec![E::default(); n];
    let mut g = c.benchmark_group("reduce");
    // Reported against the buffer size, as collective bandwidths are.
    g.throughput(Throughput::Bytes(bytes as u64));
    g.bench_function(BenchmarkId::new(format!("{}-{op}", E::DTYPE), bytes), |b| {
        b.iter(|| E::reduce(op, black_box(&mut dst), black_box(&src)))
    });
    g.finish();
}

fn memcpy(c: &mut Criterion, bytes: usize) {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    let mut g = c.benchmark_group("reduce");
    g.throughput(Throughput::Bytes(bytes as u64));
    g.bench_function(BenchmarkId::new("memcpy", bytes), |b| {
        b.iter(|| black_box(&mut dst).copy_from_slice(black_box(&src)))
    });
    g.finish();
}

fn kernels(c: &mut Criterion) {
    for bytes in SIZES {
        memcpy(c, bytes);
        reduce_one::<f32>(c, ReduceOp::Sum, bytes);
        reduce_one::<f64>(c, ReduceOp::Sum, bytes);
        reduce_one::<f16>(c, ReduceOp::Sum, bytes);
        reduce_one::<bf16>(c, ReduceOp::Sum, bytes);
        reduce_one::<i32>(c, ReduceOp::Sum, bytes);
        reduce_one::<u8>(c, ReduceOp::Max, bytes);
        reduce_one::<i64>(c, ReduceOp::BXor, bytes);
    }
}

fn codec(c: &mut Criterion) {
    let sig = Signature {
        op: OpKind::AllReduce,
        dtype: Some(DType::F32),
        reduce: Some(ReduceOp::Sum),
        count: 1 << 20,
        root: None,
        algo: 0,
    };
    let h = Header::data(3, 9, 12345, 77, &sig, 4096);
    let bytes = h.encode();
    c.bench_function("wire/encode", |b| b.iter(|| black_box(black_box(&h).encode())));
    c.bench_function("wire/decode", |b| b.iter(|| Header::decode(black_box(&bytes))));
}

criterion_group!(benches, kernels, codec);
criterion_main!(benches);
