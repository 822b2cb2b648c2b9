//! A rank's whole experts over routed rows sorted by expert, as Megatron-Core's `GroupedMLP`:
//! fc1 and fc2 are each one grouped matmul over the experts' stacked weights
//! ([`FusedOps::fused_grouped_matmul`]) and the activation one pass over all rows, instead of a
//! gather, two GEMMs, the activation and a scatter per expert. On a GPU that is two grouped GEMMs
//! forward and four backward per layer, whatever the number of experts; on the CPU the composed
//! op is the old per-expert arithmetic.
//!
//! The experts' weights stay one parameter per expert (checkpoints and parameter roles are
//! unchanged) and reach the op as parts ([`FusedOps::fused_grouped_matmul_parts`]): a GPU's
//! kernels read each expert's weight where it lies and write each expert's gradient into one
//! buffer the parameters' gradients are views of, so no stacked copy is made forward or backward
//! (it was a read and write of every expert's weights and one copy launch per expert each way)
//! and none lives from a forward to its backward.

use burn::tensor::activation::gelu;
use burn::tensor::{IndexingUpdateOp, Int, Tensor, TensorPrimitive};
use ferrotron_ops::{Fp8Experts, FusedOps, GroupRows};
use ferrotron_parallel::ParallelOps;
use ferrotron_recipe::Activation;

use super::expert::Expert;
use super::layer::ExpertsFp8;
use crate::mlp::gelu_tanh;

/// `x [rows, hidden]`, the first `group_rows[0]` rows for `experts[0]`, the next for
/// `experts[1]`, … → each row through its expert, `[rows, hidden]`. Whole experts only (not cut
/// over etp). The counts stay where they are: nothing here reads device counts to the host.
/// With `fp8`, fc1 and fc2 are fp8 grouped GEMMs (`FusedOps::fp8_experts`).
pub(super) fn grouped_experts<B: ParallelOps>(
    experts: &[Expert<B>],
    x: Tensor<B, 2>,
    group_rows: &GroupRows<B>,
    fp8: Option<&ExpertsFp8>,
) -> Tensor<B, 2> {
    let activation = experts
        .first()
        .map_or(Activation::Gelu, |expert| expert.activation);
    let fc1: Vec<Tensor<B, 2>> = experts.iter().map(|e| e.fc1.weight.val()).collect();
    let fc1_bias = biases(experts.iter().map(|e| e.fc1.bias.as_ref().map(|b| b.val())));
    let fc2_bias = biases(experts.iter().map(|e| e.fc2.bias.as_ref().map(|b| b.val())));
    // Which expert each row is for, uploaded once for both biases.
    let row_experts = (fc1_bias.is_some() || fc2_bias.is_some())
        .then(|| row_experts::<B>(group_rows, x.dims()[0], &x.device()));
    let hidden = with_bias(
        grouped_matmul(x, fc1, group_rows, fp8.map(|f| &f.fc1)),
        fc1_bias,
        row_experts.clone(),
    );
    let activated = match activation {
        Activation::Swiglu => Tensor::from_primitive(TensorPrimitive::Float(B::fused_swiglu(
            hidden.into_primitive().tensor(),
        ))),
        Activation::Gelu => gelu(hidden),
        Activation::GeluTanh => gelu_tanh(hidden),
    };
    let fc2: Vec<Tensor<B, 2>> = experts.iter().map(|e| e.fc2.weight.val()).collect();
    with_bias(
        grouped_matmul(activated, fc2, group_rows, fp8.map(|f| &f.fc2)),
        fc2_bias,
        row_experts,
    )
}

fn grouped_matmul<B: FusedOps>(
    x: Tensor<B, 2>,
    weights: Vec<Tensor<B, 2>>,
    group_rows: &GroupRows<B>,
    fp8: Option<&Fp8Experts>,
) -> Tensor<B, 2> {
    let parts = weights
        .into_iter()
        .map(|weight| weight.into_primitive().tensor())
        .collect();
    let x = x.into_primitive().tensor();
    Tensor::from_primitive(TensorPrimitive::Float(match fp8 {
        Some(fp8) => B::fp8_experts(x, parts, group_rows, fp8),
        None => B::fused_grouped_matmul_parts(x, parts, group_rows),
    }))
}

/// The experts' biases stacked `[experts, width]`, when they have them.
fn biases<B: FusedOps>(biases: impl Iterator<Item = Option<Tensor<B, 1>>>) -> Option<Tensor<B, 2>> {
    let biases: Option<Vec<Tensor<B, 1>>> = biases.collect();
    biases
        .filter(|b| !b.is_empty())
        .map(|b| Tensor::stack(b, 0))
}

/// The expert of each of the `rows` rows, `[rows]`, on the device: the number of groups that end
/// at or before each row — a one at each group's end, summed along the rows. The last group's
/// end (and a trailing empty group's) is the slot past the last row, cut off.
fn row_experts<B: FusedOps>(
    group_rows: &GroupRows<B>,
    rows: usize,
    device: &B::Device,
) -> Tensor<B, 1, Int> {
    let ends = Tensor::<B, 1, Int>::from_primitive(group_rows.device(device)).cumsum(0);
    let groups = group_rows.groups();
    Tensor::<B, 1, Int>::zeros([rows + 1], device)
        .scatter(
            0,
            ends,
            Tensor::ones([groups], device),
            IndexingUpdateOp::Add,
        )
        .cumsum(0)
        .slice_dim(0, 0..rows)
}

