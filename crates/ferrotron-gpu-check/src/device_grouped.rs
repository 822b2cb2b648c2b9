//! Rows for the grouped GEMM that reads the experts' row counts on the device
//! (`kernels/fused/grouped_gemm.rs`): its forward, input gradient and weight gradient against
//! cuBLAS's grouped call (`blas/grouped.rs`, itself checked against the composed per-group
//! matmuls in `fused_grouped.rs`) from the same 16-bit inputs, over uneven groups with empty
//! ones, one group taking every row, and 128 groups. Outputs are poisoned, so an empty group's
//! weight gradient must be written as zeros and no row may be left unwritten. The three
//! products as one cuBLASLt GEMM per expert (`runtime.grouped_gemm_per_expert`) are checked
//! against the grouped call's, likewise. On Hopper both device-count kernels are checked (the
//! wgmma one the backend takes, and the portable mma.sync one). Then all of them timed at the
//! MoE shapes of `tools/cublaslt_grouped_probe.py`.

use burn::tensor::{DType, Int, Tensor, TensorData};
use ferrotron_cuda::blas::grouped::{
    Weights, backward_grouped_call, backward_per_expert, matmul_grouped_call, matmul_per_expert,
};
use ferrotron_cuda::kernels::fused::grouped_gemm::{self, Kernel};
use ferrotron_cuda::{Cuda, CudaTensor, GpuDevice, SliceArg};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::fused::{dtype_label, host, median_ms, round};
use crate::{Row, compare, failed, first_line, guarded};

fn upload(data: &TensorData, dtype: DType, device: &GpuDevice) -> CudaTensor {
    Tensor::<Cuda, 2>::from_data(round(data.clone(), dtype), (device, dtype))
        .into_primitive()
        .tensor()
}

fn upload3(data: &TensorData, dtype: DType, device: &GpuDevice) -> CudaTensor {
    Tensor::<Cuda, 3>::from_data(round(data.clone(), dtype), (device, dtype))
        .into_primitive()
        .tensor()
}

pub(crate) fn counts_on(rows: &[usize], device: &GpuDevice) -> CudaTensor {
    let data = TensorData::new(rows.iter().map(|&r| r as i64).collect(), [rows.len()]);
    Tensor::<Cuda, 1, Int>::from_data(data, device).into_primitive()
}

fn download(x: CudaTensor) -> Result<Vec<f32>, String> {
    let t = Tensor::<Cuda, 1>::from_primitive(burn::tensor::TensorPrimitive::Float(
        x.reshape(&[x.numel()]).map_err(|e| e.to_string())?,
    ));
    t.cast(DType::F32)
        .into_data()
        .to_vec::<f32>()
        .map_err(|e| format!("{e:?}"))
}

/// The three products a grouped matmul's node runs.
const PRODUCTS: [&str; 3] = ["forward", "input grad", "weight grad"];

/// Who computes a product.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Path {
    DeviceCounts(Kernel),
    Cublas,
    /// cuBLASLt, one GEMM per expert and product.
    PerExpert,
}

/// Product `which` (of [`PRODUCTS`]) in f32, by the device-count kernels or by cuBLAS's
/// grouped call; cuBLAS's paths read the experts' weights from `parts` (each expert's own
/// tensor) where given, else from the stacked `weight`.
fn product(
    which: &str,
    path: Path,
    rows: &[usize],
    [x, weight, dy]: [&CudaTensor; 3],
    parts: Option<&[CudaTensor]>,
    device: &GpuDevice,
) -> Result<TensorData, String> {
    let weights = parts.map_or(Weights::Stacked(weight), Weights::Parts);
    let out = match (path, which) {
        (Path::DeviceCounts(kernel), "forward") => {
            grouped_gemm::forward(kernel, x, weights, &counts_on(rows, device))
        }
        (Path::DeviceCounts(kernel), "input grad") => {
            grouped_gemm::input_grad(kernel, dy, weights, &counts_on(rows, device))
        }
        (Path::DeviceCounts(kernel), _) => {
            grouped_gemm::weight_grad(kernel, x, dy, &counts_on(rows, device), rows.len())
        }
        (Path::Cublas, "forward") => matmul_grouped_call(x, weights, rows),
        (Path::PerExpert, "forward") => matmul_per_expert(x, weights, rows),
        (Path::PerExpert, _) => backward_per_expert(x, weights, dy, rows)
            .map(|(dx, dw)| if which == "input grad" { dx } else { dw }),
        (Path::Cublas, _) => backward_grouped_call(x, weights, dy, rows)
            .map(|(dx, dw)| if which == "input grad" { dx } else { dw }),
    }
    .map_err(|e| e.to_string())?;
    let all = download(out)?;
    let n = all.len();
    Ok(TensorData::new(all, [n]))
}

