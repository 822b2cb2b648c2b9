//! The fp8 grouped GEMMs with device counts (`grouped_gemm::fp8_rows`, `fp8_inner`) against f64
//! sums of the same fp8 grid values: uneven groups (one empty, one of a single row, counts not
//! multiples of 16 or 128), per-group and shared weight scales, the inner product over a
//! strided view (rows padded to 16 bytes), the TMA kernel and its clusters of two (512 columns:
//! tiles in pairs; 384: the single-block fallback). Then the whole fp8 experts node
//! (`FusedOps::fp8_experts`, `precision.fp8_experts`) over two steps on the GPU against the
//! same node on burn-flex's reference primitives: outputs, gradients and scaling state.

use std::sync::Arc;

use burn::backend::{Autodiff, Flex};
use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};
use ferrotron_cuda::fp8::Operand;
use ferrotron_cuda::kernels::fused::grouped_gemm::{self, Kernel};
use ferrotron_cuda::{CudaDevice, CudaTensor, DType as EDType, GpuDevice, SliceArg};
use ferrotron_ops::fp8::scaling::Fp8Format;
use ferrotron_ops::{Fp8Experts, Fp8Linear, Fp8State, FusedOps, GroupRows};
use ferrotron_parallel::{end_fp8_step, solo};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::compare::{self, Errors};
use crate::device_grouped::counts_on;
use crate::fp8::{bf16_values, f32s, hybrid_delayed, operand, state_rows, upload_f32};
use crate::fused::round;
use crate::{Row, failed, first_line, guarded};

// 1,480 rows: the fp8 casts take multiples of 8; the transposed operands' rows still pad to 16
const COUNTS: [usize; 8] = [300, 129, 512, 0, 77, 256, 1, 205];
/// The inner product's groups whole 128-row steps (no zeroing, every start 16-byte aligned),
/// then 16-row multiples (the last step's zeroing, aligned starts): with [`COUNTS`] they tell
/// which part of the weight gradient faulted on its first GPU run.
const WHOLE_STEPS: [usize; 8] = [256, 128, 512, 0, 128, 256, 128, 128];
const SIXTEENS: [usize; 8] = [304, 128, 512, 0, 80, 256, 16, 192];
const TMA_KERNELS: [Kernel; 2] = [Kernel::HopperTma, Kernel::HopperTmaCluster];

fn starts(counts: &[usize]) -> Vec<usize> {
    counts
        .iter()
        .scan(0, |at, &c| {
            let start = *at;
            *at += c;
            Some(start)
        })
        .collect()
}

fn compared(got: &CudaTensor, want: Vec<f32>, shape: [usize; 2]) -> Result<Errors, String> {
    let got = TensorData::new(f32s(got)?, shape);
    let want = round(TensorData::new(want, shape), DType::BF16);
    Ok(compare::compare(
        &got.convert::<burn::tensor::bf16>(),
        &want,
        2.0,
    ))
}

