use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Int, Tensor, TensorData};
use ferrotron_model::{GptModel, ModelConfig, RecomputePolicy};
use ferrotron_parallel::recompute;

use super::backward_by_range;
use crate::CpuTrainBackend;

type B = CpuTrainBackend;

const LAYERS: usize = 3;

/// A tiny GPT with dropout `dropout` everywhere (tied embeddings, learned positions).
fn model(policy: RecomputePolicy, cut_layers: bool, dropout: f64) -> GptModel<B> {
    let device = Default::default();
    <B as Backend>::seed(&device, 5);
    let section: ferrotron_recipe::Model = serde_json::from_value(serde_json::json!({
        "num_layers": LAYERS, "hidden_size": 16, "num_attention_heads": 2, "seq_length": 8,
        "vocab_size": 64, "hidden_dropout": dropout, "attention_dropout": dropout
    }))
    .expect("model section parses");
    let model: GptModel<B> = ModelConfig::from_model(&section, 64)
        .expect("valid tiny model")
        .init(&device);
    model.with_recompute(policy).with_layer_cuts(cut_layers)
}

/// Every parameter's gradient after one forward and backward, and a draw from the generator
/// after it; the number of ranges the forward cut. `restore` false skips putting the generator
/// back for the re-runs (what the test must be able to see).
fn gradients(policy: RecomputePolicy, restore: bool) -> (Vec<Option<Vec<f32>>>, Vec<f32>, usize) {
    gradients_cut(policy, false, restore)
}

/// [`gradients`] of the model with its layers cut or not (`GptModel::with_layer_cuts`).
fn gradients_cut(
    policy: RecomputePolicy,
    cut_layers: bool,
    restore: bool,
) -> (Vec<Option<Vec<f32>>>, Vec<f32>, usize) {
    gradients_of(policy, cut_layers, restore, 0.2)
}

/// [`gradients_cut`] of the model with dropout `dropout`.
fn gradients_of(
    policy: RecomputePolicy,
    cut_layers: bool,
    restore: bool,
    dropout: f64,
) -> (Vec<Option<Vec<f32>>>, Vec<f32>, usize) {
    let device = Default::default();
    let model = model(policy, cut_layers, dropout);
    let tokens = |offset: i64| {
        let values: Vec<i64> = (0..16).map(|i| (i * 7 + offset) % 64).collect();
        Tensor::<B, 2, Int>::from_data(TensorData::new(values, [2, 8]), &device)
    };
    <B as Backend>::seed(&device, 9);
    let loss = model.loss(tokens(0), tokens(1)).loss;
    let tape = recompute::take::<B>();
    let ranges = tape.segments.len();
    let grads = backward_by_range(
        loss,
        tape,
        &model,
        &[],
        restore,
        &mut || Ok(()),
        &mut |_| Ok(()),
    )
    .expect("backward");
    let after = Tensor::<B, 1>::random([4], Distribution::Default, &device);
    let after = after.into_data().to_vec::<f32>().expect("f32");
    struct Read<'a> {
        grads: &'a <B as AutodiffBackend>::Gradients,
        out: Vec<Option<Vec<f32>>>,
    }
    impl ModuleVisitor<B> for Read<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let grad = param.val().grad(self.grads);
            self.out
                .push(grad.map(|g| g.into_data().to_vec::<f32>().expect("f32")));
        }
    }
    let mut read = Read {
        grads: &grads,
        out: Vec::new(),
    };
    model.visit(&mut read);
    (read.out, after, ranges)
}

#[test]
fn recomputed_gradients_are_bit_identical_with_dropout() {
    let (kept, kept_after, none) = gradients(RecomputePolicy::Keep, true);
    assert_eq!(none, 0);
    for (policy, ranges) in [
        (RecomputePolicy::Uniform { layers: 1 }, 3),
        (RecomputePolicy::Uniform { layers: 2 }, 2),
        (RecomputePolicy::Block { layers: 2 }, 2),
    ] {
        let (grads, after, cut) = gradients(policy, true);
        assert_eq!(cut, ranges, "{policy:?} cuts {ranges} ranges");
        assert_eq!(grads, kept, "{policy:?}: gradients differ");
        assert_eq!(
            after, kept_after,
            "{policy:?}: the generator moved differently"
        );
    }
}

/// Without restoring the generator the re-runs draw other masks: the comparison above sees it.
#[test]
fn recomputing_without_the_generator_mark_changes_the_gradients() {
    let (kept, _, _) = gradients(RecomputePolicy::Keep, true);
    let (grads, _, _) = gradients(RecomputePolicy::Uniform { layers: 1 }, false);
    assert_ne!(grads, kept);
}

/// Layers cut and kept (the data-parallel overlap's ranges), alone or between recomputed ones:
/// the same gradients and generator position as one backward over the whole graph.
#[test]
fn layer_cuts_give_the_same_gradients_with_dropout() {
    let (kept, kept_after, _) = gradients(RecomputePolicy::Keep, true);
    for (policy, ranges) in [
        (RecomputePolicy::Keep, 3),
        (RecomputePolicy::Block { layers: 1 }, 3),
        (RecomputePolicy::Uniform { layers: 2 }, 2),
    ] {
        let (grads, after, cut) = gradients_cut(policy, true, true);
        assert_eq!(cut, ranges, "{policy:?} with cuts: {ranges} ranges");
        assert_eq!(grads, kept, "{policy:?} with cuts: gradients differ");
        assert_eq!(
            after, kept_after,
            "{policy:?} with cuts: the generator moved"
        );
    }
}

/// Megatron's `--recompute-modules mlp`: each layer's MLP block a recomputed range, its
/// attention block kept (a cut of its own with the layer cuts). Without dropout the gradients
/// are bit for bit those of one backward over the whole graph.
#[test]
fn mlp_recomputation_gives_the_same_gradients() {
    let (kept, _, _) = gradients_of(RecomputePolicy::Keep, false, true, 0.0);
    for (cut_layers, ranges) in [(false, LAYERS), (true, 2 * LAYERS)] {
        let (grads, _, cut) = gradients_of(RecomputePolicy::Mlp, cut_layers, true, 0.0);
        assert_eq!(cut, ranges, "cuts {cut_layers}: {ranges} ranges");
        assert_eq!(grads, kept, "cuts {cut_layers}: gradients differ");
    }
}

/// With dropout the MLP blocks re-run from the generator mark at their start: with the layer
/// cuts or without, the same gradients and generator position; without restoring the mark
/// the re-runs draw other masks. (On a backend whose generator state cannot be read, a mark
/// re-keys the stream, so the masks differ from a run without this recomputation; on the CUDA
/// backend a mark only reads the counter.)
#[test]
fn mlp_recomputation_redraws_the_forwards_dropout_masks() {
    let (grads, after, _) = gradients_of(RecomputePolicy::Mlp, false, true, 0.2);
    let (grads_cut, after_cut, _) = gradients_of(RecomputePolicy::Mlp, true, true, 0.2);
    assert_eq!(grads, grads_cut);
    assert_eq!(after, after_cut);
    let (unrestored, _, _) = gradients_of(RecomputePolicy::Mlp, false, false, 0.2);
    assert_ne!(grads, unrestored);
}
