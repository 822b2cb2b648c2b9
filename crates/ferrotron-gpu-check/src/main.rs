//! `gpu_check`: the differential op table of the ferrotron CUDA backend.
//!
//! Every backend op runs on fresh random inputs on the GPU and on burn-flex (the CPU reference),
//! and the two outputs are compared at a tolerance fit for the dtype. The GPU allocator poisons
//! every fresh buffer first (NaN / -1 / 0xFF), so an output element a kernel forgot to write
//! fails its row instead of passing by luck. One row per op and dtype, printed as a Markdown
//! table last; the exit code is non-zero when any row fails.
//!
//! It is built by CI (no feature gate) but needs a GPU to run; `tools/gpu-check.sh` wraps it for
//! the device machine. The same harness runs burn-flex against itself in the GPU-free tests, so
//! a typo in the table fails CI rather than a scarce GPU run.

mod attention_rates;
mod autodiff;
mod cases;
mod compare;
mod device_grouped;
mod fp8;
mod fp8_fused_sources;
mod fp8_grouped;
mod fp8_source;
mod fused;
mod fused_bias_gelu;
mod fused_combine;
mod fused_dropout;
mod fused_flat;
mod fused_gather;
mod fused_grouped;
mod fused_loss;
mod fused_mla;
mod fused_moe;
mod fused_norm;
mod fused_qk_norm;
mod fused_qkv;
mod fused_rope;
mod fused_router;
mod fused_router_aux;
mod fused_swiglu;
mod fused_window;
mod host_pass;
mod nccl;
mod nccl_faults;
mod pool_retry;
mod read_later;
mod timing;
mod uploads;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use anyhow::{Context, bail};
use burn::backend::Flex;
use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, TensorData, bf16, f16, read_sync};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use cases::{CASES, Case, Ctx, In, Kind, RANDOM, Val};
use compare::Errors;

/// One printed row.
#[derive(Debug, Clone)]
struct Row {
    op: String,
    dtype: &'static str,
    shape: String,
    errors: Errors,
    note: String,
}

/// The dtypes a case runs at.
fn float_dtypes(kind: Kind) -> &'static [FloatDType] {
    match kind {
        Kind::Float => &[FloatDType::F32, FloatDType::BF16, FloatDType::F16],
        Kind::FloatF32 | Kind::Int | Kind::Bool => &[FloatDType::F32],
    }
}

fn dtype_name(kind: Kind, float: FloatDType) -> &'static str {
    match (kind, float) {
        (Kind::Int, _) => "int",
        (Kind::Bool, _) => "bool",
        (_, FloatDType::BF16) => "bf16",
        (_, FloatDType::F16) => "f16",
        _ => "f32",
    }
}

/// Host data for every input of a case; floats are rounded to the case dtype here, so both
/// backends start from bit-identical values.
fn make_inputs(case: &Case, float: FloatDType, rng: &mut StdRng) -> Vec<TensorData> {
    case.inputs
        .iter()
        .map(|input| match *input {
            In::F(shape, lo, hi) => {
                let n = shape.iter().product::<usize>();
                let v: Vec<f32> = (0..n).map(|_| rng.random_range(lo..hi) as f32).collect();
                in_float(TensorData::new(v, shape.to_vec()), float)
            }
            In::Fq(shape, lo, hi) => {
                let n = shape.iter().product::<usize>();
                let v: Vec<f32> = (0..n).map(|_| rng.random_range(lo..=hi) as f32).collect();
                in_float(TensorData::new(v, shape.to_vec()), float)
            }
            In::I(shape, lo, hi) => {
                let n = shape.iter().product::<usize>();
                let v: Vec<i64> = (0..n).map(|_| rng.random_range(lo..=hi)).collect();
                TensorData::new(v, shape.to_vec())
            }
            In::B(shape) => {
                let n = shape.iter().product::<usize>();
                let v: Vec<bool> = (0..n).map(|_| rng.random_bool(0.5)).collect();
                TensorData::new(v, shape.to_vec())
            }
        })
        .collect()
}

fn in_float(data: TensorData, float: FloatDType) -> TensorData {
    match float {
        FloatDType::BF16 => data.convert::<bf16>(),
        FloatDType::F16 => data.convert::<f16>(),
        _ => data,
    }
}

