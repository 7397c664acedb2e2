//! A 2-D stencil in the style of a weather or heat model: Jacobi steps of heat
//! diffusion on a grid split in tiles over a grid of ranks. Each step sends the tile's
//! four edges to its grid neighbours and, while they travel, updates the tile's
//! interior; the edge cells follow once the neighbours' edges (the halos) are in.
//!
//! ```text
//! cargo run --release --example halo_exchange -- [--ranks 8] [--grid 2x4] [--cells 256] [--steps 100] [--hint grid|none] [--transport tcp|shm|mem]
//! ```
//!
//! `--hint grid` places the grid with [`hcomm::Communicator::grid`]: one tile of
//! neighbouring grid positions per host where the topology allows, so that most
//! halos stay inside a host. `--hint none` lays the grid over the ranks in rank order
//! (row-major), as a program that ignores the topology does. Started by hand, the
//! program launches `--ranks` copies of itself (tcp, shm) or runs the ranks as tasks
//! of one process (mem); started by a launcher (`hcomm run`, `mpirun`, …) it is one
//! rank.
//!
//! Rank 0 gathers the field at the end and checks it bit for bit against the same
//! steps computed sequentially over the whole domain, then prints the time per step,
//! and how many neighbour pairs of the grid cross hosts and racks.

use std::time::Instant;

use clap::{Parser, ValueEnum};
use common::{fail, launch_self};
use hcomm::{Communicator, Grid, Level, LocalTransport};

mod common;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Kind {
    /// TCP on tokio to every peer (shared memory off).
    Tcp,
    /// Shared-memory rings to the peers on this host (the default of `hcomm::init`).
    Shm,
    /// Ranks as tasks of one process.
    Mem,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Hint {
    /// Place the grid by the topology (`Communicator::grid`).
    Grid,
    /// Grid positions in rank order.
    None,
}

#[derive(Parser, Debug, Clone)]
#[command(about = "2-D halo exchange with overlap, verified against a sequential stencil")]
struct Args {
    /// Number of ranks when not started by a launcher.
    #[arg(long, default_value_t = 8)]
    ranks: usize,
    /// Grid of ranks, rows x columns (their product is the rank count).
    #[arg(long, default_value = "2x4")]
    grid: String,
    /// Cells per tile side.
    #[arg(long, default_value_t = 256)]
    cells: usize,
    /// Jacobi steps.
    #[arg(long, default_value_t = 100)]
    steps: usize,
    /// How grid positions are given to ranks.
    #[arg(long, value_enum, default_value_t = Hint::Grid)]
    hint: Hint,
    /// Transport.
    #[arg(long, value_enum, default_value_t = Kind::Shm)]
    transport: Kind,
}

fn dims_of(s: &str) -> [usize; 2] {
    let (a, b) = s.split_once('x').unwrap_or_else(|| fail(format!("--grid {s:?}: expected ROWSxCOLS")));
    let num = |t: &str| t.trim().parse::<usize>().unwrap_or_else(|e| fail(format!("--grid {s:?}: {e}")));
    [num(a), num(b)]
}

/// Initial temperature of global cell `(y, x)`.
fn initial(y: usize, x: usize) -> f64 {
    ((y * 31 + x * 17) % 101) as f64
}

/// One Jacobi update from the cell's four neighbours, in one fixed order so that the
/// distributed and the sequential computations give the same bits.
#[inline]
fn update(up: f64, down: f64, left: f64, right: f64) -> f64 {
    0.25 * (((up + down) + left) + right)
}

/// A tile of `c × c` cells with a one-cell halo on each side, row-major, `(c + 2)²`.
struct Tile {
    c: usize,
    cur: Vec<f64>,
    next: Vec<f64>,
}

impl Tile {
    fn new(c: usize, y0: usize, x0: usize) -> Tile {
        let w = c + 2;
        let mut cur = vec![0.0; w * w];
        for y in 0..c {
            for x in 0..c {
                cur[(y + 1) * w + x + 1] = initial(y0 + y, x0 + x);
            }
        }
        Tile { c, cur, next: vec![0.0; w * w] }
    }

    fn w(&self) -> usize {
        self.c + 2
    }

    /// Updates cell `(y, x)` (halo coordinates, 1..=c).
    #[inline]
    fn step_cell(&mut self, y: usize, x: usize) {
        let w = self.w();
        let i = y * w + x;
        self.next[i] = update(self.cur[i - w], self.cur[i + w], self.cur[i - 1], self.cur[i + 1]);
    }

