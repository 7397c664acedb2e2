//! Shared test helpers: random data per element type, the sequential reference, and
//! runners that drive every rank's future at once.
#![allow(dead_code)]

use futures::future::join_all;
use hcomm::{
    AllgatherAlgo, AllreduceAlgo, AlltoallAlgo, BcastAlgo, Communicator, DType, Element, LocalTransport, Measured,
    ReduceOp, ReduceScatterAlgo, bf16, f16,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// An element type as the tests see it.
pub trait TestElem: Element + Copy {
    /// Machine epsilon of the type (0 for integers: results must be exact).
    const EPS: f64;
    fn random(rng: &mut StdRng, op: ReduceOp) -> Self;
    fn to_f64(self) -> f64;
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl TestElem for $t {
            const EPS: f64 = 0.0;
            fn random(rng: &mut StdRng, _op: ReduceOp) -> Self { rng.random() }
            fn to_f64(self) -> f64 { self as f64 }
        }
    )*};
}
int_elem!(u8, i8, u16, i16, u32, i32, u64, i64);

fn gen_f32(rng: &mut StdRng, op: ReduceOp) -> f32 {
    match op {
        // Products of up to 16 factors in [0.5, 1.5] stay in range.
        ReduceOp::Prod => rng.random_range(0.5f32..1.5),
        _ => rng.random_range(-1.0f32..1.0),
    }
}

impl TestElem for f32 {
    const EPS: f64 = f32::EPSILON as f64;
    fn random(rng: &mut StdRng, op: ReduceOp) -> Self {
        gen_f32(rng, op)
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
}
impl TestElem for f64 {
    const EPS: f64 = f64::EPSILON;
    fn random(rng: &mut StdRng, op: ReduceOp) -> Self {
        gen_f32(rng, op) as f64 + rng.random_range(0.0..1e-9)
    }
    fn to_f64(self) -> f64 {
        self
    }
}
impl TestElem for f16 {
    const EPS: f64 = 0.000_976_562_5; // 2^-10
    fn random(rng: &mut StdRng, op: ReduceOp) -> Self {
        f16::from_f32(gen_f32(rng, op))
    }
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
}
impl TestElem for bf16 {
    const EPS: f64 = 0.007_812_5; // 2^-7
    fn random(rng: &mut StdRng, op: ReduceOp) -> Self {
        bf16::from_f32(gen_f32(rng, op))
    }
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
}

pub fn inputs<E: TestElem>(n: usize, count: usize, op: ReduceOp, seed: u64) -> Vec<Vec<E>> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| (0..count).map(|_| E::random(&mut rng, op)).collect()).collect()
}

/// Checks `got` against the sequential reduction of `inputs`: integers exactly (with
/// the same wrapping arithmetic), floats in f64 within `4 · eps · n · Σ|x|` (sums) or
/// `4 · eps · n · Π|x|` (products); min and max exactly.
pub fn check_against_reference<E: TestElem>(inputs: &[Vec<E>], op: ReduceOp, got: &[E], what: &str) {
    let n = inputs.len();
    assert_eq!(got.len(), inputs[0].len(), "{what}: length");
    if !E::DTYPE.is_float() {
        let mut want = inputs[0].clone();
        for x in &inputs[1..] {
            E::reduce(op, &mut want, x);
        }
        if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
            panic!("{what}: element {i} is {:?}, expected {:?}", got[i], want[i]);
        }
        return;
    }
    for i in 0..got.len() {
        let xs = inputs.iter().map(|v| v[i].to_f64());
        let (want, tol) = match op {
            ReduceOp::Sum => (xs.clone().sum::<f64>(), xs.map(f64::abs).sum::<f64>()),
            ReduceOp::Avg => (xs.clone().sum::<f64>() / n as f64, xs.map(f64::abs).sum::<f64>() / n as f64),
            ReduceOp::Prod => {
                let p = xs.clone().product::<f64>();
                (p, p.abs())
            }
            ReduceOp::Min => (xs.fold(f64::INFINITY, f64::min), 0.0),
            ReduceOp::Max => (xs.fold(f64::NEG_INFINITY, f64::max), 0.0),
            _ => unreachable!("bitwise ops are not defined for floats"),
        };
        let tol = 4.0 * E::EPS * n as f64 * tol;
        let g = got[i].to_f64();
        assert!((g - want).abs() <= tol, "{what}: element {i} is {g}, expected {want} ± {tol}");
    }
}

