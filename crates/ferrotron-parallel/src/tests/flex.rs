//! burn-flex's kernels against the composed ops: the cross-entropy and the tied logits' gradients
//! within float tolerance (their exponential and summation orders are their own), the AdamW
//! update and the logits bit for bit, the tied output layer with its cross-entropy as one op
//! bit for bit the two ops, and all the same bit for bit whatever the size of the thread pool
//! they run on.

use burn::backend::{Autodiff, Flex};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Int, Tensor, TensorData, TensorMetadata, TensorPrimitive};

use super::{assert_close, flat, values};
use crate::{
    AdamWStep, AdamWTensors, FusedOps, composed_adamw, composed_tied_logits, cross_entropy,
    cross_entropy_backward_reference, cross_entropy_forward_reference, tied_cross_entropy,
    tied_logits,
};

/// Rows long enough that a row is one task and a pool of several threads splits the rows.
const ROWS: usize = 24;
const VOCAB: usize = 40_003;

pub(super) fn floats<const D: usize>(
    shape: [usize; D],
    seed: f32,
    scale: f32,
) -> FloatTensor<Flex> {
    let data: Vec<f32> = values(&shape, seed)
        .into_iter()
        .map(|v| v * scale)
        .collect();
    Tensor::<Flex, D>::from_data(TensorData::new(data, shape), &Default::default())
        .into_primitive()
        .tensor()
}

fn labels() -> Tensor<Flex, 1, Int> {
    let labels: Vec<i64> = (0..ROWS as i64)
        .map(|r| (r * 7919) % VOCAB as i64)
        .collect();
    Tensor::from_data(TensorData::new(labels, [ROWS]), &Default::default())
}

pub(super) fn back<const D: usize>(t: FloatTensor<Flex>) -> Vec<f32> {
    flat(Tensor::<Flex, D>::from_primitive(TensorPrimitive::Float(t)))
}

pub(super) fn on_threads<R: Send>(threads: usize, body: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a test pool")
        .install(body)
}

/// Losses, log-sum-exps and the logits' gradient from the kernels.
fn kernel_cross_entropy() -> [Vec<f32>; 3] {
    let logits = floats([ROWS, VOCAB], 0.2, 8.0);
    assert!(Flex::has_cross_entropy_kernel(&logits));
    let saved = Flex::cross_entropy_kernel_forward(logits.clone(), labels().into_primitive());
    let lse = saved.log_sum_exp.clone();
    let grad = Flex::cross_entropy_kernel_backward(
        logits,
        labels().into_primitive(),
        saved.log_sum_exp,
        floats([ROWS], 0.9, 1.0),
    );
    [back::<1>(saved.losses), back::<1>(lse), back::<2>(grad)]
}

#[test]
fn flex_cross_entropy_kernel_equals_the_composed_reference() {
    let [losses, lse, grad] = kernel_cross_entropy();
    let logits = floats([ROWS, VOCAB], 0.2, 8.0);
    let want = cross_entropy_forward_reference::<Flex>(logits.clone(), labels().into_primitive());
    assert_close(&losses, &back::<1>(want.losses), "losses");
    assert_close(&lse, &back::<1>(want.log_sum_exp.clone()), "log-sum-exp");
    let want_grad = cross_entropy_backward_reference::<Flex>(
        logits,
        labels().into_primitive(),
        want.log_sum_exp,
        floats([ROWS], 0.9, 1.0),
    );
    assert_close(&grad, &back::<2>(want_grad), "d logits");
}

#[test]
fn flex_cross_entropy_is_the_same_on_any_number_of_threads() {
    let one = on_threads(1, kernel_cross_entropy);
    let three = on_threads(3, kernel_cross_entropy);
    assert!(
        one == three,
        "the kernels' results depend on the thread count"
    );
}