/// One row per product: the device-count kernel against cuBLAS's grouped call, one for the
/// per-expert cuBLASLt GEMMs against the same, and both cuBLAS paths over the experts' own
/// tensors (separate allocations, as parameters are) against themselves over the stack.
/// Which kernels' rows a run checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernels {
    /// Every path: the device-count kernels, per-expert cuBLASLt, cuBLAS's grouped call.
    All,
    /// The TMA kernels alone (`--filter device_grouped_tma`), so a first run of them on a GPU
    /// stands on its own under a short timeout.
    Tma,
}

impl Kernels {
    fn takes(self, path: Path) -> bool {
        match self {
            Kernels::All => true,
            Kernels::Tma => matches!(
                path,
                Path::DeviceCounts(
                    Kernel::HopperTma | Kernel::HopperTmaCluster | Kernel::HopperTmaPingpong
                )
            ),
        }
    }
}

fn rows_of(
    device: &GpuDevice,
    rng: &mut StdRng,
    dtype: DType,
    rows: &[usize],
    [k, n]: [usize; 2],
    what: &str,
    kernels: Kernels,
) -> Vec<Row> {
    let total: usize = rows.iter().sum();
    let x = upload(&host(&[total, k], rng, dtype), dtype, device);
    let weight = upload3(&host(&[rows.len(), k, n], rng, dtype), dtype, device);
    let dy = upload(&host(&[total, n], rng, dtype), dtype, device);
    let operands = [&x, &weight, &dy];
    let parts: Vec<CudaTensor> = (0..rows.len())
        .map(|g| {
            let part = weight
                .slice(&[
                    SliceArg::range(g, g + 1),
                    SliceArg::full(k),
                    SliceArg::full(n),
                ])
                .and_then(|p| p.reshape(&[k, n]))
                .expect("an expert's slice");
            // A copy of its own, at its own address.
            ferrotron_cuda::kernels::prim::elementwise::copy(&part).expect("a copy")
        })
        .collect();
    // The device-count kernels take 16-bit operands only.
    let device_counts: Vec<(&str, Path)> = if dtype == DType::F32 {
        Vec::new()
    } else {
        Kernel::available(x.device())
            .into_iter()
            .flat_map(|kernel| PRODUCTS.map(|which| (which, Path::DeviceCounts(kernel))))
            .collect()
    };
    let checks = device_counts
        .iter()
        .map(|&(which, path)| (which, path, false))
        .chain(
            PRODUCTS
                .iter()
                .map(|which| (*which, Path::PerExpert, false)),
        )
        .chain(PRODUCTS.iter().map(|which| (*which, Path::PerExpert, true)))
        .chain(PRODUCTS.iter().map(|which| (*which, Path::Cublas, true)))
        .chain(
            device_counts
                .iter()
                .map(|&(which, path)| (which, path, true)),
        )
        .filter(|&(_, path, _)| kernels.takes(path));
    checks
        .map(|(which, path, over_parts)| {
            let (op, label, against) = match (path, over_parts) {
                (Path::PerExpert, false) => (
                    "grouped_gemm_per_expert".to_owned(),
                    "per-expert cuBLASLt".to_owned(),
                    Path::Cublas,
                ),
                (Path::PerExpert, true) => (
                    "grouped_gemm_per_expert_parts".to_owned(),
                    "per-expert cuBLASLt over parts vs stacked".to_owned(),
                    Path::PerExpert,
                ),
                (Path::Cublas, _) => (
                    "grouped_gemm_parts".to_owned(),
                    "cuBLAS grouped over parts vs stacked".to_owned(),
                    Path::Cublas,
                ),
                (Path::DeviceCounts(kernel), false) => {
                    let (suffix, what) = kernel_names(kernel);
                    let label = match what {
                        Some(what) => format!("device counts ({what}) vs cuBLAS grouped"),
                        None => "device counts vs cuBLAS grouped".to_owned(),
                    };
                    (
                        format!("grouped_gemm_device_counts{suffix}"),
                        label,
                        Path::Cublas,
                    )
                }
                (Path::DeviceCounts(kernel), true) => (
                    format!("grouped_gemm_device_counts{}_parts", kernel_names(kernel).0),
                    "device counts over parts vs stacked".to_owned(),
                    Path::DeviceCounts(kernel),
                ),
            };
            let given = over_parts.then_some(&parts[..]);
            let got = guarded(|| product(which, path, rows, operands, given, device));
            let want = guarded(|| product(which, against, rows, operands, None, device));
            let (errors, note) = match (got, want) {
                // Same 16-bit inputs, f32 sums in another order, one rounding each.
                (Ok(got), Ok(want)) => (
                    compare::compare(&round(got, dtype), &round(want, dtype), 2.0),
                    format!("{which}; {what}; {label}"),
                ),
                (Err(e), _) => (failed(), format!("{which}: {label}: {}", first_line(&e))),
                (_, Err(e)) => (failed(), format!("{which}: reference: {}", first_line(&e))),
            };
            Row {
                op,
                dtype: dtype_label(dtype),
                shape: format!("[{total}, {k}] x [{}, {k}, {n}]", rows.len()),
                errors,
                note,
            }
        })
        .collect()
}

