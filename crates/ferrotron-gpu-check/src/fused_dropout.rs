//! Rows for the residual add with hidden dropout (one kernel each way, the keep bits drawn in
//! the forward and drawn again in the backward). No composed run can match it (another
//! generator), so the row checks what must hold whatever the draws: for `Σ w ∘ out` with
//! `out = r + keep ∘ x / (1 − p)`, the residual's gradient is `w` exactly; `x`'s gradient is
//! `w / (1 − p)` where the forward kept the element and 0 where it dropped it (a mask drawn
//! differently in the backward disagrees on about 2p(1 − p) of the elements); the output is `r`
//! where dropped and `r + x / (1 − p)` where kept; and the kept fraction is 1 − p. f32 inputs
//! keep the arithmetic exact enough to tell kept from dropped without rounding doubt.

use burn::tensor::{DType, Tensor, TensorPrimitive};
use ferrotron_cuda::{Cuda, GpuDevice};
use ferrotron_ops::FusedOps;
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::compare::Errors;
use crate::fused::{A, host, median_ms, upload};
use crate::{Row, failed, first_line, guarded};

fn values(t: Tensor<Cuda, 1>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("f32")
}

fn row(device: &GpuDevice, rng: &mut StdRng, prob: f64) -> Row {
    let n = 1 << 20;
    let run = || -> Result<(usize, f64, f64), String> {
        let x: Tensor<A, 1> = upload(&host(&[n], rng, DType::F32), DType::F32, device);
        let r: Tensor<A, 1> = upload(&host(&[n], rng, DType::F32), DType::F32, device);
        let w = Tensor::<A, 1>::from_data(host(&[n], rng, DType::F32), (device, DType::F32));
        let out: Tensor<A, 1> =
            Tensor::from_primitive(TensorPrimitive::Float(A::fused_dropout_add(
                x.clone().into_primitive().tensor(),
                r.clone().into_primitive().tensor(),
                prob,
            )));
        let grads = (out.clone() * w.clone()).sum().backward();
        let scale = (1.0 / (1.0 - prob)) as f32;
        let dx = values(x.grad(&grads).ok_or("no dx")?);
        let dr = values(r.grad(&grads).ok_or("no d residual")?);
        let [xs, rs, ws, outs] = [x.inner(), r.inner(), w.inner(), out.inner()].map(values);
        let (mut bad, mut kept, mut worst) = (0usize, 0usize, 0f64);
        for i in 0..n {
            let keep = dx[i] != 0.0;
            kept += usize::from(keep);
            let want_out = if keep { rs[i] + xs[i] * scale } else { rs[i] };
            let want_dx = if keep { ws[i] * scale } else { 0.0 };
            let err = f64::from((outs[i] - want_out).abs()).max(f64::from((dx[i] - want_dx).abs()));
            worst = worst.max(err);
            if err > 1e-5 * (1.0 + f64::from(want_out.abs())) || dr[i] != ws[i] {
                bad += 1;
            }
        }
        Ok((bad, kept as f64 / n as f64, worst))
    };
    let (errors, note) = match guarded(run) {
        Ok((bad, kept, worst)) => {
            let fraction_ok = (kept - (1.0 - prob)).abs() < 0.01;
            (
                Errors {
                    max_abs: worst,
                    max_rel: (kept - (1.0 - prob)).abs(),
                    bad: bad + usize::from(!fraction_ok),
                    mismatch: None,
                },
                format!(
                    "kept {kept:.4} (want {:.2}); out, dx and d residual agree with one mask",
                    1.0 - prob
                ),
            )
        }
        Err(e) => (failed(), format!("backend: {}", first_line(&e))),
    };
    Row {
        op: format!("fused_dropout_add p {prob}"),
        dtype: "f32",
        shape: format!("[{n}]"),
        errors,
        note,
    }
}

/// Every dropout-add row.
pub(crate) fn rows(device: &GpuDevice) -> Vec<Row> {
    let mut rng = StdRng::seed_from_u64(19);
    vec![row(device, &mut rng, 0.1), row(device, &mut rng, 0.5)]
}

/// The fused forward and backward against burn's composition (Bernoulli fill, two multiplies,
/// the add; the backward's two multiplies) at a gpt-1.3b activation (micro batch 12).
pub(crate) fn timings(device: &GpuDevice) -> String {
    let mut out = String::from(
        "| dropout-add fwd+bwd (bf16, p 0.1, autodiff) | fused ms | composed ms |\n|---|---:|---:|\n",
    );
    let shape = [12, 2048, 2048];
    let line = guarded(|| {
        let mk = || {
            Tensor::<A, 3>::random(shape, burn::tensor::Distribution::Normal(0.0, 1.0), device)
                .cast(DType::BF16)
                .require_grad()
        };
        let (x, r) = (mk(), mk());
        let run = |fused: bool| {
            let (xp, rp) = (
                x.clone().into_primitive().tensor(),
                r.clone().into_primitive().tensor(),
            );
            let o = if fused {
                A::fused_dropout_add(xp, rp, 0.1)
            } else {
                ferrotron_ops::composed_dropout_add::<A>(xp, rp, 0.1)
            };
            let o: Tensor<A, 3> = Tensor::from_primitive(TensorPrimitive::Float(o));
            let grads = o.sum().backward();
            let _ = x.grad(&grads);
        };
        let fused = median_ms(device, 10, || run(true));
        let composed = median_ms(device, 10, || run(false));
        Ok(format!("| {shape:?} | {fused:.3} | {composed:.3} |\n"))
    });
    out.push_str(&line.unwrap_or_else(|e| format!("| {shape:?} | failed: {} |\n", first_line(&e))));
    out
}
