//! Rows for the MoE combine (`FusedOps::fused_combine_rows`): the kernels in f32 and bf16
//! against the composed gather, multiply and sum in f32 on the same GPU from the same rounded
//! rows and weights. Each case has two rows: the output with the rows' gradient, and the weights'
//! gradient, of a weighted-sum loss; outputs are poisoned, so a row the backward leaves unwritten
//! shows.
//! Slots run in a shuffled order, some dropped (reading the zero row), with `k` of 1, 2 and 8.

use burn::tensor::{DType, Int, Tensor, TensorData, TensorPrimitive};
use ferrotron_cuda::{Cuda, GpuDevice};
use ferrotron_ops::{CombineIndex, CombineSpec, FusedOps, composed_combine_rows};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::fused::{A, host, round, rounded_row, upload};
use crate::{Row, guarded};

/// Slot → row (`rows` where dropped) and row → slot for `slots` slots, about `drop` of them
/// dropped, rows in a shuffled order.
fn routing(slots: usize, drop: f64, rng: &mut StdRng) -> (usize, Vec<i64>, Vec<i64>) {
    let mut kept: Vec<usize> = (0..slots).filter(|_| !rng.random_bool(drop)).collect();
    kept.shuffle(rng);
    let rows = kept.len();
    let mut index = vec![rows as i64; slots];
    let mut back = vec![0i64; rows];
    for (row, &slot) in kept.iter().enumerate() {
        index[slot] = row as i64;
        back[row] = slot as i64;
    }
    (rows, index, back)
}

fn ints(values: &[i64], device: &GpuDevice) -> Tensor<A, 1, Int> {
    Tensor::from_data(TensorData::new(values.to_vec(), [values.len()]), device)
}

/// One combine's inputs: the experts' rows, the combine weights, the loss's weighting and the
/// routing.
struct Case {
    x: TensorData,
    weights: TensorData,
    w: TensorData,
    index: Vec<i64>,
    back: Vec<i64>,
    spec: CombineSpec,
}

impl Case {
    /// `tokens` tokens of `k` slots over rows of `hidden`, about `drop` of the slots dropped.
    fn random(rng: &mut StdRng, dtype: DType, [tokens, k, hidden]: [usize; 3], drop: f64) -> Case {
        let (rows, index, back) = routing(tokens * k, drop, rng);
        Case {
            x: host(&[rows, hidden], rng, dtype),
            weights: host(&[tokens * k], rng, dtype),
            w: host(&[tokens, hidden], rng, DType::F32),
            index,
            back,
            spec: CombineSpec {
                topk: k,
                dropped: rows < tokens * k,
            },
        }
    }

    fn rows(&self) -> usize {
        self.back.len()
    }
}

/// Output and rows' gradient of `Σ w ∘ combine` flattened into one f32 tensor, and the weights'
/// gradient, by the kernels (`FUSED`) or composed.
fn grads<const FUSED: bool>(case: &Case, dtype: DType, device: &GpuDevice) -> [TensorData; 2] {
    let x: Tensor<A, 2> = upload(&case.x, dtype, device);
    let weights: Tensor<A, 1> = upload(&case.weights, dtype, device);
    let index = CombineIndex {
        index: ints(&case.index, device).into_primitive(),
        back: ints(&case.back, device).into_primitive(),
    };
    let (rows, p) = (
        x.clone().into_primitive().tensor(),
        weights.clone().into_primitive().tensor(),
    );
    let out = if FUSED {
        A::fused_combine_rows(rows, index, p, case.spec)
    } else {
        composed_combine_rows::<A>(rows, index, p, case.spec)
    };
    let out: Tensor<A, 2> = Tensor::from_primitive(TensorPrimitive::Float(out));
    let w = Tensor::<A, 2>::from_data(round(case.w.clone(), DType::F32), (device, DType::F32));
    let g = (out.clone().cast(DType::F32) * w).sum().backward();
    let packed = Tensor::cat(
        vec![
            out.inner().cast(DType::F32).reshape([-1]),
            x.grad(&g).expect("d rows").cast(DType::F32).reshape([-1]),
        ],
        0,
    );
    let d_weights = weights.grad(&g).expect("d weights").cast(DType::F32);
    [packed.into_data(), d_weights.into_data()]
}