/// `a [rows, k]` rows of group g against `b_g [n, k]`, each group's weight its own scale or one
/// shared.
fn rows_row(
    device: &Arc<CudaDevice>,
    counts: &CudaTensor,
    kernel: Kernel,
    [k, n]: [usize; 2],
    formats: (Fp8Format, Fp8Format),
    per_group: bool,
) -> Result<Errors, String> {
    let mut rng = StdRng::seed_from_u64(48);
    let rows: usize = COUNTS.iter().sum();
    let groups = COUNTS.len();
    let sa = 32.0f32;
    let (a, ca) = operand(device, &mut rng, [rows, k], formats.0, sa)?;
    let mut b_grid = Vec::new();
    let mut b_casts = Vec::new();
    let mut b_inverse = Vec::new();
    for g in 0..groups {
        let sb = if per_group {
            16.0 * (g + 1) as f32
        } else {
            64.0
        };
        let (grid, cast) = operand(device, &mut rng, [n, k], formats.1, sb)?;
        b_grid.push(grid);
        b_casts.push(cast);
        b_inverse.push(1.0 / sb);
    }
    let b_scale = if per_group {
        upload_f32(device, &b_inverse, &[groups])
    } else {
        b_casts[0].scale_inv.clone()
    };
    let b: Vec<CudaTensor> = b_casts.iter().map(|c| c.data.clone()).collect();
    let got = grouped_gemm::fp8_rows(
        kernel,
        Operand {
            data: &ca.data,
            format: formats.0,
            scale_inv: &ca.scale_inv,
        },
        &b,
        formats.1,
        &b_scale,
        counts,
        EDType::BF16,
        // the forward's fast accumulation; the input gradient (e5m2 rows) splits it
        formats.0 == Fp8Format::E4m3,
    )
    .map_err(|e| e.to_string())?;
    let mut want = vec![0.0f32; rows * n];
    for (g, (&count, start)) in COUNTS.iter().zip(starts(&COUNTS)).enumerate() {
        let inv = f64::from(1.0 / sa) * f64::from(b_inverse[if per_group { g } else { 0 }]);
        for r in start..start + count {
            for c in 0..n {
                let dot: f64 = (0..k)
                    .map(|j| f64::from(a[r * k + j]) * f64::from(b_grid[g][c * k + j]))
                    .sum();
                want[r * n + c] = (dot * inv) as f32;
            }
        }
    }
    compared(&got, want, [rows, n])
}

/// `a_t [m, rows]` and `b_t [n, rows]` reduced over each group's columns; the operands are views
/// of buffers whose rows are padded to a multiple of 16 bytes.
fn inner_row(
    device: &Arc<CudaDevice>,
    (host_counts, counts): (&[usize], &CudaTensor),
    kernel: Kernel,
    [m, n]: [usize; 2],
    formats: (Fp8Format, Fp8Format),
) -> Result<Errors, String> {
    let mut rng = StdRng::seed_from_u64(49);
    let rows: usize = host_counts.iter().sum();
    let padded = rows.div_ceil(16) * 16;
    let (sa, sb) = (32.0f32, 8.0f32);
    let (a, ca) = operand(device, &mut rng, [m, padded], formats.0, sa)?;
    let (b, cb) = operand(device, &mut rng, [n, padded], formats.1, sb)?;
    let view = |t: &CudaTensor, r: usize| {
        t.slice(&[SliceArg::full(r), SliceArg::range(0, rows)])
            .map_err(|e| e.to_string())
    };
    let (a_view, b_view) = (view(&ca.data, m)?, view(&cb.data, n)?);
    let got = grouped_gemm::fp8_inner(
        kernel,
        Operand {
            data: &a_view,
            format: formats.0,
            scale_inv: &ca.scale_inv,
        },
        Operand {
            data: &b_view,
            format: formats.1,
            scale_inv: &cb.scale_inv,
        },
        counts,
        host_counts.len(),
        EDType::BF16,
    )
    .map_err(|e| e.to_string())?;
    let inv = f64::from(1.0 / sa) * f64::from(1.0 / sb);
    let mut want = vec![0.0f32; host_counts.len() * m * n];
    for (g, (&count, start)) in host_counts.iter().zip(starts(host_counts)).enumerate() {
        for i in 0..m {
            for j in 0..n {
                let dot: f64 = (start..start + count)
                    .map(|r| f64::from(a[i * padded + r]) * f64::from(b[j * padded + r]))
                    .sum();
                want[(g * m + i) * n + j] = (dot * inv) as f32;
            }
        }
    }
    compared(&got, want, [host_counts.len() * m, n])
}

fn row(op: &str, shape: String, note: String, result: Result<Errors, String>) -> Row {
    match result {
        Ok(errors) => Row {
            op: op.into(),
            dtype: "fp8",
            shape,
            errors,
            note,
        },
        Err(e) => Row {
            op: op.into(),
            dtype: "fp8",
            shape,
            errors: failed(),
            note: format!("{note}: {}", first_line(&e)),
        },
    }
}

