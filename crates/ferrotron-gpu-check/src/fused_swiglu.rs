//! Rows for SwiGLU of the packed projection: the fused node in bf16 and f32 against the
//! composed `silu(gate) · up` in f32 on the same GPU from the same rounded projection: the
//! output and the packed gradient of a weighted-sum loss (both halves of which the backward
//! must write: outputs are poisoned).

use burn::tensor::{DType, Tensor, TensorData};
use ferrotron_cuda::GpuDevice;
use ferrotron_ops::{FusedOps, composed_swiglu};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::fused::{A, host, output_and_grad, packed_grad_row, round, upload};
use crate::{Row, guarded};

/// Output and packed gradient of `Σ w ∘ swiglu(x)`, fused node (`FUSED`) or composed.
fn grads<const FUSED: bool>(
    x: &TensorData,
    w: &TensorData,
    dtype: DType,
    device: &GpuDevice,
) -> TensorData {
    let x: Tensor<A, 2> = upload(x, dtype, device);
    let w = Tensor::<A, 2>::from_data(round(w.clone(), DType::F32), (device, DType::F32));
    let p = x.clone().into_primitive().tensor();
    let out = if FUSED {
        A::fused_swiglu(p)
    } else {
        composed_swiglu::<A>(p)
    };
    output_and_grad(out, &x, w)
}

fn row(device: &GpuDevice, rng: &mut StdRng, dtype: DType) -> Row {
    let [rows, f] = [512, 688];
    let x = host(&[rows, 2 * f], rng, dtype);
    let w = host(&[rows, f], rng, DType::F32);
    let got = guarded(|| Ok(grads::<true>(&x, &w, dtype, device)));
    let want = guarded(|| Ok(grads::<false>(&x, &w, DType::F32, device)));
    packed_grad_row(
        "fused_swiglu",
        dtype,
        format!("[{rows}, {}]", 2 * f),
        got,
        want,
    )
}

/// Every SwiGLU row.
pub(crate) fn rows(device: &GpuDevice) -> Vec<Row> {
    let mut rng = StdRng::seed_from_u64(23);
    vec![
        row(device, &mut rng, DType::F32),
        row(device, &mut rng, DType::BF16),
    ]
}
