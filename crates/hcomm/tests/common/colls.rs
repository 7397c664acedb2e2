//! Checks of every collective against a sequential reference, generic over the
//! transport and the element type.

use futures::future::join_all;
use hcomm::{BcastAlgo, Communicator, LocalTransport, ReduceOp};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{TestElem, check_against_reference, inputs};

fn offsets(counts: &[usize]) -> Vec<usize> {
    let mut o = vec![0];
    for c in counts {
        o.push(o[o.len() - 1] + c);
    }
    o
}

/// Random per-rank counts in `0..=max` (equal on every rank: same seed).
pub fn random_counts(n: usize, max: usize, seed: u64) -> Vec<usize> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(0..=max)).collect()
}

/// A broadcast from `root` by `algo` (`None`: the automatic choice) against the
/// root's data.
pub async fn broadcast<T: LocalTransport, E: TestElem>(
    comms: &[Communicator<T>],
    count: usize,
    root: usize,
    algo: impl Into<Option<BcastAlgo>>,
    seed: u64,
) {
    let n = comms.len();
    let algo = algo.into();
    let ins = inputs::<E>(n, count, ReduceOp::Sum, seed);
    let mut bufs = ins.clone();
    let calls = comms.iter().zip(bufs.iter_mut()).map(|(c, b)| async move {
        match algo {
            Some(a) => c.broadcast_with(b, root, a).await,
            None => c.broadcast(b, root).await,
        }
    });
    for (r, res) in join_all(calls).await.into_iter().enumerate() {
        res.unwrap_or_else(|e| panic!("broadcast n={n} count={count} root={root} {algo:?}: rank {r}: {e}"));
    }
    for (r, b) in bufs.iter().enumerate() {
        assert!(
            *b == ins[root],
            "broadcast n={n} count={count} root={root} {algo:?}: rank {r} differs from the root's data"
        );
    }
}

pub async fn reduce<T: LocalTransport, E: TestElem>(
    comms: &[Communicator<T>],
    count: usize,
    op: ReduceOp,
    root: usize,
    seed: u64,
) {
    let n = comms.len();
    let ins = inputs::<E>(n, count, op, seed);
    let mut bufs = ins.clone();
    for res in join_all(comms.iter().zip(bufs.iter_mut()).map(|(c, b)| c.reduce(b, op, root))).await {
        res.unwrap();
    }
    let what = format!("reduce n={n} count={count} {} {op} root={root}", E::DTYPE);
    check_against_reference(&ins, op, &bufs[root], &what);
    for r in (0..n).filter(|&r| r != root) {
        assert!(bufs[r] == ins[r], "{what}: rank {r}'s buffer changed");
    }
}

pub async fn gather_scatter<T: LocalTransport, E: TestElem>(
    comms: &[Communicator<T>],
    count: usize,
    root: usize,
    seed: u64,
) {
    let n = comms.len();
    let ins = inputs::<E>(n, count, ReduceOp::Sum, seed);
    let want: Vec<E> = ins.concat();
    // gather
    let mut outs: Vec<Vec<E>> =
        (0..n).map(|r| if r == root { vec![E::zeroed(); n * count] } else { Vec::new() }).collect();
    for res in join_all(comms.iter().zip(outs.iter_mut()).zip(&ins).map(|((c, o), i)| c.gather(i, o, root))).await {
        res.unwrap();
    }
    assert!(outs[root] == want, "gather n={n} count={count} root={root}");
    // scatter back
    let mut got: Vec<Vec<E>> = (0..n).map(|_| vec![E::zeroed(); count]).collect();
    let sends: Vec<Vec<E>> = (0..n).map(|r| if r == root { want.clone() } else { Vec::new() }).collect();
    for res in join_all(comms.iter().zip(got.iter_mut()).zip(&sends).map(|((c, g), s)| c.scatter(s, g, root))).await {
        res.unwrap();
    }
    assert!(got == ins, "scatter n={n} count={count} root={root}");
    // v-variants with random counts
    let counts = random_counts(n, count, seed ^ 0x55);
    let off = offsets(&counts);
    let vins: Vec<Vec<E>> = (0..n).map(|r| want.iter().copied().cycle().skip(r).take(counts[r]).collect()).collect();
    let vwant: Vec<E> = vins.concat();
    let mut vouts: Vec<Vec<E>> =
        (0..n).map(|r| if r == root { vwant.iter().rev().copied().collect() } else { Vec::new() }).collect();
    for res in
        join_all(comms.iter().zip(vouts.iter_mut()).zip(&vins).map(|((c, o), i)| c.gatherv(i, o, &counts, root))).await
    {
        res.unwrap();
    }
    assert!(vouts[root] == vwant, "gatherv n={n} counts={counts:?} root={root}");
    let mut vgot: Vec<Vec<E>> = (0..n).map(|r| vwant[off[r]..off[r + 1]].iter().rev().copied().collect()).collect();
    let vsends: Vec<Vec<E>> = (0..n).map(|r| if r == root { vwant.clone() } else { Vec::new() }).collect();
    for res in
        join_all(comms.iter().zip(vgot.iter_mut()).zip(&vsends).map(|((c, g), s)| c.scatterv(s, &counts, g, root)))
            .await
    {
        res.unwrap();
    }
    assert!(vgot == vins, "scatterv n={n} counts={counts:?} root={root}");
}

