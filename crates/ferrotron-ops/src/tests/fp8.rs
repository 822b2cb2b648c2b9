//! The fp8 linear on burn-flex through the reference primitives: the node's products are the
//! fp8 products of the right transposes with the right scales (checked against host arithmetic
//! on the grids), the scaling state records and updates as delayed scaling should, weights are
//! cast once per step, current scaling scales each tensor by its own amax, inference records
//! nothing, a checkpoint's rows restore the state, and the launch refusal of this backend.

use std::collections::HashMap;

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorMetadata, TensorPrimitive};

use super::{B, flat, tensor, values};
use crate::fp8::scaling::{
    AMAX, AmaxAlgo, Fp8Format, Fp8Role, Fp8Scaling, Fp8Settings, HISTORY, SCALE, amax, round_to_fp8,
};
use crate::{Fp8Linear, Fp8State, FusedOps, end_local_fp8_step};

const M: usize = 6;
const K: usize = 32;
const N: usize = 16;

pub(super) fn hybrid(scaling: Fp8Scaling) -> Fp8Settings {
    Fp8Settings {
        forward: Fp8Format::E4m3,
        backward: Fp8Format::E5m2,
        scaling,
        margin: 0,
    }
}

pub(super) fn delayed() -> Fp8Settings {
    hybrid(Fp8Scaling::Delayed {
        history: 2,
        algo: AmaxAlgo::MostRecent,
    })
}

fn layer(settings: Fp8Settings) -> Fp8Linear {
    let state = Fp8State::new(
        settings,
        vec!["layers.0.qkv".into(), "layers.0.proj".into()],
    );
    Fp8Linear::new(&state, 1)
}

/// The state's numbers (all slots) on the host.
pub(super) fn state_values(fp8: &Fp8Linear) -> Vec<f32> {
    fp8.state()
        .rows::<Flex>()
        .into_iter()
        .flat_map(|(_, row)| row)
        .collect()
}

pub(super) fn at(fp8: &Fp8Linear, role: Fp8Role, field: usize) -> f32 {
    state_values(fp8)[fp8.block_offset(role) + field]
}

/// Scaled inputs: magnitudes around `scale`, so casts exercise the grids' whole range.
pub(super) fn scaled(shape: [usize; 2], seed: f32, scale: f32) -> Tensor<B, 2> {
    tensor(shape, seed) * scale
}

struct Run {
    output: Vec<f32>,
    dx: Vec<f32>,
    dw: Vec<f32>,
    db: Vec<f32>,
}

/// One forward and backward of `(x·W + b) · g` summed, through the node.
fn run(fp8: &Fp8Linear, x: Tensor<B, 2>, w: Tensor<B, 2>, g: Tensor<B, 2>) -> Run {
    let x = x.require_grad();
    let w = w.require_grad();
    let b = tensor([N], 0.9).require_grad();
    let y: Tensor<B, 2> = Tensor::from_primitive(TensorPrimitive::Float(B::fp8_linear(
        x.clone().into_primitive().tensor(),
        w.clone().into_primitive().tensor(),
        Some(b.clone().into_primitive().tensor()),
        fp8,
    )));
    let grads = (y.clone() * g).sum().backward();
    Run {
        output: flat(y),
        dx: flat(x.grad(&grads).expect("dx")),
        dw: flat(w.grad(&grads).expect("dW")),
        db: flat(b.grad(&grads).expect("db")),
    }
}

/// `q` of `[rows, cols]` on `format`'s grid after scaling by `scale`.
pub(super) fn cast(values: &[f32], scale: f32, format: Fp8Format) -> Vec<f32> {
    values
        .iter()
        .map(|v| round_to_fp8(v * scale, format))
        .collect()
}

/// `a [m, k] · b [k, n]` on the host in f64.
pub(super) fn matmul(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    (0..m * n)
        .map(|i| {
            let (r, c) = (i / n, i % n);
            (0..k)
                .map(|j| f64::from(a[r * k + j]) * f64::from(b[j * n + c]))
                .sum::<f64>() as f32
        })
        .collect()
}

pub(super) fn transpose(a: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..rows * cols)
        .map(|i| a[(i % rows) * cols + i / rows])
        .collect()
}

pub(super) fn close(actual: &[f32], expected: &[f32], what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!(
            (a - e).abs() <= 2e-5 * (1.0 + e.abs()),
            "{what}[{i}]: {a} vs {e}"
        );
    }
}

