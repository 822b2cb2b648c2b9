//! Rows for the fused MoE router (`FusedOps::fused_moe_router`): the kernels in f32 and bf16
//! against the composed routing (the f32 scores, the top-k kernel, the weights in burn ops)
//! in f32 on the same GPU from the same rounded logits. Each case has two rows: the decisions,
//! which must match exactly, and the weights with the logits' gradient of a weighted-sum loss
//! (outputs poisoned, so an element the backward leaves unwritten shows). Softmax after the
//! top-k, pre-softmax and sigmoid with a selection bias; one expert and eight of 128, DeepSeek-V3's
//! group limit (8 of 256 in 8 groups, 4 of them); and logits on a grid of eighths, where most
//! experts tie with others and the lower index must win.

use burn::tensor::{DType, Int, Tensor, TensorData, TensorPrimitive};
use ferrotron_cuda::GpuDevice;
use ferrotron_ops::{FusedOps, GroupLimit, RouterScore, RouterSpec, composed_moe_router};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::fused::{A, dtype_label, host, round, rounded_row, upload};
use crate::fused_moe::exact_row;
use crate::{Row, guarded};

/// Logits `[tokens, experts]`: uniform in [-4, 4), or (`tied`) eighths in [-1, 1).
pub(crate) fn logits(rng: &mut StdRng, [tokens, experts]: [usize; 2], tied: bool) -> TensorData {
    let values: Vec<f32> = (0..tokens * experts)
        .map(|_| {
            if tied {
                rng.random_range(-8.0f32..8.0).floor() / 8.0
            } else {
                rng.random_range(-4.0f32..4.0)
            }
        })
        .collect();
    TensorData::new(values, [tokens, experts])
}

/// One routing's inputs.
struct Case {
    logits: TensorData,
    bias: Option<TensorData>,
    /// The loss's weighting of the weights.
    w: TensorData,
    spec: RouterSpec,
}

/// The decisions, and the weights with the logits' gradient of `Σ w ∘ weights` flattened into
/// one f32 tensor, by the kernels (`FUSED`) or composed.
fn run<const FUSED: bool>(case: &Case, dtype: DType, device: &GpuDevice) -> [TensorData; 2] {
    let logits: Tensor<A, 2> = upload(&case.logits, dtype, device);
    let bias = case.bias.as_ref().map(|bias| {
        Tensor::<A, 1>::from_data(round(bias.clone(), DType::F32), (device, DType::F32))
            .into_primitive()
            .tensor()
    });
    let primitive = logits.clone().into_primitive().tensor();
    let routing = if FUSED {
        A::fused_moe_router(primitive, bias, case.spec)
    } else {
        composed_moe_router::<A>(primitive, bias, case.spec)
    };
    let chosen = Tensor::<A, 2, Int>::from_primitive(routing.chosen);
    let weights: Tensor<A, 1> = Tensor::from_primitive(TensorPrimitive::Float(routing.weights));
    let w = Tensor::<A, 1>::from_data(round(case.w.clone(), DType::F32), (device, DType::F32));
    let g = (weights.clone().cast(DType::F32) * w).sum().backward();
    let packed = Tensor::cat(
        vec![
            weights.inner().cast(DType::F32).reshape([-1]),
            logits
                .grad(&g)
                .expect("d logits")
                .cast(DType::F32)
                .reshape([-1]),
        ],
        0,
    );
    [chosen.into_data().convert::<i64>(), packed.into_data()]
}

/// What a row's shape column says of its routing.
fn label([tokens, experts]: [usize; 2], spec: &RouterSpec, bias: bool, tied: bool) -> String {
    let score = match spec.score {
        RouterScore::Softmax if spec.pre_softmax => "pre-softmax",
        RouterScore::Softmax => "softmax",
        RouterScore::Sigmoid => "sigmoid",
    };
    let mut label = format!("[{tokens}, {experts}] k {} {score}", spec.topk);
    if bias {
        label.push_str(" + bias");
    }
    if let Some(limit) = spec.group_limit {
        label.push_str(&format!(
            ", groups {} top {}",
            limit.num_groups, limit.group_topk
        ));
    }
    if spec.scaling_factor != 1.0 {
        label.push_str(&format!(", scaled {}", spec.scaling_factor));
    }
    if tied {
        label.push_str(", tied eighths");
    }
    label
}

