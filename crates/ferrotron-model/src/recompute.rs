//! Which layers a chunk recomputes in the backward pass, and running a chunk's layers with those
//! ranges cut out of the graph (`ferrotron_parallel::recompute`).
//!
//! The policy is Megatron's full recomputation, per pipeline chunk as Megatron counts it and as
//! the planner's memory terms assume: `uniform` keeps the input of every group of `num_layers`
//! consecutive layers and re-runs the group; `block` re-runs each of the chunk's first
//! `num_layers` layers on its own and keeps the rest whole.
//!
//! Selective recomputation (Megatron's attention core: scores, softmax, dropout) is what a fused
//! attention kernel does anyway (it keeps the softmax statistics and recomputes the
//! probabilities in its backward), so on the CUDA backend it is in effect whether or not the
//! recipe asks; the composed attention of the CPU backends does not recompute it (see the
//! README). Selective recomputation of the MLP blocks (`modules: [mlp]`) cuts each dense
//! layer's second half out as a range of its own: at long sequence lengths the MLP holds most
//! of a layer's activations and few of its FLOPs, attention the reverse.

use std::cell::RefCell;
use std::ops::Range;
use std::rc::Rc;

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};
use ferrotron_parallel::recompute::{Rerun, RngMark, Run};
use ferrotron_parallel::{ParallelOps, prefetch};
use ferrotron_recipe::{Recompute, RecomputeGranularity, RecomputeMethod};

use crate::block::TransformerBlock;
use crate::parallel::SequencePositions;
use crate::{LayerLoads, ModelError};

/// The layer ranges of a chunk that are recomputed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RecomputePolicy {
    /// Every activation kept (also `selective` of the attention core: see the module docs).
    #[default]
    Keep,
    /// Groups of `layers` consecutive layers, each re-run as one range.
    Uniform { layers: usize },
    /// The chunk's first `layers` layers, each re-run on its own.
    Block { layers: usize },
    /// Every dense layer's MLP block re-run on its own, the attention block kept (Megatron's
    /// selective recomputation with `--recompute-modules mlp`).
    Mlp,
}

impl RecomputePolicy {
    /// The recipe's `recompute` section (a plan's: `auto` already resolved).
    pub fn from_recipe(recompute: &Recompute) -> Result<Self, ModelError> {
        let layers = || {
            recompute
                .num_layers
                .map(|n| n as usize)
                .filter(|&n| n > 0)
                .ok_or_else(|| {
                    ModelError::Incompatible(
                        "recompute: full needs num_layers of at least 1".to_owned(),
                    )
                })
        };
        match (recompute.granularity, recompute.method) {
            (RecomputeGranularity::Selective, _) if recompute.recomputes_mlp() => Ok(Self::Mlp),
            (RecomputeGranularity::None | RecomputeGranularity::Selective, _) => Ok(Self::Keep),
            (RecomputeGranularity::Full, Some(RecomputeMethod::Uniform)) => {
                Ok(Self::Uniform { layers: layers()? })
            }
            (RecomputeGranularity::Full, Some(RecomputeMethod::Block)) => {
                Ok(Self::Block { layers: layers()? })
            }
            (RecomputeGranularity::Full, None) => Err(ModelError::Incompatible(
                "recompute: full needs a method (uniform or block)".to_owned(),
            )),
            (RecomputeGranularity::Auto, _) => Err(ModelError::Incompatible(
                "recompute: auto is resolved by the planner before a model runs".to_owned(),
            )),
        }
    }

    /// The recomputed ranges of a chunk of `count` layers, in order.
    pub fn ranges(&self, count: usize) -> Vec<Range<usize>> {
        match *self {
            Self::Keep | Self::Mlp => Vec::new(),
            Self::Uniform { layers } => (0..count)
                .step_by(layers)
                .map(|start| start..(start + layers).min(count))
                .collect(),
            Self::Block { layers } => (0..layers.min(count)).map(|i| i..i + 1).collect(),
        }
    }
}

