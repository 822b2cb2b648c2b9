//! Rows for the MoE experts' grouped matmul: the fused node (cuBLAS grouped GEMMs) against the
//! composed per-group matmuls (one cuBLASLt GEMM per group) in the same dtype on the same GPU
//! from the same rounded inputs: the output and both gradients (x and the stacked weight) of a
//! weighted-sum loss, with uneven groups and one empty group (whose weight gradient must come
//! back zero: outputs are poisoned). In bf16 the reference is the composed op in bf16, not in
//! f32: both round the output gradient to bf16 before the backward GEMMs, and an f32 reference
//! that does not would differ by that rounding summed over a group's rows (up to 0.125 on
//! gradients of magnitude ~10 here), which says nothing about the grouping.

use burn::tensor::{DType, Int, Tensor, TensorData, TensorPrimitive};
use ferrotron_cuda::GpuDevice;
use ferrotron_ops::{FusedOps, GroupRows, composed_grouped_matmul};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::fused::{A, dtype_label, host, round, upload};
use crate::{Row, compare, failed, first_line, guarded};

/// Rows per expert: uneven, the fourth empty (a Mixtral-sized layer's shape, fewer rows).
const GROUPS: [usize; 8] = [300, 129, 512, 0, 77, 256, 1, 200];

/// How a row computes the grouped matmul.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Composed,
    /// The fused node over the stacked weight.
    Fused,
    /// The fused node over the groups' own weights, computed by slicing one weight: stacked
    /// again by the op.
    Parts,
    /// The fused node over the groups' own weights, each a leaf as a parameter is: never
    /// stacked, each part's gradient registered by the node.
    Leaves,
}

/// Output, x gradient and weight gradient of `Σ w ∘ grouped(x, weight)`, flattened in f32.
fn grads(
    mode: Mode,
    x: &TensorData,
    weight: &TensorData,
    w: &TensorData,
    dtype: DType,
    device: &GpuDevice,
) -> TensorData {
    let x: Tensor<A, 2> = upload(x, dtype, device);
    let weight: Tensor<A, 3> = upload(weight, dtype, device);
    let w = Tensor::<A, 2>::from_data(round(w.clone(), DType::F32), (device, DType::F32));
    let (px, pw) = (
        x.clone().into_primitive().tensor(),
        weight.clone().into_primitive().tensor(),
    );
    // The fused node gets the counts on the device, as dropless routing leaves them.
    let counts = TensorData::new(GROUPS.iter().map(|&r| r as i64).collect(), [GROUPS.len()]);
    let counts = Tensor::<A, 1, Int>::from_data(counts, device).into_primitive();
    let mut leaves: Vec<Tensor<A, 2>> = Vec::new();
    let out = match mode {
        Mode::Fused => A::fused_grouped_matmul(px, pw, &GroupRows::on_device(counts)),
        Mode::Parts => {
            let [groups, k, n] = weight.dims();
            let parts = (0..groups)
                .map(|g| {
                    weight
                        .clone()
                        .slice_dim(0, g..g + 1)
                        .reshape([k, n])
                        .into_primitive()
                        .tensor()
                })
                .collect();
            A::fused_grouped_matmul_parts(px, parts, &GroupRows::on_device(counts))
        }
        Mode::Leaves => {
            let [groups, k, n] = weight.dims();
            leaves = (0..groups)
                .map(|g| {
                    let part = weight.clone().slice_dim(0, g..g + 1).reshape([k, n]);
                    Tensor::<A, 2>::from_data(part.into_data(), (device, dtype)).require_grad()
                })
                .collect();
            let parts = leaves
                .iter()
                .map(|part| part.clone().into_primitive().tensor())
                .collect();
            A::fused_grouped_matmul_parts(px, parts, &GroupRows::on_device(counts))
        }
        Mode::Composed => {
            composed_grouped_matmul::<A>(px, pw, &GroupRows::on_host(GROUPS.to_vec()))
        }
    };
    let out: Tensor<A, 2> = Tensor::from_primitive(TensorPrimitive::Float(out));
    let g = (out.clone().cast(DType::F32) * w).sum().backward();
    let dweight = if mode == Mode::Leaves {
        let parts = leaves
            .iter()
            .map(|part| part.grad(&g).expect("a part's gradient").reshape([-1]))
            .collect();
        Tensor::cat(parts, 0)
    } else {
        weight.grad(&g).expect("dweight").reshape([-1])
    };
    Tensor::cat(
        vec![
            out.inner().cast(DType::F32).reshape([-1]),
            x.grad(&g).expect("dx").cast(DType::F32).reshape([-1]),
            dweight.cast(DType::F32),
        ],
        0,
    )
    .into_data()
}

fn row(device: &GpuDevice, rng: &mut StdRng, dtype: DType, [k, n]: [usize; 2], mode: Mode) -> Row {
    let rows: usize = GROUPS.iter().sum();
    let x = host(&[rows, k], rng, dtype);
    let weight = host(&[GROUPS.len(), k, n], rng, dtype);
    let w = host(&[rows, n], rng, DType::F32);
    let got = guarded(|| Ok(grads(mode, &x, &weight, &w, dtype, device)));
    let want = guarded(|| Ok(grads(Mode::Composed, &x, &weight, &w, dtype, device)));
    let (errors, note) = match (got, want) {
        // Same roundings on both sides: what differs is the order of each f32 sum.
        (Ok(got), Ok(want)) => (
            compare::compare(&round(got, dtype), &round(want, dtype), 2.0),
            match mode {
                Mode::Parts => "fused (sliced parts) vs composed, same dtype; out + dx + dweight",
                Mode::Leaves => {
                    "fused (parameter parts) vs composed, same dtype; out + dx + dweights"
                }
                _ => "fused vs composed, same dtype; out + dx + dweight",
            }
            .to_string(),
        ),
        (Err(e), _) => (failed(), format!("fused: {}", first_line(&e))),
        (_, Err(e)) => (failed(), format!("composed: {}", first_line(&e))),
    };
    let op = match mode {
        Mode::Parts | Mode::Leaves => "fused_grouped_matmul_parts",
        _ => "fused_grouped_matmul",
    };
    Row {
        op: op.into(),
        dtype: dtype_label(dtype),
        shape: format!("[{rows}, {k}] x [{}, {k}, {n}]", GROUPS.len()),
        errors,
        note,
    }
}

/// Every grouped-matmul row: fc1-like (k < n) and fc2-like (k > n) shapes.
pub(crate) fn rows(device: &GpuDevice) -> Vec<Row> {
    let mut rng = StdRng::seed_from_u64(29);
    let mut rows = Vec::new();
    for mode in [Mode::Fused, Mode::Parts, Mode::Leaves] {
        for dtype in [DType::F32, DType::BF16] {
            rows.push(row(device, &mut rng, dtype, [128, 352], mode));
            rows.push(row(device, &mut rng, dtype, [176, 128], mode));
        }
    }
    rows
}