#[test]
fn flex_cross_entropy_backward_leaves_shared_logits_alone() {
    let logits = floats([ROWS, VOCAB], 0.2, 8.0);
    let before = back::<2>(logits.clone());
    let saved = Flex::cross_entropy_kernel_forward(logits.clone(), labels().into_primitive());
    let shared = logits.clone();
    let _grad = Flex::cross_entropy_kernel_backward(
        logits,
        labels().into_primitive(),
        saved.log_sum_exp,
        floats([ROWS], 0.9, 1.0),
    );
    assert!(
        back::<2>(shared) == before,
        "the backward wrote into a shared buffer"
    );
}

#[test]
#[should_panic(expected = "outside the vocabulary")]
fn flex_cross_entropy_refuses_a_label_outside_the_vocabulary() {
    let logits = floats([2, 5], 0.2, 1.0);
    let labels =
        Tensor::<Flex, 1, Int>::from_data(TensorData::new(vec![1i64, 5], [2]), &Default::default());
    Flex::cross_entropy_kernel_forward(logits, labels.into_primitive());
}

const PARAMS: usize = 70_001;

fn adamw_step(decay: Option<f64>, grad_scale: f64) -> AdamWStep {
    AdamWStep {
        lr: 3e-3,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        decay,
        bias_correction1: 1.0 - 0.9f64.powi(3),
        bias_correction2: 1.0 - 0.95f64.powi(3),
        grad_scale,
        rounded: None,
        moment_dtypes: crate::F32_MOMENTS,
    }
}

fn adamw_bits(out: AdamWTensors<Flex>) -> Vec<Vec<u32>> {
    [out.value, out.exp_avg, out.exp_avg_sq]
        .into_iter()
        .map(|t| back::<1>(t).into_iter().map(f32::to_bits).collect())
        .collect()
}

#[test]
fn flex_adamw_is_the_composed_update_bit_for_bit_on_any_number_of_threads() {
    let moments = || {
        let exp_avg_sq: Vec<f32> = values(&[PARAMS], 0.5).iter().map(|v| v * v * 0.1).collect();
        (
            floats([PARAMS], 0.3, 0.05),
            Tensor::<Flex, 1>::from_floats(exp_avg_sq.as_slice(), &Default::default())
                .into_primitive()
                .tensor(),
        )
    };
    let scale = || {
        Some(
            Tensor::<Flex, 1>::from_floats([0.75f32], &Default::default())
                .into_primitive()
                .tensor(),
        )
    };
    for (decay, grad_scale, with_moments, device_scale) in [
        (Some(1.0 - 3e-3 * 0.1), 1.0, true, false),
        (None, 0.37, true, false),
        (Some(0.999), 1.0, false, false),
        (None, 1.0, true, true),
    ] {
        let step = adamw_step(decay, grad_scale);
        let args = || {
            (
                floats([PARAMS], 0.1, 1.0),
                floats([PARAMS], 0.7, 0.3),
                with_moments.then(moments),
                if device_scale { scale() } else { None },
            )
        };
        let (value, grad, m, s) = args();
        let want = adamw_bits(composed_adamw::<Flex>(value, grad, m, step, s));
        for threads in [1, 3] {
            let got = on_threads(threads, || {
                let (value, grad, m, s) = args();
                adamw_bits(Flex::adamw_step(value, grad, m, step, s))
            });
            assert!(
                got == want,
                "AdamW on {threads} threads differs from the composed update \
                 (decay {decay:?}, grad scale {grad_scale}, moments {with_moments}, device scale {device_scale})"
            );
        }
    }
}

