//! Measured algorithm selection: [`Communicator::tune`] times every algorithm of every
//! collective family on the job itself and keeps the fastest per size, and the
//! alternatives the adaptive selection keeps timing.
//!
//! A cost model (even a calibrated one) misses what this machine does under load:
//! where ranks share processors, the binomial tree beats recursive doubling at small
//! sizes because fewer messages are in flight at once, and the ring's pipelining
//! pays off at other sizes than the α–β model predicts. Measuring is what Open MPI's
//! tuned decision files and NCCL's tuner plugins do too.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use hcomm_collectives::{AllgatherAlgo, AllreduceAlgo, AlltoallAlgo, BcastAlgo, Measured, ReduceScatterAlgo};
use hcomm_core::{Error, LocalTransport, ReduceOp, Result};

use crate::Communicator;
use crate::tune_file::Loaded;

/// What [`Communicator::tune`] measures.
#[derive(Debug, Clone)]
pub struct TuneOptions {
    /// Sizes go from 8 bytes up by factors of `step` to this (the whole buffer for
    /// allreduce and broadcast, one rank's block for the others, whose largest block
    /// is this divided by the rank count).
    pub max_bytes: usize,
    /// Timed runs of each algorithm at a size where one run moves 8 MiB or more; more
    /// at smaller sizes (up to 8 times this), as their times are noisier.
    pub reps: usize,
    /// Passes over all sizes. The first times every algorithm; each later pass
    /// times, twice as often (four times where the first pass's two best were within
    /// 10%), only the algorithms within 1.25x of the first pass's best at that size,
    /// two at a time (with three or more, the first pass's best against the next,
    /// the winner against the one after), and the later passes' summed medians
    /// decide (with one pass, the first decides).
    pub passes: usize,
    /// Factor between measured sizes (2 or more); sizes between take the choice of
    /// the nearest on a log scale.
    pub step: usize,
    /// Run each algorithm once untimed, after a barrier, before each timed run (after
    /// another barrier), so that every timed run follows one of its own kind: the
    /// time a job gets that calls the collective at that size again and again. Off,
    /// a timed run follows whichever algorithm the round's shuffle put before it, and
    /// on ranks that share processors that costs the one after a switch between
    /// patterns (the ring's, recursive doubling's) a large share of a small call,
    /// which the duels then charge to whichever switched more often. On by default;
    /// it doubles the tuning time.
    pub primed: bool,
}

impl Default for TuneOptions {
    fn default() -> Self {
        TuneOptions { max_bytes: 16 << 20, reps: 5, passes: 2, step: 2, primed: true }
    }
}

/// `HCOMM_TUNE`, read through `get`: unset, empty or `0` for no tuning, `1` for
/// [`TuneOptions::default`], or the largest size to measure (`4M`, `512K`, bytes).
pub(crate) fn options_from_env(get: impl Fn(&str) -> Option<String>) -> Result<Option<TuneOptions>> {
    let Some(t) = hcomm_core::settings::TUNE.text(get)? else { return Ok(None) };
    let bad = || Error::config(format!("HCOMM_TUNE={t:?} is not 0, 1 or a size such as 4M"));
    match t.as_str() {
        "0" => return Ok(None),
        "1" => return Ok(Some(TuneOptions::default())),
        _ => {}
    }
    let max_bytes = crate::env::parse_size(&t).filter(|&b| b >= 8).ok_or_else(bad)?;
    Ok(Some(TuneOptions { max_bytes, ..TuneOptions::default() }))
}

/// What `init` measures once connected: `HCOMM_CALIBRATE`, then `HCOMM_TUNE` (or
/// the table `HCOMM_TUNE_FILE` holds).
pub(crate) struct Measure {
    pub(crate) calibrate: bool,
    pub(crate) tune: Option<TuneOptions>,
    /// `HCOMM_TUNE_FILE`: where a table measured before is read from, or the one
    /// measured now is written to.
    pub(crate) file: Option<PathBuf>,
}

impl Measure {
    /// The settings, read through `get` (before connecting, so that a wrong value
    /// fails at once).
    pub(crate) fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Measure> {
        let file = hcomm_core::settings::TUNE_FILE.text(&get)?.map(PathBuf::from);
        Ok(Measure { tune: options_from_env(&get)?, calibrate: calibrate_from_env(&get)?, file })
    }