fn upload<B: Backend>(data: &[TensorData], device: &B::Device) -> Vec<Val<B>> {
    data.iter()
        .map(|d| {
            if d.dtype.is_float() {
                Val::F(B::float_from_data(d.clone(), device))
            } else if d.dtype.is_bool() {
                Val::B(B::bool_from_data(d.clone(), device))
            } else {
                Val::I(B::int_from_data(d.clone(), device))
            }
        })
        .collect()
}

fn download<B: Backend>(value: Val<B>) -> Result<TensorData, String> {
    let read = match value {
        Val::F(t) => read_sync(B::float_into_data(t)),
        Val::I(t) => read_sync(B::int_into_data(t)),
        Val::B(t) => read_sync(B::bool_into_data(t)),
    };
    read.map_err(|e| e.to_string())
}

/// Runs `f`, turning a panic (how burn's infallible op traits report failure) into an error.
fn guarded<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(payload) => Err(payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panicked".to_string())),
    }
}

fn run_on<B: Backend>(
    op: &str,
    float: FloatDType,
    data: &[TensorData],
    device: &B::Device,
) -> Result<TensorData, String> {
    guarded(|| {
        let ctx = Ctx::<B> {
            vals: upload::<B>(data, device),
            float,
            device: device.clone(),
        };
        download::<B>(cases::exec::<B>(op, &ctx))
    })
}

/// Compares backend `G` against backend `R` on every case whose op contains `filter`.
fn op_rows<G: Backend, R: Backend>(
    gpu: &G::Device,
    reference: &R::Device,
    filter: &str,
    seed: u64,
) -> Vec<Row> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut rows = Vec::new();
    for case in CASES.iter().filter(|c| c.op.contains(filter)) {
        for &float in float_dtypes(case.kind) {
            let data = make_inputs(case, float, &mut rng);
            let shape = data
                .first()
                .map(|d| format!("{:?}", d.shape.as_slice()))
                .unwrap_or_else(|| "-".to_string());
            let want = run_on::<R>(cases::reference_op(case.op), float, &data, reference);
            let got = run_on::<G>(case.op, float, &data, gpu);
            let (errors, note) = match (got, want) {
                (Ok(got), Ok(want)) => (compare::compare(&got, &want, case.tol), String::new()),
                (Err(e), _) => (failed(), format!("backend: {}", first_line(&e))),
                (_, Err(e)) => (failed(), format!("reference: {}", first_line(&e))),
            };
            let note = match (&errors.mismatch, note.is_empty()) {
                (Some(m), true) => m.clone(),
                _ => note,
            };
            rows.push(Row {
                op: case.op.to_string(),
                dtype: dtype_name(case.kind, float),
                shape,
                errors,
                note,
            });
        }
    }
    rows
}

fn failed() -> Errors {
    Errors {
        max_abs: f64::NAN,
        max_rel: f64::NAN,
        bad: 0,
        mismatch: Some("did not run".to_string()),
    }
}

fn first_line(s: &str) -> String {
    s.lines()
        .next()
        .unwrap_or_default()
        .chars()
        .take(160)
        .collect()
}

/// Random ops: the sample's mean and variance against the distribution's, within 1 %.
fn random_rows<G: Backend>(gpu: &G::Device, filter: &str) -> Vec<Row> {
    let mut rows = Vec::new();
    for &op in RANDOM.iter().filter(|op| op.contains(filter)) {
        let dtypes: &[FloatDType] = if op == "int_random" {
            &[FloatDType::F32]
        } else {
            &[FloatDType::F32, FloatDType::BF16]
        };
        for &float in dtypes {
            let sample = guarded(|| download::<G>(cases::random_moments::<G>(op, float, gpu)));
            let (want_mean, want_var) = cases::expected_moments(op);
            let (errors, note) = match sample {
                Ok(data) => {
                    let (mean, var) = compare::moments(&data);
                    let mean_err = (mean - want_mean).abs();
                    let var_err = (var - want_var).abs() / want_var;
                    let ok = mean_err <= 0.01 * want_var.sqrt().max(1.0) && var_err <= 0.01;
                    (
                        Errors {
                            max_abs: mean_err,
                            max_rel: var_err,
                            bad: usize::from(!ok),
                            mismatch: None,
                        },
                        format!(
                            "mean {mean:.4} (want {want_mean}), var {var:.4} (want {want_var:.4})"
                        ),
                    )
                }
                Err(e) => (failed(), format!("backend: {}", first_line(&e))),
            };
            let kind = if op == "int_random" {
                Kind::Int
            } else {
                Kind::Float
            };
            rows.push(Row {
                op: op.to_string(),
                dtype: dtype_name(kind, float),
                shape: "[1048576]".to_string(),
                errors,
                note,
            });
        }
    }
    rows
}