/// One allreduce of random data on every rank at once, checked against the reference
/// and for bitwise equality across ranks.
pub async fn check_allreduce<T: LocalTransport, E: TestElem>(
    comms: &[Communicator<T>],
    count: usize,
    op: ReduceOp,
    seed: u64,
) {
    check_allreduce_with::<T, E>(comms, count, op, seed, None).await;
}

/// [`check_allreduce`] with a forced algorithm (`None`: the communicator's choice);
/// returns rank 0's result.
pub async fn check_allreduce_with<T: LocalTransport, E: TestElem>(
    comms: &[Communicator<T>],
    count: usize,
    op: ReduceOp,
    seed: u64,
    algo: Option<AllreduceAlgo>,
) -> Vec<E> {
    let n = comms.len();
    let what = format!(
        "allreduce n={n} count={count} {} {op} {algo:?} seed={seed} over {}",
        E::DTYPE,
        comms[0].transport_name()
    );
    let inputs = inputs::<E>(n, count, op, seed);
    let mut bufs = inputs.clone();
    let results = join_all(comms.iter().zip(bufs.iter_mut()).map(|(c, b)| async move {
        match algo {
            Some(a) => c.all_reduce_with(b, op, a).await,
            None => c.all_reduce(b, op).await,
        }
    }))
    .await;
    for (r, res) in results.into_iter().enumerate() {
        res.unwrap_or_else(|e| panic!("{what}: rank {r} failed: {e}"));
    }
    for (r, b) in bufs.iter().enumerate().skip(1) {
        let (a, b): (&[u8], &[u8]) = (bytemuck::cast_slice(&bufs[0]), bytemuck::cast_slice(b));
        assert!(a == b, "{what}: rank {r}'s result differs bitwise from rank 0's");
    }
    check_against_reference(&inputs, op, &bufs[0], &what);
    bufs.swap_remove(0)
}

/// Every element type that supports `op`.
pub async fn check_all_types<T: LocalTransport>(comms: &[Communicator<T>], count: usize, op: ReduceOp, seed: u64) {
    check_all_types_with(comms, count, op, seed, None).await;
}

/// [`check_all_types`] with a forced algorithm.
pub async fn check_all_types_with<T: LocalTransport>(
    comms: &[Communicator<T>],
    count: usize,
    op: ReduceOp,
    seed: u64,
    algo: Option<AllreduceAlgo>,
) {
    for d in DType::ALL {
        if !op.supports(d) {
            continue;
        }
        let s = seed ^ ((d as u64) << 32);
        match d {
            DType::U8 => drop(check_allreduce_with::<T, u8>(comms, count, op, s, algo).await),
            DType::I8 => drop(check_allreduce_with::<T, i8>(comms, count, op, s, algo).await),
            DType::U16 => drop(check_allreduce_with::<T, u16>(comms, count, op, s, algo).await),
            DType::I16 => drop(check_allreduce_with::<T, i16>(comms, count, op, s, algo).await),
            DType::U32 => drop(check_allreduce_with::<T, u32>(comms, count, op, s, algo).await),
            DType::I32 => drop(check_allreduce_with::<T, i32>(comms, count, op, s, algo).await),
            DType::U64 => drop(check_allreduce_with::<T, u64>(comms, count, op, s, algo).await),
            DType::I64 => drop(check_allreduce_with::<T, i64>(comms, count, op, s, algo).await),
            DType::F16 => drop(check_allreduce_with::<T, f16>(comms, count, op, s, algo).await),
            DType::BF16 => drop(check_allreduce_with::<T, bf16>(comms, count, op, s, algo).await),
            DType::F32 => drop(check_allreduce_with::<T, f32>(comms, count, op, s, algo).await),
            DType::F64 => drop(check_allreduce_with::<T, f64>(comms, count, op, s, algo).await),
        }
    }
}

