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

/// A value of every class the narrowing treats apart, of both signs: zeros, subnormals with
/// their leading bit anywhere (21 and 22 lose low bits through f64), every exponent with
/// mantissas at the rounding edges (ties to odd and even, sticky bits only among the three
/// lowest, rounding into the next binade and from the largest finite value to infinity) and
/// pseudo-random ones, infinities and NaNs (quiet, signalling, any payload).
fn bf16_narrowing_sample() -> Vec<u32> {
    let edges = [
        0, 1, 2, 3, 4, 7, 8, 0xF, 0x7FFF, 0x8000, 0x8001, 0x8002, 0x8004, 0x8007, 0x8008, 0x8010,
        0xFFFF, 0x1_0000, 0x1_7FFF, 0x1_8000, 0x1_8001, 0x1_8007, 0x1_8008, 0x20_0000, 0x20_8000,
        0x20_8001, 0x20_8003, 0x40_0000, 0x40_8000, 0x40_8001, 0x40_8002, 0x40_8003, 0x60_8001,
        0x7F_7FFF, 0x7F_8000, 0x7F_8001, 0x7F_8008, 0x7F_FFFF,
    ];
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut random = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state as u32 & 0x7F_FFFF
    };
    let mut sample = Vec::new();
    for sign in [0, 0x8000_0000] {
        for exponent in 0..=255u32 {
            let mantissas = edges.into_iter().chain((0..2_000).map(|_| random()));
            sample.extend(mantissas.map(|m| sign | exponent << 23 | m));
        }
    }
    sample
}

#[test]
fn bf16_narrowing_is_burn_flexs_cast_bit_for_bit_on_every_class() {
    use crate::cpu::bf16_bits::bf16_from_f32;
    for bits in bf16_narrowing_sample() {
        let x = f32::from_bits(bits);
        let want = burn::tensor::bf16::from_f64(f64::from(x)).to_bits();
        let got = bf16_from_f32(x).to_bits();
        assert_eq!(
            got, want,
            "bf16 of {bits:#010x}: {got:#06x}, want {want:#06x}"
        );
    }
}

/// All 2³² f32 values (8 s in release on two cores):
/// `cargo test --release -p ferrotron-ops bf16_narrowing -- --ignored`.
#[test]
#[ignore = "2^32 values; run in release"]
fn bf16_narrowing_is_burn_flexs_cast_bit_for_bit_on_every_f32() {
    use crate::cpu::bf16_bits::bf16_from_f32;
    use rayon::prelude::*;
    let wrong = (0..=u16::MAX)
        .into_par_iter()
        .map(|high| {
            (0..=u16::MAX)
                .filter(|&low| {
                    let x = f32::from_bits(u32::from(high) << 16 | u32::from(low));
                    bf16_from_f32(x).to_bits()
                        != burn::tensor::bf16::from_f64(f64::from(x)).to_bits()
                })
                .count()
        })
        .sum::<usize>();
    assert_eq!(wrong, 0, "f32 values narrowed to another bf16");
}

#[test]
fn bf16_widening_is_half_s_bit_for_bit_on_every_bf16() {
    use crate::cpu::bf16_bits::bf16_to_f32;
    for bits in 0..=u16::MAX {
        let x = burn::tensor::bf16::from_bits(bits);
        assert_eq!(
            bf16_to_f32(x).to_bits(),
            x.to_f32().to_bits(),
            "{bits:#06x}"
        );
    }
}

/// A host buffer of one dtype, as the offloaded optimizer holds it.
#[derive(Clone)]
enum Buffer {
    F32(Vec<f32>),
    Bf16(Vec<burn::tensor::bf16>),
    F16(Vec<burn::tensor::f16>),
}

impl Buffer {
    fn of(t: FloatTensor<Flex>) -> Self {
        let data = t.into_data();
        match data.dtype {
            DType::F32 => Buffer::F32(data.to_vec().expect("f32")),
            DType::BF16 => Buffer::Bf16(data.to_vec().expect("bf16")),
            DType::F16 => Buffer::F16(data.to_vec().expect("f16")),
            dtype => unreachable!("{dtype:?}"),
        }
    }