/// Reduce-scatters of equal blocks of `count` and of random counts up to it, by
/// `algo` (`None`: the automatic choice).
pub async fn reduce_scatter<T: LocalTransport, E: TestElem>(
    comms: &[Communicator<T>],
    count: usize,
    op: ReduceOp,
    algo: impl Into<Option<hcomm::ReduceScatterAlgo>>,
    seed: u64,
) {
    let algo = algo.into();
    let n = comms.len();
    for counts in [vec![count; n], random_counts(n, count, seed)] {
        let off = offsets(&counts);
        let ins = inputs::<E>(n, off[n], op, seed);
        let mut outs: Vec<Vec<E>> = (0..n).map(|r| ins[r][off[r]..off[r + 1]].to_vec()).collect();
        let equal = counts.iter().all(|&c| c == count);
        let counts = &counts;
        let res = join_all(comms.iter().zip(outs.iter_mut()).zip(&ins).map(|((c, o), i)| async move {
            match (equal, algo) {
                (true, Some(a)) => c.reduce_scatter_with(i, o, op, a).await,
                (true, None) => c.reduce_scatter(i, o, op).await,
                (false, Some(a)) => c.reduce_scatter_v_with(i, o, counts, op, a).await,
                (false, None) => c.reduce_scatter_v(i, o, counts, op).await,
            }
        }))
        .await;
        res.into_iter().for_each(|r| r.unwrap());
        for r in 0..n {
            let block: Vec<Vec<E>> = ins.iter().map(|v| v[off[r]..off[r + 1]].to_vec()).collect();
            check_against_reference(
                &block,
                op,
                &outs[r],
                &format!("reduce_scatter {algo:?} n={n} counts={counts:?} {} {op} rank {r}", E::DTYPE),
            );
        }
    }
}

pub async fn all_to_all<T: LocalTransport, E: TestElem>(comms: &[Communicator<T>], count: usize, seed: u64) {
    let n = comms.len();
    let ins = inputs::<E>(n, n * count, ReduceOp::Sum, seed);
    for algo in hcomm::AlltoallAlgo::ALL {
        let mut outs: Vec<Vec<E>> = ins.iter().map(|v| v.iter().rev().copied().collect()).collect();
        for res in
            join_all(comms.iter().zip(outs.iter_mut()).zip(&ins).map(|((c, o), i)| c.all_to_all_with(i, o, algo))).await
        {
            res.unwrap();
        }
        check_alltoall(&ins, &outs, count, algo);
    }
    all_to_all_auto(comms, &ins, count).await;
    // v: rank g sends m(g, r) elements to rank r.
    let m = |g: usize, r: usize| (g * 7 + r * 3 + seed as usize) % (count + 1);
    let send_counts: Vec<Vec<usize>> = (0..n).map(|g| (0..n).map(|r| m(g, r)).collect()).collect();
    let recv_counts: Vec<Vec<usize>> = (0..n).map(|r| (0..n).map(|g| m(g, r)).collect()).collect();
    let vins: Vec<Vec<E>> =
        (0..n).map(|g| ins[g].iter().copied().cycle().take(send_counts[g].iter().sum()).collect()).collect();
    let mut vouts: Vec<Vec<E>> = (0..n).map(|r| vec![E::zeroed(); recv_counts[r].iter().sum()]).collect();
    let res = join_all(
        comms
            .iter()
            .enumerate()
            .zip(vouts.iter_mut())
            .map(|((r, c), o)| c.all_to_all_v(&vins[r], &send_counts[r], o, &recv_counts[r])),
    )
    .await;
    res.into_iter().for_each(|r| r.unwrap());
    for r in 0..n {
        let ro = offsets(&recv_counts[r]);
        for g in 0..n {
            let so = offsets(&send_counts[g]);
            assert!(vouts[r][ro[g]..ro[g + 1]] == vins[g][so[r]..so[r + 1]], "alltoallv n={n}: block {g} at rank {r}");
        }
    }
}

