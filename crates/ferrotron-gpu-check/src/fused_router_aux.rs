//! Rows for the router's balancing and z-loss terms (`FusedOps::fused_moe_router_aux`): the
//! kernels in f32 and bf16 against the composed terms in f32 on the same GPU from the same
//! rounded logits. Each case has two rows where it counts: the plain top-k counts, which must
//! match exactly, and the mass with the log-sum-exps and the logits' gradient of a weighted-sum
//! loss of both (outputs poisoned). Softmax and sigmoid mass; one group, per-sequence groups and
//! a group whose rows leave the last band short; 128 and 60 experts; tied logits for the counts.

use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};
use ferrotron_cuda::GpuDevice;
use ferrotron_ops::{
    BalancingSpec, FusedOps, RouterAux, RouterAuxSpec, RouterScore, composed_moe_router_aux,
};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::fused::{A, dtype_label, host, round, rounded_row, upload};
use crate::fused_moe::exact_row;
use crate::fused_router::logits;
use crate::{Row, guarded};

/// The counts (empty where not asked for), and the mass, the log-sum-exps and the logits'
/// gradient of `Σ a ∘ mass + Σ b ∘ lse` flattened into one f32 tensor, by the kernels (`FUSED`)
/// or composed.
fn run<const FUSED: bool>(
    (data, a, b): (&TensorData, &TensorData, &TensorData),
    spec: RouterAuxSpec,
    dtype: DType,
    device: &GpuDevice,
) -> [TensorData; 2] {
    let logits: Tensor<A, 2> = upload(data, dtype, device);
    let primitive = logits.clone().into_primitive().tensor();
    let terms: RouterAux<A> = if FUSED {
        A::fused_moe_router_aux(primitive, spec)
    } else {
        composed_moe_router_aux::<A>(primitive, spec)
    };
    let float = |x| TensorPrimitive::Float(x);
    let weighting = |w: &TensorData| {
        Tensor::<A, 1>::from_data(round(w.clone(), DType::F32), (device, DType::F32))
    };
    let mut parts = Vec::new();
    let mut loss = Tensor::<A, 1>::zeros([1], (device, DType::F32));
    if let Some(mass) = terms.probability_mass {
        let mass: Tensor<A, 1> = Tensor::<A, 2>::from_primitive(float(mass))
            .cast(DType::F32)
            .reshape([-1]);
        loss = loss + (mass.clone() * weighting(a)).sum();
        parts.push(mass.inner());
    }
    if let Some(lse) = terms.log_sum_exp {
        let lse = Tensor::<A, 1>::from_primitive(float(lse)).cast(DType::F32);
        loss = loss + (lse.clone() * weighting(b)).sum();
        parts.push(lse.inner());
    }
    let g = loss.backward();
    parts.push(
        logits
            .grad(&g)
            .expect("d logits")
            .cast(DType::F32)
            .reshape([-1]),
    );
    let counts = match terms.topk_counts {
        Some(counts) => Tensor::<A, 2>::from_primitive(float(counts))
            .inner()
            .cast(DType::F32)
            .reshape([-1])
            .into_data(),
        None => TensorData::new(Vec::<f32>::new(), [0]),
    };
    [counts, Tensor::cat(parts, 0).into_data()]
}

/// What a row's shape column says of its terms.
fn label([tokens, experts]: [usize; 2], spec: &RouterAuxSpec, tied: bool) -> String {
    let mut label = format!("[{tokens}, {experts}]");
    if let Some(balancing) = spec.balancing {
        let score = match balancing.score {
            RouterScore::Softmax => "softmax",
            RouterScore::Sigmoid => "sigmoid",
        };
        label.push_str(&format!(
            " {score} mass per {} tokens",
            balancing.tokens_per_group
        ));
        if let Some(k) = balancing.count_topk {
            label.push_str(&format!(", top {k} counts"));
        }
    }
    if spec.log_sum_exp {
        label.push_str(", lse");
    }
    if tied {
        label.push_str(", tied eighths");
    }
    label
}

/// The rows of one case: the counts' (where asked for) and the differentiable terms'.
fn rows_of(
    device: &GpuDevice,
    rng: &mut StdRng,
    dtype: DType,
    dims: [usize; 2],
    spec: RouterAuxSpec,
    tied: bool,
) -> Vec<Row> {
    let [tokens, experts] = dims;
    let groups = spec
        .balancing
        .map_or(0, |balancing| tokens / balancing.tokens_per_group);
    // the kernel's dtype's values for both sides (bf16 ties what f32 tells apart)
    let data = round(logits(rng, dims, tied), dtype).convert::<f32>();
    let a = host(&[groups * experts], rng, DType::F32);
    let b = host(&[tokens], rng, DType::F32);
    let inputs = (&data, &a, &b);
    let got = guarded(|| Ok(run::<true>(inputs, spec, dtype, device)));
    let want = guarded(|| Ok(run::<false>(inputs, spec, DType::F32, device)));
    let part = |r: &Result<[TensorData; 2], String>, i: usize| {
        r.as_ref()
            .map(|parts| parts[i].clone())
            .map_err(Clone::clone)
    };
    let shape = label(dims, &spec, tied);
    let mut rows = Vec::new();
    if spec.balancing.is_some_and(|b| b.count_topk.is_some()) {
        rows.push(exact_row(
            "moe_router_aux",
            dtype_label(dtype),
            format!("{shape}: counts"),
            (part(&got, 0), part(&want, 0), "composed f32"),
        ));
    }
    rows.push(rounded_row(
        "moe_router_aux",
        dtype,
        shape,
        (8.0, "mass + lse + d logits"),
        part(&got, 1),
        part(&want, 1),
    ));
    rows
}

fn spec(
    score: RouterScore,
    tokens_per_group: usize,
    count_topk: Option<usize>,
    log_sum_exp: bool,
) -> RouterAuxSpec {
    RouterAuxSpec {
        balancing: Some(BalancingSpec {
            score,
            tokens_per_group,
            count_topk,
        }),
        log_sum_exp,
    }
}

/// Every router-terms row.
pub(crate) fn rows(device: &GpuDevice) -> Vec<Row> {
    let mut rng = StdRng::seed_from_u64(53);
    let lse_only = RouterAuxSpec {
        balancing: None,
        log_sum_exp: true,
    };
    let cases = [
        ([4096, 128], spec(RouterScore::Softmax, 1024, Some(8), true)),
        (
            [4096, 128],
            spec(RouterScore::Sigmoid, 4096, Some(1), false),
        ),
        ([4096, 128], spec(RouterScore::Softmax, 4096, None, false)),
        ([1000, 60], spec(RouterScore::Sigmoid, 500, Some(6), true)),
        ([4096, 128], lse_only),
    ];
    let mut out = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        for &(dims, spec) in &cases {
            out.extend(rows_of(device, &mut rng, dtype, dims, spec, false));
        }
        let tied = spec(RouterScore::Softmax, 256, Some(8), true);
        out.extend(rows_of(device, &mut rng, dtype, [1024, 128], tied, true));
    }
    out
}