    fn bits(&self) -> Vec<u32> {
        match self {
            Buffer::F32(x) => x.iter().map(|x| x.to_bits()).collect(),
            Buffer::Bf16(x) => x.iter().map(|x| x.to_bits().into()).collect(),
            Buffer::F16(x) => x.iter().map(|x| x.to_bits().into()).collect(),
        }
    }

    /// The same length of NaNs: what a buffer only written holds does not matter.
    fn garbage(&self) -> Self {
        match self {
            Buffer::F32(x) => Buffer::F32(vec![f32::NAN; x.len()]),
            Buffer::Bf16(x) => Buffer::Bf16(vec![burn::tensor::bf16::NAN; x.len()]),
            Buffer::F16(x) => Buffer::F16(vec![burn::tensor::f16::NAN; x.len()]),
        }
    }

    fn values(&self, range: std::ops::Range<usize>) -> crate::HostValues<'_> {
        match self {
            Buffer::F32(x) => crate::HostValues::F32(&x[range]),
            Buffer::Bf16(x) => crate::HostValues::Bf16(&x[range]),
            Buffer::F16(x) => crate::HostValues::F16(&x[range]),
        }
    }

    fn moment(&mut self, range: std::ops::Range<usize>) -> crate::HostMoment<'_> {
        match self {
            Buffer::F32(x) => crate::HostMoment::F32(&mut x[range]),
            Buffer::Bf16(x) => crate::HostMoment::Bf16(&mut x[range]),
            Buffer::F16(_) => unreachable!("no f16 moments"),
        }
    }

    fn rounded(&mut self, range: std::ops::Range<usize>) -> crate::HostRounded<'_> {
        match self {
            Buffer::Bf16(x) => crate::HostRounded::Bf16(&mut x[range]),
            Buffer::F16(x) => crate::HostRounded::F16(&mut x[range]),
            Buffer::F32(_) => unreachable!("no f32 copy"),
        }
    }
}

/// `values` with every 37th element one of the values whose bits are easiest to get wrong.
fn with_specials(mut x: Vec<f32>) -> Vec<f32> {
    let specials = [
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        1e-40,
        -3e-39,
        f32::MIN_POSITIVE,
        f32::MAX,
        -1.7e38,
        1e-20,
    ];
    for (i, x) in x.iter_mut().enumerate().step_by(37) {
        *x = specials[(i / 37) % specials.len()];
    }
    x
}

