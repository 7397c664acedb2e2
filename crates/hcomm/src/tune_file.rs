//! The table [`Communicator::tune`] measured, kept in a file so that later jobs of
//! the same shape use it instead of measuring again (`HCOMM_TUNE_FILE`), as Open
//! MPI's decision files and NCCL's tuner plugins keep theirs.
//!
//! The file is JSON: the job's shape (rank count, transport, the host of each rank)
//! and, per collective family, the chosen algorithm at each measured size by name.
//! A table is used only by a job of the same shape: with another rank count,
//! transport or placement of ranks on hosts, the algorithms rank otherwise.

use std::path::Path;

use hcomm_collectives::{AllgatherAlgo, AllreduceAlgo, AlltoallAlgo, BcastAlgo, Measured, ReduceScatterAlgo};
use hcomm_core::{Error, LocalTransport, Result};
use serde::{Deserialize, Serialize};

use crate::Communicator;

/// Version of the file's layout: 2 added the allreduce's alternatives
/// (`allreduce_alternatives`), 3 the allgather's and the reduce-scatter's, 4 the
/// broadcast's and the alltoall's. Files of formats 1 to 3 are read too, without the
/// alternatives they lack.
const FORMAT: u32 = 4;

/// Largest tuning file read (a table of every family at sizes up to 2^62 holds a few
/// kilobytes): anything larger is not one.
const MAX_FILE: u64 = 1 << 20;

/// The shape of a job a table was measured on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Shape {
    ranks: usize,
    transport: String,
    /// The host index of each rank (hosts numbered in the order of their first rank).
    host_of: Vec<usize>,
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hosts = self.host_of.iter().max().map_or(0, |h| h + 1);
        write!(
            f,
            "{} ranks over {} on {hosts} host(s), hosts of the ranks {:?}",
            self.ranks, self.transport, self.host_of
        )
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    format: u32,
    job: Shape,
    allreduce: Vec<(usize, String)>,
    /// The allreduce's alternatives where any came close (absent in files written
    /// before the adaptive selection).
    #[serde(default)]
    allreduce_alternatives: Vec<(usize, Vec<String>)>,
    broadcast: Vec<(usize, String)>,
    /// As `allreduce_alternatives` (absent before format 4).
    #[serde(default)]
    broadcast_alternatives: Vec<(usize, Vec<String>)>,
    allgather: Vec<(usize, String)>,
    /// As `allreduce_alternatives` (absent before format 3).
    #[serde(default)]
    allgather_alternatives: Vec<(usize, Vec<String>)>,
    reduce_scatter: Vec<(usize, String)>,
    #[serde(default)]
    reduce_scatter_alternatives: Vec<(usize, Vec<String>)>,
    alltoall: Vec<(usize, String)>,
    #[serde(default)]
    alltoall_alternatives: Vec<(usize, Vec<String>)>,
}

/// What a tuning file held for this job.
#[derive(Debug)]
pub(crate) enum Loaded {
    /// The table, for a job of this shape (boxed: a few hundred bytes of vectors'
    /// headers beside the other variants' string).
    Table(Box<Measured>),
    /// No file at the path.
    Absent,
    /// A table of a job of another shape (why, in words).
    OtherJob(String),
}

fn names<A: Copy + std::fmt::Display>(table: &[(usize, A)]) -> Vec<(usize, String)> {
    table.iter().map(|&(b, a)| (b, a.to_string())).collect()
}

/// A family's table as the file holds it, by `parse` of each entry: sizes in
/// increasing order.
fn by_size<V, W>(family: &str, table: &[(usize, V)], parse: impl Fn(&V) -> Result<W>) -> Result<Vec<(usize, W)>> {
    let mut out: Vec<(usize, W)> = Vec::with_capacity(table.len());
    for (b, v) in table {
        if out.last().is_some_and(|(prev, _)| prev >= b) {
            return Err(Error::config(format!("{family}: sizes not in increasing order at {b}")));
        }
        out.push((*b, parse(v).map_err(|e| Error::config(format!("{family} at {b} bytes: {e}")))?));
    }
    Ok(out)
}

fn algos<A: std::str::FromStr<Err = Error>>(family: &str, table: &[(usize, String)]) -> Result<Vec<(usize, A)>> {
    by_size(family, table, |name| name.parse())
}