    /// The four edges of the tile: top row, bottom row, left column, right column.
    fn edges(&self) -> [Vec<f64>; 4] {
        let (c, w) = (self.c, self.w());
        [
            self.cur[w + 1..w + 1 + c].to_vec(),
            self.cur[c * w + 1..c * w + 1 + c].to_vec(),
            (1..=c).map(|y| self.cur[y * w + 1]).collect(),
            (1..=c).map(|y| self.cur[y * w + c]).collect(),
        ]
    }

    /// Writes the halo on side `side` (0 top, 1 bottom, 2 left, 3 right).
    fn set_halo(&mut self, side: usize, v: &[f64]) {
        let (c, w) = (self.c, self.w());
        match side {
            0 => self.cur[1..=c].copy_from_slice(v),
            1 => self.cur[(c + 1) * w + 1..(c + 1) * w + 1 + c].copy_from_slice(v),
            2 => (1..=c).for_each(|y| self.cur[y * w] = v[y - 1]),
            _ => (1..=c).for_each(|y| self.cur[y * w + c + 1] = v[y - 1]),
        }
    }

    fn interior(&self) -> Vec<f64> {
        let (c, w) = (self.c, self.w());
        (1..=c).flat_map(|y| self.cur[y * w + 1..y * w + 1 + c].iter().copied()).collect()
    }
}

/// Tag of a halo travelling towards side `side` of its receiver.
fn tag(side: usize) -> u32 {
    100 + side as u32
}

/// Runs the steps on one rank at grid rank `comm.rank()` of `grid`; returns the
/// seconds per step and the final interior.
async fn rank_main<T: LocalTransport>(
    comm: &Communicator<T>,
    grid: &Grid,
    args: &Args,
) -> Result<(f64, Vec<f64>), String> {
    let g = comm.rank();
    let (c, coords) = (args.cells, grid.coords(g));
    let mut tile = Tile::new(c, coords[0] * c, coords[1] * c);
    // Neighbours: up, down (dimension 0), left, right (dimension 1).
    let (up, down) = grid.shift(g, 0, 1);
    let (left, right) = grid.shift(g, 1, 1);
    let nbr = [up, down, left, right];
    // The side of the receiver a halo I send to side `s` lands on.
    let opposite = [1, 0, 3, 2];
    comm.barrier().await.map_err(|e| e.to_string())?;
    let start = Instant::now();
    for _ in 0..args.steps {
        let edges = tile.edges();
        // Sends copy the edges at the call; the receives are posted now.
        let sends = futures::future::try_join_all(
            (0..4).filter_map(|s| nbr[s].map(|p| comm.send(p, tag(opposite[s]), &edges[s]))),
        );
        let recvs = futures::future::try_join_all(
            (0..4).filter_map(|s| nbr[s].map(|p| async move { comm.recv::<f64>(p, tag(s)).await.map(|v| (s, v)) })),
        );
        let exchange = futures::future::try_join(sends, recvs);
        // The interior while the halos travel, yielding between row blocks so that
        // the transport's tasks on this thread move the halos meanwhile.
        let interior = async {
            for y0 in (2..c).step_by(32) {
                for y in y0..(y0 + 32).min(c) {
                    for x in 2..c {
                        tile.step_cell(y, x);
                    }
                }
                tokio::task::yield_now().await;
            }
        };
        let (got, ()) = futures::join!(exchange, interior);
        let (_, halos) = got.map_err(|e| e.to_string())?;
        for (s, v) in halos {
            tile.set_halo(s, &v);
        }
        // Grid edges keep a zero halo (the initial one).
        for i in 1..=c {
            for (y, x) in [(1, i), (c, i), (i, 1), (i, c)] {
                tile.step_cell(y, x);
            }
        }
        std::mem::swap(&mut tile.cur, &mut tile.next);
    }
    let per_step = start.elapsed().as_secs_f64() / args.steps.max(1) as f64;
    Ok((per_step, tile.interior()))
}

/// The same steps over the whole domain.
fn sequential(rows: usize, cols: usize, steps: usize) -> Vec<f64> {
    let (h, w) = (rows + 2, cols + 2);
    let mut cur = vec![0.0; h * w];
    for y in 0..rows {
        for x in 0..cols {
            cur[(y + 1) * w + x + 1] = initial(y, x);
        }
    }
    let mut next = cur.clone();
    for _ in 0..steps {
        for y in 1..=rows {
            for x in 1..=cols {
                let i = y * w + x;
                next[i] = update(cur[i - w], cur[i + w], cur[i - 1], cur[i + 1]);
            }
        }
        std::mem::swap(&mut cur, &mut next);
    }
    cur
}

/// Gathers the field at grid rank 0 and checks it there; the slowest rank's time per
/// step is returned on every rank.
async fn run<T: LocalTransport>(world: &Communicator<T>, args: &Args) -> Result<Option<String>, String> {
    let dims = dims_of(&args.grid);
    let (comm_owned, grid);
    let comm = match args.hint {
        Hint::Grid => {
            let (cm, gr) = world.grid(&dims, &[false, false]).await.map_err(|e| e.to_string())?;
            (comm_owned, grid) = (Some(cm), gr);
            comm_owned.as_ref().expect("just set")
        }
        Hint::None => {
            grid = Grid::new(&dims, &[false, false]).map_err(|e| e.to_string())?;
            if grid.size() != world.size() {
                return Err(format!("--grid {} has {} positions for {} ranks", args.grid, grid.size(), world.size()));
            }
            world
        }
    };
    let (per_step, mine) = rank_main(comm, &grid, args).await?;
    let mut slowest = [per_step];
    comm.all_reduce(&mut slowest, hcomm::ReduceOp::Max).await.map_err(|e| e.to_string())?;
    let c = args.cells;
    let n = comm.size();
    let mut all = if comm.rank() == 0 { vec![0.0; n * c * c] } else { Vec::new() };
    comm.gather(&mine, &mut all, 0).await.map_err(|e| e.to_string())?;
    if comm.rank() != 0 {
        return Ok(None);
    }
    let (rows, cols) = (dims[0] * c, dims[1] * c);
    let want = sequential(rows, cols, args.steps);
    for gr in 0..n {
        let co = grid.coords(gr);
        for y in 0..c {
            for x in 0..c {
                let got = all[gr * c * c + y * c + x];
                let (gy, gx) = (co[0] * c + y, co[1] * c + x);
                let w = want[(gy + 1) * (cols + 2) + gx + 1];
                if got.to_bits() != w.to_bits() {
                    return Err(format!("cell ({gy}, {gx}) of grid rank {gr} is {got}, sequential {w}"));
                }
            }
        }
    }
    // Which world rank holds each grid position, for the crossing counts.
    let order: Vec<usize> = match args.hint {
        Hint::Grid => grid.placement(world.topology()).map_err(|e| e.to_string())?,
        Hint::None => (0..n).collect(),
    };
    let topo = world.topology();
    Ok(Some(format!(
        "halo exchange: {}x{} grid of {c}x{c} tiles, {} steps, hint {:?}, transport {}\n  verified: the field equals the sequential stencil bit for bit\n  neighbour pairs across hosts {} across racks {} (of {}) on {} hosts in {} racks\n  time per step {:.3} ms (slowest rank)",
        dims[0],
        dims[1],
        args.steps,
        args.hint,
        comm.transport_name(),
        grid.crossings(&order, topo, Level::Rack),
        grid.crossings(&order, topo, Level::Spine),
        (0..n).map(|g| grid.neighbours(g).len()).sum::<usize>() / 2,
        topo.host_count(),
        topo.rack_count(),
        slowest[0] * 1e3
    )))
}

fn as_rank(args: &Args) {
    tokio::runtime::Runtime::new().unwrap_or_else(|e| fail(e)).block_on(async {
        let mut cfg = hcomm::Config::from_env().unwrap_or_else(|e| fail(e));
        if args.transport == Kind::Tcp {
            cfg.shm = false;
        }
        let comm = cfg.connect().await.unwrap_or_else(|e| fail(e));
        if let Some(report) = run(&comm, args).await.unwrap_or_else(|e| fail(e)) {
            println!("{report}");
        }
        comm.finalize().await.unwrap_or_else(|e| fail(e));
    });
}

fn main() {
    let args = Args::parse();
    let dims = dims_of(&args.grid);
    if args.cells < 4 {
        fail("--cells must be at least 4");
    }
    if hcomm::env::LaunchEnv::launched() {
        return as_rank(&args);
    }
    if dims[0] * dims[1] != args.ranks {
        fail(format!("--grid {} has {} positions for --ranks {}", args.grid, dims[0] * dims[1], args.ranks));
    }
    match args.transport {
        Kind::Mem => tokio::runtime::Runtime::new().unwrap_or_else(|e| fail(e)).block_on(async {
            let comms = hcomm::local(args.ranks);
            let results = futures::future::join_all(comms.iter().map(|c| run(c, &args))).await;
            for r in results {
                if let Some(report) = r.unwrap_or_else(|e| fail(e)) {
                    println!("{report}");
                }
            }
        }),
        Kind::Tcp | Kind::Shm => launch_self(args.ranks),
    }
}