    /// Calibrates and tunes `comm` as asked. With a tuning file: a table there for a
    /// job of this shape is used instead of tuning; with none there (or one of
    /// another job's), the table is measured if `HCOMM_TUNE` is set and written
    /// there, else that is a configuration error.
    pub(crate) async fn run<T: LocalTransport>(self, mut comm: Communicator<T>) -> Result<Communicator<T>> {
        if self.calibrate {
            comm.calibrate().await?;
        }
        if let Some(path) = &self.file {
            let why = match comm.read_tuning(path).await? {
                Loaded::Table(m) => {
                    comm.set_measured(*m);
                    tracing::debug!(path = %path.display(), "tuning table loaded");
                    return Ok(comm);
                }
                Loaded::Absent => "there is no file".to_string(),
                Loaded::OtherJob(why) => why,
            };
            if self.tune.is_none() {
                return Err(Error::config(format!(
                    "HCOMM_TUNE_FILE={}: {why}, and HCOMM_TUNE is not set to measure a table",
                    path.display()
                )));
            }
            tracing::info!(path = %path.display(), why, "measuring a tuning table for this job");
        }
        if let Some(opts) = &self.tune {
            comm.tune(opts).await?;
            if let Some(path) = &self.file {
                // Rank 0 writes; every rank learns whether it could, so that `init`
                // fails on all alike rather than on rank 0 alone.
                let saved = comm.save_tuning(path);
                let mut ok = [u8::from(saved.is_ok())];
                comm.broadcast(&mut ok[..], 0).await?;
                saved?;
                if ok[0] == 0 {
                    return Err(Error::config(format!(
                        "HCOMM_TUNE_FILE={}: rank 0 could not write the tuning table",
                        path.display()
                    )));
                }
            }
        }
        Ok(comm)
    }
}

/// `HCOMM_CALIBRATE`, read through `get`: unset, empty or `0` for no calibration, `1`
/// for [`Communicator::calibrate`](crate::Communicator::calibrate) at `init`.
pub(crate) fn calibrate_from_env(get: impl Fn(&str) -> Option<String>) -> Result<bool> {
    Ok(hcomm_core::settings::CALIBRATE.flag(get)?.unwrap_or(false))
}

/// The order in which `k` contenders run in round `round`: a shuffle, the same on
/// every rank, so that no contender always follows the same other one (the one
/// before leaves the ranks out of step by its own pattern, which a fixed order would
/// charge to the one after).
pub fn round_order(k: usize, round: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..k).collect();
    let mut x = (round as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x2545_f491_4f6c_dd1d;
    for i in (1..k).rev() {
        // xorshift64*
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let r = x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33;
        order.swap(i, (r % (i as u64 + 1)) as usize);
    }
    order
}

/// The sizes [`Communicator::tune`] measures: 8 bytes up by factors of `step` (at
/// least 2) to `max_bytes`.
pub fn tune_sizes(max_bytes: usize, step: usize) -> Vec<usize> {
    let step = step.max(2);
    std::iter::successors(Some(8usize), |s| (s * step <= max_bytes).then_some(s * step)).collect()
}