/// A family's alternatives as the file names them.
fn alternatives<A: std::str::FromStr<Err = Error>>(
    family: &str,
    table: &[(usize, Vec<String>)],
) -> Result<Vec<(usize, Vec<A>)>> {
    by_size(family, table, |names| names.iter().map(|n| n.parse()).collect())
}

/// A family's alternatives by name, for the file.
fn alternative_names<A: std::fmt::Display>(table: &[(usize, Vec<A>)]) -> Vec<(usize, Vec<String>)> {
    table.iter().map(|(b, algos)| (*b, algos.iter().map(ToString::to_string).collect())).collect()
}

fn shape_of<T: LocalTransport>(comm: &Communicator<T>) -> Shape {
    let topo = comm.topology();
    Shape {
        ranks: comm.size(),
        transport: comm.transport_name().to_string(),
        host_of: (0..comm.size()).map(|r| topo.host_of(r)).collect(),
    }
}

/// `m` as the file's JSON, for a job of `shape`.
fn encode(shape: Shape, m: &Measured) -> String {
    let f = File {
        format: FORMAT,
        job: shape,
        allreduce: names(&m.allreduce),
        allreduce_alternatives: alternative_names(&m.allreduce_alternatives),
        broadcast: names(&m.broadcast),
        broadcast_alternatives: alternative_names(&m.broadcast_alternatives),
        allgather: names(&m.allgather),
        allgather_alternatives: alternative_names(&m.allgather_alternatives),
        reduce_scatter: names(&m.reduce_scatter),
        reduce_scatter_alternatives: alternative_names(&m.reduce_scatter_alternatives),
        alltoall: names(&m.alltoall),
        alltoall_alternatives: alternative_names(&m.alltoall_alternatives),
    };
    serde_json::to_string_pretty(&f).expect("a table serializes")
}

/// The file's `bytes`, read for a job of `shape`.
fn decode(bytes: &[u8], shape: &Shape) -> Result<Loaded> {
    let f: File = serde_json::from_slice(bytes).map_err(|e| Error::config(format!("not a tuning table: {e}")))?;
    if !(1..=FORMAT).contains(&f.format) {
        return Err(Error::config(format!("tuning table format {}, this build reads 1 to {FORMAT}", f.format)));
    }
    if f.job.ranks != f.job.host_of.len() {
        return Err(Error::config(format!("{} ranks but {} hosts of ranks", f.job.ranks, f.job.host_of.len())));
    }
    if f.job != *shape {
        return Ok(Loaded::OtherJob(format!("it was measured on {}, this job is {shape}", f.job)));
    }
    Ok(Loaded::Table(Box::new(Measured {
        ranks: f.job.ranks,
        allreduce: algos::<AllreduceAlgo>("allreduce", &f.allreduce)?,
        allreduce_alternatives: alternatives::<AllreduceAlgo>("allreduce_alternatives", &f.allreduce_alternatives)?,
        broadcast: algos::<BcastAlgo>("broadcast", &f.broadcast)?,
        broadcast_alternatives: alternatives::<BcastAlgo>("broadcast_alternatives", &f.broadcast_alternatives)?,
        allgather: algos::<AllgatherAlgo>("allgather", &f.allgather)?,
        allgather_alternatives: alternatives::<AllgatherAlgo>("allgather_alternatives", &f.allgather_alternatives)?,
        reduce_scatter: algos::<ReduceScatterAlgo>("reduce_scatter", &f.reduce_scatter)?,
        reduce_scatter_alternatives: alternatives::<ReduceScatterAlgo>(
            "reduce_scatter_alternatives",
            &f.reduce_scatter_alternatives,
        )?,
        alltoall: algos::<AlltoallAlgo>("alltoall", &f.alltoall)?,
        alltoall_alternatives: alternatives::<AlltoallAlgo>("alltoall_alternatives", &f.alltoall_alternatives)?,
    })))
}

/// What rank 0 found at the path: 0 no file, 1 its bytes, 2 an error's message.
const ABSENT: u64 = 0;
const FOUND: u64 = 1;
const FAILED: u64 = 2;

