//! hcomm-bench end to end: every operation over the in-process transport and two TCP
//! processes; the CSV, JSON and SVG outputs hold what the table promised.

use std::process::Command;

fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hcomm-bench"))
}

fn rows(csv: &str) -> Vec<Vec<String>> {
    csv.lines().skip(1).map(|l| l.split(',').map(str::to_string).collect()).collect()
}

#[test]
fn every_operation_with_csv_json_and_plot() {
    let dir = std::env::temp_dir().join(format!("hcomm-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (csv, json, svg) = (dir.join("r.csv"), dir.join("r.json"), dir.join("r.svg"));
    let out = bench()
        .args(["--transport", "mem", "--ranks", "3", "--max", "4K", "--iters", "3", "--warmup", "1", "--no-progress"])
        .arg("--csv")
        .arg(&csv)
        .arg("--json")
        .arg(&json)
        .arg("--plot")
        .arg(&svg)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.contains("# hcomm-bench: 3 ranks, transport mem"), "{table}");
    let rows = rows(&std::fs::read_to_string(&csv).unwrap());
    let count = |op: &str| rows.iter().filter(|r| r[0] == op).count();
    // 4 B .. 4 KiB doubling: 11 sizes; the blocked collectives start at 3 x 4 B.
    for op in ["latency", "bw", "allreduce", "broadcast"] {
        assert_eq!(count(op), 11, "{op}");
    }
    for op in ["allgather", "reduce_scatter", "alltoall"] {
        assert_eq!(count(op), 9, "{op}: 12 B .. 3 KiB");
    }
    for r in &rows {
        let (avg, min, max): (f64, f64, f64) = (r[6].parse().unwrap(), r[7].parse().unwrap(), r[8].parse().unwrap());
        assert!(0.0 < min && min <= avg * 1.0001 && avg <= max * 1.0001, "{r:?}");
        let (bytes, algbw, busbw): (f64, f64, f64) =
            (r[4].parse().unwrap(), r[9].parse().unwrap(), r[10].parse().unwrap());
        assert!((algbw - bytes / avg / 1e3).abs() <= 1e-6 + algbw * 1e-3, "{r:?}");
        let factor = match r[0].as_str() {
            "allreduce" => 4.0 / 3.0,
            "allgather" | "reduce_scatter" | "alltoall" => 2.0 / 3.0,
            _ => 1.0,
        };
        assert!((busbw - algbw * factor).abs() <= 1e-6 + busbw * 1e-3, "{r:?}");
        assert_eq!(r[5], "3", "iterations");
    }
    let run: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(run["rows"].as_array().unwrap().len(), rows.len());
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg") && plot.contains("<polyline") && plot.contains("allreduce"), "{plot}");
    // A plot of two runs from files, without measuring.
    let two = dir.join("two.svg");
    let out = bench()
        .args(["--no-run", "--plot-op", "broadcast", "--plot"])
        .arg(&two)
        .arg("--with")
        .arg(&json)
        .arg("--with")
        .arg(&json)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(&two).unwrap().matches("<polyline").count(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tcp_processes_and_forced_algorithms() {
    let out = bench()
        .args(["--ranks", "2", "--ops", "latency,allreduce", "--max", "64", "--iters", "5", "--algo", "allreduce=ring"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.contains("transport tcp"), "{table}");
    assert_eq!(
        table.lines().filter(|l| l.trim_start().starts_with("allreduce") && l.ends_with("ring")).count(),
        5,
        "{table}"
    );
    let bad = bench().args(["--transport", "mem", "--algo", "allreduce=fast"]).output().unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown allreduce algorithm"));
}
