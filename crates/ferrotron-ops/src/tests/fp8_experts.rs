//! The fp8 experts node on burn-flex through the reference primitives: each group's rows go
//! through its own expert's weight with that weight's own scale and the rows' shared one, the
//! gradients are the fp8 products of the right transposes (an expert without rows gets a zero
//! weight gradient), and the scaling state records the rows' and gradient's amaxes in the rows'
//! slot and each weight's in its own.

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorPrimitive};

use super::fp8::{at, cast, close, delayed, hybrid, matmul, scaled, transpose};
use super::{B, flat};
use crate::fp8::scaling::{AMAX, Fp8Format, Fp8Role, Fp8Scaling, Fp8Settings, amax};
use crate::{Fp8Experts, Fp8Linear, Fp8State, FusedOps, GroupRows};

/// Rows per expert: the second has none.
const COUNTS: [usize; 3] = [3, 0, 2];
const ROWS: usize = 5;
const K: usize = 8;
const N: usize = 4;

fn experts(settings: Fp8Settings) -> Fp8Experts {
    let names = ["rows", "0", "1", "2"].map(|e| format!("layers.0.experts.{e}.fc1"));
    let state = Fp8State::new(settings, names.to_vec());
    Fp8Experts {
        rows: Fp8Linear::new(&state, 0),
        weights: (1..=COUNTS.len())
            .map(|slot| Fp8Linear::new(&state, slot))
            .collect(),
    }
}

struct Run {
    output: Vec<f32>,
    dx: Vec<f32>,
    dw: Vec<Vec<f32>>,
}

/// One forward and backward of `Σ experts(x) ∘ g` through the node.
fn run(fp8: &Fp8Experts, x: Tensor<B, 2>, weights: &[Tensor<B, 2>], g: Tensor<B, 2>) -> Run {
    let x = x.require_grad();
    let weights: Vec<Tensor<B, 2>> = weights.iter().map(|w| w.clone().require_grad()).collect();
    let y: Tensor<B, 2> = Tensor::from_primitive(TensorPrimitive::Float(B::fp8_experts(
        x.clone().into_primitive().tensor(),
        weights
            .iter()
            .map(|w| w.clone().into_primitive().tensor())
            .collect(),
        &GroupRows::on_host(COUNTS.to_vec()),
        fp8,
    )));
    let grads = (y.clone() * g).sum().backward();
    Run {
        output: flat(y),
        dx: flat(x.grad(&grads).expect("dx")),
        dw: weights
            .iter()
            .map(|w| flat(w.grad(&grads).expect("dW")))
            .collect(),
    }
}

/// The products with the rows' scale `sx`, the gradient's `sg` and each weight's `sw[e]`.
fn expected(x: &[f32], w: &[Vec<f32>], g: &[f32], sx: f32, sw: &[f32], sg: f32) -> Run {
    let (qx, qg) = (cast(x, sx, Fp8Format::E4m3), cast(g, sg, Fp8Format::E5m2));
    let mut output = vec![0.0; ROWS * N];
    let mut dx = vec![0.0; ROWS * K];
    let mut dw = Vec::new();
    let mut start = 0;
    for (e, &count) in COUNTS.iter().enumerate() {
        let qw = cast(&w[e], sw[e], Fp8Format::E4m3);
        let (rows_x, rows_g) = (
            &qx[start * K..(start + count) * K],
            &qg[start * N..(start + count) * N],
        );
        let y = matmul(rows_x, &qw, count, K, N);
        let d = matmul(rows_g, &transpose(&qw, K, N), count, N, K);
        for (i, v) in y.into_iter().enumerate() {
            output[start * N + i] = v / sx / sw[e];
        }
        for (i, v) in d.into_iter().enumerate() {
            dx[start * K + i] = v / sg / sw[e];
        }
        let grad = matmul(&transpose(rows_x, count, K), rows_g, K, count, N);
        dw.push(grad.into_iter().map(|v| v / sx / sg).collect());
        start += count;
    }
    Run { output, dx, dw }
}

fn inputs() -> (Tensor<B, 2>, Vec<Tensor<B, 2>>, Tensor<B, 2>) {
    let x = scaled([ROWS, K], 0.1, 3.0);
    // experts of different magnitudes, the third a millionth of the second's
    let weights = [0.05, 0.5, 5e-7]
        .iter()
        .enumerate()
        .map(|(e, &size)| scaled([K, N], 0.2 + e as f32 * 0.1, size))
        .collect();
    (x, weights, scaled([ROWS, N], 0.3, 1e-4))
}

#[test]
fn each_group_goes_through_its_expert_with_that_weights_own_scale() {
    let fp8 = experts(hybrid(Fp8Scaling::Current));
    let (x, weights, g) = inputs();
    let (xv, gv) = (flat(x.clone()), flat(g.clone()));
    let wv: Vec<Vec<f32>> = weights.iter().map(|w| flat(w.clone())).collect();
    let got = run(&fp8, x, &weights, g);
    let sw: Vec<f32> = wv.iter().map(|w| 448.0 / amax(w)).collect();
    let want = expected(&xv, &wv, &gv, 448.0 / amax(&xv), &sw, 57344.0 / amax(&gv));
    close(&got.output, &want.output, "output");
    close(&got.dx, &want.dx, "dx");
    for (e, (got, want)) in got.dw.iter().zip(&want.dw).enumerate() {
        close(got, want, &format!("dW of expert {e}"));
    }
    assert!(got.dw[1].iter().all(|&v| v == 0.0), "no rows, no gradient");
    // One scale for all three weights would flush the smallest expert's values below e4m3's
    // subnormals; its own scale keeps them.
    let shared = 448.0 / wv.iter().map(|w| amax(w)).fold(0.0, f32::max);
    let error = |scale: f32| -> f32 {
        let q = cast(&wv[2], scale, Fp8Format::E4m3);
        q.iter()
            .zip(&wv[2])
            .map(|(q, w)| (q / scale - w).abs())
            .sum()
    };
    assert!(
        error(shared) > 4.0 * error(sw[2]),
        "{} vs {}",
        error(shared),
        error(sw[2])
    );
}

#[test]
fn the_rows_slot_records_the_rows_and_gradient_and_each_weight_its_own() {
    let fp8 = experts(delayed());
    let (x, weights, g) = inputs();
    let (xv, gv) = (flat(x.clone()), flat(g.clone()));
    run(&fp8, x, &weights, g);
    assert_eq!(at(&fp8.rows, Fp8Role::Input, AMAX), amax(&xv));
    assert_eq!(at(&fp8.rows, Fp8Role::GradOutput, AMAX), amax(&gv));
    assert_eq!(at(&fp8.rows, Fp8Role::Weight, AMAX), 0.0, "no weight there");
    for (handle, w) in fp8.weights.iter().zip(&weights) {
        assert_eq!(at(handle, Fp8Role::Weight, AMAX), amax(&flat(w.clone())));
        assert_eq!(
            at(handle, Fp8Role::Input, AMAX),
            0.0,
            "the rows are cast once"
        );
    }
    crate::end_local_fp8_step::<Flex>(fp8.rows.state());
}