/// Sizes 0, 1, small primes, sizes not divisible by the rank count, and a few larger.
pub const SIZES: &[usize] = &[0, 1, 2, 3, 5, 7, 13, 31, 64, 97, 257, 1000, 4099, 65_537];
pub const NET_SIZES: &[usize] = &[0, 1, 7, 97, 1000, 4099, 65_537];

/// The whole element type × operator matrix over `sizes`.
pub async fn matrix<T: LocalTransport>(comms: &[Communicator<T>], sizes: &[usize]) {
    matrix_with(comms, sizes, None).await;
}

/// [`matrix`] with a forced algorithm.
pub async fn matrix_with<T: LocalTransport>(comms: &[Communicator<T>], sizes: &[usize], algo: Option<AllreduceAlgo>) {
    for (i, &count) in sizes.iter().enumerate() {
        for op in ReduceOp::ALL {
            check_all_types_with(comms, count, op, (comms.len() as u64) << 48 | (i as u64) << 8 | op as u64, algo)
                .await;
        }
    }
}

/// Point-to-point: every rank sends `count` elements to every other rank (and
/// itself) under two tags, and checks what it receives against what was sent.
/// Sends are queued when they are called, not when first polled: rank 0 starts five
/// sends under one tag (small and large, slices and owned bytes), drops one without
/// ever polling it and awaits the others in reverse; rank 1 receives all five in the
/// order of the calls, the dropped one included.
pub async fn sends_queue_at_the_call<T: LocalTransport>(comms: &[Communicator<T>]) {
    let msgs: Vec<Vec<u8>> =
        [10, 300_007, 0, 70_001, 5].iter().enumerate().map(|(i, &n)| vec![i as u8 + 1; n]).collect();
    let mut sends = vec![
        Box::pin(comms[0].send(1, 77, &msgs[0])) as std::pin::Pin<Box<dyn std::future::Future<Output = _>>>,
        Box::pin(comms[0].send(1, 77, &msgs[1])),
        Box::pin(comms[0].send_bytes(1, 77, bytes::Bytes::from(msgs[2].clone()))),
        Box::pin(comms[0].send(1, 77, &msgs[3])),
        Box::pin(comms[0].send_bytes(1, 77, bytes::Bytes::from(msgs[4].clone()))),
    ];
    drop(sends.remove(1));
    for s in sends.into_iter().rev() {
        s.await.unwrap();
    }
    for (i, m) in msgs.iter().enumerate() {
        let got = comms[1].recv::<u8>(0, 77).await.unwrap();
        assert!(got == *m, "message {i} ({} bytes) out of order or missing: got {} bytes", m.len(), got.len());
    }
}

pub async fn p2p_all_pairs<T: LocalTransport>(comms: &[Communicator<T>], count: usize, seed: u64) {
    let n = comms.len();
    let data = |from: usize, to: usize, tag: u32| -> Vec<u64> {
        let mut rng = StdRng::seed_from_u64(seed ^ ((from * 1000 + to) as u64) << 16 ^ tag as u64);
        (0..count).map(|_| rng.random()).collect()
    };
    let results = join_all(comms.iter().map(|c| async move {
        let r = c.rank();
        let recvs = join_all(
            (0..n)
                .flat_map(|src| [(src, 1u32), (src, 2u32)])
                .map(|(src, tag)| async move { (src, tag, c.recv::<u64>(src, tag).await) }),
        );
        let sends = join_all((0..n).flat_map(|dst| [(dst, 2u32), (dst, 1u32)]).map(|(dst, tag)| {
            let d = data(r, dst, tag);
            async move { c.send(dst, tag, &d).await }
        }));
        let (got, sent) = futures::join!(recvs, sends);
        for s in sent {
            s.unwrap_or_else(|e| panic!("rank {r} send failed: {e}"));
        }
        for (src, tag, g) in got {
            let g = g.unwrap_or_else(|e| panic!("rank {r} recv from {src} failed: {e}"));
            assert!(g == data(src, r, tag), "rank {r}: message from {src} tag {tag} ({count} elements) corrupted");
        }
    }))
    .await;
    assert_eq!(results.len(), n);
}