/// What a run of layers hands on: the hidden states, the running sum of the MoE auxiliary
/// losses (`[1]`), and each MoE layer's expert loads.
pub(crate) struct LayersOut<B: Backend> {
    pub hidden: Tensor<B, 3>,
    pub aux_loss: Tensor<B, 1>,
    pub loads: Vec<LayerLoads>,
}

/// Runs `layers` (the model's layers `first..`) in order after `input`, marking dropout's
/// generator at each layer start when `marks` (see `ferrotron_parallel::recompute`); the first
/// layer's mark is the caller's when `first_marked`. Each layer start runs the waits registered
/// for it (`ferrotron_parallel::prefetch`: parameters still being gathered).
pub(crate) fn run_plain<B: ParallelOps>(
    layers: &[TransformerBlock<B>],
    first: usize,
    input: LayersOut<B>,
    positions: &SequencePositions<B>,
    marks: bool,
    first_marked: bool,
) -> LayersOut<B> {
    let mut out = input;
    for (index, layer) in layers.iter().enumerate() {
        prefetch::entering_layer(first + index);
        if marks && !(first_marked && index == 0) {
            B::rng_mark(&out.hidden.device());
        }
        let (next, stats) = layer.forward(out.hidden, positions);
        out.hidden = next;
        if let Some(stats) = stats {
            out.aux_loss = out.aux_loss + stats.aux_loss;
            out.loads.push(stats.loads);
        }
    }
    out
}

/// Runs `layers` as one recomputed range from the generator position `mark`. The running
/// auxiliary loss goes through the range (not summed after it) so the sum associates as in a
/// run without recomputation; a dense range leaves it outside.
pub(crate) fn run_recomputed<B: ParallelOps>(
    layers: &[TransformerBlock<B>],
    first: usize,
    input: LayersOut<B>,
    positions: &SequencePositions<B>,
    marks: bool,
    mark: RngMark,
) -> LayersOut<B> {
    let has_moe = layers.iter().any(|layer| layer.moe().is_some());
    // A lazily initialised parameter (burn's norm initialisers) cloned before its first read
    // would initialise in each clone: another tensor, another autodiff leaf than the model's.
    for layer in layers {
        layer.visit(&mut Materialize);
    }
    let tracked = Rc::new(layers.to_vec());
    let positions = positions.clone();
    let loads = Rc::new(RefCell::new(Vec::new()));
    let loads_out = loads.clone();
    let rerun: Rerun<B> = Rc::new(move |inputs, track| {
        let (hidden, aux_loss) = split_inputs(inputs);
        let untracked: Vec<_>;
        let layers = if track {
            tracked.as_slice()
        } else {
            untracked = tracked
                .iter()
                .map(|layer| layer.clone().no_grad())
                .collect();
            untracked.as_slice()
        };
        let input = LayersOut {
            hidden,
            aux_loss,
            loads: Vec::new(),
        };
        let out = run_plain(layers, first, input, &positions, marks, true);
        if !track {
            *loads_out.borrow_mut() = out.loads;
        }
        let mut outputs = vec![out.hidden.into_primitive().tensor()];
        if has_moe {
            outputs.push(out.aux_loss.into_primitive().tensor());
        }
        outputs
    });
    let mut inputs = vec![input.hidden.into_primitive().tensor()];
    if has_moe {
        inputs.push(input.aux_loss.clone().into_primitive().tensor());
    }
    let outputs = B::recompute(inputs, mark, rerun);
    joined(outputs, input.aux_loss, input.loads, loads.take())
}