impl<T: LocalTransport> Communicator<T> {
    /// Times every algorithm of allreduce, broadcast, allgather, reduce-scatter and
    /// alltoall at sizes from 8 bytes to `opts.max_bytes` (f32 sum), keeps the fastest
    /// at each size (over the small sizes whose times hardly grow, the fastest over all
    /// of them: there one size's lead is the machine's noise) and uses that table for
    /// automatic selection from now on (forced algorithms, per call or by environment,
    /// still win). The algorithms take turns
    /// within each round, each after a barrier (and after an untimed run of its own,
    /// see [`TuneOptions::primed`]); an algorithm's time is the median over rounds of
    /// the slowest rank's, so every rank decides alike. Passes after the
    /// first time only the contenders (see [`TuneOptions::passes`]). The table also
    /// keeps every family's alternatives within
    /// 1.5x of the first pass's best at each size, which the adaptive selection keeps
    /// timing while the job runs ([`hcomm_collectives::adapt`], `HCOMM_ADAPT`).
    /// Collective.
    ///
    /// Takes seconds up to 16 MiB, and about twice as long primed; the table is for this
    /// communicator's rank count (a split communicator falls back to the cost model).
    ///
    /// # Errors
    /// As the collectives it runs.
    ///
    /// # Cancel safety
    /// Dropping the future leaves the tuning unchanged; the collective in flight is
    /// aborted on every rank, as for any collective.
    pub async fn tune(&mut self, opts: &TuneOptions) -> Result<Measured> {
        let n = self.size();
        let (whole, block) =
            (tune_sizes(opts.max_bytes, opts.step), tune_sizes((opts.max_bytes / n).max(8), opts.step));
        let reps = |bytes: usize| ((8 << 20) / bytes.max(1)).clamp(opts.reps.max(1), 8 * opts.reps.max(1));
        // The hierarchical allreduce is measured where the topology has a hierarchy.
        let mut ar = Family::new("allreduce", &AllreduceAlgo::candidates(self.group.layout()), &whole);
        let mut bc = Family::new("broadcast", &BcastAlgo::ALL, &whole);
        let mut ag = Family::new("allgather", &AllgatherAlgo::ALL, &block);
        let mut rs = Family::new("reduce_scatter", &ReduceScatterAlgo::ALL, &block);
        let mut aa = Family::new("alltoall", &AlltoallAlgo::ALL, &block);
        // Warm the links first: TCP grows its windows and buffers over a connection's
        // first large transfers, and timings taken before would not hold after.
        let mut warm = vec![0.0f32; (opts.max_bytes / 4).max(1)];
        for _ in 0..3 {
            self.all_reduce_with(&mut warm, ReduceOp::Sum, AllreduceAlgo::Ring).await?;
            self.all_to_all_with(
                &warm[..warm.len() / n * n],
                &mut vec![0.0; warm.len() / n * n],
                AlltoallAlgo::Pairwise,
            )
            .await?;
        }
        drop(warm);
        // The first pass times every algorithm; later passes only the contenders
        // there (within `CONTEND` of the best at that size), twice as often, and
        // decide alone (see `CONTEND`).
        let passes = opts.passes.max(1);
        for pass in 0..passes {
            let r = |bytes: usize| if pass == 0 { reps(bytes) } else { 2 * reps(bytes) };
            for (i, &bytes) in whole.iter().enumerate() {
                let mut buf = vec![1.0f32; (bytes / 4).max(1)];
                self.time_pass(&mut ar, i, pass, r(bytes), opts.primed, async |a| {
                    self.all_reduce_with(&mut buf, ReduceOp::Sum, a).await
                })
                .await?;
                self.time_pass(&mut bc, i, pass, r(bytes), opts.primed, async |a| {
                    self.broadcast_with(&mut buf, 0, a).await
                })
                .await?;
            }
            for (i, &bytes) in block.iter().enumerate() {
                let c = (bytes / 4).max(1);
                let (mine, mut all) = (vec![1.0f32; c], vec![0.0f32; n * c]);
                let r = r(bytes * n);
                self.time_pass(&mut ag, i, pass, r, opts.primed, async |a| {
                    self.all_gather_with(&mine, &mut all, a).await
                })
                .await?;
                let mut out = vec![0.0f32; c];
                self.time_pass(&mut rs, i, pass, r, opts.primed, async |a| {
                    self.reduce_scatter_with(&all, &mut out, ReduceOp::Sum, a).await
                })
                .await?;
                let mut got = vec![0.0f32; n * c];
                self.time_pass(&mut aa, i, pass, r, opts.primed, async |a| {
                    self.all_to_all_with(&all, &mut got, a).await
                })
                .await?;
            }
        }
        let (allreduce, broadcast) = (ar.table(passes), bc.table(passes));
        let (allgather, reduce_scatter, alltoall) = (ag.table(passes), rs.table(passes), aa.table(passes));
        let m = Measured {
            ranks: n,
            allreduce_alternatives: ar.alternatives(&allreduce),
            allreduce,
            broadcast_alternatives: bc.alternatives(&broadcast),
            broadcast,
            allgather_alternatives: ag.alternatives(&allgather),
            allgather,
            reduce_scatter_alternatives: rs.alternatives(&reduce_scatter),
            reduce_scatter,
            alltoall_alternatives: aa.alternatives(&alltoall),
            alltoall,
        };
        self.set_measured(m.clone());
        tracing::debug!(?m, "tuned");
        Ok(m)
    }

    /// Selects by the measured table `m` from now on (forced algorithms still win).
    pub(crate) fn set_measured(&mut self, m: Measured) {
        let mut t = self.tuning().clone();
        t.measured = m;
        self.set_tuning(t);
    }

    /// Times pass `pass` of one family at its size `i`: the algorithms
    /// [`contenders`] names, with `run` (in a later pass, two at a time: see
    /// [`knockout`]), recorded in `f` (and in a debug event, `tune timed`).
    async fn time_pass<A: Copy + PartialEq + std::fmt::Debug>(
        &self,
        f: &mut Family<A>,
        i: usize,
        pass: usize,
        reps: usize,
        primed: bool,
        mut run: impl AsyncFnMut(A) -> Result<()>,
    ) -> Result<()> {
        let mut set = contenders(pass, &f.first, i);
        if pass == 0 || set.len() == 1 {
            let algos: Vec<A> = set.iter().map(|&j| f.algos[j]).collect();
            let t = self.medians(&algos, reps, primed, run).await?;
            f.log(i, pass, reps, &set, &t);
            record(pass, &mut f.first[i], &mut f.later[i], &set, &t);
            return Ok(());
        }
        // Two contenders or more: duels, the first pass's best first, each winner
        // against the next. Timed together, three or four algorithms rank otherwise
        // than two at a time (close among four, far apart head to head); the duels
        // are the measurement the selection is checked by.
        let row = &f.first[i];
        set.sort_by(|&a, &b| row[a].total_cmp(&row[b]));
        let reps = if close(row) { 2 * reps } else { reps };
        let algos = &f.algos;
        let times = knockout(set.len(), async |a, b| {
            let t = self.medians(&[algos[set[a]], algos[set[b]]], reps, primed, &mut run).await?;
            Ok((t[0], t[1]))
        })
        .await?;
        f.log(i, pass, reps, &set, &times);
        record(pass, &mut f.first[i], &mut f.later[i], &set, &times);
        Ok(())
    }