fn kernel_name(kernel: Kernel) -> &'static str {
    if kernel == Kernel::HopperTmaCluster {
        "TMA, clusters of two"
    } else {
        "TMA"
    }
}

/// Output, dx and every expert's dW of `Σ g ∘ fp8_experts(x)` over two steps, each step's
/// scaling state after it.
fn experts_steps<B>(
    x: &TensorData,
    parts: &[TensorData],
    g: &TensorData,
    counts: &[usize],
    device: &B::Device,
) -> TensorData
where
    B::InnerBackend: FusedOps + ferrotron_parallel::ParallelOps,
    B: burn::tensor::backend::AutodiffBackend + FusedOps,
{
    let names = std::iter::once("experts.fc1".to_owned())
        .chain((0..parts.len()).map(|e| format!("experts.{e}.fc1")))
        .collect();
    let state = Fp8State::new(hybrid_delayed(), names);
    let experts = Fp8Experts {
        rows: Fp8Linear::new(&state, 0),
        weights: (1..=parts.len())
            .map(|s| Fp8Linear::new(&state, s))
            .collect(),
    };
    let mut pieces = Vec::new();
    for _ in 0..2 {
        let leaf = |d: &TensorData| {
            Tensor::<B, 2>::from_data(d.clone(), (device, DType::BF16)).require_grad()
        };
        let x = leaf(x);
        let weights: Vec<Tensor<B, 2>> = parts.iter().map(leaf).collect();
        let y = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(B::fp8_experts(
            x.clone().into_primitive().tensor(),
            weights
                .iter()
                .map(|w| w.clone().into_primitive().tensor())
                .collect(),
            &GroupRows::on_host(counts.to_vec()),
            &experts,
        )));
        let g = Tensor::<B, 2>::from_data(g.clone(), (device, DType::F32));
        let grads = (y.clone().cast(DType::F32) * g).sum().backward();
        let flat = |t: Tensor<B::InnerBackend, 2>| t.cast(DType::F32).reshape([-1]);
        pieces.push(flat(y.inner()));
        pieces.push(flat(x.grad(&grads).expect("dx")));
        for w in &weights {
            pieces.push(flat(w.grad(&grads).expect("dW")));
        }
        end_fp8_step::<B::InnerBackend>(&state, &[&solo()]);
        pieces.push(state_rows(&state, &pieces[0].device()));
    }
    Tensor::cat(pieces, 0).into_data()
}

/// The node on the GPU against the reference on burn-flex, from the same bf16 values.
fn experts_row(device: &GpuDevice, [k, n]: [usize; 2]) -> Row {
    // routed rows a multiple of 16, as tokens × top-k are
    let counts = [300, 129, 512, 0, 77, 256, 1, 213];
    let rows: usize = counts.iter().sum();
    let mut rng = StdRng::seed_from_u64(50);
    let mut data = |shape: [usize; 2], scale: f32| {
        TensorData::new(
            bf16_values(&mut rng, shape[0] * shape[1], scale),
            shape.to_vec(),
        )
    };
    let x = data([rows, k], 2.0);
    let parts: Vec<TensorData> = (0..counts.len())
        .map(|e| data([k, n], 0.05 * (1 + e % 3) as f32))
        .collect();
    let g = data([rows, n], 1.0);
    let got = guarded(|| {
        Ok(experts_steps::<Autodiff<ferrotron_cuda::Cuda>>(
            &x, &parts, &g, &counts, device,
        ))
    });
    let want = guarded(|| {
        Ok(experts_steps::<Autodiff<Flex>>(
            &x,
            &parts,
            &g,
            &counts,
            &Default::default(),
        ))
    });
    let (op, shape) = (
        "fp8_experts vs reference",
        format!("[{rows}, {k}] x {}·[{k}, {n}]", counts.len()),
    );
    let note = "2 steps: out, dx, each dW, state; kernels vs host reference";
    match (got, want) {
        (Ok(got), Ok(want)) => Row {
            op: op.into(),
            dtype: "fp8",
            shape,
            // both round the same fp8 products to bf16: only accumulation order differs
            errors: compare::compare(&round(got, DType::BF16), &round(want, DType::BF16), 1.0),
            note: note.into(),
        },
        (Err(e), _) | (_, Err(e)) => Row {
            op: op.into(),
            dtype: "fp8",
            shape,
            errors: failed(),
            note: format!("{note}: {}", first_line(&e)),
        },
    }
}

