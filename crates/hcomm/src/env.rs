//! Reading rank, size and rendezvous address from the environment that launchers set.
//!
//! Looked up in this order (the first launcher whose rank variable is set wins):
//!
//! | launcher | rank | size | job id | rendezvous |
//! |---|---|---|---|---|
//! | `hcomm run`, or by hand | `HCOMM_RANK` | `HCOMM_SIZE` | `HCOMM_JOB_ID` | `HCOMM_ADDR` |
//! | OpenMPI `mpirun` | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | `OMPI_MCA_ess_base_jobid`, `PMIX_NAMESPACE` | see below |
//! | Slurm `srun` | `SLURM_PROCID` | `SLURM_NTASKS` | `SLURM_JOB_ID`.`SLURM_STEP_ID` | see below |
//! | PMI (MPICH Hydra) | `PMI_RANK` | `PMI_SIZE` | `PMI_JOBID` | see below |
//! | torchrun | `RANK` | `WORLD_SIZE` | `TORCHELASTIC_RUN_ID`.`TORCHELASTIC_RESTART_COUNT` | `MASTER_ADDR`:`MASTER_PORT` |
//!
//! The rendezvous address (where rank 0 serves the store) is `HCOMM_ADDR` if set, else
//! `MASTER_ADDR`:`MASTER_PORT` if set. Failing both, when the launcher says every rank
//! is on this host (`OMPI_COMM_WORLD_LOCAL_SIZE`, `SLURM_STEP_NUM_NODES` or
//! `MPI_LOCALNRANKS` equal to one host), the store goes on 127.0.0.1 at a port derived
//! from the job id; across hosts without an address, [`LaunchEnv::from_env`] fails with
//! an error that says what to set, never a silent guess.

use hcomm_core::settings;
use hcomm_core::{Error, Result};

/// What a launcher told this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    pub rank: usize,
    pub size: usize,
    /// Rank among the ranks on this host, when the launcher says.
    pub local_rank: Option<usize>,
    /// `host:port` of rank 0's rendezvous store.
    pub addr: String,
    /// Job identity: connections from other jobs are refused.
    pub job_id: String,
    /// Which launcher's variables were used (`hcomm`, `openmpi`, `slurm`, `pmi`, `torchrun`).
    pub launcher: &'static str,
}

struct Launcher {
    name: &'static str,
    rank: &'static str,
    size: &'static str,
    local_rank: &'static str,
    job: &'static [&'static str],
    /// Variable that holds the number of ranks on this host, or the number of hosts.
    single_host: Option<(&'static str, SingleHost)>,
}

#[derive(Clone, Copy)]
enum SingleHost {
    LocalSizeEqualsSize,
    OneNode,
}

const LAUNCHERS: &[Launcher] = &[
    Launcher {
        name: "hcomm",
        rank: settings::RANK.name,
        size: settings::SIZE.name,
        local_rank: settings::LOCAL_RANK.name,
        job: &[settings::JOB_ID.name],
        single_host: None,
    },
    Launcher {
        name: "openmpi",
        rank: "OMPI_COMM_WORLD_RANK",
        size: "OMPI_COMM_WORLD_SIZE",
        local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
        job: &["OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"],
        single_host: Some(("OMPI_COMM_WORLD_LOCAL_SIZE", SingleHost::LocalSizeEqualsSize)),
    },
    Launcher {
        name: "slurm",
        rank: "SLURM_PROCID",
        size: "SLURM_NTASKS",
        local_rank: "SLURM_LOCALID",
        job: &["SLURM_JOB_ID", "SLURM_STEP_ID"],
        single_host: Some(("SLURM_STEP_NUM_NODES", SingleHost::OneNode)),
    },
    Launcher {
        name: "pmi",
        rank: "PMI_RANK",
        size: "PMI_SIZE",
        local_rank: "MPI_LOCALRANKID",
        job: &["PMI_JOBID"],
        single_host: Some(("MPI_LOCALNRANKS", SingleHost::LocalSizeEqualsSize)),
    },
    Launcher {
        name: "torchrun",
        rank: "RANK",
        size: "WORLD_SIZE",
        local_rank: "LOCAL_RANK",
        // The restart count too: a restarted group (a new set of worker processes
        // at the same address) is another launch, whose ranks must not meet the
        // old one's.
        job: &["TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT"],
        single_host: None,
    },
];

fn parse_num(var: &str, v: &str) -> Result<usize> {
    v.trim().parse().map_err(|_| Error::config(format!("{var}={v:?} is not a non-negative integer")))
}

/// Port in 20000..60000 derived from a job id, for single-host jobs without an address.
fn derived_port(job: &str) -> u16 {
    let h = job.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    20000 + (h % 40000) as u16
}

impl LaunchEnv {
    /// Reads the process environment. See the module documentation.
    ///
    /// # Errors
    /// A configuration error naming the variable at fault: no launcher variables at
    /// all, a rank without a size, a value that is not a number, a rank not below the
    /// size, or a multi-host job without a rendezvous address.
    pub fn from_env() -> Result<LaunchEnv> {
        LaunchEnv::from_vars(|k| std::env::var(k).ok())
    }