/// Runs the dense `layer` with its MLP block as a recomputed range of its own: the block's input
/// is all it keeps for the backward, which re-runs the norm, both projections, the activation,
/// the dropout (from the generator mark taken at the block's start) and the residual add. The
/// attention block before it runs as [`run_plain`] would run the layer, or as a kept cut when
/// `cut` (the data-parallel overlap's ranges). A dense layer's auxiliary loss and loads pass
/// through untouched.
pub(crate) fn run_mlp_recomputed<B: ParallelOps>(
    layer: &TransformerBlock<B>,
    index: usize,
    input: LayersOut<B>,
    positions: &SequencePositions<B>,
    marks: bool,
    cut: bool,
) -> LayersOut<B> {
    debug_assert!(layer.moe().is_none(), "`mlp` recomputes dense layers only");
    prefetch::entering_layer(index);
    let device = input.hidden.device();
    if marks {
        B::rng_mark(&device);
    }
    layer.visit(&mut Materialize);
    let attended = if cut {
        let tracked = layer.clone();
        let positions = positions.clone();
        let run: Run<B> = Box::new(move |inputs| {
            let (hidden, _) = split_inputs::<B>(inputs);
            vec![
                tracked
                    .attention_block(hidden, &positions)
                    .into_primitive()
                    .tensor(),
            ]
        });
        let outputs = B::cut_kept(vec![input.hidden.into_primitive().tensor()], run);
        joined(outputs, input.aux_loss.clone(), Vec::new(), Vec::new()).hidden
    } else {
        layer.attention_block(input.hidden, positions)
    };
    let mark = if marks { B::rng_mark(&device) } else { [0, 0] };
    let tracked = layer.clone();
    let rerun: Rerun<B> = Rc::new(move |inputs, track| {
        let (hidden, _) = split_inputs::<B>(inputs);
        let layer = if track {
            tracked.clone()
        } else {
            tracked.clone().no_grad()
        };
        let (out, _) = layer.feed_forward_block(hidden);
        vec![out.into_primitive().tensor()]
    });
    let outputs = B::recompute(vec![attended.into_primitive().tensor()], mark, rerun);
    joined(outputs, input.aux_loss, input.loads, Vec::new())
}

/// Runs `layer` as a kept cut of the graph (`ferrotron_parallel::recompute`): tracked, with its
/// activations, but differentiated by the trainer's driver on its own. The running auxiliary
/// loss goes through the cut as through a recomputed range.
pub(crate) fn run_kept<B: ParallelOps>(
    layer: &TransformerBlock<B>,
    index: usize,
    input: LayersOut<B>,
    positions: &SequencePositions<B>,
    marks: bool,
) -> LayersOut<B> {
    let has_moe = layer.moe().is_some();
    layer.visit(&mut Materialize);
    let tracked = layer.clone();
    let positions = positions.clone();
    let loads = Rc::new(RefCell::new(Vec::new()));
    let loads_out = loads.clone();
    let run: Run<B> = Box::new(move |inputs| {
        let (hidden, aux_loss) = split_inputs(inputs);
        let input = LayersOut {
            hidden,
            aux_loss,
            loads: Vec::new(),
        };
        let out = run_plain(
            std::slice::from_ref(&tracked),
            index,
            input,
            &positions,
            marks,
            false,
        );
        *loads_out.borrow_mut() = out.loads;
        let mut outputs = vec![out.hidden.into_primitive().tensor()];
        if has_moe {
            outputs.push(out.aux_loss.into_primitive().tensor());
        }
        outputs
    });
    let mut inputs = vec![input.hidden.into_primitive().tensor()];
    if has_moe {
        inputs.push(input.aux_loss.clone().into_primitive().tensor());
    }
    let outputs = B::cut_kept(inputs, run);
    joined(outputs, input.aux_loss, input.loads, loads.take())
}