/// The automatic choice's alltoall of `ins` (blocks of `count`) against the
/// reference.
pub async fn all_to_all_auto<T: LocalTransport, E: TestElem>(comms: &[Communicator<T>], ins: &[Vec<E>], count: usize) {
    let n = comms.len();
    let mut outs: Vec<Vec<E>> = ins.iter().map(|v| v.iter().rev().copied().collect()).collect();
    for (r, res) in join_all(comms.iter().zip(outs.iter_mut()).zip(ins).map(|((c, o), i)| c.all_to_all(i, o)))
        .await
        .into_iter()
        .enumerate()
    {
        res.unwrap_or_else(|e| panic!("alltoall n={n} count={count}: rank {r}: {e}"));
    }
    for r in 0..n {
        for g in 0..n {
            assert!(
                outs[r][g * count..(g + 1) * count] == ins[g][r * count..(r + 1) * count],
                "alltoall n={n} count={count}: block {g} at rank {r}"
            );
        }
    }
}

pub async fn all_gather_v<T: LocalTransport, E: TestElem>(
    comms: &[Communicator<T>],
    count: usize,
    algo: hcomm::AllgatherAlgo,
    seed: u64,
) {
    let n = comms.len();
    let counts = random_counts(n, count, seed);
    let ins: Vec<Vec<E>> =
        (0..n).map(|r| inputs::<E>(1, counts[r], ReduceOp::Sum, seed + r as u64).remove(0)).collect();
    let want: Vec<E> = ins.concat();
    let mut outs: Vec<Vec<E>> = (0..n).map(|_| want.iter().rev().copied().collect()).collect();
    for res in join_all(
        comms.iter().zip(outs.iter_mut()).zip(&ins).map(|((c, o), i)| c.all_gather_v_with(i, o, &counts, algo)),
    )
    .await
    {
        res.unwrap();
    }
    assert!(outs.iter().all(|o| *o == want), "allgatherv {algo} n={n} counts={counts:?}");
}

pub async fn scans<T: LocalTransport, E: TestElem>(comms: &[Communicator<T>], count: usize, op: ReduceOp, seed: u64) {
    let n = comms.len();
    let ins = inputs::<E>(n, count, op, seed);
    for exclusive in [false, true] {
        let mut bufs = ins.clone();
        let res = join_all(
            comms
                .iter()
                .zip(bufs.iter_mut())
                .map(|(c, b)| async move { if exclusive { c.exscan(b, op).await } else { c.scan(b, op).await } }),
        )
        .await;
        res.into_iter().for_each(|r| r.unwrap());
        for r in 0..n {
            let what = format!("scan exclusive={exclusive} n={n} count={count} {} {op} rank {r}", E::DTYPE);
            if exclusive && r == 0 {
                assert!(bufs[0] == ins[0], "{what}: rank 0 changed");
            } else {
                let upto = if exclusive { r } else { r + 1 };
                check_against_reference(&ins[..upto], op, &bufs[r], &what);
            }
        }
    }
}

/// An allgather of `count` per rank by `algo` (`None`: the automatic choice).
pub async fn all_gather<T: LocalTransport, E: TestElem>(
    comms: &[Communicator<T>],
    count: usize,
    algo: impl Into<Option<hcomm::AllgatherAlgo>>,
    seed: u64,
) {
    let algo = algo.into();
    let n = comms.len();
    let ins = inputs::<E>(n, count, ReduceOp::Sum, seed);
    let want: Vec<E> = ins.concat();
    let mut outs: Vec<Vec<E>> = (0..n).map(|_| want.iter().rev().copied().collect()).collect();
    for res in join_all(comms.iter().zip(outs.iter_mut()).zip(&ins).map(|((c, o), i)| async move {
        match algo {
            Some(a) => c.all_gather_with(i, o, a).await,
            None => c.all_gather(i, o).await,
        }
    }))
    .await
    {
        res.unwrap();
    }
    for (r, o) in outs.iter().enumerate() {
        assert!(*o == want, "allgather {algo:?} n={n} count={count}: rank {r}");
    }
}

fn check_alltoall<E: TestElem>(ins: &[Vec<E>], outs: &[Vec<E>], count: usize, algo: hcomm::AlltoallAlgo) {
    let n = ins.len();
    for r in 0..n {
        for g in 0..n {
            assert!(
                outs[r][g * count..(g + 1) * count] == ins[g][r * count..(r + 1) * count],
                "alltoall {algo:?} n={n} count={count}: block {g} at rank {r}"
            );
        }
    }
}