/// Each row plus its expert's bias (`row_experts` is present whenever a bias is).
fn with_bias<B: FusedOps>(
    x: Tensor<B, 2>,
    bias: Option<Tensor<B, 2>>,
    row_experts: Option<Tensor<B, 1, Int>>,
) -> Tensor<B, 2> {
    match (bias, row_experts) {
        (Some(bias), Some(index)) => x + bias.select(0, index),
        _ => x,
    }
}

#[cfg(test)]
mod tests {
    use burn::module::Param;
    use burn::tensor::{Distribution, TensorData};

    use super::*;
    use crate::mlp::MlpShape;
    use crate::tests::{CpuAutodiff, values};

    type B = CpuAutodiff;

    /// Rows per expert, the third expert empty.
    const GROUPS: [usize; 4] = [3, 5, 0, 2];

    fn experts(activation: Activation, bias: bool) -> Vec<Expert<B>> {
        let shape = MlpShape {
            hidden: 6,
            ffn: 4,
            activation,
            bias,
            std: 0.5,
            output_std: 0.5,
        };
        let device = Default::default();
        (0..GROUPS.len())
            .map(|_| {
                let mut expert = Expert::<B>::new(&shape, &device);
                // Non-zero biases, so a misplaced one shows.
                for linear in [&mut expert.fc1, &mut expert.fc2] {
                    if let Some(bias) = &linear.bias {
                        let random = Tensor::random(bias.dims(), Distribution::Default, &device);
                        linear.bias = Some(Param::from_tensor(random));
                    }
                }
                expert
            })
            .collect()
    }

    /// The same values on every call: `sin(step · i)`.
    fn fixed(shape: [usize; 2], step: f32) -> Tensor<B, 2> {
        let values: Vec<f32> = (0..shape[0] * shape[1])
            .map(|i| (step * i as f32).sin())
            .collect();
        Tensor::from_data(TensorData::new(values, shape), &Default::default())
    }

    /// Output, input gradient and every expert parameter's gradient under a fixed weighting
    /// (`None` where a parameter got no gradient).
    fn run(
        experts: &[Expert<B>],
        f: impl Fn(&[Expert<B>], Tensor<B, 2>) -> Tensor<B, 2>,
    ) -> Vec<Option<Vec<f32>>> {
        let rows = GROUPS.iter().sum();
        let x = fixed([rows, 6], 0.37).require_grad();
        let out = f(experts, x.clone());
        let weighting = fixed([rows, 6], 0.91);
        let grads = (out.clone() * weighting).sum().backward();
        let mut all = vec![Some(values(out)), x.grad(&grads).map(values)];
        for expert in experts {
            for linear in [&expert.fc1, &expert.fc2] {
                all.push(linear.weight.grad(&grads).map(values));
                if let Some(bias) = &linear.bias {
                    all.push(bias.grad(&grads).map(values));
                }
            }
        }
        all
    }

    /// Each expert over its own rows, as the layer computed before grouped matmuls.
    fn one_by_one(experts: &[Expert<B>], x: Tensor<B, 2>) -> Tensor<B, 2> {
        let mut start = 0;
        let mut blocks = Vec::new();
        for (expert, &rows) in experts.iter().zip(&GROUPS) {
            let index: Vec<i64> = (start..start + rows).map(|r| r as i64).collect();
            let index = Tensor::<B, 1, Int>::from_data(TensorData::new(index, [rows]), &x.device());
            blocks.push(expert.forward(x.clone().select(0, index)));
            start += rows;
        }
        Tensor::cat(blocks, 0)
    }

    /// Equal up to rounding, a missing reference gradient (an expert that saw no rows, one by
    /// one) counting as zero.
    fn assert_close(got: &[Option<Vec<f32>>], want: &[Option<Vec<f32>>]) {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            let g = g.as_ref().expect("every parameter gets a gradient");
            let w = w.clone().unwrap_or_else(|| vec![0.0; g.len()]);
            assert_eq!(g.len(), w.len());
            for (a, b) in g.iter().zip(&w) {
                assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{g:?} vs {w:?}");
            }
        }
    }

    #[test]
    fn grouped_experts_match_the_experts_one_by_one() {
        for (activation, bias) in [(Activation::Swiglu, false), (Activation::Gelu, true)] {
            let experts = experts(activation, bias);
            let grouped = run(&experts, |e, x| {
                grouped_experts(e, x, &GroupRows::on_host(GROUPS.to_vec()), None)
            });
            // Counts left on the device route the same rows (the biases' experts built there).
            let on_device = run(&experts, |e, x| {
                let counts = GROUPS.iter().map(|&r| r as i64).collect();
                let counts = Tensor::<B, 1, Int>::from_data(
                    TensorData::new(counts, [GROUPS.len()]),
                    &x.device(),
                );
                grouped_experts(e, x, &GroupRows::on_device(counts.into_primitive()), None)
            });
            assert_close(&on_device, &grouped);
            let reference = run(&experts, one_by_one);
            assert_close(&grouped, &reference);
            // The empty expert's fc1 weight gradient is zero, the others' not.
            let fc1_grads = if bias { [2, 6, 10, 14] } else { [2, 4, 6, 8] };
            let fc1_grad = |expert: usize| grouped[fc1_grads[expert]].clone().expect("a gradient");
            assert!(fc1_grad(2).iter().all(|&g| g == 0.0));
            assert!(fc1_grad(3).iter().any(|&g| g != 0.0));
        }
    }
}
