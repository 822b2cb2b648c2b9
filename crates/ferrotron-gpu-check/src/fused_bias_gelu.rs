//! Rows for GELU with its linear's bias (`runtime.bias_gelu_fusion`): the node's kernels (the
//! forward map adding the bias, the backward pass writing GELU's input gradient with the bias
//! gradient's column sums) in bf16 and f32 against the composed `gelu(x + b)` in f32 on the same
//! GPU from the same rounded inputs: the output, dx and dbias of a weighted-sum loss (outputs
//! poisoned). 3,000 rows make 47 bands of the backward, the last one short.

use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};
use ferrotron_cuda::{Cuda, GpuDevice};
use ferrotron_ops::{bias_gelu_node, composed_bias_gelu};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::fused::{A, host, round, rounded_row, upload};
use crate::{Row, guarded};

/// Output, dx and dbias of `Σ w ∘ gelu(x + b)`, the node's kernels (`FUSED`) or composed.
fn grads<const FUSED: bool>(
    (x, b, w): (&TensorData, &TensorData, &TensorData),
    dtype: DType,
    device: &GpuDevice,
) -> TensorData {
    let x: Tensor<A, 2> = upload(x, dtype, device);
    let b: Tensor<A, 1> = upload(b, dtype, device);
    let w = Tensor::<A, 2>::from_data(round(w.clone(), DType::F32), (device, DType::F32));
    let (px, pb) = (
        x.clone().into_primitive().tensor(),
        b.clone().into_primitive().tensor(),
    );
    let out = if FUSED {
        bias_gelu_node::<Cuda, NoCheckpointing>(px, pb)
    } else {
        composed_bias_gelu::<A>(px, pb)
    };
    let out: Tensor<A, 2> = Tensor::from_primitive(TensorPrimitive::Float(out));
    let g = (out.clone().cast(DType::F32) * w).sum().backward();
    Tensor::cat(
        vec![
            out.inner().cast(DType::F32).reshape([-1]),
            x.grad(&g).expect("dx").cast(DType::F32).reshape([-1]),
            b.grad(&g).expect("dbias").cast(DType::F32).reshape([-1]),
        ],
        0,
    )
    .into_data()
}

fn row(device: &GpuDevice, rng: &mut StdRng, dtype: DType) -> Row {
    let [rows, n] = [3000, 1040];
    let x = host(&[rows, n], rng, dtype);
    let b = host(&[n], rng, dtype);
    let w = host(&[rows, n], rng, DType::F32);
    let inputs = (&x, &b, &w);
    let got = guarded(|| Ok(grads::<true>(inputs, dtype, device)));
    let want = guarded(|| Ok(grads::<false>(inputs, DType::F32, device)));
    rounded_row(
        "fused_bias_gelu",
        dtype,
        format!("[{rows}, {n}] + [{n}]"),
        (2.0, "out + dx + dbias"),
        got,
        want,
    )
}

/// Every bias-GELU row.
pub(crate) fn rows(device: &GpuDevice) -> Vec<Row> {
    let mut rng = StdRng::seed_from_u64(29);
    vec![
        row(device, &mut rng, DType::F32),
        row(device, &mut rng, DType::BF16),
    ]
}
