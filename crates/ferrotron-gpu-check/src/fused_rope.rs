//! Rows for RoPE on the packed projection: the fused node in bf16 and f32 against the composed
//! rotation in f32 on the same GPU from the same rounded projection and tables: the rotated
//! projection and the packed gradient of a weighted-sum loss (every slot of which the kernels
//! must write: outputs are poisoned). GQA shape (4 query heads per group) and real RoPE tables.

use burn::tensor::{DType, Tensor, TensorData};
use ferrotron_cuda::GpuDevice;
use ferrotron_ops::{FusedOps, composed_rope_qkv};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::fused::{A, host, output_and_grad, packed_grad_row, round, upload};
use crate::{Row, guarded};

/// `cos`, `sin` `[seq, dim]` of RoPE with base 10000, positions starting at `first`.
fn tables(seq: usize, dim: usize, first: usize) -> [TensorData; 2] {
    let half = dim / 2;
    let angle = |p: usize, c: usize| {
        (first + p) as f64 * 10000f64.powf(-(2.0 * (c % half) as f64) / dim as f64)
    };
    let table = |f: fn(f64) -> f64| {
        let values = (0..seq)
            .flat_map(|p| (0..dim).map(move |c| f(angle(p, c)) as f32))
            .collect::<Vec<_>>();
        TensorData::new(values, [seq, dim])
    };
    [table(f64::cos), table(f64::sin)]
}

/// Rotated projection and packed gradient of `Σ w ∘ rope(x)`, fused node (`FUSED`) or composed.
fn grads<const FUSED: bool>(
    x: &TensorData,
    w: &TensorData,
    [cos, sin]: &[TensorData; 2],
    dtype: DType,
    device: &GpuDevice,
) -> TensorData {
    let x: Tensor<A, 5> = upload(x, dtype, device);
    let w = Tensor::<A, 5>::from_data(round(w.clone(), DType::F32), (device, DType::F32));
    let cos: Tensor<A, 2> = upload(cos, dtype, device);
    let sin: Tensor<A, 2> = upload(sin, dtype, device);
    let [p, c, s] = [
        x.clone().into_primitive().tensor(),
        cos.into_primitive().tensor(),
        sin.into_primitive().tensor(),
    ];
    let out = if FUSED {
        A::fused_rope_qkv(p, c, s)
    } else {
        composed_rope_qkv::<A>(p, c, s)
    };
    output_and_grad(out, &x, w)
}

fn row(device: &GpuDevice, rng: &mut StdRng, dtype: DType) -> Row {
    let shape = [2, 256, 4, 6, 64];
    let x = host(&shape, rng, dtype);
    let w = host(&shape, rng, DType::F32);
    // Rounded to the row's dtype, so both sides rotate by the same table values.
    let t = tables(256, 64, 1000).map(|table| round(table, dtype));
    let got = guarded(|| Ok(grads::<true>(&x, &w, &t, dtype, device)));
    let want = guarded(|| Ok(grads::<false>(&x, &w, &t, DType::F32, device)));
    packed_grad_row("fused_rope_qkv", dtype, format!("{shape:?}"), got, want)
}

/// Every RoPE row.
pub(crate) fn rows(device: &GpuDevice) -> Vec<Row> {
    let mut rng = StdRng::seed_from_u64(29);
    vec![
        row(device, &mut rng, DType::F32),
        row(device, &mut rng, DType::BF16),
    ]
}
