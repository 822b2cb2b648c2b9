//! End-to-end tests of `recipe report`: metrics files laid down by the test (the format `recipe
//! run` writes), charts that are real PNGs of the promised size, and a golden markdown summary.

use std::path::Path;
use std::process::{Command, Output};

fn recipe(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_recipe"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run the recipe binary")
}

/// A metrics file of `steps` steps whose loss decays from `start`, with an eval every 5 steps.
fn metrics(start: f64, lr: f64, steps: u64) -> String {
    let mut out = String::new();
    for step in 1..=steps {
        let s = step as f64;
        let loss = start * (-s / 40.0).exp() + 2.0;
        let warm = (s / 5.0).min(1.0);
        out.push_str(&format!(
            "{{\"step\":{step},\"loss\":{loss},\"lr\":{},\"grad_norm\":{},\"tokens_per_second\":{},\"tflops_per_gpu\":0.01,\"mfu\":{},\"step_seconds\":0.2,\"memory_bytes\":1000000}}\n",
            lr * warm,
            0.5 + loss / 4.0,
            1000.0 + 10.0 * s,
            0.02 + 0.0001 * s
        ));
        if step % 5 == 0 {
            out.push_str(&format!(
                "{{\"step\":{step},\"eval_loss\":{}}}\n",
                loss + 0.3
            ));
        }
    }
    out
}

/// `(width, height)` from a PNG's signature and IHDR chunk, or `None` if it is not a PNG.
fn png_size(bytes: &[u8]) -> Option<(u32, u32)> {
    const SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n'];
    if bytes.len() < 24 || bytes[..8] != SIGNATURE || &bytes[12..16] != b"IHDR" {
        return None;
    }
    let word =
        |at: usize| u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    Some((word(16), word(20)))
}

#[test]
fn a_sweep_directory_and_a_run_give_charts_and_a_summary() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sweep = dir.path().join("lr-scan");
    for (name, start, lr) in [
        ("lr-scan-000-lr3e-4", 6.0, 3e-4),
        ("lr-scan-001-lr1e-3", 8.0, 1e-3),
    ] {
        let member = sweep.join(name);
        std::fs::create_dir_all(&member).expect("member dir");
        std::fs::write(member.join("metrics.jsonl"), metrics(start, lr, 30)).expect("metrics");
    }
    let single = dir.path().join("baseline");
    std::fs::create_dir_all(&single).expect("run dir");
    // A torn last line, as a crashed run leaves it, is skipped and counted.
    let text = metrics(7.0, 5e-4, 20) + "{\"step\":21,\"lo";
    std::fs::write(single.join("metrics.jsonl"), text).expect("metrics");

    let out = recipe(
        dir.path(),
        &["report", "lr-scan", "baseline", "--out", "report"],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = dir.path().join("report");
    for chart in [
        "loss.png",
        "eval_loss.png",
        "lr.png",
        "grad_norm.png",
        "tokens_per_second.png",
        "mfu.png",
    ] {
        let bytes = std::fs::read(report.join(chart)).expect(chart);
        assert_eq!(
            png_size(&bytes),
            Some((1000, 560)),
            "{chart} is a 1000×560 PNG"
        );
        // Three coloured curves, axes and text: far more than a blank image compresses to.
        assert!(
            bytes.len() > 15_000,
            "{chart} has only {} bytes",
            bytes.len()
        );
    }
    let summary = std::fs::read_to_string(report.join("report.md")).expect("report.md");
    insta::assert_snapshot!("report_summary", summary);
}

#[test]
fn charts_without_data_are_left_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = dir.path().join("run");
    std::fs::create_dir_all(&run).expect("run dir");
    std::fs::write(
        run.join("metrics.jsonl"),
        "{\"step\":1,\"loss\":5.0}\n{\"step\":2,\"loss\":4.0}\n",
    )
    .expect("metrics");
    let out = recipe(dir.path(), &["report", "run"]);
    assert_eq!(out.status.code(), Some(0));
    let report = run.join("report");
    assert!(report.join("loss.png").is_file());
    for absent in [
        "eval_loss.png",
        "lr.png",
        "grad_norm.png",
        "tokens_per_second.png",
        "mfu.png",
    ] {
        assert!(!report.join(absent).exists(), "{absent} has no data");
    }
    let summary = std::fs::read_to_string(report.join("report.md")).expect("report.md");
    assert!(
        summary.contains("| run | 2 | 2 | 4.0000 | - | - | - |"),
        "{summary}"
    );
}

#[test]
fn a_directory_without_metrics_is_an_error_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("empty")).expect("dir");
    let out = recipe(dir.path(), &["report", "empty"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("empty") && err.contains("metrics.jsonl"),
        "{err}"
    );
}

/// The `manifest.json` of a sweep member, with only what the report reads: the recipe.
fn manifest(name: &str, lr: f64, seed: u64) -> String {
    serde_json::json!({
        "format_version": 1,
        "status": "finished",
        "recipe": {
            "name": name,
            "model": {"num_layers": 2, "hidden_size": 64},
            "training": {"seed": seed, "optimizer": {"lr": lr, "min_lr": 0.0}},
            "checkpoint": {"dir": format!("/runs/{name}/checkpoints")},
            "logging": {"jsonl": format!("/runs/{name}/metrics.jsonl")},
        },
    })
    .to_string()
}

#[test]
fn a_seeded_sweep_shows_its_axes_and_mean_and_std_across_seeds_smoothed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sweep = dir.path().join("seeds");
    let members = [
        ("seeds-000-lr3e-4-s1", 6.0, 3e-4, 1),
        ("seeds-001-lr3e-4-s2", 6.5, 3e-4, 2),
        ("seeds-002-lr1e-3-s1", 8.0, 1e-3, 1),
        ("seeds-003-lr1e-3-s2", 7.0, 1e-3, 2),
    ];
    for (name, start, lr, seed) in members {
        let member = sweep.join(name);
        std::fs::create_dir_all(&member).expect("member dir");
        std::fs::write(member.join("metrics.jsonl"), metrics(start, lr, 30)).expect("metrics");
        std::fs::write(member.join("manifest.json"), manifest(name, lr, seed)).expect("manifest");
    }
    let out = recipe(dir.path(), &["report", "seeds", "--smooth", "0.6"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = sweep.join("report");
    for chart in ["loss.png", "grad_norm.png", "lr.png"] {
        let bytes = std::fs::read(report.join(chart)).expect(chart);
        assert_eq!(png_size(&bytes), Some((1000, 560)), "{chart}");
    }
    let summary = std::fs::read_to_string(report.join("report.md")).expect("report.md");
    insta::assert_snapshot!("report_seeds_smoothed", summary);

    // Smoothing draws other pixels than the raw curves alone.
    let raw = recipe(dir.path(), &["report", "seeds", "--out", "raw"]);
    assert_eq!(raw.status.code(), Some(0));
    let smoothed = std::fs::read(report.join("loss.png")).expect("smoothed chart");
    let plain = std::fs::read(dir.path().join("raw/loss.png")).expect("raw chart");
    assert_ne!(
        smoothed, plain,
        "--smooth changed nothing in the loss chart"
    );
}

#[test]
fn a_smoothing_weight_outside_0_to_1_is_a_usage_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    for bad in ["1", "-0.1", "much"] {
        let out = recipe(dir.path(), &["report", ".", &format!("--smooth={bad}")]);
        assert_eq!(out.status.code(), Some(2), "--smooth {bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--smooth"), "{err}");
    }
}
