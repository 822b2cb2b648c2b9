//! Rows for the MoE dispatch's gradient (`FusedOps::gather_rows_backward`): the kernel against
//! the composed select and sum on the same GPU from the same values, in f32 and bf16, each
//! token's rows spread over a shuffled order, groups of 1, 2 and 8. The output is poisoned, so
//! an unwritten row shows; groups of one and two must match to the bit.

use burn::tensor::{DType, Int, Tensor, TensorData};
use ferrotron_cuda::{Cuda, GpuDevice};
use ferrotron_ops::{FusedOps, gather_rows_backward_reference};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use crate::fused::{dtype_label, host};
use crate::{Row, compare, failed, first_line, guarded};

fn row(
    device: &GpuDevice,
    rng: &mut StdRng,
    dtype: DType,
    [tokens, group, hidden]: [usize; 3],
) -> Row {
    let reads = tokens * group;
    let grad = host(&[reads, hidden], rng, dtype);
    let mut back: Vec<i64> = (0..reads as i64).collect();
    back.shuffle(rng);
    let sum = |kernel: bool| -> Result<TensorData, String> {
        let g = Tensor::<Cuda, 2>::from_data(grad.clone(), (device, dtype))
            .into_primitive()
            .tensor();
        let b = Tensor::<Cuda, 1, Int>::from_data(TensorData::new(back.clone(), [reads]), device)
            .into_primitive();
        let out = if kernel {
            Cuda::gather_rows_backward(g, b, group)
        } else {
            gather_rows_backward_reference::<Cuda>(g, b, group)
        };
        Ok(
            Tensor::<Cuda, 2>::from_primitive(burn::tensor::TensorPrimitive::Float(out))
                .cast(DType::F32)
                .into_data(),
        )
    };
    let (got, want) = (guarded(|| sum(true)), guarded(|| sum(false)));
    // groups of one or two: the same f32 sums, one rounding each
    let scale = if group <= 2 { 0.0 } else { 2.0 };
    let (errors, note) = match (got, want) {
        (Ok(got), Ok(want)) => (
            compare::compare(&got, &want, scale),
            format!("kernel vs select and sum; group {group}"),
        ),
        (Err(e), _) => (failed(), format!("kernel: {}", first_line(&e))),
        (_, Err(e)) => (failed(), format!("composed: {}", first_line(&e))),
    };
    Row {
        op: "gather_rows_backward".into(),
        dtype: dtype_label(dtype),
        shape: format!("[{reads}, {hidden}] → [{tokens}, {hidden}]"),
        errors,
        note,
    }
}

/// Every row of the dispatch's gradient.
pub(crate) fn rows(device: &GpuDevice) -> Vec<Row> {
    let mut rng = StdRng::seed_from_u64(37);
    let mut out = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        for dims in [[1000, 1, 96], [2048, 2, 1024], [512, 8, 2048]] {
            out.push(row(device, &mut rng, dtype, dims));
        }
    }
    out
}