/// A range's or cut's inputs as the layers take them: the hidden states, and the auxiliary loss
/// so far (with MoE; zero without).
fn split_inputs<B: Backend>(inputs: Vec<FloatTensor<B>>) -> (Tensor<B, 3>, Tensor<B, 1>) {
    let mut inputs = inputs.into_iter();
    let hidden = Tensor::from_primitive(TensorPrimitive::Float(
        inputs
            .next()
            .expect("a range's first input is the hidden states"),
    ));
    let aux_loss = match inputs.next() {
        Some(aux) => Tensor::from_primitive(TensorPrimitive::Float(aux)),
        None => Tensor::zeros([1], &hidden.device()),
    };
    (hidden, aux_loss)
}

/// The layers' result after a range or cut: its `outputs` (hidden states, then the auxiliary
/// loss with MoE; without, the input's `aux_loss` passes through), and the input's expert
/// loads `earlier` followed by the range's own `loads`.
fn joined<B: Backend>(
    outputs: Vec<FloatTensor<B>>,
    aux_loss: Tensor<B, 1>,
    earlier: Vec<LayerLoads>,
    loads: Vec<LayerLoads>,
) -> LayersOut<B> {
    let mut outputs = outputs.into_iter();
    let hidden = Tensor::from_primitive(TensorPrimitive::Float(
        outputs.next().expect("a range outputs the hidden states"),
    ));
    let aux_loss = match outputs.next() {
        Some(aux) => Tensor::from_primitive(TensorPrimitive::Float(aux)),
        None => aux_loss,
    };
    let mut all_loads = earlier;
    all_loads.extend(loads);
    LayersOut {
        hidden,
        aux_loss,
        loads: all_loads,
    }
}

struct Materialize;

impl<B: Backend> ModuleVisitor<B> for Materialize {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        param.val();
    }
}

#[cfg(test)]
mod tests {
    use ferrotron_recipe::RecomputeModule;

    use super::*;

    #[test]
    fn ranges_follow_megatrons_methods() {
        assert!(RecomputePolicy::Keep.ranges(4).is_empty());
        assert_eq!(
            RecomputePolicy::Uniform { layers: 3 }.ranges(7),
            vec![0..3, 3..6, 6..7]
        );
        assert_eq!(
            RecomputePolicy::Block { layers: 2 }.ranges(5),
            vec![0..1, 1..2]
        );
        assert_eq!(
            RecomputePolicy::Block { layers: 9 }.ranges(2),
            vec![0..1, 1..2]
        );
    }

    #[test]
    fn the_recipe_section_maps_to_a_policy() {
        use RecomputeGranularity::{Auto, Full, None as Off, Selective};
        let policy = |granularity, method, num_layers| {
            RecomputePolicy::from_recipe(&Recompute {
                granularity,
                method,
                num_layers,
                modules: Vec::new(),
            })
            .ok()
        };
        assert_eq!(policy(Off, None, None), Some(RecomputePolicy::Keep));
        assert_eq!(policy(Selective, None, None), Some(RecomputePolicy::Keep));
        let selective = |modules| Recompute {
            granularity: Selective,
            modules,
            ..Recompute::default()
        };
        assert_eq!(
            RecomputePolicy::from_recipe(&selective(vec![RecomputeModule::CoreAttn])).ok(),
            Some(RecomputePolicy::Keep)
        );
        assert_eq!(
            RecomputePolicy::from_recipe(&selective(vec![RecomputeModule::Mlp])).ok(),
            Some(RecomputePolicy::Mlp)
        );
        assert!(RecomputePolicy::Mlp.ranges(4).is_empty());
        assert_eq!(
            policy(Full, Some(RecomputeMethod::Uniform), Some(2)),
            Some(RecomputePolicy::Uniform { layers: 2 })
        );
        assert_eq!(
            policy(Full, Some(RecomputeMethod::Block), Some(1)),
            Some(RecomputePolicy::Block { layers: 1 })
        );
        assert_eq!(policy(Full, None, Some(1)), None);
        assert_eq!(policy(Full, Some(RecomputeMethod::Block), None), None);
        assert_eq!(policy(Auto, None, None), None);
    }
}