/// The kernels' rows (no experts node: a fault there would be sticky and fail every row after
/// it, so the node runs on its own, [`node_rows`]).
pub(crate) fn kernel_rows(device: &GpuDevice) -> Vec<Row> {
    let engine = match CudaDevice::get(device.ordinal) {
        Ok(engine) => engine,
        Err(e) => {
            return vec![row(
                "grouped_gemm_fp8",
                "-".into(),
                "device".into(),
                Err(e.to_string()),
            )];
        }
    };
    // The TMA kernels are Hopper's (sm_90a).
    if engine.arch() != "sm_90" {
        return Vec::new();
    }
    let counts = &counts_on(&COUNTS, device);
    let (whole_steps, sixteens) = (
        &counts_on(&WHOLE_STEPS, device),
        &counts_on(&SIXTEENS, device),
    );
    let device = &engine;
    let (e4m3, e5m2) = (Fp8Format::E4m3, Fp8Format::E5m2);
    let mut out = Vec::new();
    for kernel in TMA_KERNELS {
        for ([k, n], formats, per_group) in [
            ([256, 512], (e4m3, e4m3), true),
            ([256, 384], (e4m3, e4m3), false),
            ([512, 256], (e5m2, e4m3), true),
        ] {
            let result = guarded(|| rows_row(device, counts, kernel, [k, n], formats, per_group));
            out.push(row(
                "grouped_gemm_fp8_rows",
                format!(
                    "[{}, {k}] x {}·[{n}, {k}]ᵀ",
                    COUNTS.iter().sum::<usize>(),
                    COUNTS.len()
                ),
                format!(
                    "{}·{}ᵀ ({} accumulation), {} scales, {}; bf16 out vs f64",
                    formats.0.name(),
                    formats.1.name(),
                    if formats.0 == e4m3 { "fast" } else { "split" },
                    if per_group { "per-group" } else { "shared" },
                    kernel_name(kernel)
                ),
                result,
            ));
        }
    }
    // The inner products last: the first GPU run of the fp8 experts node faulted in one
    // (2026-12-07 23:19 UTC), and a fault fails every row after it.
    for kernel in TMA_KERNELS {
        for (host_counts, counts, what) in [
            (&WHOLE_STEPS[..], whole_steps, "whole 128-row steps"),
            (&SIXTEENS, sixteens, "16-row multiples"),
            (&COUNTS, counts, "uneven groups, rows padded to 16 bytes"),
        ] {
            let [m, n] = [256, 512];
            let rows: usize = host_counts.iter().sum();
            let result =
                guarded(|| inner_row(device, (host_counts, counts), kernel, [m, n], (e4m3, e5m2)));
            out.push(row(
                "grouped_gemm_fp8_inner",
                format!("[{m}, {rows}]·[{n}, {rows}]ᵀ by groups"),
                format!(
                    "e4m3ᵀ·e5m2 over {what}; {}; bf16 out vs f64",
                    kernel_name(kernel)
                ),
                result,
            ));
        }
    }
    out
}

/// The fp8 experts node's row, on Hopper (`--filter fp8_experts`; last under `--filter fp8`).
pub(crate) fn node_rows(device: &GpuDevice) -> Vec<Row> {
    match CudaDevice::get(device.ordinal) {
        Ok(engine) if engine.arch() == "sm_90" => vec![experts_row(device, [256, 512])],
        Ok(_) => Vec::new(),
        Err(e) => vec![row(
            "fp8_experts",
            "-".into(),
            "device".into(),
            Err(e.to_string()),
        )],
    }
}
