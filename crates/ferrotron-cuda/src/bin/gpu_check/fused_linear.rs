//! Rows for the biased linear's node (`ferrotron_parallel::linear`): its weight and bias
//! gradients from one GEMM with cuBLASLt's bias-gradient epilogue, against burn's linear node
//! (the GEMM and a GEMV) on the same GPU, same dtype: output, input, weight and bias gradients
//! of a weighted-sum loss. An odd small shape checks the path where cuBLASLt may offer no
//! algorithm for the epilogue (the two separate calls then).

use burn::tensor::module::linear as burn_linear;
use burn::tensor::{DType, Tensor, TensorData};
use ferrotron_cuda::GpuDevice;
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::compare;
use crate::fused::{A, dtype_label, host, round, upload};
use crate::{Row, failed, first_line, guarded};

/// Output and the three gradients, flattened into one f32 tensor, through the fused node
/// (`FUSED`) or burn's.
fn grads<const FUSED: bool>(
    data: &[TensorData; 4],
    dtype: DType,
    device: &GpuDevice,
) -> TensorData {
    let x: Tensor<A, 3> = upload(&data[0], dtype, device);
    let weight: Tensor<A, 2> = upload(&data[1], dtype, device);
    let bias: Tensor<A, 1> = upload(&data[2], dtype, device);
    let out = if FUSED {
        ferrotron_parallel::linear(x.clone(), weight.clone(), Some(bias.clone()))
    } else {
        burn_linear(x.clone(), weight.clone(), Some(bias.clone()))
    };
    let w = Tensor::<A, 3>::from_data(round(data[3].clone(), DType::F32), (device, DType::F32));
    let g = (out.clone().cast(DType::F32) * w).sum().backward();
    Tensor::cat(
        vec![
            out.inner().cast(DType::F32).reshape([-1]),
            x.grad(&g).expect("dx").cast(DType::F32).reshape([-1]),
            weight.grad(&g).expect("dW").cast(DType::F32).reshape([-1]),
            bias.grad(&g).expect("db").cast(DType::F32).reshape([-1]),
        ],
        0,
    )
    .into_data()
}

fn row(device: &GpuDevice, rng: &mut StdRng, dtype: DType, [b, s, i, o]: [usize; 4]) -> Row {
    let data = [
        host(&[b, s, i], rng, dtype),
        host(&[i, o], rng, dtype),
        host(&[o], rng, dtype),
        host(&[b, s, o], rng, DType::F32),
    ];
    let got = guarded(|| Ok(grads::<true>(&data, dtype, device)));
    let want = guarded(|| Ok(grads::<false>(&data, dtype, device)));
    let (errors, note) = match (got, want) {
        (Ok(got), Ok(want)) => (
            compare::compare(&round(got, dtype), &round(want, dtype), 2.0),
            "bias gradient from the weight GEMM vs burn's GEMM + GEMV; out, dx, dW, db".into(),
        ),
        (Err(e), _) => (failed(), format!("fused: {}", first_line(&e))),
        (_, Err(e)) => (failed(), format!("burn: {}", first_line(&e))),
    };
    Row {
        op: "fused_linear".into(),
        dtype: dtype_label(dtype),
        shape: format!("[{b}, {s}, {i}] · [{i}, {o}]"),
        errors,
        note,
    }
}

/// Every biased-linear row.
pub(crate) fn rows(device: &GpuDevice) -> Vec<Row> {
    let mut rng = StdRng::seed_from_u64(23);
    let mut rows = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        for shape in [[4, 512, 768, 2304], [3, 37, 24, 40]] {
            rows.push(row(device, &mut rng, dtype, shape));
        }
    }
    rows
}
