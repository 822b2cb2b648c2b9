//! What sweeps and reports cost outside the runs themselves: expanding a large sweep, reading a
//! long metrics file, and drawing the charts of a three-run report.

use std::hint::black_box;
use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use ferrotron_sweep::{MetricsLog, ReportOptions, RunMetrics, SweepSpec, expand, write_report};

fn metrics_text(steps: u64, start: f64) -> String {
    let mut out = String::new();
    for step in 1..=steps {
        let s = step as f64;
        out.push_str(&format!(
            "{{\"step\":{step},\"loss\":{},\"lr\":0.001,\"grad_norm\":1.0,\"tokens_per_second\":{},\"tflops_per_gpu\":1.0,\"mfu\":0.4,\"step_seconds\":0.1,\"memory_bytes\":1}}\n",
            start * (-s / 300.0).exp() + 2.0,
            1000.0 + s
        ));
        if step % 50 == 0 {
            out.push_str(&format!(
                "{{\"step\":{step},\"eval_loss\":{}}}\n",
                start * (-s / 300.0).exp() + 2.3
            ));
        }
    }
    out
}

fn benches(c: &mut Criterion) {
    let spec = SweepSpec::parse(
        Path::new("s.yaml"),
        "sweep:\n  name: big\n  base: b.yaml\n  \
         grid: { training.optimizer.lr: [1, 2, 3, 4], parallel.tensor: [1, 2, 4, 8], training.micro_batch_size: [1, 2, 4, 8] }\n  \
         zip: { model.num_layers: [1, 2, 3, 4, 5, 6, 7, 8], model.hidden_size: [1, 2, 3, 4, 5, 6, 7, 8] }\n  \
         seeds: [1, 2, 3, 4]\n",
    )
    .expect("bench sweep parses");
    c.bench_function("expand 2048 members", |b| {
        b.iter(|| expand(black_box(&spec)))
    });

    let text = metrics_text(10_000, 8.0);
    c.bench_function("MetricsLog::parse 10k steps", |b| {
        b.iter(|| MetricsLog::parse(black_box(&text)))
    });

    let runs: Vec<RunMetrics> = (0..3)
        .map(|i| RunMetrics {
            label: format!("run-{i}"),
            log: MetricsLog::parse(&metrics_text(1000, 6.0 + f64::from(i))),
            recipe: None,
        })
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut group = c.benchmark_group("report");
    group.sample_size(10);
    group.bench_function("write_report 3 runs x 1000 steps (5 PNGs)", |b| {
        b.iter(|| {
            write_report(black_box(&runs), dir.path(), &ReportOptions::default()).expect("report")
        })
    });
    let smooth = ReportOptions { smooth: Some(0.6) };
    group.bench_function("write_report 3 runs x 1000 steps smoothed", |b| {
        b.iter(|| write_report(black_box(&runs), dir.path(), &smooth).expect("report"))
    });
    group.finish();
}

criterion_group!(sweep, benches);
criterion_main!(sweep);