/// Every rank sends `len` random bytes to every rank (itself included) twice: by
/// `send_bytes` (taken by `recv_bytes`, tag 3) and as `u64`s by `send` (taken by
/// `recv_bytes` as their native bytes, tag 4); checks every message.
pub async fn p2p_bytes_all_pairs<T: LocalTransport>(comms: &[Communicator<T>], len: usize, seed: u64) {
    let n = comms.len();
    let data = |from: usize, to: usize| -> Vec<u64> {
        let mut rng = StdRng::seed_from_u64(seed ^ ((from * 1000 + to) as u64) << 20);
        (0..len.div_ceil(8)).map(|_| rng.random()).collect()
    };
    let bytes_of = |v: &[u64]| -> Vec<u8> { v.iter().flat_map(|x| x.to_ne_bytes()).take(len).collect() };
    join_all(comms.iter().map(|c| async move {
        let r = c.rank();
        let recvs = join_all(
            (0..n)
                .flat_map(|src| [(src, 3u32), (src, 4u32)])
                .map(|(src, tag)| async move { (src, tag, c.recv_bytes(src, tag).await) }),
        );
        let sends = join_all((0..n).map(|dst| {
            let d = data(r, dst);
            let owned = hcomm::Bytes::from(bytes_of(&d));
            async move {
                c.send_bytes(dst, 3, owned).await?;
                c.send(dst, 4, &d).await
            }
        }));
        let (got, sent) = futures::join!(recvs, sends);
        for s in sent {
            s.unwrap_or_else(|e| panic!("rank {r} send failed: {e}"));
        }
        for (src, tag, g) in got {
            let g = g.unwrap_or_else(|e| panic!("rank {r} recv from {src} failed: {e}"));
            let d = data(src, r);
            let want = if tag == 3 { bytes_of(&d) } else { d.iter().flat_map(|x| x.to_ne_bytes()).collect() };
            assert!(g[..] == want[..], "rank {r}: byte message from {src} tag {tag} ({len} bytes) corrupted");
        }
    }))
    .await;
}

/// Starts one allreduce per entry of `sizes` on every rank at once (all in flight on
/// one communicator per rank) and checks each result on each rank.
pub async fn in_flight<T: LocalTransport, E: TestElem>(comms: &[Communicator<T>], sizes: &[usize], op: ReduceOp) {
    let n = comms.len();
    let inputs: Vec<Vec<Vec<E>>> = sizes.iter().enumerate().map(|(i, &s)| inputs::<E>(n, s, op, i as u64)).collect();
    // bufs[rank][operation]
    let mut bufs: Vec<Vec<Vec<E>>> = (0..n).map(|r| inputs.iter().map(|per_op| per_op[r].clone()).collect()).collect();
    let all = join_all(
        comms.iter().zip(bufs.iter_mut()).map(|(c, mine)| join_all(mine.iter_mut().map(|b| c.all_reduce(b, op)))),
    )
    .await;
    all.into_iter().flatten().for_each(|r| r.unwrap());
    for (i, per_op) in inputs.iter().enumerate() {
        for (r, rank_bufs) in bufs.iter().enumerate() {
            check_against_reference(per_op, op, &rank_bufs[i], &format!("in-flight op {i} on rank {r}"));
        }
    }
}

pub mod colls;

/// `len` pseudo-random bytes from `seed` (xorshift; cheap enough for tens of MiB).
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Rank 0 of `a` sends `data` to rank 1 (`b`) under `tag`, as a slice or, if `owned`,
/// as `Bytes`; `b` receives it with `recv_into` (`recv_kind` 0), `recv` (1) or
/// `recv_bytes` (2); panics unless it arrives whole.
pub async fn send_and_receive<T: LocalTransport>(
    a: &Communicator<T>,
    b: &Communicator<T>,
    tag: u32,
    data: &[u8],
    owned: bool,
    recv_kind: u8,
) {
    let len = data.len();
    let send = async {
        if owned { a.send_bytes(1, tag, hcomm::Bytes::copy_from_slice(data)).await } else { a.send(1, tag, data).await }
    };
    let recv = async {
        match recv_kind {
            0 => {
                let mut buf = vec![0u8; len];
                b.recv_into(0, tag, &mut buf).await.map(|()| buf)
            }
            1 => b.recv::<u8>(0, tag).await,
            _ => b.recv_bytes(0, tag).await.map(|x| x.to_vec()),
        }
    };
    let (s, r) = futures::join!(send, recv);
    s.unwrap_or_else(|e| panic!("{len} B, receive kind {recv_kind}, owned {owned}: {e}"));
    let got = r.unwrap_or_else(|e| panic!("{len} B, receive kind {recv_kind}, owned {owned}: {e}"));
    assert!(got == data, "{len} B, receive kind {recv_kind}, owned {owned}: wrong bytes");
}