    /// The time `run` takes with each of `algos`: median over `reps` rounds (after
    /// one warm-up round, unless `primed`) of the slowest rank's time, in seconds,
    /// the same on every rank. `primed`: see [`TuneOptions::primed`].
    async fn medians<A: Copy>(
        &self,
        algos: &[A],
        reps: usize,
        primed: bool,
        mut run: impl AsyncFnMut(A) -> Result<()>,
    ) -> Result<Vec<f64>> {
        let k = algos.len();
        let mut times: Vec<Vec<Duration>> = vec![Vec::with_capacity(reps); k];
        // A primed round warms up what it times.
        for round in usize::from(primed)..=reps {
            for j in round_order(k, round) {
                if primed {
                    self.barrier().await?;
                    run(algos[j]).await?;
                }
                self.barrier().await?;
                let t = Instant::now();
                run(algos[j]).await?;
                if round > 0 {
                    times[j].push(t.elapsed());
                }
            }
        }
        let mut medians: Vec<f64> = times
            .into_iter()
            .map(|mut t| {
                t.sort();
                t[t.len() / 2].as_secs_f64()
            })
            .collect();
        self.all_reduce_with(&mut medians, ReduceOp::Max, AllreduceAlgo::RecursiveDoubling).await?;
        Ok(medians)
    }
}

/// How far behind the best of the first pass an algorithm may be at a size and still
/// be timed again. The first pass runs every algorithm of a family in each round
/// (shuffled, a barrier before each); algorithms far behind then shape the rounds
/// the close ones are timed in and hide their differences, so later passes time
/// only the close ones.
const CONTEND: f64 = 1.25;

/// How far behind the first pass's best at a size an algorithm may be and still be
/// an alternative the adaptive selection keeps timing while the job runs
/// (`hcomm_collectives::adapt`), since times on a shared machine move that far
/// within a job. Each window of 16 calls runs an alternative twice, so one 1.5x
/// behind costs at most 6% there.
const ALTERNATIVE: f64 = 1.5;

/// How near the first pass's two best algorithms at a size must be for a later pass
/// to time them twice as often again, since a median of few rounds then picks the
/// slower one now and then.
const CLOSE: f64 = 1.10;

/// Duels among `k` contenders (indices `0..k`, the presumed best first): 0 against
/// 1, the faster against 2, and so on; `duel(a, b)` times `a` and `b` head to head.
/// Each contender's time is the one from its last duel.
async fn knockout(k: usize, mut duel: impl AsyncFnMut(usize, usize) -> Result<(f64, f64)>) -> Result<Vec<f64>> {
    let mut times = vec![0.0; k];
    let mut champion = 0;
    for c in 1..k {
        let (tc, tn) = duel(champion, c).await?;
        (times[champion], times[c]) = (tc, tn);
        if tn < tc {
            champion = c;
        }
    }
    Ok(times)
}

/// Whether the two best of the first pass's `times` are within [`CLOSE`].
fn close(times: &[f64]) -> bool {
    let mut t: Vec<f64> = times.iter().copied().filter(|x| x.is_finite()).collect();
    t.sort_by(f64::total_cmp);
    t.len() >= 2 && t[1] <= t[0] * CLOSE
}

/// The algorithms (indices) a pass times at size `i`: all in the first pass, then
/// those within [`CONTEND`] of the first pass's best there, and the first pass's
/// best at each neighbouring size: the times are smooth in the size while a shared
/// machine's noise is not, so a neighbour's best is worth timing again.
fn contenders(pass: usize, first: &[Vec<f64>], i: usize) -> Vec<usize> {
    let row = &first[i];
    let near: Vec<usize> = [i.checked_sub(1), Some(i + 1)]
        .into_iter()
        .flatten()
        .filter_map(|n| first.get(n))
        .filter_map(|r| (0..r.len()).filter(|&j| r[j].is_finite()).min_by(|&a, &b| r[a].total_cmp(&r[b])))
        .collect();
    let b = row.iter().copied().fold(f64::INFINITY, f64::min);
    (0..row.len()).filter(|&j| pass == 0 || row[j] <= b * CONTEND || near.contains(&j)).collect()
}