/// What a mixed-precision step hands the kernel (the offloaded optimizer's every update): a
/// bf16 or f16 gradient, bf16 moments, a 16-bit copy of the new value; each output the
/// composed update's to the bit, on any number of threads.
#[test]
fn flex_adamw_takes_16_bit_gradients_moments_and_copies_bit_for_bit() {
    let bf16 = DType::BF16;
    for (grad_dtype, moment_dtypes, rounded, with_moments) in [
        (DType::F32, crate::F32_MOMENTS, Some(bf16), true),
        (bf16, crate::F32_MOMENTS, Some(bf16), false),
        (DType::F16, [bf16, DType::F32], Some(DType::F16), true),
        (bf16, [bf16, bf16], None, true),
        (DType::F32, [DType::F32, bf16], Some(bf16), false),
    ] {
        let step = AdamWStep {
            rounded,
            moment_dtypes,
            ..adamw_step(Some(0.999), 0.81)
        };
        let cast = |t: FloatTensor<Flex>, dtype: DType| -> FloatTensor<Flex> {
            Tensor::<Flex, 1>::from_primitive(TensorPrimitive::Float(t))
                .cast(dtype)
                .into_primitive()
                .tensor()
        };
        let args = || {
            let moments = with_moments.then(|| {
                let exp_avg_sq: Vec<f32> =
                    values(&[PARAMS], 0.5).iter().map(|v| v * v * 0.1).collect();
                let v = Tensor::<Flex, 1>::from_floats(exp_avg_sq.as_slice(), &Default::default())
                    .into_primitive()
                    .tensor();
                (
                    cast(floats([PARAMS], 0.3, 0.05), moment_dtypes[0]),
                    cast(v, moment_dtypes[1]),
                )
            });
            (
                floats([PARAMS], 0.1, 1.0),
                cast(floats([PARAMS], 0.7, 0.3), grad_dtype),
                moments,
            )
        };
        let bits = |out: AdamWTensors<Flex>| -> (Vec<DType>, Vec<Vec<u32>>) {
            let outputs = [
                Some(out.value),
                Some(out.exp_avg),
                Some(out.exp_avg_sq),
                out.rounded,
            ];
            let outputs: Vec<_> = outputs.into_iter().flatten().collect();
            let dtypes = outputs.iter().map(TensorMetadata::dtype).collect();
            let bits = outputs
                .into_iter()
                .map(|t| {
                    back::<1>(cast(t, DType::F32))
                        .into_iter()
                        .map(f32::to_bits)
                        .collect()
                })
                .collect();
            (dtypes, bits)
        };
        let (value, grad, m) = args();
        let want = bits(composed_adamw::<Flex>(value, grad, m, step, None));
        for (threads, shared) in [(1, false), (3, false), (3, true)] {
            let got = on_threads(threads, || {
                let (value, grad, m) = args();
                // a checkpoint's snapshot holding the state: the update goes out of place
                let _held = shared.then(|| (value.clone(), m.clone()));
                bits(Flex::adamw_step(value, grad, m, step, None))
            });
            assert!(
                got == want,
                "AdamW on {threads} threads (shared {shared}) differs from the composed update \
                 (grad {grad_dtype:?}, moments {moment_dtypes:?}, rounded {rounded:?}, \
                 moments given {with_moments})"
            );
        }
    }
}

/// Large enough (`n · vocab · hidden` ≥ 192³) that the GEMMs run on the pool.
const LOGIT_ROWS: usize = 96;
const LOGIT_VOCAB: usize = 5_003;
const LOGIT_HIDDEN: usize = 32;

/// Logits, `d rows` and `d embedding` of `Σ logits · c` for a fixed `c`, through autodiff: with
/// the kernel node, or the composed product.
fn tied_logits_and_grads(kernel: bool) -> [Vec<u32>; 3] {
    type A = Autodiff<Flex>;
    let leaf = |shape: [usize; 2], seed: f32| {
        let data: Vec<f32> = values(&shape, seed).into_iter().map(|v| v * 0.5).collect();
        Tensor::<A, 2>::from_data(TensorData::new(data, shape), &Default::default()).require_grad()
    };
    let rows = leaf([LOGIT_ROWS, LOGIT_HIDDEN], 0.4);
    let embedding = leaf([LOGIT_VOCAB, LOGIT_HIDDEN], 0.8);
    let logits = if kernel {
        assert!(Flex::has_tied_logits_kernel(
            &floats([LOGIT_ROWS, LOGIT_HIDDEN], 0.4, 0.5),
            &floats([LOGIT_VOCAB, LOGIT_HIDDEN], 0.8, 0.5),
        ));
        tied_logits(rows.clone(), embedding.clone())
    } else {
        Tensor::from_primitive(TensorPrimitive::Float(composed_tied_logits::<A>(
            rows.clone().into_primitive().tensor(),
            embedding.clone().into_primitive().tensor(),
        )))
    };
    let weights = leaf([LOGIT_ROWS, LOGIT_VOCAB], 0.6).detach();
    let grads = (logits.clone() * weights).sum().backward();
    let bits = |t: Tensor<Flex, 2>| flat(t).into_iter().map(f32::to_bits).collect();
    [
        bits(logits.inner()),
        bits(rows.grad(&grads).expect("d rows")),
        bits(embedding.grad(&grads).expect("d embedding")),
    ]
}