    /// Whether any launcher's rank variable is set.
    pub fn launched() -> bool {
        LAUNCHERS.iter().any(|l| std::env::var_os(l.rank).is_some())
    }

    /// Like [`LaunchEnv::from_env`], reading variables through `get`.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<LaunchEnv> {
        let Some(l) = LAUNCHERS.iter().find(|l| get(l.rank).is_some()) else {
            let names: Vec<&str> = LAUNCHERS.iter().map(|l| l.rank).collect();
            return Err(Error::config(format!(
                "no launcher environment found (none of {} is set): start the program with `hcomm run -n N`, mpirun, srun or torchrun, or set HCOMM_RANK, HCOMM_SIZE and HCOMM_ADDR",
                names.join(", ")
            )));
        };
        let rank = parse_num(l.rank, &get(l.rank).unwrap_or_default())?;
        let size_s = get(l.size).ok_or_else(|| Error::config(format!("{} is set but {} is not", l.rank, l.size)))?;
        let size = parse_num(l.size, &size_s)?;
        if size == 0 {
            return Err(Error::config(format!("{}=0: a job needs at least one rank", l.size)));
        }
        if rank >= size {
            return Err(Error::config(format!("{}={rank} is not below {}={size}", l.rank, l.size)));
        }
        let local_rank = match get(l.local_rank) {
            Some(v) => Some(parse_num(l.local_rank, &v)?),
            None => None,
        };
        let job_parts: Vec<String> = l.job.iter().filter_map(|k| get(k)).collect();
        let job_id = get(settings::JOB_ID.name)
            .or_else(|| (!job_parts.is_empty()).then(|| job_parts.join(".")))
            .unwrap_or_else(|| String::from("default"));

        let addr = if let Some(a) = get(settings::ADDR.name) {
            a
        } else if let Some(host) = get("MASTER_ADDR") {
            let port = get("MASTER_PORT").ok_or_else(|| Error::config("MASTER_ADDR is set but MASTER_PORT is not"))?;
            parse_num("MASTER_PORT", &port)?;
            format!("{host}:{port}")
        } else {
            let single = match l.single_host {
                Some((var, SingleHost::LocalSizeEqualsSize)) => {
                    get(var).map(|v| parse_num(var, &v)).transpose()? == Some(size)
                }
                Some((var, SingleHost::OneNode)) => get(var).map(|v| parse_num(var, &v)).transpose()? == Some(1),
                None => size == 1,
            };
            if !single {
                return Err(Error::config(format!(
                    "ranks from {} span several hosts (or the launcher does not say), and no rendezvous address is set: set HCOMM_ADDR=host:port (rank 0's host, a free port) for every rank",
                    l.name
                )));
            }
            format!("127.0.0.1:{}", derived_port(&job_id))
        };
        if !addr.contains(':') {
            return Err(Error::config(format!("rendezvous address {addr:?} is not host:port")));
        }
        Ok(LaunchEnv { rank, size, local_rank, addr, job_id, launcher: l.name })
    }
}

pub use hcomm_core::settings::parse_size;

/// Warns once per process, for each `HCOMM_*` variable in the environment that
/// HComm does not read, with the known name nearest to it: a misspelt setting
/// (`HCOMM_TIMOUT`) would otherwise be ignored silently. A `tracing` warning (target
/// `hcomm::config`), or a line on standard error when no subscriber is installed.
pub fn warn_unknown_vars() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for (name, _) in std::env::vars_os() {
            let Some(name) = name.to_str() else { continue };
            if let Some(msg) = unknown_var(name) {
                if tracing::dispatcher::has_been_set() {
                    tracing::warn!(target: "hcomm::config", "{msg}");
                } else {
                    eprintln!("hcomm: {msg}");
                }
            }
        }
    });
}

/// The warning for variable `name`, if it is an `HCOMM_*` variable HComm does not read.
fn unknown_var(name: &str) -> Option<String> {
    if !name.starts_with("HCOMM_") || settings::find(name).is_some() {
        return None;
    }
    let nearest =
        settings::ALL.iter().map(|s| s.name).min_by_key(|k| edit_distance(name, k)).unwrap_or("HCOMM_TIMEOUT");
    Some(match edit_distance(name, nearest) {
        // Close enough to be a slip of the keyboard.
        d if d <= 3 => format!("{name} is not a variable HComm reads (did you mean {nearest}?); it is ignored"),
        _ => format!("{name} is not a variable HComm reads; it is ignored"),
    })
}