/// A device-count kernel's row-name suffix and its words in the notes and the timing table
/// (`None`: the portable `mma.sync` kernel, named by neither).
fn kernel_names(kernel: Kernel) -> (&'static str, Option<&'static str>) {
    match kernel {
        Kernel::Portable => ("", None),
        Kernel::Hopper => ("_sm90", Some("wgmma fed by cp.async")),
        Kernel::HopperNarrow => ("_sm90_n128", Some("wgmma fed by cp.async, 128 x 128 tiles")),
        Kernel::HopperPair => (
            "_sm90_pair",
            Some("wgmma fed by cp.async, two blocks an SM"),
        ),
        Kernel::HopperTma => ("_sm90_tma", Some("wgmma fed by the TMA, warp-specialised")),
        Kernel::HopperTmaCluster => (
            "_sm90_tma_cluster",
            Some("TMA, clusters of two sharing the row tile"),
        ),
        Kernel::HopperTmaPingpong => (
            "_sm90_tma_pingpong",
            Some("TMA, ping-pong warpgroups on 128 x 128 tiles"),
        ),
    }
}

/// Row counts of `groups` experts summing to `total`, skewed as routing leaves them, expert 1
/// empty (the probe's distribution).
fn skewed(groups: usize, total: usize, rng: &mut StdRng) -> Vec<usize> {
    let weights: Vec<f64> = (0..groups)
        .map(|g| {
            if g == 1 {
                0.0
            } else {
                rng.random_range(0.0f64..1.0).powi(2) + 0.05
            }
        })
        .collect();
    let sum: f64 = weights.iter().sum();
    let mut rows: Vec<usize> = weights
        .iter()
        .map(|w| (w / sum * total as f64) as usize)
        .collect();
    rows[0] += total - rows.iter().sum::<usize>();
    rows
}

pub(crate) fn rows(device: &GpuDevice, kernels: Kernels) -> Vec<Row> {
    let mut rng = StdRng::seed_from_u64(47);
    let mut out = Vec::new();
    let uneven = [300, 129, 512, 0, 77, 256, 1, 200];
    let one_takes_all = [0, 0, 1000, 0, 0, 0, 0, 0];
    let many = skewed(128, 3000, &mut rng);
    for dtype in [DType::BF16, DType::F16, DType::F32] {
        out.extend(rows_of(
            device,
            &mut rng,
            dtype,
            &uneven,
            [256, 384],
            "uneven, one empty",
            kernels,
        ));
        out.extend(rows_of(
            device,
            &mut rng,
            dtype,
            &uneven,
            [384, 256],
            "uneven, one empty",
            kernels,
        ));
        // Two column tiles of 256 in every product: the cluster kernel's pairs.
        out.extend(rows_of(
            device,
            &mut rng,
            dtype,
            &uneven,
            [512, 512],
            "uneven, one empty, column tiles in pairs",
            kernels,
        ));
        out.extend(rows_of(
            device,
            &mut rng,
            dtype,
            &one_takes_all,
            [256, 256],
            "one expert takes every row",
            kernels,
        ));
        out.extend(rows_of(
            device,
            &mut rng,
            dtype,
            &many,
            [256, 128],
            "128 experts, skewed",
            kernels,
        ));
    }
    out
}