/// The autodiff row: MLP loss and gradients through `Autodiff<G>` against `Autodiff<R>`.
fn autodiff_rows<G: Backend, R: Backend>(gpu: &G::Device, reference: &R::Device) -> Vec<Row> {
    let mut rng = StdRng::seed_from_u64(7);
    let mut uniform = |shape: [usize; 2], scale: f32| {
        let n = shape[0] * shape[1];
        let v: Vec<f32> = (0..n).map(|_| rng.random_range(-scale..scale)).collect();
        TensorData::new(v, shape.to_vec())
    };
    let inputs = autodiff::MlpInputs {
        x: uniform([8, 16], 1.0),
        w1: uniform([16, 32], 0.3),
        b1: {
            let d = uniform([1, 32], 0.1);
            TensorData::new(d.to_vec::<f32>().unwrap_or_default(), [32])
        },
        w2: uniform([32, 5], 0.3),
        targets: TensorData::new((0..8i64).map(|i| (i * 3) % 5).collect::<Vec<_>>(), [8, 1]),
    };
    // bf16 runs the same graph on bf16 copies of the inputs: the transposed bf16 matmuls and
    // bf16 reductions of the backward pass.
    [(FloatDType::F32, "f32"), (FloatDType::BF16, "bf16")]
        .into_iter()
        .map(|(float, dtype)| {
            let inputs = inputs.in_dtype(|d| in_float(d, float));
            let got = guarded(|| Ok(autodiff::mlp_gradients::<G>(&inputs, gpu)));
            let want = guarded(|| Ok(autodiff::mlp_gradients::<R>(&inputs, reference)));
            let (errors, note) = match (got, want) {
                (Ok(g), Ok(w)) => (
                    compare::compare(&g, &w, 4.0),
                    "loss + grads of w1, b1, w2, x".into(),
                ),
                (Err(e), _) => (failed(), format!("backend: {}", first_line(&e))),
                (_, Err(e)) => (failed(), format!("reference: {}", first_line(&e))),
            };
            Row {
                op: "autodiff_mlp".to_string(),
                dtype,
                shape: "[8, 16]".to_string(),
                errors,
                note,
            }
        })
        .collect()
}

fn render(rows: &[Row]) -> String {
    let mut out = String::from(
        "| op | dtype | shape | max abs err | max rel err | pass | note |\n|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {:.3e} | {:.3e} | {} | {} |\n",
            r.op,
            r.dtype,
            r.shape,
            r.errors.max_abs,
            r.errors.max_rel,
            if r.errors.pass() { "yes" } else { "NO" },
            r.note.replace('|', "/"),
        ));
    }
    let passed = rows.iter().filter(|r| r.errors.pass()).count();
    out.push_str(&format!("\n{passed}/{} rows pass\n", rows.len()));
    out
}

/// Every row of the table: ops, random ops, autodiff.
fn all_rows<G: Backend, R: Backend>(
    gpu: &G::Device,
    reference: &R::Device,
    filter: &str,
    seed: u64,
) -> Vec<Row> {
    let mut rows = op_rows::<G, R>(gpu, reference, filter, seed);
    rows.extend(random_rows::<G>(gpu, filter));
    if "autodiff_mlp".contains(filter) {
        rows.extend(autodiff_rows::<G, R>(gpu, reference));
    }
    rows
}