/// The fp8 products the node must compute with scales `sx`, `sw`, `sg`.
fn expected(x: &[f32], w: &[f32], g: &[f32], b: &[f32], [sx, sw, sg]: [f32; 3]) -> Run {
    let (qx, qw, qg) = (
        cast(x, sx, Fp8Format::E4m3),
        cast(w, sw, Fp8Format::E4m3),
        cast(g, sg, Fp8Format::E5m2),
    );
    let mut output = matmul(&qx, &qw, M, K, N);
    for (i, y) in output.iter_mut().enumerate() {
        *y = *y * (1.0 / sx * (1.0 / sw)) + b[i % N];
    }
    let scale = |v: Vec<f32>, s: f32| v.into_iter().map(|x| x * s).collect::<Vec<_>>();
    let dx = matmul(&qg, &transpose(&qw, K, N), M, N, K);
    let dw = matmul(&transpose(&qx, M, K), &qg, K, M, N);
    let db = (0..N).map(|c| (0..M).map(|r| g[r * N + c]).sum()).collect();
    Run {
        output,
        dx: scale(dx, 1.0 / sg * (1.0 / sw)),
        dw: scale(dw, 1.0 / sx * (1.0 / sg)),
        db,
    }
}

#[test]
fn the_first_step_measures_its_scales_and_later_steps_use_the_step_befores() {
    let fp8 = layer(delayed());
    let x = scaled([M, K], 0.1, 3.0);
    let w = scaled([K, N], 0.2, 0.05);
    // gradients below e5m2's smallest subnormal (2^-16): scale 1 would flush them to zero
    let g = scaled([M, N], 0.3, 1e-6);
    let (xv, wv, gv) = (flat(x.clone()), flat(w.clone()), flat(g.clone()));
    let bv = values(&[N], 0.9);
    let measured = [448.0 / amax(&xv), 448.0 / amax(&wv), 57344.0 / amax(&gv)];

    // Step 1 has no amax history: each cast measures its tensor's amax for its scale (not the
    // initial 1), and records it.
    assert!(fp8.measures_first_scales());
    let first = run(&fp8, x.clone(), w.clone(), g.clone());
    let want = expected(&xv, &wv, &gv, &bv, measured);
    close(&first.output, &want.output, "step 1 output");
    close(&first.dx, &want.dx, "step 1 dx");
    close(&first.dw, &want.dw, "step 1 dW");
    close(&first.db, &want.db, "step 1 db");
    assert_eq!(at(&fp8, Fp8Role::Input, AMAX), amax(&xv));
    assert_eq!(at(&fp8, Fp8Role::Weight, AMAX), amax(&wv));
    assert_eq!(at(&fp8, Fp8Role::GradOutput, AMAX), amax(&gv));
    assert_eq!(
        at(&fp8, Fp8Role::Input, SCALE),
        1.0,
        "no update inside a step"
    );
    // With scale 1 the tiny gradients would have been lost.
    let exact = matmul(&gv, &transpose(&wv, K, N), M, N, K);
    let error = |v: &[f32]| -> f32 { v.iter().zip(&exact).map(|(a, e)| (a - e).abs()).sum() };
    let unscaled = expected(&xv, &wv, &gv, &bv, [1.0; 3]);
    assert!(
        error(&first.dx) * 4.0 < error(&unscaled.dx),
        "measured scales keep the gradients' precision"
    );

    end_local_fp8_step::<Flex>(fp8.state());
    assert!(!fp8.measures_first_scales());
    for (role, scale) in Fp8Role::ALL.into_iter().zip(measured) {
        assert_eq!(at(&fp8, role, SCALE), scale, "{role:?}");
        assert_eq!(at(&fp8, role, AMAX), 0.0, "{role:?}");
    }
    assert_eq!(at(&fp8, Fp8Role::Input, HISTORY), amax(&xv));

    // Step 2 casts with step 1's scales, not its own tensors' (0.3 times as large here:
    // not a power of two, whose scales would round alike).
    let (x2, g2) = (x * 0.3, g * 0.3);
    let (x2v, g2v) = (flat(x2.clone()), flat(g2.clone()));
    let second = run(&fp8, x2, w, g2);
    let want = expected(&x2v, &wv, &g2v, &bv, measured);
    close(&second.output, &want.output, "step 2 output");
    close(&second.dx, &want.dx, "step 2 dx");
    close(&second.dw, &want.dw, "step 2 dW");
    // and the other slot of the chunk was never touched
    assert_eq!(state_values(&fp8)[AMAX], 0.0);
}

#[test]
fn an_amax_beyond_the_delayed_scale_saturates_instead_of_overflowing() {
    let fp8 = layer(delayed());
    let w = scaled([K, N], 0.2, 0.05);
    let g = scaled([M, N], 0.3, 1.0);
    run(&fp8, scaled([M, K], 0.1, 1.0), w.clone(), g.clone());
    end_local_fp8_step::<Flex>(fp8.state());
    // ten times the amax the scale was made for: every large value lands on ±448 / scale
    let big = scaled([M, K], 0.1, 10.0);
    let out = run(&fp8, big.clone(), w, g);
    assert!(out.output.iter().all(|y| y.is_finite()));
    let scale = at(&fp8, Fp8Role::Input, SCALE);
    let stored: Vec<f32> = cast(&flat(big), scale, Fp8Format::E4m3);
    assert!(stored.iter().any(|q| q.abs() == 448.0), "saturated");
    assert_eq!(
        at(&fp8, Fp8Role::Input, AMAX),
        amax(&values(&[M, K], 0.1)) * 10.0
    );
}

