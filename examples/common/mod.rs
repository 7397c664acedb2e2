//! Pieces the examples share: sizes with suffixes, fatal errors, and launching
//! oneself as N local ranks.
#![allow(dead_code)]

/// `16M`, `4K`, `1G` or a plain number of bytes.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().map(|n| n * mult).map_err(|e| format!("bad size {s:?}: {e}"))
}

/// Prints `msg` with the program's name and exits with status 1.
pub fn fail(msg: impl std::fmt::Display) -> ! {
    let name = std::env::args().next().unwrap_or_default();
    let name = std::path::Path::new(&name).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    eprintln!("{name}: {msg}");
    std::process::exit(1);
}

/// Runs this program again as `ranks` local processes (with the launcher's
/// environment, so each copy is one rank) and exits with the job's status.
pub fn launch_self(ranks: usize) -> ! {
    let exe = std::env::current_exe().unwrap_or_else(|e| fail(e));
    let launch = hcomm_launch::Launch {
        ranks,
        program: exe.into_os_string(),
        args: std::env::args_os().skip(1).collect(),
        prefix: false,
        env: Vec::new(),
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap_or_else(|e| fail(e));
    let out = rt.block_on(hcomm_launch::run(launch)).unwrap_or_else(|e| fail(e));
    std::process::exit(out.code);
}
