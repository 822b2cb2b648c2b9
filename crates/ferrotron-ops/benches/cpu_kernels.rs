//! burn-flex's fused kernels against the composed ops they replace, at the quick start's shapes
//! (shakespeare-tiny: 512 rows × 50,304 words of logits; the tied 50,304 × 64 embedding; layers
//! of hidden 64, 4 heads, 8 × 64 tokens): the cross-entropy forward + backward through autodiff
//! (the model's loss, mean over rows), one AdamW update, the whole tied output layer (its three
//! GEMMs around the loss kernel), the bulk of a quick-start step's arithmetic, and a layer's
//! LayerNorm, attention and GELU forward + backward, and the offloaded optimizer's AdamW update
//! of a 16M-element piece (`adamw_offload_16m`). Each on the process's rayon pool
//! (`RAYON_NUM_THREADS` sizes it).
//!
//!     RAYON_NUM_THREADS=1 cargo bench -p ferrotron-ops --bench cpu_kernels

use burn::backend::{Autodiff, Flex};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Distribution, Int, Tensor, bf16};
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use ferrotron_ops::{
    AdamWStep, AttentionSpec, FusedOps, HostAdamW, HostMoment, HostOldValues, HostRounded,
    HostValues, NormKind, NormSpec, composed_adamw, composed_gelu, composed_norm,
    composed_qkv_attention, cross_entropy, gelu, norm, tied_logits,
};

type B = Autodiff<Flex>;
const ROWS: usize = 512;
const VOCAB: usize = 50_304;
const HIDDEN: usize = 64;

fn logits() -> Tensor<B, 2> {
    Tensor::<B, 2>::random(
        [ROWS, VOCAB],
        Distribution::Normal(0.0, 2.0),
        &Default::default(),
    )
}

fn labels() -> Tensor<B, 1, Int> {
    Tensor::<B, 1, Int>::random(
        [ROWS],
        Distribution::Uniform(0.0, VOCAB as f64),
        &Default::default(),
    )
}

/// The model's composed loss on one rank: max-shifted log-sum-exp minus the target logit.
fn composed_loss(logits: Tensor<B, 2>, labels: Tensor<B, 1, Int>) -> Tensor<B, 1> {
    let logits = logits.cast(DType::F32);
    let max = logits.clone().detach().max_dim(1);
    let shifted = logits - max;
    let sum_exp = shifted.clone().exp().sum_dim(1);
    let target = shifted.gather(1, labels.reshape([ROWS, 1]));
    (sum_exp.log() - target).reshape([ROWS])
}