struct Args {
    filter: String,
    timings: bool,
    seed: u64,
    device_index: usize,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        filter: String::new(),
        timings: true,
        seed: 2026,
        device_index: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().with_context(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--filter" => args.filter = value("--filter")?,
            "--no-timings" => args.timings = false,
            "--seed" => args.seed = value("--seed")?.parse().context("--seed")?,
            "--device" => args.device_index = value("--device")?.parse().context("--device")?,
            "-h" | "--help" => {
                println!(
                    "gpu_check [--filter SUBSTRING|fused|qk_norm|window|mla|moe|moe_router|device_grouped|device_grouped_tma|fp8_experts|upload|host_pass|alloc|fp8|nccl|attention_rates] [--seed N] [--device INDEX] [--no-timings]\n\
                     Runs every ferrotron-cuda backend op against burn-flex, then the fused ops and\n\
                     linear overrides against their composed versions, the fp8 kernels and linear\n\
                     (Hopper), then the NCCL communicator\n\
                     (one rank; needs libnccl.so on LD_LIBRARY_PATH), and prints the table.\n\
                     FERROTRON_OP_TIMING=1 adds the per-op GPU time table."
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?} (try --help)"),
        }
    }
    Ok(args)
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    if let Ok(which) = std::env::var(nccl_faults::CHILD) {
        nccl_faults::child(&which, args.device_index);
    }
    let device = ferrotron_cuda::GpuDevice::new(args.device_index);
    let engine = ferrotron_cuda::CudaDevice::get(args.device_index)
        .with_context(|| format!("opening CUDA device {}", args.device_index))?;
    engine.set_poison_allocations(true);
    let started = Instant::now();
    // Quiet the default hook: failing ops are caught and reported in their row.
    std::panic::set_hook(Box::new(|_| {}));
    let rows = all_rows::<ferrotron_cuda::Cuda, Flex>(
        &device,
        &Default::default(),
        &args.filter,
        args.seed,
    );
    let mut rows = rows;
    if args.filter.is_empty() || args.filter == "fused" {
        rows.extend(fused::rows(&device));
        rows.extend(fused_norm::rows(&device));
        rows.extend(fused_loss::rows(&device));
        rows.extend(fused_qkv::rows(&device));
        rows.extend(fused_dropout::rows(&device));
        rows.extend(fused_swiglu::rows(&device));
        rows.extend(fused_bias_gelu::rows(&device));
        rows.extend(fused_rope::rows(&device));
        rows.extend(fused_flat::rows(&device));
    }
    if args.filter.is_empty() || args.filter == "fused" || args.filter == "combine" {
        rows.extend(fused_combine::rows(&device));
        rows.extend(fused_gather::rows(&device));
    }
    if args.filter.is_empty() || args.filter == "fused" || args.filter == "qk_norm" {
        rows.extend(fused_qk_norm::rows(&device));
    }
    if args.filter.is_empty() || args.filter == "fused" || args.filter == "window" {
        rows.extend(fused_window::rows(&device));
    }
    if args.filter.is_empty() || args.filter == "fused" || args.filter == "mla" {
        rows.extend(fused_mla::rows(&device));
    }
    if args.filter.is_empty() || args.filter == "fused" || args.filter == "fused_grouped" {
        rows.extend(fused_grouped::rows(&device));
    }
    if args.filter.is_empty() || args.filter == "fused" || args.filter == "device_grouped" {
        rows.extend(device_grouped::rows(&device, device_grouped::Kernels::All));
    }
    if args.filter == "device_grouped_tma" {
        rows.extend(device_grouped::rows(&device, device_grouped::Kernels::Tma));
        rows.extend(fp8_grouped::kernel_rows(&device));
    }
    if args.filter == "fp8_experts" {
        rows.extend(fp8_grouped::node_rows(&device));
    }
    if args.filter.is_empty() || args.filter == "fused" || args.filter == "moe" {
        rows.extend(fused_moe::rows(&device));
    }
    if args.filter.is_empty() || args.filter == "fused" || args.filter == "moe_router" {
        rows.extend(fused_router::rows(&device));
        rows.extend(fused_router_aux::rows(&device));
    }
    if args.filter.is_empty() || args.filter == "fused" || args.filter == "upload" {
        rows.extend(uploads::rows(&device));
    }
    if args.filter.is_empty() || args.filter == "fused" || args.filter == "host_pass" {
        rows.extend(host_pass::rows(&device));
        rows.extend(read_later::rows(&device));
    }
    if args.filter.is_empty() || args.filter == "alloc" {
        rows.extend(pool_retry::rows(args.device_index));
    }
    if args.filter.is_empty() || args.filter == "fp8" {
        rows.extend(fp8::rows(&device));
        rows.extend(fp8_fused_sources::rows(&device));
        rows.extend(fp8_grouped::kernel_rows(&device));
        rows.extend(fp8_grouped::node_rows(&device));
    }
    let mut nccl_comm = None;
    if args.filter.is_empty() || args.filter == "nccl" {
        let (nccl_rows, comm) = nccl::rows(args.device_index);
        rows.extend(nccl_rows);
        if let Some(comm) = &comm {
            rows.extend(nccl_faults::rows(comm));
        }
        nccl_comm = comm;
    }
    let _ = std::panic::take_hook();
    eprintln!(
        "gpu_check: {} rows in {:.1} s on {}",
        rows.len(),
        started.elapsed().as_secs_f64(),
        ferrotron_cuda::Cuda::name(&device)
    );
    print!("{}", render(&rows));
    if args.timings && args.filter == "nccl" {
        if let Some(comm) = &nccl_comm {
            println!("\n{}", nccl::timings(comm));
        }
    } else if args.timings && args.filter == "fp8" {
        println!("\n{}", fp8_source::timings(&device));
    } else if args.timings && args.filter == "combine" {
        println!("\n{}", fused_combine::timings(&device));
    } else if args.timings && args.filter == "window" {
        println!("\n{}", fused_window::timings(&device));
    } else if args.timings && args.filter == "mla" {
        println!("\n{}", fused_mla::timings(&device));
    } else if args.timings && args.filter == "attention_rates" {
        println!("\n{}", attention_rates::timings(&device));
    } else if args.timings && args.filter == "device_grouped" {
        println!("\n{}", device_grouped::timings(&device));
    } else if args.timings && args.filter == "host_pass" {
        println!("\n{}", read_later::timings(&device));
    } else if args.timings {
        if let Some(comm) = &nccl_comm {
            println!("\n{}", nccl::timings(comm));
        }
        println!(
            "\n{}",
            timing::render(&timing::timings::<ferrotron_cuda::Cuda>(&device, 1))
        );
        println!("\n{}", fused::timings(&device));
        println!("\n{}", fused_norm::timings(&device));
        println!("\n{}", fused_loss::timings(&device));
        println!("\n{}", fused_qkv::timings(&device));
        println!("\n{}", fused_window::timings(&device));
        println!("\n{}", fused_mla::timings(&device));
        println!("\n{}", device_grouped::timings(&device));
        println!("\n{}", fused_dropout::timings(&device));
        println!("\n{}", fp8_source::timings(&device));
        println!("\n{}", read_later::timings(&device));
    }
    if ferrotron_cuda::timing::enabled() {
        println!(
            "\nper-op GPU time (FERROTRON_OP_TIMING)\n{}",
            ferrotron_cuda::timing::report()
        );
    }
    let failures = rows.iter().filter(|r| !r.errors.pass()).count();
    if failures > 0 {
        bail!("{failures} rows failed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::flex::FlexDevice;
    use burn::tensor::DType;

    /// The whole table, burn-flex against itself: every op name resolves, every case runs, and
    /// identical backends agree (within tolerance: tie order and summation order may differ). A typo in the table fails here, not on the GPU.
    #[test]
    fn the_table_runs_on_flex_against_itself() {
        let rows = all_rows::<Flex, Flex>(&FlexDevice, &FlexDevice, "", 1);
        let random_ops = 2 * RANDOM.len() - 1;
        let expected: usize = CASES
            .iter()
            .map(|c| float_dtypes(c.kind).len())
            .sum::<usize>()
            + random_ops
            + 2;
        assert_eq!(rows.len(), expected);
        // Ops burn-flex lacks (checked against a composition) cannot run on the Flex "backend".
        let failing: Vec<String> = rows
            .iter()
            .filter(|r| !r.errors.pass() && cases::reference_op(&r.op) == r.op)
            .map(|r| format!("{} {}: {}", r.op, r.dtype, r.note))
            .collect();
        assert!(failing.is_empty(), "{failing:#?}");
        assert!(render(&rows).contains("rows pass"));
    }

    #[test]
    fn timings_run_small_on_the_cpu() {
        let lines = timing::timings::<Flex>(&FlexDevice, 64);
        assert_eq!(lines.len(), 5);
        assert!(lines.iter().all(|t| t.median_ms.is_finite()));
        assert!(timing::render(&lines).contains("TFLOP/s"));
    }

    #[test]
    fn inputs_are_rounded_to_the_case_dtype() {
        let case = CASES
            .iter()
            .find(|c| c.op == "add")
            .expect("add is in the table");
        let mut rng = StdRng::seed_from_u64(3);
        let data = make_inputs(case, FloatDType::BF16, &mut rng);
        assert!(data.iter().all(|d| d.dtype == DType::BF16));
    }
}