/// One family's measurements, per size and algorithm: the first pass's times, and
/// the later passes' sums.
struct Family<A> {
    name: &'static str,
    sizes: Vec<usize>,
    algos: Vec<A>,
    first: Vec<Vec<f64>>,
    later: Vec<Vec<f64>>,
}

impl<A: Copy + PartialEq + std::fmt::Debug> Family<A> {
    fn new(name: &'static str, algos: &[A], sizes: &[usize]) -> Family<A> {
        let zero = vec![vec![0.0; algos.len()]; sizes.len()];
        Family { name, sizes: sizes.to_vec(), algos: algos.to_vec(), first: zero.clone(), later: zero }
    }

    /// The choice at each size: by the later passes if there were any.
    fn table(&self, passes: usize) -> Vec<(usize, A)> {
        fastest(&self.sizes, if passes > 1 { &self.later } else { &self.first }, &self.first, &self.algos)
    }

    /// The alternatives to the choice at each size of `table` (this family's
    /// [`Family::table`]) where any came within [`ALTERNATIVE`] of the first pass's
    /// best there, fastest first by that pass.
    fn alternatives(&self, table: &[(usize, A)]) -> Vec<(usize, Vec<A>)> {
        let mut out = Vec::new();
        for (&(size, pick), row) in table.iter().zip(&self.first) {
            let best = row.iter().copied().fold(f64::INFINITY, f64::min);
            let mut near: Vec<usize> = (0..row.len())
                .filter(|&j| self.algos[j] != pick && row[j].is_finite() && row[j] <= best * ALTERNATIVE)
                .collect();
            near.sort_by(|&a, &b| row[a].total_cmp(&row[b]));
            if !near.is_empty() {
                out.push((size, near.into_iter().map(|j| self.algos[j]).collect()));
            }
        }
        out
    }

    /// A debug event with what one timing at size `i` measured (seconds in `times`,
    /// of the algorithms at `set`): the slowest rank's median, the same on every rank.
    fn log(&self, i: usize, pass: usize, reps: usize, set: &[usize], times: &[f64]) {
        tracing::debug!(
            family = self.name,
            bytes = self.sizes[i],
            pass,
            reps,
            algos = ?set.iter().map(|&j| self.algos[j]).collect::<Vec<_>>(),
            times_us = ?times.iter().map(|t| (t * 1e7).round() / 10.0).collect::<Vec<_>>(),
            "tune timed"
        );
    }
}

/// Records a pass's times of the algorithms at `set`: the first pass's in `first`,
/// later ones summed in `later`, where the algorithms left out are infinitely slow.
fn record(pass: usize, first: &mut [f64], later: &mut [f64], set: &[usize], times: &[f64]) {
    let row = if pass == 0 { first } else { later };
    let mut timed = vec![false; row.len()];
    for (&j, &t) in set.iter().zip(times) {
        row[j] += t;
        timed[j] = true;
    }
    if pass > 0 {
        for (x, _) in row.iter_mut().zip(timed).filter(|(_, t)| !t) {
            *x = f64::INFINITY;
        }
    }
}

/// How near an algorithm's time at a size must be to the best there for the
/// neighbouring sizes to have a say, above the latency-bound run (see [`FLAT`] and
/// [`fastest`]).
///
/// The choice was once the best of times smoothed over both neighbouring sizes
/// (weights 1, 4, 1) for every algorithm, on the view that the curves are smooth in
/// the size. They are not near the crossovers, where smoothing chose an algorithm
/// slower head to head, so neighbours only break near-ties.
const TIE: f64 = 1.03;

/// How far above the smallest sizes' best time the best at a size may be for that size
/// to count as latency bound, where [`fastest`] pools the run of such sizes.
///
/// Below that, the bytes are under a fifth of an operation's time, and the algorithms
/// differ by their steps and their pattern of peers, which do not change with the
/// size; a lead that comes and goes from one size to the next there is the machine's
/// noise, which comes in phases longer than one size's duel, so the whole run is
/// pooled rather than a few neighbours.
///
/// The crossovers seen so far lie well above the run (the alltoall's Bruck and
/// pairwise exchange at 32-64 KiB blocks on shared memory, where the times have
/// doubled): one inside it would be missed, at sizes where the times differ by
/// little.
const FLAT: f64 = 1.25;