/// Levenshtein distance of two ASCII names.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, &ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, &cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != cb)).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn unknown_variables_are_named_with_the_nearest_known_one() {
        // Spelt in two parts, so that the scan of the sources below does not take
        // these for variables HComm reads.
        let var = |rest: &str| format!("HCOMM_{rest}");
        let m = unknown_var(&var("TIMOUT")).unwrap();
        assert!(m.contains("did you mean HCOMM_TIMEOUT?"), "{m}");
        let m = unknown_var(&var("TCP_SPIN")).unwrap();
        assert!(m.contains("did you mean HCOMM_TCP_SPIN_US?"), "{m}");
        let m = unknown_var(&var("SOMETHING_ELSE_ENTIRELY")).unwrap();
        assert!(!m.contains("did you mean"), "{m}");
        for k in settings::ALL {
            assert_eq!(unknown_var(k.name), None, "{}", k.name);
        }
        assert_eq!(unknown_var("PATH"), None);
    }

    /// Every `"HCOMM_..."` name the sources (crates, examples, benches) spell out is
    /// known, so that the warning never names a variable HComm reads.
    #[test]
    fn every_variable_the_sources_read_is_known() {
        fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for e in std::fs::read_dir(dir).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    out.push(p);
                }
            }
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut files = Vec::new();
        for d in ["crates", "examples", "benches"] {
            walk(&root.join(d), &mut files);
        }
        let mut seen = 0;
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            for (i, _) in text.match_indices("\"HCOMM_") {
                let name: String = text[i + 1..]
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                // A prefix that a format string completes (`HCOMM_COST_{name}_US`).
                if name.ends_with('_') {
                    continue;
                }
                seen += 1;
                assert!(
                    settings::find(&name).is_some(),
                    "{name} (in {}) is not declared in hcomm_core::settings",
                    f.display()
                );
            }
        }
        assert!(seen > 50, "only {seen} names found: the walk missed the sources");
    }

    fn env(vars: &[(&str, &str)]) -> Result<LaunchEnv> {
        let m: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        LaunchEnv::from_vars(|k| m.get(k).cloned())
    }

    #[test]
    fn hcomm_vars() {
        let e =
            env(&[("HCOMM_RANK", "2"), ("HCOMM_SIZE", "4"), ("HCOMM_ADDR", "10.0.0.1:29500"), ("HCOMM_JOB_ID", "j")])
                .unwrap();
        assert_eq!(
            (e.rank, e.size, e.addr.as_str(), e.job_id.as_str(), e.launcher),
            (2, 4, "10.0.0.1:29500", "j", "hcomm")
        );
    }

    #[test]
    fn openmpi_single_host_derives_address() {
        let vars = [
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
            ("OMPI_MCA_ess_base_jobid", "1995177985"),
        ];
        let a = env(&vars).unwrap();
        assert_eq!(a.launcher, "openmpi");
        assert!(a.addr.starts_with("127.0.0.1:"));
        // Every rank of the job derives the same address.
        let mut other = vars;
        other[0].1 = "3";
        assert_eq!(env(&other).unwrap().addr, a.addr);
        // Across hosts, no guess.
        let mut multi = vars;
        multi[2].1 = "2";
        let e = env(&multi).unwrap_err();
        assert!(e.to_string().contains("HCOMM_ADDR"), "{e}");
    }

    #[test]
    fn torchrun_and_slurm() {
        let t = env(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "node1"), ("MASTER_PORT", "29500")]).unwrap();
        assert_eq!((t.addr.as_str(), t.launcher), ("node1:29500", "torchrun"));
        // Each restart of a torchrun group is a launch of its own.
        let restart = |n: &str| {
            env(&[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "node1"),
                ("MASTER_PORT", "29500"),
                ("TORCHELASTIC_RUN_ID", "train"),
                ("TORCHELASTIC_RESTART_COUNT", n),
            ])
            .unwrap()
            .job_id
        };
        assert_eq!(restart("0"), "train.0");
        assert_ne!(restart("0"), restart("1"));
        let s = env(&[
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_STEP_NUM_NODES", "1"),
            ("SLURM_JOB_ID", "77"),
            ("SLURM_STEP_ID", "0"),
        ])
        .unwrap();
        assert_eq!((s.rank, s.size, s.job_id.as_str()), (3, 8, "77.0"));
    }

    #[test]
    fn bad_values_are_named() {
        for (vars, needle) in [
            (&[("HCOMM_RANK", "x"), ("HCOMM_SIZE", "2")][..], "HCOMM_RANK=\"x\""),
            (&[("HCOMM_RANK", "0")][..], "HCOMM_SIZE is not"),
            (&[("HCOMM_RANK", "4"), ("HCOMM_SIZE", "4"), ("HCOMM_ADDR", "h:1")][..], "not below"),
            (&[("HCOMM_RANK", "0"), ("HCOMM_SIZE", "0")][..], "at least one"),
            (&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")][..], "MASTER_PORT"),
            (&[][..], "no launcher environment"),
        ] {
            let e = env(vars).unwrap_err();
            assert!(e.to_string().contains(needle), "{e} lacks {needle}");
            assert_eq!(e.kind(), hcomm_core::ErrorKind::Config);
        }
    }
}