#[test]
fn flex_tied_logits_are_the_composed_product_and_the_same_on_any_number_of_threads() {
    let want = tied_logits_and_grads(false);
    let got = tied_logits_and_grads(true);
    let floats = |bits: &[u32]| bits.iter().map(|&b| f32::from_bits(b)).collect::<Vec<_>>();
    // The logits are the composed GEMM's bits; the gradients sum over the vocabulary (`d rows`)
    // and the rows (`d embedding`) in the kernel's own order.
    assert_eq!(got[0], want[0], "logits differ from the composed product");
    for (name, (got, want)) in ["d rows", "d embedding"]
        .iter()
        .zip(got[1..].iter().zip(&want[1..]))
    {
        assert_close(&floats(got), &floats(want), name);
    }
    for threads in [1, 2, 3] {
        let again = on_threads(threads, || tied_logits_and_grads(true));
        assert!(again == got, "tied logits on {threads} threads differ");
    }
}

/// Losses, `d rows` and `d embedding` of `Σ losses · c` for the tied output layer and its
/// cross-entropy, as one op or as the two ops in turn.
fn tied_loss_and_grads(one_op: bool) -> [Vec<u32>; 3] {
    type A = Autodiff<Flex>;
    let leaf = |shape: [usize; 2], seed: f32| {
        let data: Vec<f32> = values(&shape, seed).into_iter().map(|v| v * 2.0).collect();
        Tensor::<A, 2>::from_data(TensorData::new(data, shape), &Default::default()).require_grad()
    };
    let rows = leaf([LOGIT_ROWS, LOGIT_HIDDEN], 0.4);
    let embedding = leaf([LOGIT_VOCAB, LOGIT_HIDDEN], 0.8);
    let labels: Vec<i64> = (0..LOGIT_ROWS as i64)
        .map(|r| (r * 7919) % LOGIT_VOCAB as i64)
        .collect();
    let labels =
        Tensor::<A, 1, Int>::from_data(TensorData::new(labels, [LOGIT_ROWS]), &Default::default());
    let losses = if one_op {
        tied_cross_entropy(rows.clone(), embedding.clone(), labels).expect("a Flex kernel")
    } else {
        let logits = tied_logits(rows.clone(), embedding.clone());
        cross_entropy(logits, labels).expect("a Flex kernel")
    };
    let weights = Tensor::<A, 1>::from_data(
        TensorData::new(values(&[LOGIT_ROWS], 1.3), [LOGIT_ROWS]),
        &Default::default(),
    );
    let grads = (losses.clone() * weights).sum().backward();
    let bits = |t: Vec<f32>| t.into_iter().map(f32::to_bits).collect();
    [
        bits(flat(losses.inner())),
        bits(flat(rows.grad(&grads).expect("d rows"))),
        bits(flat(embedding.grad(&grads).expect("d embedding"))),
    ]
}

#[test]
fn flex_tied_cross_entropy_is_the_two_ops_bit_for_bit_on_any_number_of_threads() {
    let want = tied_loss_and_grads(false);
    for threads in [1, 2, 3] {
        let got = on_threads(threads, || tied_loss_and_grads(true));
        for (name, (got, want)) in ["losses", "d rows", "d embedding"]
            .iter()
            .zip(got.iter().zip(&want))
        {
            assert!(
                got == want,
                "{threads} threads: {name} differs from the two ops"
            );
        }
    }
}