/// The offloaded optimizer's update of slices (in two pieces cut off the chunk grid, each split
/// into chunks on the pool), in place or from old values in other buffers, against the
/// composed update: every output to the bit, for inputs full of zeros of both signs,
/// subnormals, infinities and NaNs, with and without each factor, on any number of threads.
#[test]
fn host_adamw_on_slices_is_the_composed_update_bit_for_bit() {
    let bf16 = DType::BF16;
    let single = DType::F32;
    for (grad_dtype, moment_dtypes, rounded, with_moments, decay, grad_scale, device_scale) in [
        (
            single,
            crate::F32_MOMENTS,
            Some(bf16),
            true,
            Some(0.999),
            0.81,
            None,
        ),
        (single, crate::F32_MOMENTS, None, true, None, 1.0, None),
        (
            single,
            crate::F32_MOMENTS,
            Some(bf16),
            false,
            None,
            1.0,
            Some(0.75f32),
        ),
        (
            bf16,
            [bf16, bf16],
            Some(bf16),
            true,
            Some(0.999),
            1.0,
            Some(1.5),
        ),
        (
            bf16,
            [bf16, bf16],
            Some(bf16),
            false,
            Some(0.999),
            0.5,
            None,
        ),
        (
            DType::F16,
            [bf16, single],
            Some(DType::F16),
            true,
            None,
            0.81,
            None,
        ),
        (
            single,
            [single, bf16],
            None,
            true,
            Some(0.99),
            1.0,
            Some(0.3),
        ),
    ] {
        let step = AdamWStep {
            rounded,
            moment_dtypes,
            ..adamw_step(decay, grad_scale)
        };
        let tensor = |x: Vec<f32>, dtype: DType| -> FloatTensor<Flex> {
            Tensor::<Flex, 1>::from_data(TensorData::new(x, [PARAMS]), &Default::default())
                .cast(dtype)
                .into_primitive()
                .tensor()
        };
        let value = with_specials(values(&[PARAMS], 0.1));
        let grad = with_specials(values(&[PARAMS], 0.7).iter().map(|g| g * 0.3).collect());
        let exp_avg = with_specials(values(&[PARAMS], 0.3).iter().map(|m| m * 0.05).collect());
        let exp_avg_sq: Vec<f32> = values(&[PARAMS], 0.5).iter().map(|v| v * v * 0.1).collect();
        let exp_avg_sq = with_specials(exp_avg_sq);
        let moments = with_moments.then(|| {
            (
                tensor(exp_avg.clone(), moment_dtypes[0]),
                tensor(exp_avg_sq.clone(), moment_dtypes[1]),
            )
        });
        let scale = device_scale.map(|s| {
            Tensor::<Flex, 1>::from_floats([s], &Default::default())
                .into_primitive()
                .tensor()
        });
        let composed = composed_adamw::<Flex>(
            tensor(value.clone(), single),
            tensor(grad.clone(), grad_dtype),
            moments.clone(),
            step,
            scale,
        );
        let want: Vec<Vec<u32>> = [
            Some(composed.value),
            Some(composed.exp_avg),
            Some(composed.exp_avg_sq),
            composed.rounded,
        ]
        .into_iter()
        .flatten()
        .map(|t| Buffer::of(t).bits())
        .collect();

        let grad = Buffer::of(tensor(grad, grad_dtype));
        let [m, v] = moment_dtypes.map(|dtype| Buffer::of(tensor(vec![0.0; PARAMS], dtype)));
        let (m, v) = match &moments {
            Some((m, v)) => (Buffer::of(m.clone()), Buffer::of(v.clone())),
            None => (m.garbage(), v.garbage()),
        };
        let copy = rounded.map(|dtype| Buffer::of(tensor(vec![0.0; PARAMS], dtype)).garbage());
        let adamw = crate::HostAdamW::new(&step, device_scale, !with_moments);
        for (threads, out_of_place) in [(1, false), (3, false), (3, true)] {
            let got = on_threads(threads, || {
                let (mut value_to, mut m_to, mut v_to) = if out_of_place {
                    (vec![f32::NAN; PARAMS], m.garbage(), v.garbage())
                } else {
                    (value.clone(), m.clone(), v.clone())
                };
                let mut copy = copy.clone();
                for range in [0..12_345, 12_345..PARAMS] {
                    let old = crate::HostOldValues {
                        master: Some(&value[range.clone()]),
                        exp_avg: Some(m.values(range.clone())),
                        exp_avg_sq: Some(v.values(range.clone())),
                    };
                    adamw.update(
                        &mut value_to[range.clone()],
                        m_to.moment(range.clone()),
                        v_to.moment(range.clone()),
                        grad.values(range.clone()),
                        if out_of_place {
                            old
                        } else {
                            Default::default()
                        },
                        copy.as_mut().map(|c| c.rounded(range.clone())),
                    );
                }
                [Some(Buffer::F32(value_to)), Some(m_to), Some(v_to), copy]
                    .into_iter()
                    .flatten()
                    .map(|b| b.bits())
                    .collect::<Vec<_>>()
            });
            assert!(
                got == want,
                "slice AdamW on {threads} threads (out of place {out_of_place}) differs from \
                 the composed update (grad {grad_dtype:?}, moments {moment_dtypes:?}, rounded \
                 {rounded:?}, moments given {with_moments}, decay {decay:?}, grad scale \
                 {grad_scale}, device scale {device_scale:?})"
            );
        }
    }
}

#[test]
#[should_panic(expected = "the gradient has Some(9) elements, the master 10")]
fn host_adamw_refuses_buffers_of_other_lengths() {
    let step = adamw_step(None, 1.0);
    let (mut p, mut m, mut v) = (vec![0.0; 10], vec![0.0; 10], vec![0.0; 10]);
    crate::HostAdamW::new(&step, None, false).update(
        &mut p,
        crate::HostMoment::F32(&mut m),
        crate::HostMoment::F32(&mut v),
        crate::HostValues::F32(&[0.0; 9]),
        Default::default(),
        None,
    );
}