/// Milliseconds and TFLOP/s of each product, device counts against cuBLAS's grouped call (host
/// counts given, nothing read back), at the probe's MoE shapes in bf16.
pub(crate) fn timings(device: &GpuDevice) -> String {
    let mut table = String::from(
        "| grouped GEMM (bf16) | pass | device counts ms | TFLOP/s | cuBLAS grouped ms | TFLOP/s |\n|---|---|---:|---:|---:|---:|\n",
    );
    let mut rng = StdRng::seed_from_u64(7);
    for (name, groups, k, n, total) in [
        ("small-moe 8x2816", 8, 1024, 2816, 16 * 2048 * 2),
        ("mixtral 8x14336", 8, 4096, 14336, 4 * 4096 * 2),
        ("qwen3 128x768", 128, 2048, 768, 4 * 4096 * 8),
        ("deepseek 64x2048", 64, 2048, 2048, 4 * 4096 * 8),
    ] {
        let rows = skewed(groups, total, &mut rng);
        let lines = guarded(|| {
            let random = |shape: &[usize]| -> CudaTensor {
                Tensor::<Cuda, 1>::random(
                    [shape.iter().product::<usize>()],
                    burn::tensor::Distribution::Normal(0.0, 1.0),
                    device,
                )
                .cast(DType::BF16)
                .into_primitive()
                .tensor()
                .reshape(shape)
                .expect("a contiguous reshape")
            };
            let (x, w, dy) = (
                random(&[total, k]),
                random(&[groups, k, n]),
                random(&[total, n]),
            );
            let counts = counts_on(&rows, device);
            let flops = 2.0 * (total * k * n) as f64;
            let rate = |ms: f64| flops / (ms * 1e-3) / 1e12;
            let mut lines = String::new();
            for pass in PRODUCTS {
                let time = |kernel: Kernel| {
                    median_ms(device, 10, || {
                        let _ = match pass {
                            "forward" => {
                                grouped_gemm::forward(kernel, &x, Weights::Stacked(&w), &counts)
                            }
                            "input grad" => {
                                grouped_gemm::input_grad(kernel, &dy, Weights::Stacked(&w), &counts)
                            }
                            _ => grouped_gemm::weight_grad(kernel, &x, &dy, &counts, groups),
                        };
                    })
                };
                let kernels = Kernel::available(x.device());
                let ours = time(kernels[0]);
                for &other in &kernels[1..] {
                    let ms = time(other);
                    let what = kernel_names(other).1.unwrap_or("mma.sync");
                    lines.push_str(&format!(
                        "| {name} | {pass}, device counts ({what}) | {ms:.3} | {:.0} | | |\n",
                        rate(ms)
                    ));
                }
                let cublas = median_ms(device, 10, || {
                    let _ = match pass {
                        "forward" => matmul_grouped_call(&x, Weights::Stacked(&w), &rows),
                        // cuBLAS's backward computes both gradients in one call
                        _ => backward_grouped_call(&x, Weights::Stacked(&w), &dy, &rows)
                            .map(|(dx, _)| dx),
                    };
                });
                let cublas = if pass == "forward" {
                    cublas
                } else {
                    cublas / 2.0
                };
                if pass != "weight grad" {
                    let per_expert = median_ms(device, 10, || {
                        let _ = if pass == "forward" {
                            matmul_per_expert(&x, Weights::Stacked(&w), &rows)
                        } else {
                            backward_per_expert(&x, Weights::Stacked(&w), &dy, &rows)
                                .map(|(dx, _)| dx)
                        };
                    });
                    let (what, per_expert) = if pass == "forward" {
                        ("forward", per_expert)
                    } else {
                        ("both grads (half)", per_expert / 2.0)
                    };
                    lines.push_str(&format!(
                        "| {name} | {what}, per-expert cuBLASLt | | | {per_expert:.3} | {:.0} |\n",
                        rate(per_expert)
                    ));
                }
                let best = kernel_names(kernels[0]).1.unwrap_or("mma.sync");
                lines.push_str(&format!(
                    "| {name} | {pass}, the default ({best}) | {ours:.3} | {:.0} | {cublas:.3}{} | {:.0} |\n",
                    rate(ours),
                    if pass == "forward" {
                        ""
                    } else {
                        " (half of both)"
                    },
                    rate(cublas)
                ));
            }
            Ok(lines)
        });
        table.push_str(
            &lines.unwrap_or_else(|e| format!("| {name} | failed: {} |\n", first_line(&e))),
        );
    }
    table
}