/// Rank 0 of `a` sends 300 007 `f32` to rank 1 (`b`) twice, under tags 999 and 1000:
/// the first arrives whole through `recv_into`, the second, received into a buffer
/// one element short, is refused as a mismatch.
pub async fn typed_and_refused<T: LocalTransport>(a: &Communicator<T>, b: &Communicator<T>) {
    let floats: Vec<f32> = (0..300_007).map(|k| k as f32 * 0.25 - 7.0).collect();
    let mut out = vec![0f32; floats.len()];
    let (s, r) = futures::join!(a.send(1, 999, &floats), b.recv_into(0, 999, &mut out));
    s.unwrap();
    r.unwrap();
    assert_eq!(out, floats);
    let mut short = vec![0f32; floats.len() - 1];
    let (s, r) = futures::join!(a.send(1, 1000, &floats), b.recv_into(0, 1000, &mut short));
    s.unwrap();
    assert!(r.unwrap_err().is_mismatch());
}

/// A free loopback port for a rendezvous (taken and released; another process could
/// take it in between, which this machine's tests do not).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A table whose allreduce has alternatives at 64 KiB (Rabenseifner's, then the
/// tree and the ring) and at 1 MiB (the ring, then recursive doubling), whose
/// broadcast has some at 64 KiB (the binomial tree, then the chain and the scatter
/// and allgather), and whose allgather, reduce-scatter and alltoall have some at
/// 16 KiB blocks (the ring, then recursive doubling and Bruck's; recursive halving,
/// then the ring; pairwise exchange, then Bruck's), as `Communicator::tune` leaves
/// one.
pub fn contested(comms: &mut [Communicator<impl LocalTransport>]) {
    let n = comms.len();
    for c in comms.iter_mut() {
        let mut t = c.tuning().clone();
        t.measured = Measured {
            ranks: n,
            allreduce: vec![
                (8, AllreduceAlgo::RecursiveDoubling),
                (64 << 10, AllreduceAlgo::Rabenseifner),
                (1 << 20, AllreduceAlgo::Ring),
            ],
            allreduce_alternatives: vec![
                (64 << 10, vec![AllreduceAlgo::Tree, AllreduceAlgo::Ring]),
                (1 << 20, vec![AllreduceAlgo::RecursiveDoubling]),
            ],
            allgather: vec![(8, AllgatherAlgo::Bruck), (16 << 10, AllgatherAlgo::Ring)],
            allgather_alternatives: vec![(16 << 10, vec![AllgatherAlgo::RecursiveDoubling, AllgatherAlgo::Bruck])],
            reduce_scatter: vec![(8, ReduceScatterAlgo::Ring), (16 << 10, ReduceScatterAlgo::RecursiveHalving)],
            reduce_scatter_alternatives: vec![(16 << 10, vec![ReduceScatterAlgo::Ring])],
            broadcast: vec![(8, BcastAlgo::Binomial), (64 << 10, BcastAlgo::Binomial)],
            broadcast_alternatives: vec![(64 << 10, vec![BcastAlgo::Chain, BcastAlgo::ScatterAllgather])],
            alltoall: vec![(8, AlltoallAlgo::Bruck), (16 << 10, AlltoallAlgo::Pairwise)],
            alltoall_alternatives: vec![(16 << 10, vec![AlltoallAlgo::Bruck])],
        };
        c.set_tuning(t);
    }
}

/// A `tracing` writer into shared memory.
#[derive(Clone, Default)]
pub struct Captured(pub std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
