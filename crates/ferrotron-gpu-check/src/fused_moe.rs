//! Rows for MoE routing's decisions on the device: the top-k and permutation kernels against
//! the host reference (`moe_topk_reference`, `moe_permutation_reference`) on the same inputs.
//! Decisions are integers, so they must match exactly. The scores are multiples of 1/8 with
//! signed zeros mixed in, so ties (the lower index wins) and `total_cmp`'s -0 < +0 are
//! exercised; the permutations include an uneven last chunk, one expert taking every position,
//! nothing at all, and the largest expert count.

use burn::tensor::{DType, Int, Tensor, TensorData};
use ferrotron_cuda::{Cuda, GpuDevice};
use ferrotron_ops::{FusedOps, GroupLimit, moe_permutation_reference, moe_topk_reference};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::compare;
use crate::fused::dtype_label;
use crate::{Row, failed, first_line, guarded};

fn ints<const D: usize>(x: Tensor<Cuda, D, Int>) -> TensorData {
    x.into_data().convert::<i64>()
}

/// Exact comparison of the kernel's and the reference's integers (`against` names the
/// reference).
pub(crate) fn exact_row(
    op: &str,
    dtype: &'static str,
    shape: String,
    (got, want, against): (Result<TensorData, String>, Result<TensorData, String>, &str),
) -> Row {
    let (errors, note) = match (got, want) {
        (Ok(got), Ok(want)) => (
            compare::compare(&got, &want, 1.0),
            format!("kernel vs {against}, exact"),
        ),
        (Err(e), _) => (failed(), format!("kernel: {}", first_line(&e))),
        (_, Err(e)) => (failed(), format!("reference: {}", first_line(&e))),
    };
    Row {
        op: op.into(),
        dtype,
        shape,
        errors,
        note,
    }
}

fn topk_row(
    device: &GpuDevice,
    rng: &mut StdRng,
    dtype: DType,
    [rows, experts]: [usize; 2],
    k: usize,
    group_limit: Option<GroupLimit>,
) -> Row {
    let values: Vec<f32> = (0..rows * experts)
        .map(|_| match rng.random_range(0..16) {
            0 => -0.0,
            1 => 0.0,
            _ => (rng.random_range(-16.0f32..16.0)).floor() / 8.0,
        })
        .collect();
    let scores = TensorData::new(values, [rows, experts]);
    let upload = || {
        Tensor::<Cuda, 2>::from_data(scores.clone(), (device, dtype))
            .into_primitive()
            .tensor()
    };
    let got = guarded(|| {
        let chosen = Cuda::moe_topk(upload(), k, group_limit);
        Ok(ints(Tensor::<Cuda, 2, Int>::from_primitive(chosen)))
    });
    let want = guarded(|| {
        let chosen = moe_topk_reference::<Cuda>(upload(), k, group_limit);
        Ok(ints(Tensor::<Cuda, 2, Int>::from_primitive(chosen)))
    });
    let groups = group_limit.map_or(String::new(), |g| {
        format!(", groups {} top {}", g.num_groups, g.group_topk)
    });
    exact_row(
        "moe_topk",
        dtype_label(dtype),
        format!("[{rows}, {experts}] k {k}{groups}"),
        (got, want, "host reference"),
    )
}

fn permutation_row(device: &GpuDevice, experts: Vec<i64>, num_experts: usize, what: &str) -> Row {
    let n = experts.len();
    let data = TensorData::new(experts, [n]);
    let upload = || Tensor::<Cuda, 1, Int>::from_data(data.clone(), device).into_primitive();
    let both = |p: ferrotron_ops::MoePermutation<Cuda>| {
        let mut all: Vec<i64> = Vec::new();
        for part in [p.order, p.rows, p.counts] {
            all.extend(ints(Tensor::<Cuda, 1, Int>::from_primitive(part)).iter::<i64>());
        }
        let len = all.len();
        TensorData::new(all, [len])
    };
    let got = guarded(|| Ok(both(Cuda::moe_permutation(upload(), num_experts))));
    let want = guarded(|| {
        Ok(both(moe_permutation_reference::<Cuda>(
            upload(),
            num_experts,
        )))
    });
    exact_row(
        "moe_permutation",
        "i64",
        format!("[{n}] of {num_experts} experts, {what}"),
        (got, want, "host reference"),
    )
}

/// Every routing row: top-k at a small MoE's shape and DeepSeek-style group limits, and
/// permutations of random, skewed and empty routings.
pub(crate) fn rows(device: &GpuDevice) -> Vec<Row> {
    let mut rng = StdRng::seed_from_u64(31);
    let mut rows = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        rows.push(topk_row(device, &mut rng, dtype, [8192, 8], 2, None));
        rows.push(topk_row(device, &mut rng, dtype, [333, 4], 4, None));
    }
    let limit = |num_groups, group_topk| {
        Some(GroupLimit {
            num_groups,
            group_topk,
        })
    };
    rows.push(topk_row(
        device,
        &mut rng,
        DType::F32,
        [1000, 256],
        8,
        limit(8, 4),
    ));
    rows.push(topk_row(
        device,
        &mut rng,
        DType::BF16,
        [4096, 64],
        6,
        limit(8, 3),
    ));
    for (n, num_experts) in [(16384, 8), (65537, 64), (4000, 4096)] {
        let experts = (0..n)
            .map(|_| rng.random_range(0..num_experts as i64))
            .collect();
        rows.push(permutation_row(device, experts, num_experts, "uniform"));
    }
    rows.push(permutation_row(device, vec![3; 5000], 8, "one expert"));
    rows.push(permutation_row(device, Vec::new(), 8, "empty"));
    rows
}