/// The two rows of one case. The weights' gradient is a dot product over `hidden` of the output
/// gradient, which the `dtype` run rounds to `dtype` first: compared at the scale of the norm's
/// γ gradient, a reduction over rounded rows too.
fn row(
    device: &GpuDevice,
    rng: &mut StdRng,
    dtype: DType,
    dims: [usize; 3],
    drop: f64,
) -> Vec<Row> {
    let case = Case::random(rng, dtype, dims, drop);
    let [tokens, k, hidden] = dims;
    let got = guarded(|| Ok(grads::<true>(&case, dtype, device)));
    let want = guarded(|| Ok(grads::<false>(&case, DType::F32, device)));
    let shape = format!("[{}, {hidden}] → [{tokens}, {hidden}], k {k}", case.rows());
    let part = |r: &Result<[TensorData; 2], String>, i: usize| {
        r.as_ref()
            .map(|parts| parts[i].clone())
            .map_err(Clone::clone)
    };
    let dropped = format!("out + packed dx; {} dropped", tokens * k - case.rows());
    [(0, 2.0, dropped.as_str()), (1, 8.0, "d weights")]
        .into_iter()
        .map(|(i, scale, what)| {
            let (got, want) = (part(&got, i), part(&want, i));
            rounded_row(
                "fused_combine_rows",
                dtype,
                shape.clone(),
                (scale, what),
                got,
                want,
            )
        })
        .collect()
}

/// Every combine row.
pub(crate) fn rows(device: &GpuDevice) -> Vec<Row> {
    let mut rng = StdRng::seed_from_u64(29);
    let mut out = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        out.extend(row(device, &mut rng, dtype, [2048, 2, 1024], 0.0));
        out.extend(row(device, &mut rng, dtype, [512, 8, 512], 0.1));
        out.extend(row(device, &mut rng, dtype, [300, 1, 96], 0.2));
    }
    out
}

/// Milliseconds of the combine's forward and backward (a weighted-sum loss's), kernels against
/// the composed graph, in bf16 at the MoE bench rows' shapes.
pub(crate) fn timings(device: &GpuDevice) -> String {
    let mut table = String::from(
        "| combine (bf16, fwd + bwd) | tokens × k × hidden | kernels ms | composed ms |\n|---|---|---:|---:|\n",
    );
    let mut rng = StdRng::seed_from_u64(31);
    for (name, tokens, k, hidden) in [
        ("small MoE", 32768, 2, 1024),
        ("Mixtral", 16384, 2, 4096),
        ("Qwen3-30B-A3B", 16384, 8, 2048),
    ] {
        let case = Case::random(&mut rng, DType::BF16, [tokens, k, hidden], 0.0);
        let line = guarded(|| {
            // uploaded once: the timed part is the op's forward and backward and the loss's
            let x = Tensor::<Cuda, 2>::from_data(case.x.clone(), (device, DType::BF16));
            let p = Tensor::<Cuda, 1>::from_data(case.weights.clone(), (device, DType::BF16));
            let weighting = Tensor::<A, 2>::from_data(case.w.clone(), (device, DType::F32));
            let (index, back) = (ints(&case.index, device), ints(&case.back, device));
            let step = |fused: bool| {
                let x = Tensor::<A, 2>::from_inner(x.clone()).require_grad();
                let p = Tensor::<A, 1>::from_inner(p.clone()).require_grad();
                let index = CombineIndex {
                    index: index.clone().into_primitive(),
                    back: back.clone().into_primitive(),
                };
                let (r, q) = (x.into_primitive().tensor(), p.into_primitive().tensor());
                let out = if fused {
                    A::fused_combine_rows(r, index, q, case.spec)
                } else {
                    composed_combine_rows::<A>(r, index, q, case.spec)
                };
                let out: Tensor<A, 2> = Tensor::from_primitive(TensorPrimitive::Float(out));
                let _ = (out.cast(DType::F32) * weighting.clone()).sum().backward();
            };
            let fused = crate::fused::median_ms(device, 5, || step(true));
            let composed = crate::fused::median_ms(device, 5, || step(false));
            Ok(format!(
                "| {name} | {tokens} × {k} × {hidden} | {fused:.3} | {composed:.3} |\n"
            ))
        });
        table.push_str(&line.unwrap_or_else(|e| format!("| {name} | failed: {e} |\n")));
    }
    table.push_str(
        "(each includes the loss's own multiply, sum and their backward, the same in both)\n",
    );
    table
}