fn read_at_root(path: &Path) -> (u64, Vec<u8>) {
    let read = || -> std::io::Result<Vec<u8>> {
        let f = std::fs::File::open(path)?;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::Read::take(f, MAX_FILE + 1), &mut bytes)?;
        Ok(bytes)
    };
    match read() {
        Ok(b) if b.len() as u64 > MAX_FILE => (FAILED, format!("larger than {MAX_FILE} bytes").into_bytes()),
        Ok(b) => (FOUND, b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (ABSENT, Vec::new()),
        Err(e) => (FAILED, e.to_string().into_bytes()),
    }
}

impl<T: LocalTransport> Communicator<T> {
    /// Writes the table [`Communicator::tune`] measured (the one selection uses now)
    /// to `path` as JSON, with the job's shape (rank count, transport, the host of
    /// each rank), for [`Communicator::load_tuning`] in a later job of the same
    /// shape. Rank 0 writes (a temporary file beside `path`, renamed over it); the
    /// other ranks return at once. Not collective.
    ///
    /// # Errors
    /// At rank 0: an invalid-argument error if no table was measured on this
    /// communicator; an I/O error naming the path.
    pub fn save_tuning(&self, path: &Path) -> Result<()> {
        if self.rank() != 0 {
            return Ok(());
        }
        let m = &self.tuning().measured;
        if m.ranks != self.size() {
            return Err(Error::invalid("no tuning table to save: Communicator::tune has not run on this communicator"));
        }
        let name = path.file_name().map_or_else(|| "tuning".into(), |n| n.to_string_lossy().into_owned());
        let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
        let what = |e| Error::io(format!("writing the tuning table {}", path.display()), e);
        std::fs::write(&tmp, encode(shape_of(self), m)).map_err(what)?;
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            what(e)
        })
    }

    /// Uses the table a job of the same shape saved at `path`
    /// ([`Communicator::save_tuning`]) for algorithm selection from now on, as if
    /// [`Communicator::tune`] had measured it here. Rank 0 reads the file and sends
    /// it to every rank, so it needs to exist only where rank 0 runs, and every rank
    /// decides alike. `Ok(false)` if there is no file at `path` (the selection is
    /// unchanged). Collective.
    ///
    /// # Errors
    /// On every rank alike: a configuration error naming the path if the file is not
    /// a tuning table, was measured on a job of another shape (rank count,
    /// transport, hosts of the ranks), or could not be read at rank 0; otherwise
    /// the errors of the broadcasts that carry it.
    ///
    /// # Cancel safety
    /// Dropping the future leaves the selection unchanged; a broadcast in flight is
    /// aborted on every rank, as for any collective.
    pub async fn load_tuning(&mut self, path: &Path) -> Result<bool> {
        match self.read_tuning(path).await? {
            Loaded::Table(m) => {
                self.set_measured(*m);
                Ok(true)
            }
            Loaded::Absent => Ok(false),
            Loaded::OtherJob(why) => {
                Err(Error::config(format!("the tuning table {} is for another job: {why}", path.display())))
            }
        }
    }

    /// What the file at `path` holds for this job, read at rank 0 and broadcast.
    pub(crate) async fn read_tuning(&self, path: &Path) -> Result<Loaded> {
        let (status, mut bytes) = if self.rank() == 0 { read_at_root(path) } else { (ABSENT, Vec::new()) };
        let mut head = [status, bytes.len() as u64];
        self.broadcast(&mut head[..], 0).await?;
        let [status, len] = head;
        if len > MAX_FILE {
            return Err(Error::config(format!("tuning table {}: {len} bytes announced", path.display())));
        }
        bytes.resize(len as usize, 0);
        if len > 0 {
            // Every rank knows `len`, so all skip this alike when there is nothing.
            self.broadcast(&mut bytes, 0).await?;
        }
        let at = |e: Error| Error::config(format!("tuning table {}: {e}", path.display()));
        match status {
            ABSENT => Ok(Loaded::Absent),
            FOUND => decode(&bytes, &shape_of(self)).map_err(at),
            _ => Err(Error::config(format!(
                "tuning table {}: rank 0 could not read it: {}",
                path.display(),
                String::from_utf8_lossy(&bytes)
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Measured {
        Measured {
            ranks: 4,
            allreduce: vec![
                (8, AllreduceAlgo::RecursiveDoubling),
                (65536, AllreduceAlgo::Rabenseifner),
                (1 << 20, AllreduceAlgo::Ring),
            ],
            allreduce_alternatives: vec![(1 << 20, vec![AllreduceAlgo::Tree, AllreduceAlgo::Rabenseifner])],
            broadcast: vec![(8, BcastAlgo::Binomial), (1 << 20, BcastAlgo::Chain)],
            broadcast_alternatives: vec![(1 << 20, vec![BcastAlgo::Binomial, BcastAlgo::ScatterAllgather])],
            allgather: vec![(8, AllgatherAlgo::Bruck), (8192, AllgatherAlgo::Ring)],
            allgather_alternatives: vec![(8192, vec![AllgatherAlgo::RecursiveDoubling])],
            reduce_scatter: vec![(8, ReduceScatterAlgo::RecursiveHalving)],
            reduce_scatter_alternatives: vec![(8, vec![ReduceScatterAlgo::Ring])],
            alltoall: vec![(8, AlltoallAlgo::Pairwise)],
            alltoall_alternatives: vec![(8, vec![AlltoallAlgo::Bruck])],
        }
    }

    fn shape() -> Shape {
        Shape { ranks: 4, transport: "tcp".into(), host_of: vec![0, 0, 1, 1] }
    }

    #[test]
    fn a_table_survives_its_file() {
        let text = encode(shape(), &table());
        match decode(text.as_bytes(), &shape()).unwrap() {
            Loaded::Table(m) => assert_eq!(*m, table()),
            other => panic!("{other:?}"),
        }
        // A file written before the broadcast's and alltoall's alternatives were
        // kept (format 3) loads without them, one from before the allgather's and
        // reduce-scatter's (format 2) without those too, and one from before any
        // (format 1) without any.
        let mut old: serde_json::Value = serde_json::from_str(&text).unwrap();
        old.as_object_mut().unwrap().remove("broadcast_alternatives").unwrap();
        old.as_object_mut().unwrap().remove("alltoall_alternatives").unwrap();
        old["format"] = 3.into();
        let format3 = Measured { broadcast_alternatives: Vec::new(), alltoall_alternatives: Vec::new(), ..table() };
        match decode(old.to_string().as_bytes(), &shape()).unwrap() {
            Loaded::Table(m) => assert_eq!(*m, format3),
            other => panic!("{other:?}"),
        }
        old.as_object_mut().unwrap().remove("allgather_alternatives").unwrap();
        old.as_object_mut().unwrap().remove("reduce_scatter_alternatives").unwrap();
        old["format"] = 2.into();
        let format2 =
            Measured { allgather_alternatives: Vec::new(), reduce_scatter_alternatives: Vec::new(), ..format3 };
        match decode(old.to_string().as_bytes(), &shape()).unwrap() {
            Loaded::Table(m) => assert_eq!(*m, format2),
            other => panic!("{other:?}"),
        }
        old.as_object_mut().unwrap().remove("allreduce_alternatives").unwrap();
        old["format"] = 1.into();
        match decode(old.to_string().as_bytes(), &shape()).unwrap() {
            Loaded::Table(m) => assert_eq!(*m, Measured { allreduce_alternatives: Vec::new(), ..format2 }),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn another_shape_is_told_apart() {
        let text = encode(shape(), &table());
        for other in [
            Shape { ranks: 2, transport: "tcp".into(), host_of: vec![0, 1] },
            Shape { transport: "uring".into(), ..shape() },
            Shape { host_of: vec![0, 1, 0, 1], ..shape() },
        ] {
            match decode(text.as_bytes(), &other).unwrap() {
                Loaded::OtherJob(why) => assert!(why.contains("this job is"), "{why}"),
                l => panic!("{l:?}"),
            }
        }
    }

    #[test]
    fn a_file_that_is_not_a_table_is_an_error() {
        let good = encode(shape(), &table());
        let format = format!("\"format\": {FORMAT}");
        let bad = [
            String::new(),
            "{}".into(),
            "not json".into(),
            good.replace(&format, &format!("\"format\": {}", FORMAT + 1)),
            good.replace("\"ring\"", "\"spiral\""),
            good.replace("\"tree\"", "\"spiral\""),
            good.replace(&format, &format!("{format}, \"extra\": 3")),
            good.replace("65536", "1048577"),
            good.replace("\"ranks\": 4", "\"ranks\": 3"),
        ];
        for text in bad {
            let e = decode(text.as_bytes(), &shape()).unwrap_err();
            assert_eq!(e.kind(), hcomm_core::ErrorKind::Config, "{text}: {e}");
        }
    }

    /// A fresh path in the temporary directory for test `name`.
    fn temp(name: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("hcomm-tune-{}-{name}.json", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    async fn all<T, F: std::future::Future<Output = T>>(fs: impl IntoIterator<Item = F>) -> Vec<T> {
        futures::future::join_all(fs).await
    }

    #[tokio::test]
    async fn save_then_load_and_every_rank_agrees() {
        let path = temp("save-load");
        let mut comms = crate::local(3);
        // Nothing measured yet: nothing to save (rank 0 says so; the others write
        // nothing either way).
        assert_eq!(comms[0].save_tuning(&path).unwrap_err().kind(), hcomm_core::ErrorKind::InvalidArgument);
        assert!(comms[1].save_tuning(&path).is_ok());
        // No file: nothing loaded, on every rank.
        for r in all(comms.iter_mut().map(|c| c.load_tuning(&path))).await {
            assert!(!r.unwrap());
        }
        let opts = crate::TuneOptions { max_bytes: 256, reps: 1, passes: 1, step: 4, primed: false };
        let tables: Vec<Measured> =
            all(comms.iter_mut().map(|c| c.tune(&opts))).await.into_iter().map(|t| t.unwrap()).collect();
        for c in &comms {
            c.save_tuning(&path).unwrap();
        }
        let mut fresh = crate::local(3);
        for r in all(fresh.iter_mut().map(|c| c.load_tuning(&path))).await {
            assert!(r.unwrap());
        }
        for c in &fresh {
            assert_eq!(c.tuning().measured, tables[0]);
        }
        // A job of another shape refuses it, on every rank alike.
        let mut two = crate::local(2);
        for r in all(two.iter_mut().map(|c| c.load_tuning(&path))).await {
            let e = r.unwrap_err();
            assert_eq!(e.kind(), hcomm_core::ErrorKind::Config);
            assert!(e.to_string().contains("another job"), "{e}");
        }
        // A file that is not a table: an error on every rank, not a hang.
        std::fs::write(&path, b"{\"format\": 1}").unwrap();
        for r in all(fresh.iter_mut().map(|c| c.load_tuning(&path))).await {
            assert_eq!(r.unwrap_err().kind(), hcomm_core::ErrorKind::Config);
        }
        let _ = std::fs::remove_file(&path);
    }

    #[tokio::test]
    async fn hcomm_tune_file_measures_once_then_reads() {
        let path = temp("env");
        let measure = |tune: bool| crate::tune::Measure {
            calibrate: false,
            tune: tune.then_some(crate::TuneOptions { max_bytes: 256, reps: 1, passes: 1, step: 4, primed: false }),
            file: Some(path.clone()),
        };
        // No file and nothing to measure with: a clear error on every rank.
        for r in all(crate::local(3).into_iter().map(|c| measure(false).run(c))).await {
            let e = r.unwrap_err();
            assert!(e.to_string().contains("HCOMM_TUNE_FILE") && e.to_string().contains("no file"), "{e}");
        }
        // Measured and written once...
        let first: Vec<_> = all(crate::local(3).into_iter().map(|c| measure(true).run(c))).await;
        let table = first[0].as_ref().unwrap().tuning().measured.clone();
        assert_eq!(table.ranks, 3);
        assert!(path.exists());
        // ...then read, without HCOMM_TUNE.
        for c in all(crate::local(3).into_iter().map(|c| measure(false).run(c))).await {
            assert_eq!(c.unwrap().tuning().measured, table);
        }
        // A job of another shape with HCOMM_TUNE measures its own and replaces it.
        for c in all(crate::local(2).into_iter().map(|c| measure(true).run(c))).await {
            assert_eq!(c.unwrap().tuning().measured.ranks, 2);
        }
        for c in all(crate::local(2).into_iter().map(|c| measure(false).run(c))).await {
            assert_eq!(c.unwrap().tuning().measured.ranks, 2);
        }
        let _ = std::fs::remove_file(&path);
    }
}