/// The fastest algorithm at each size.
///
/// Where the size is latency bound (from the smallest size to the last whose best
/// first-pass time is within [`FLAT`] of the least best time at any size up to it),
/// the algorithm with the least mean time relative to each size's best over all the
/// latency-bound sizes: there one size's lead is noise unless the others show it too.
///
/// Elsewhere the fastest in `times` at that size, unless others come within [`TIE`]
/// of it; then, among those, the best of the times relative to the best at each size,
/// smoothed with both neighbouring sizes (weights 1, 4, 1), which a shared machine's
/// noise is more likely to have decided than the algorithms.
///
/// An algorithm left out at another size (infinite in `times` there) counts with its
/// time relative to the best in `first` (the first pass, which timed every algorithm),
/// so that being far behind there counts against it rather than not at all. Only
/// algorithms `times` has at a size are chosen there.
fn fastest<A: Copy>(sizes: &[usize], times: &[Vec<f64>], first: &[Vec<f64>], algos: &[A]) -> Vec<(usize, A)> {
    let relative = |t: &Vec<f64>| -> Vec<f64> {
        let best = t.iter().copied().fold(f64::INFINITY, f64::min).max(f64::MIN_POSITIVE);
        t.iter().map(|x| x / best).collect()
    };
    let rel: Vec<Vec<f64>> = times.iter().map(relative).collect();
    let rel_first: Vec<Vec<f64>> = first.iter().map(relative).collect();
    let at = |j: usize, a: usize| {
        let r = rel.get(j)?[a];
        if r.is_finite() { Some(r) } else { rel_first.get(j).map(|f| f[a]).filter(|f| f.is_finite()) }
    };
    // The latency-bound sizes: from the smallest to the last within FLAT of the least
    // best time up to it (one noisy size between does not cut the run).
    let (mut least, mut flat) = (f64::INFINITY, 0);
    for (i, t) in first.iter().enumerate() {
        let best = t.iter().copied().fold(f64::INFINITY, f64::min);
        least = least.min(best);
        if best.is_finite() && best <= least * FLAT {
            flat = i + 1;
        }
    }
    (0..sizes.len())
        .map(|i| {
            let (window, own, tie): (Vec<usize>, f64, f64) = if i < flat && flat > 1 {
                ((0..flat).collect(), 1.0, f64::MAX)
            } else {
                ([i.wrapping_sub(1), i, i + 1].into_iter().filter(|&j| j < sizes.len()).collect(), 4.0, TIE)
            };
            let score = |a: usize| {
                let (mut sum, mut weight) = (0.0, 0.0);
                for &j in &window {
                    if let Some(r) = at(j, a) {
                        let w = if j == i { own } else { 1.0 };
                        sum += w * r;
                        weight += w;
                    }
                }
                sum / weight
            };
            let best = (0..algos.len())
                .filter(|&a| rel[i][a] <= tie)
                .min_by(|&x, &y| score(x).total_cmp(&score(y)))
                .expect("a family has algorithms, and the fastest is within TIE of itself");
            (sizes[i], algos[best])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `rows` with each size's times twice the size before's, as where the bytes
    /// dominate (no size latency bound but the first, see `FLAT`).
    fn growing(rows: &[Vec<f64>]) -> Vec<Vec<f64>> {
        rows.iter().enumerate().map(|(i, r)| r.iter().map(|t| t * f64::from(1u32 << i)).collect()).collect()
    }

    #[test]
    fn knockout_keeps_the_winner_of_each_duel() {
        // True times 3, 1, 2: 0 loses to 1, which beats 2.
        let truth = [3.0, 1.0, 2.0];
        let mut duels = Vec::new();
        let times = futures::executor::block_on(knockout(3, async |a, b| {
            duels.push((a, b));
            Ok((truth[a], truth[b]))
        }))
        .unwrap();
        assert_eq!(duels, vec![(0, 1), (1, 2)]);
        assert_eq!(times, vec![3.0, 1.0, 2.0]);
        // A failed duel fails the whole.
        let r = futures::executor::block_on(knockout(3, async |_, _| Err(Error::invalid("x"))));
        assert!(r.is_err());
        assert_eq!(futures::executor::block_on(knockout(1, async |_, _| unreachable!())).unwrap(), vec![0.0]);
    }

    #[test]
    fn close_means_the_two_best_within_ten_percent() {
        assert!(close(&[1.0, 1.09, 3.0]));
        assert!(close(&[3.0, 1.0, 1.1]));
        assert!(!close(&[1.0, 1.2, 1.3]));
        // A left-out algorithm (infinite) is not a contender.
        assert!(!close(&[1.0, f64::INFINITY]));
        assert!(!close(&[1.0]));
    }

    #[test]
    fn a_size_decides_alone_unless_its_best_are_tied() {
        let sizes = [8, 16, 32, 64, 128, 256];
        // Algorithm 0 wins small, 1 wins large; at 32, 1 wins clearly between two
        // sizes where 0 does (as the ring at 128 KiB between Rabenseifner's and the
        // tree's sizes): its own size decides.
        let mut times =
            vec![vec![1.0, 2.0], vec![1.0, 2.0], vec![1.3, 1.0], vec![1.0, 2.0], vec![3.0, 1.0], vec![3.0, 1.0]];
        let picks = |t: &[Vec<f64>]| -> Vec<usize> {
            let t = growing(t);
            fastest(&sizes, &t, &t, &[0, 1]).into_iter().map(|p| p.1).collect()
        };
        assert_eq!(picks(&times), vec![0, 0, 1, 0, 1, 1]);
        // Within TIE of each other, the neighbours decide: a 2% lead at 32 against
        // 2x at both sizes around is more likely noise.
        times[2] = vec![1.02, 1.0];
        assert_eq!(picks(&times), vec![0, 0, 0, 0, 1, 1]);
        times[2] = vec![1.0, 1.02];
        times[1] = vec![2.0, 1.0];
        times[3] = vec![2.0, 1.0];
        assert_eq!(picks(&times), vec![0, 1, 1, 1, 1, 1]);
        assert_eq!(fastest(&[8], &[vec![2.0, 1.0, 3.0]], &[vec![2.0, 1.0, 3.0]], &['a', 'b', 'c']), vec![(8, 'b')]);
        // Left out of the later pass at a neighbouring size (infinite there), an
        // algorithm counts with the first pass's time there: 2x the best at 8
        // outweighs its 2% lead at 16.
        let later = growing(&[vec![f64::INFINITY, 1.0], vec![1.0, 1.02]]);
        let first = growing(&[vec![2.0, 1.0], vec![1.0, 1.02]]);
        assert_eq!(fastest(&[8, 16], &later, &first, &[0, 1]), vec![(8, 1), (16, 1)]);
        // Without a first-pass time either, the neighbour says nothing.
        let first = growing(&[vec![f64::INFINITY, 1.0], vec![1.0, 1.02]]);
        assert_eq!(fastest(&[8, 16], &later, &first, &[0, 1]), vec![(8, 1), (16, 0)]);
    }

    #[test]
    fn latency_bound_sizes_decide_together() {
        let sizes = [8, 16, 32, 64, 128, 256, 512];
        // Algorithm 1 is 8% behind 0 at every size but 32, where noise put it 10%
        // ahead; the times hardly grow to 128 (latency bound), then double.
        let mut times = vec![vec![1.0, 1.08]; 7];
        times[2] = vec![1.1, 1.0];
        times[4] = vec![1.2, 1.3];
        times[5] = vec![2.0, 2.1];
        times[6] = vec![4.0, 8.0];
        let picks =
            |t: &[Vec<f64>]| -> Vec<usize> { fastest(&sizes, t, t, &[0, 1]).into_iter().map(|p| p.1).collect() };
        // Alone, 32 would go to 1; pooled with 8-128 it goes to 0.
        assert_eq!(picks(&times), vec![0; 7]);
        // A lead over most of the run wins all of it: 1 ahead from 32 on.
        for t in &mut times[2..5] {
            *t = vec![t[0] * 1.1, t[0]];
        }
        assert_eq!(picks(&times), vec![1, 1, 1, 1, 1, 0, 0]);
        // Beyond the latency-bound run (256 is 2x the least best time) the size and
        // its neighbours decide as before, even where 1 leads at 128.
        times[5] = vec![2.1, 2.0];
        assert_eq!(picks(&times)[5], 1);
        // An algorithm not timed at a size (infinite) is not chosen there, however
        // the sizes around pool.
        let mut t = vec![vec![1.0, 1.2]; 3];
        t[1] = vec![f64::INFINITY, 1.0];
        assert_eq!(fastest(&[8, 16, 32], &t, &vec![vec![1.0, 1.2]; 3], &[0, 1]), vec![(8, 0), (16, 1), (32, 0)]);
        // A first size slower than those after it (a cold start) does not stretch the
        // run: the least time so far is the reference, so 128 B (2.0, 2x the least)
        // decides alone, where pooled with the sizes before it would go to 0.
        let t = vec![vec![3.0, 3.3], vec![1.0, 1.1], vec![1.0, 1.1], vec![1.0, 1.1], vec![2.1, 2.0]];
        assert_eq!(picks_of(&t), vec![0, 0, 0, 0, 1]);
        // A noisy size within the run (1.4x at 32 B) does not cut it: 32-128 B pool
        // with 8-16 B, where 0 leads.
        let t = vec![vec![1.0, 1.1], vec![1.0, 1.1], vec![1.4, 1.45], vec![1.0, 1.02], vec![1.02, 1.0], vec![4.0, 3.0]];
        assert_eq!(picks_of(&t), vec![0, 0, 0, 0, 0, 1]);
        // One latency-bound size alone decides as any other.
        assert_eq!(picks_of(&[vec![1.0, 1.02], vec![4.0, 2.0]]), vec![1, 1]);
    }

    fn picks_of(t: &[Vec<f64>]) -> Vec<usize> {
        let sizes: Vec<usize> = (0..t.len()).map(|i| 8 << i).collect();
        fastest(&sizes, t, t, &[0, 1]).into_iter().map(|p| p.1).collect()
    }

    #[test]
    fn later_passes_time_the_contenders_and_decide() {
        let (mut first, mut later) = (vec![0.0; 4], vec![0.0; 4]);
        assert_eq!(contenders(0, std::slice::from_ref(&first), 0), vec![0, 1, 2, 3]);
        record(0, &mut first, &mut later, &[0, 1, 2, 3], &[1.0, 1.2, 1.3, 2.0]);
        // Within 25% of the best: 0 and 1 (1.3 is just outside).
        let set = contenders(1, std::slice::from_ref(&first), 0);
        assert_eq!(set, vec![0, 1]);
        // The best of a neighbouring size is timed again too, however far behind.
        let rows = [vec![1.0, 1.1, 3.0, 3.0], first.clone(), vec![2.0, 2.0, 2.0, 1.0]];
        assert_eq!(contenders(1, &rows, 1), vec![0, 1, 3]);
        assert_eq!(contenders(1, &rows, 0), vec![0, 1]);
        assert_eq!(contenders(1, &rows, 2), vec![0, 3]);
        record(1, &mut first, &mut later, &set, &[1.1, 1.0]);
        record(2, &mut first, &mut later, &set, &[1.1, 1.0]);
        assert_eq!(later, vec![2.2, 2.0, f64::INFINITY, f64::INFINITY]);
        assert_eq!(first, vec![1.0, 1.2, 1.3, 2.0]);
        assert_eq!(fastest(&[8], &[later], &[first], &['a', 'b', 'c', 'd']), vec![(8, 'b')]);
    }

    #[test]
    fn alternatives_are_those_within_range_of_the_first_pass_best() {
        let mut f = Family::new("allreduce", &['a', 'b', 'c'], &[8, 16, 32]);
        f.first = growing(&[vec![1.0, 1.2, 3.0], vec![1.0, 1.6, 1.45], vec![2.0, 1.0, f64::INFINITY]]);
        // One pass: its times decide. At 8, b is within 1.5x (c is not); at 16, c
        // only; at 32 the choice is b and a is 2x behind.
        assert_eq!(f.table(1), vec![(8, 'a'), (16, 'a'), (32, 'b')]);
        assert_eq!(f.alternatives(&f.table(1)), vec![(8, vec!['b']), (16, vec!['c'])]);
        // Where the later passes chose another, the first pass's best is an
        // alternative, and the others by their first-pass times.
        f.first[1] = vec![2.0, 2.2, 2.1];
        f.later =
            growing(&[vec![2.0, 2.2, f64::INFINITY], vec![2.1, f64::INFINITY, 2.0], vec![2.1, 2.0, f64::INFINITY]]);
        assert_eq!(f.table(2), vec![(8, 'a'), (16, 'c'), (32, 'b')]);
        assert_eq!(f.alternatives(&f.table(2)), vec![(8, vec!['b']), (16, vec!['a', 'b'])]);
    }

    #[test]
    fn hcomm_tune_grammar() {
        let get = |v: &'static str| move |k: &str| (k == "HCOMM_TUNE").then(|| v.to_string());
        assert!(options_from_env(|_| None).unwrap().is_none());
        assert!(options_from_env(get("0")).unwrap().is_none());
        assert_eq!(options_from_env(get("1")).unwrap().unwrap().max_bytes, 16 << 20);
        assert_eq!(options_from_env(get("4M")).unwrap().unwrap().max_bytes, 4 << 20);
        assert_eq!(options_from_env(get(" 512k ")).unwrap().unwrap().max_bytes, 512 << 10);
        assert_eq!(options_from_env(get("4096")).unwrap().unwrap().max_bytes, 4096);
        for bad in ["yes", "4X", "M", "-1", "4", "99999999999999999999G"] {
            let e = options_from_env(get(bad)).unwrap_err();
            assert!(e.to_string().contains("HCOMM_TUNE"), "{bad}: {e}");
        }
    }

    #[test]
    fn hcomm_calibrate_grammar() {
        let get = |v: &'static str| move |k: &str| (k == "HCOMM_CALIBRATE").then(|| v.to_string());
        assert!(!calibrate_from_env(|_| None).unwrap());
        assert!(!calibrate_from_env(get("0")).unwrap());
        assert!(calibrate_from_env(get(" 1 ")).unwrap());
        assert!(calibrate_from_env(get("true")).unwrap());
        // Empty is an error, as for every setting (see `hcomm_core::settings`).
        for bad in ["", "2", "sure"] {
            let e = calibrate_from_env(get(bad)).unwrap_err();
            assert!(e.to_string().contains("HCOMM_CALIBRATE"), "{bad}: {e}");
        }
    }
}