fn cross_entropy_bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("cross_entropy_512x50304_fwd_bwd");
    group.sample_size(10);
    let labels = labels();
    // Fresh logits per iteration (as the output layer makes them), drawn outside the timing.
    group.bench_function("composed", |b| {
        b.iter_batched(
            logits,
            |x| {
                let x = x.require_grad();
                let grads = composed_loss(x.clone(), labels.clone()).mean().backward();
                x.grad(&grads).expect("d logits")
            },
            BatchSize::LargeInput,
        )
    });
    group.bench_function("flex_kernel", |b| {
        b.iter_batched(
            logits,
            |x| {
                let x = x.require_grad();
                let loss = cross_entropy(x.clone(), labels.clone()).expect("a Flex kernel");
                let grads = loss.mean().backward();
                x.grad(&grads).expect("d logits")
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

fn flat(n: usize, positive: bool) -> FloatTensor<Flex> {
    let x = Tensor::<Flex, 1>::random([n], Distribution::Normal(0.0, 0.1), &Default::default());
    let x = if positive { x.abs() } else { x };
    x.into_primitive().tensor()
}

fn adamw_bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("adamw_50304x64");
    group.sample_size(20);
    let n = VOCAB * HIDDEN;
    let step = AdamWStep {
        lr: 5e-3,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        decay: Some(1.0 - 5e-3 * 0.1),
        bias_correction1: 0.1,
        bias_correction2: 0.05,
        grad_scale: 0.5,
        rounded: None,
        moment_dtypes: ferrotron_ops::F32_MOMENTS,
    };
    let inputs = || {
        (
            flat(n, false),
            flat(n, false),
            Some((flat(n, false), flat(n, true))),
        )
    };
    group.bench_function("composed", |b| {
        b.iter_batched(
            inputs,
            |(p, g, m)| composed_adamw::<Flex>(p, g, m, step, None),
            BatchSize::LargeInput,
        )
    });
    group.bench_function("flex_kernel", |b| {
        b.iter_batched(
            inputs,
            |(p, g, m)| Flex::adamw_step(p, g, m, step, None),
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

/// Elements of one offloaded piece: 16M, a slice of an 8B model's flat state.
const OFFLOAD_PIECE: usize = 1 << 24;

/// The offloaded optimizer's update of one 16M-element piece (f32 gradient and master, the
/// bf16 copy of the new value), moments in f32 (30 bytes of memory traffic an element: p, m, v,
/// g read, p, m, v and the copy written) or in bf16 (22 bytes): through `Flex::adamw_step` on
/// tensors and through the slice API on buffers updated in place.
fn offload_adamw_bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("adamw_offload_16m");
    group.sample_size(10);
    let n = OFFLOAD_PIECE;
    let values = |seed: u32, positive: bool| -> Vec<f32> {
        (0..n as u32)
            .map(|i| {
                let x = ((i.wrapping_mul(2_654_435_761) ^ seed) % 20_001) as f32 * 1e-5 - 0.1;
                if positive { x.abs() + 1e-6 } else { x }
            })
            .collect()
    };
    let (p, g, m, v) = (
        values(1, false),
        values(2, false),
        values(3, false),
        values(4, true),
    );
    for (name, moment_dtype, bytes) in [
        ("f32_moments_bf16_copy", DType::F32, 30),
        ("bf16_moments_bf16_copy", DType::BF16, 22),
    ] {
        group.throughput(criterion::Throughput::Bytes((n * bytes) as u64));
        let step = AdamWStep {
            lr: 3e-4,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            decay: Some(1.0 - 3e-4 * 0.1),
            bias_correction1: 0.1,
            bias_correction2: 0.05,
            grad_scale: 0.5,
            rounded: Some(DType::BF16),
            moment_dtypes: [moment_dtype; 2],
        };
        let tensor = |x: &[f32], dtype: DType| -> FloatTensor<Flex> {
            Tensor::<Flex, 1>::from_floats(x, &Default::default())
                .cast(dtype)
                .into_primitive()
                .tensor()
        };
        group.bench_function(format!("{name}/flex_adamw_step"), |b| {
            b.iter_batched(
                || {
                    (
                        tensor(&p, DType::F32),
                        tensor(&g, DType::F32),
                        Some((tensor(&m, moment_dtype), tensor(&v, moment_dtype))),
                    )
                },
                |(p, g, m)| Flex::adamw_step(p, g, m, step, None),
                BatchSize::LargeInput,
            )
        });
        let adamw = HostAdamW::new(&step, None, false);
        let (mut master, mut copy) = (p.clone(), vec![bf16::ZERO; n]);
        let (mut m32, mut v32) = (m.clone(), v.clone());
        let narrow = |x: &[f32]| -> Vec<bf16> { x.iter().map(|&x| bf16::from_f32(x)).collect() };
        let (mut m16, mut v16) = (narrow(&m), narrow(&v));
        group.bench_function(format!("{name}/host_slice"), |b| {
            b.iter(|| {
                let (exp_avg, exp_avg_sq) = if moment_dtype == DType::F32 {
                    (HostMoment::F32(&mut m32), HostMoment::F32(&mut v32))
                } else {
                    (HostMoment::Bf16(&mut m16), HostMoment::Bf16(&mut v16))
                };
                adamw.update(
                    &mut master,
                    exp_avg,
                    exp_avg_sq,
                    HostValues::F32(&g),
                    HostOldValues::default(),
                    Some(HostRounded::Bf16(&mut copy)),
                )
            })
        });
    }
    group.finish();
}

/// The tied output layer as the model runs it: `[rows, hidden] · embeddingᵀ`, the loss kernel,
/// and the backward's two GEMMs (`d rows`, `d embedding`).
fn output_layer_bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("tied_output_layer_512x64x50304_fwd_bwd");
    group.sample_size(10);
    let labels = labels();
    let inputs = || {
        let init = Distribution::Normal(0.0, 0.02);
        (
            Tensor::<B, 2>::random([ROWS, HIDDEN], init, &Default::default()).require_grad(),
            Tensor::<B, 2>::random([VOCAB, HIDDEN], init, &Default::default()).require_grad(),
        )
    };
    group.bench_function("flex", |b| {
        b.iter_batched(
            inputs,
            |(rows, embedding)| {
                let logits = tied_logits(rows.clone(), embedding.clone());
                let loss = cross_entropy(logits, labels.clone()).expect("a Flex kernel");
                let grads = loss.mean().backward();
                (rows.grad(&grads), embedding.grad(&grads))
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

/// A layer's LayerNorm, packed attention and GELU (the ops with CPU kernels), forward and
/// backward, composed or through the kernels' nodes.
fn layer_ops(kernels: bool) -> Option<Tensor<Flex, 3>> {
    let device = Default::default();
    let init = Distribution::Normal(0.0, 1.0);
    let x = Tensor::<B, 3>::random([8, 64, 64], init, &device).require_grad();
    let gamma = Tensor::<B, 1>::ones([64], &device).require_grad();
    let beta = Tensor::<B, 1>::zeros([64], &device).require_grad();
    let spec = NormSpec {
        kind: NormKind::Layer,
        epsilon: 1e-5,
    };
    let normed = if kernels {
        norm(x.clone(), gamma, Some(beta), spec)
    } else {
        composed_norm(x.clone(), gamma, Some(beta), spec)
    };
    // `[8, 64, 4 groups, q k v, 16]` from the normed rows, as the QKV projection lays them out
    let qkv = Tensor::cat(vec![normed.clone(); 3], 2).reshape([8, 64, 4, 3, 16]);
    let qkv = qkv.into_primitive().tensor();
    let spec = AttentionSpec::causal();
    let context: Tensor<B, 4> =
        Tensor::from_primitive(burn::tensor::TensorPrimitive::Float(if kernels {
            B::fused_qkv_attention(qkv, spec)
        } else {
            composed_qkv_attention::<B>(qkv, spec)
        }));
    let wide = Tensor::cat(vec![context.reshape([8, 64, 64]); 4], 2);
    let activated = if kernels {
        gelu(wide)
    } else {
        Tensor::from_primitive(burn::tensor::TensorPrimitive::Float(composed_gelu::<B>(
            wide.into_primitive().tensor(),
        )))
    };
    let grads = activated.sum().backward();
    x.grad(&grads)
}

fn layers_bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("layer_norm_attention_gelu_8x64x64_fwd_bwd");
    group.sample_size(20);
    group.bench_function("composed", |b| b.iter(|| layer_ops(false)));
    group.bench_function("flex_kernels", |b| b.iter(|| layer_ops(true)));
    group.finish();
}

criterion_group!(
    benches,
    cross_entropy_bench,
    adamw_bench,
    offload_adamw_bench,
    output_layer_bench,
    layers_bench
);
criterion_main!(benches);