#[test]
fn weights_are_cast_once_per_optimizer_step() {
    let fp8 = layer(delayed());
    let x = scaled([M, K], 0.1, 1.0);
    let g = scaled([M, N], 0.3, 1.0);
    let w = scaled([K, N], 0.2, 0.5);
    let first = run(&fp8, x.clone(), w.clone(), g.clone());
    // A second microbatch of the same step reuses the first cast, whatever it is handed.
    let again = run(&fp8, x.clone(), w.clone() * 2.0, g.clone());
    assert_eq!(again.output, first.output);
    end_local_fp8_step::<Flex>(fp8.state());
    let next = run(&fp8, x, w * 2.0, g);
    assert_ne!(
        next.output, first.output,
        "the next step casts the new weights"
    );
}

#[test]
fn current_scaling_scales_each_tensor_by_its_own_amax() {
    let fp8 = layer(hybrid(Fp8Scaling::Current));
    let x = scaled([M, K], 0.1, 3.0);
    let w = scaled([K, N], 0.2, 0.05);
    let g = scaled([M, N], 0.3, 1e-4);
    let (xv, wv, gv) = (flat(x.clone()), flat(w.clone()), flat(g.clone()));
    let got = run(&fp8, x, w, g);
    let scales = [448.0 / amax(&xv), 448.0 / amax(&wv), 57344.0 / amax(&gv)];
    let want = expected(&xv, &wv, &gv, &values(&[N], 0.9), scales);
    close(&got.output, &want.output, "output");
    close(&got.dx, &want.dx, "dx");
    close(&got.dw, &want.dw, "dW");
    assert!(fp8.state().rows::<Flex>().is_empty(), "no state to keep");
}

#[test]
fn inference_casts_record_nothing() {
    let fp8 = layer(delayed());
    let x = scaled([M, K], 0.1, 1.0).inner();
    let w = scaled([K, N], 0.2, 0.5).inner();
    let y = Flex::fp8_linear(
        x.into_primitive().tensor(),
        w.into_primitive().tensor(),
        None,
        &fp8,
    );
    assert_eq!(y.shape().dims::<2>(), [M, N]);
    assert!(state_values(&fp8).iter().all(|v| *v == 0.0 || *v == 1.0));
}

#[test]
fn checkpoint_rows_restore_the_state_by_name() {
    let fp8 = layer(delayed());
    run(
        &fp8,
        scaled([M, K], 0.1, 1.0),
        scaled([K, N], 0.2, 0.5),
        scaled([M, N], 0.3, 1.0),
    );
    end_local_fp8_step::<Flex>(fp8.state());
    let rows: HashMap<String, Vec<f32>> = fp8.state().rows::<Flex>().into_iter().collect();
    assert_eq!(rows.len(), 2);
    let fresh = layer(delayed());
    fresh
        .state()
        .restore::<Flex>(&rows, &Default::default())
        .expect("same recipe");
    assert_eq!(state_values(&fresh), state_values(&fp8));
    assert!(!fresh.measures_first_scales(), "restored scales are used");
    // A layer the checkpoint lacks (fp8 switched on at the resume) measures its first scales;
    // the one it has uses its restored scales.
    let partial: HashMap<String, Vec<f32>> = rows
        .iter()
        .filter(|(name, _)| name.as_str() == "layers.0.qkv")
        .map(|(name, row)| (name.clone(), row.clone()))
        .collect();
    let state = Fp8State::new(
        delayed(),
        vec!["layers.0.qkv".into(), "layers.0.proj".into()],
    );
    state
        .restore::<Flex>(&partial, &Default::default())
        .expect("same recipe");
    assert!(!state.measures_first_scales(0));
    assert!(state.measures_first_scales(1));
    end_local_fp8_step::<Flex>(&state);
    assert!(!state.measures_first_scales(1), "scaled after a step");
    let longer = Fp8State::new(
        hybrid(Fp8Scaling::Delayed {
            history: 4,
            algo: AmaxAlgo::Max,
        }),
        vec!["layers.0.proj".into()],
    );
    let err = longer
        .restore::<Flex>(&rows, &Default::default())
        .expect_err("another history length");
    assert!(err.contains("fp8_amax_history_len"), "{err}");
}

#[test]
fn the_cpu_backend_refuses_fp8_training() {
    let err = B::fp8_support(&Default::default(), &delayed()).expect_err("no fp8 GEMMs");
    assert!(err.contains("no fp8 GEMMs"), "{err}");
}
