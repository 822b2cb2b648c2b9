//! cuDNN's fused attention timed at the bench rows' shapes, with and without dropout: the
//! numbers the planner's attention rate is fitted to (`ferrotron-plan`'s `hardware.rs`).
//!
//! The planner used one attention efficiency per GPU kind, fitted on gpt-1.3b (head dim 128,
//! dropout 0.1). Head dim 64 runs at about half that rate, dropout costs the forward more
//! than twice its time, and long sequences run faster: one number could not predict the
//! gpt-350m, no-dropout and 32k–128k rows together. Each row here is one bench row's layer:
//! forward and backward kernel time (median of `reps` calls) and its fraction of 989 TFLOP/s
//! by the causal count (forward `2·b·h·s²·d`, backward 2.5×, as the plan counts them).

use ferrotron_cuda::GpuDevice;
use ferrotron_ops::AttentionSpec;

use crate::fused::{attention_ms, bf16_normal};
use crate::{first_line, guarded};

/// H100/H200 dense bf16 peak, the planner's MFU denominator.
const PEAK: f64 = 989e12;

/// (row, [b, heads, kv heads, seq, head dim], dropout, repetitions).
const SHAPES: &[(&str, [usize; 5], f64, usize)] = &[
    ("gpt-1.3b", [12, 16, 16, 2048, 128], 0.1, 10),
    ("gpt-1.3b", [12, 16, 16, 2048, 128], 0.0, 10),
    ("gpt-350m", [16, 16, 16, 2048, 64], 0.1, 10),
    ("gpt-350m", [16, 16, 16, 2048, 64], 0.0, 10),
    ("llama-1b", [6, 32, 8, 4096, 64], 0.0, 10),
    ("llama-1b-32k", [1, 32, 8, 32768, 64], 0.0, 5),
    ("llama-1b-128k", [1, 32, 8, 131072, 64], 0.0, 3),
    ("llama3.1-8b", [1, 32, 8, 8192, 128], 0.0, 10),
    ("llama3.1-8b-32k", [1, 32, 8, 32768, 128], 0.0, 5),
    ("qwen3-30b-a3b", [2, 32, 4, 4096, 128], 0.0, 10),
];

pub(crate) fn timings(device: &GpuDevice) -> String {
    let mut out = String::from(
        "| attention at a bench row (bf16, causal) | shape | dropout | fwd ms | fwd of peak | bwd ms | bwd of peak | fwd+bwd of peak |\n|---|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for &(row, [b, h, g, s, d], dropout, reps) in SHAPES {
        let shape = format!("b {b} h {h} kv {g} s {s} d {d}");
        let line = guarded(|| {
            let mk = |heads: usize| bf16_normal(device, [b, heads, s, d]);
            let (q, k, v, grad) = (mk(h), mk(g), mk(g), mk(h));
            let spec = AttentionSpec {
                dropout,
                ..AttentionSpec::causal()
            };
            let (fwd, bwd) = attention_ms(device, [&q, &k, &v, &grad], spec, reps);
            let flops = 2.0 * (b * h * s * s * d) as f64;
            let of_peak = |flops: f64, ms: f64| flops / (ms * 1e-3) / PEAK;
            Ok(format!(
                "| {row} | {shape} | {dropout} | {fwd:.3} | {:.3} | {bwd:.3} | {:.3} | {:.3} |\n",
                of_peak(flops, fwd),
                of_peak(2.5 * flops, bwd),
                of_peak(3.5 * flops, fwd + bwd),
            ))
        });
        out.push_str(&line.unwrap_or_else(|e| {
            format!(
                "| {row} | {shape} | {dropout} | failed: {} |\n",
                first_line(&e)
            )
        }));
    }
    out
}
