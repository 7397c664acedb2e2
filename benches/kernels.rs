//! Criterion benches of the hot kernels: the reduction of each element type, beside a
//! plain copy of the same bytes (the memory-bandwidth bound), and the wire header codec.
//!
//! cargo bench -p hcomm-core --bench kernels

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use hcomm_core::wire::Header;
use hcomm_core::{DType, Element, OpKind, ReduceOp, Signature, bf16, f16};

const BYTES: usize = 4 << 20;

fn reduce_one<E: Element + Default>(c: &mut Criterion, op: ReduceOp) {
    let n = BYTES / std::mem::size_of::<E>();
    let src: Vec<E> = vec![E::default(); n];
    let mut dst: Vec<E> = vec![E::default(); n];
    let mut g = c.benchmark_group("reduce");
    // Reported against the buffer size, as collective bandwidths are.
    g.throughput(Throughput::Bytes(BYTES as u64));
    g.bench_function(BenchmarkId::new(format!("{}-{op}", E::DTYPE), BYTES), |b| {
        b.iter(|| E::reduce(op, black_box(&mut dst), black_box(&src)))
    });
    g.finish();
}

fn memcpy(c: &mut Criterion) {
    let src = vec![1u8; BYTES];
    let mut dst = vec![0u8; BYTES];
    let mut g = c.benchmark_group("reduce");
    g.throughput(Throughput::Bytes(BYTES as u64));
    g.bench_function(BenchmarkId::new("memcpy", BYTES), |b| {
        b.iter(|| black_box(&mut dst).copy_from_slice(black_box(&src)))
    });
    g.finish();
}

fn kernels(c: &mut Criterion) {
    memcpy(c);
    reduce_one::<f32>(c, ReduceOp::Sum);
    reduce_one::<f64>(c, ReduceOp::Sum);
    reduce_one::<f16>(c, ReduceOp::Sum);
    reduce_one::<bf16>(c, ReduceOp::Sum);
    reduce_one::<i32>(c, ReduceOp::Sum);
    reduce_one::<u8>(c, ReduceOp::Max);
    reduce_one::<i64>(c, ReduceOp::BXor);
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