/// The two rows of one routing.
fn rows_of(
    device: &GpuDevice,
    rng: &mut StdRng,
    dtype: DType,
    dims: [usize; 2],
    spec: RouterSpec,
    (bias, tied): (bool, bool),
) -> [Row; 2] {
    let [tokens, experts] = dims;
    let case = Case {
        // rounded to the kernel's dtype first: the composed f32 routing must see the values the
        // kernel sees (bf16 ties experts the unrounded logits tell apart)
        logits: round(logits(rng, dims, tied), dtype).convert::<f32>(),
        bias: bias.then(|| host(&[experts], rng, DType::F32)),
        w: host(&[tokens * spec.topk], rng, DType::F32),
        spec,
    };
    let got = guarded(|| Ok(run::<true>(&case, dtype, device)));
    let want = guarded(|| Ok(run::<false>(&case, DType::F32, device)));
    let part = |r: &Result<[TensorData; 2], String>, i: usize| {
        r.as_ref()
            .map(|parts| parts[i].clone())
            .map_err(Clone::clone)
    };
    let shape = label(dims, &spec, bias, tied);
    [
        exact_row(
            "moe_router",
            dtype_label(dtype),
            format!("{shape}: decisions"),
            (part(&got, 0), part(&want, 0), "composed f32"),
        ),
        rounded_row(
            "moe_router",
            dtype,
            shape,
            (4.0, "weights + d logits"),
            part(&got, 1),
            part(&want, 1),
        ),
    ]
}

/// Every router row.
pub(crate) fn rows(device: &GpuDevice) -> Vec<Row> {
    let mut rng = StdRng::seed_from_u64(47);
    let deepseek = GroupLimit {
        num_groups: 8,
        group_topk: 4,
    };
    let cases = [
        (
            [2048, 128],
            RouterSpec::plain(8, RouterScore::Softmax, false),
            false,
        ),
        (
            [2048, 128],
            RouterSpec::plain(1, RouterScore::Softmax, false),
            false,
        ),
        (
            [2048, 128],
            RouterSpec::plain(8, RouterScore::Softmax, true),
            false,
        ),
        (
            [2048, 128],
            RouterSpec {
                scaling_factor: 2.5,
                ..RouterSpec::plain(1, RouterScore::Softmax, true)
            },
            false,
        ),
        (
            [2048, 128],
            RouterSpec::plain(8, RouterScore::Sigmoid, false),
            true,
        ),
        (
            [2048, 128],
            RouterSpec::plain(1, RouterScore::Sigmoid, false),
            true,
        ),
        (
            [2048, 256],
            RouterSpec {
                group_limit: Some(deepseek),
                scaling_factor: 2.5,
                ..RouterSpec::plain(8, RouterScore::Sigmoid, false)
            },
            true,
        ),
        (
            [1000, 60],
            RouterSpec {
                group_limit: Some(GroupLimit {
                    num_groups: 4,
                    group_topk: 3,
                }),
                ..RouterSpec::plain(6, RouterScore::Softmax, true)
            },
            false,
        ),
    ];
    let mut out = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        for &(dims, spec, bias) in &cases {
            out.extend(rows_of(device, &mut rng, dtype, dims, spec, (bias, false)));
        }
        for spec in [
            RouterSpec::plain(8, RouterScore::Softmax, false),
            RouterSpec::plain(8, RouterScore::Softmax, true),
            RouterSpec {
                group_limit: Some(deepseek),
                ..RouterSpec::plain(8, RouterScore::Softmax, false)
            },
        ] {
            let dims = [512, 128];
            out.extend(rows_of(device, &mut rng, dtype, dims, spec, (false, true)));
        }
    }
    out
}
