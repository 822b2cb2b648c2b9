//! fp8 in the runtime (issue 17): the recipe's precision section as the kernels' settings, the
//! refusal of backends without fp8 GEMMs, the chunks' fp8 layers, the once-per-step scale
//! update and the scaling state in checkpoints.
//!
//! The update runs after the optimizer step, so every microbatch of a step casts with the same
//! scales and the weights are cast once per step (Megatron with Transformer Engine updates per
//! microbatch forward; one update per step is what the weight cache needs, and with
//! `fp8_amax_history_len: 1` the scales still follow the previous step's amaxes). Amaxes are
//! max-reduced over the tensor- and data-parallel groups first (Transformer Engine's amax
//! reduction group), so those ranks' states stay equal and a checkpoint holds each layer's row
//! once, under its layer's name (`layers.3.attention.qkv.fp8_scaling`) in the optimizer files.

use std::collections::HashMap;

use burn::tensor::backend::AutodiffBackend;
use ferrotron_model::GptModel;
use ferrotron_ops::FusedOps;
use ferrotron_ops::fp8::scaling::{AmaxAlgo, Fp8Format, Fp8Scaling, Fp8Settings};
use ferrotron_parallel::{ParallelContext, ShardSpec, end_fp8_step};
use ferrotron_recipe::{Fp8, Fp8AmaxComputeAlgo, Fp8Recipe, Precision};

use crate::TrainError;
use crate::checkpoint::{ShardTensor, ShardedCheckpoint};

/// The suffix of a layer's scaling state in a checkpoint.
pub(crate) const FP8_SCALING: &str = "fp8_scaling";

/// The kernels' settings for `precision`, `None` without fp8; recipes the runtime does not
/// implement are refused.
pub(crate) fn settings(precision: &Precision) -> Result<Option<Fp8Settings>, TrainError> {
    let (forward, backward) = match precision.fp8 {
        Fp8::None => return Ok(None),
        Fp8::Hybrid => (Fp8Format::E4m3, Fp8Format::E5m2),
        Fp8::E4m3 => (Fp8Format::E4m3, Fp8Format::E4m3),
    };
    let scaling = match precision.fp8_recipe {
        Fp8Recipe::Delayed => Fp8Scaling::Delayed {
            history: precision.fp8_amax_history_len.max(1) as usize,
            algo: match precision.fp8_amax_compute_algo {
                Fp8AmaxComputeAlgo::MostRecent => AmaxAlgo::MostRecent,
                Fp8AmaxComputeAlgo::Max => AmaxAlgo::Max,
            },
        },
        Fp8Recipe::Tensorwise => Fp8Scaling::Current,
        other => {
            let name = if other == Fp8Recipe::Mxfp8 {
                "mxfp8"
            } else {
                "blockwise"
            };
            return Err(TrainError::Config(format!(
                "precision.fp8_recipe {name} is not implemented by this runtime (its scales are \
                 per block, not per tensor); use fp8_recipe: delayed or tensorwise"
            )));
        }
    };
    Ok(Some(Fp8Settings {
        forward,
        backward,
        scaling,
        margin: precision.fp8_margin,
    }))
}

/// `chunks` with fp8 GEMMs in the layers the recipe puts in fp8 (`first_last_layers_bf16`),
/// once `device` is known to have fp8 GEMMs (see [`check_support`]).
pub(crate) fn with_fp8<B: FusedOps>(
    chunks: Vec<GptModel<B>>,
    precision: &Precision,
    device: &B::Device,
) -> Result<Vec<GptModel<B>>, TrainError> {
    let Some(settings) = settings(precision)? else {
        return Ok(chunks);
    };
    check_support::<B>(precision, &settings, device)?;
    Ok(chunks
        .into_iter()
        .map(|chunk| {
            let layers = chunk.config().num_layers as u32;
            chunk.with_fp8(
                settings,
                |layer| precision.fp8_layer(layer as u32, layers),
                precision.fp8_experts,
            )
        })
        .collect())
}

/// Refuses an fp8 recipe on a backend (or a GPU) without fp8 GEMMs, naming why.
fn check_support<B: FusedOps>(
    precision: &Precision,
    settings: &Fp8Settings,
    device: &B::Device,
) -> Result<(), TrainError> {
    B::fp8_support(device, settings).map_err(|why| {
        TrainError::Config(format!(
            "precision.fp8 {} cannot train here: {why}",
            match precision.fp8 {
                Fp8::E4m3 => "e4m3",
                _ => "hybrid",
            }
        ))
    })
}

/// Ends an optimizer step for every chunk's fp8 layers (collective over tp and dp × cp).
pub(crate) fn end_step<B>(chunks: &[GptModel<B>], ctx: &ParallelContext)
where
    B: crate::TrainBackend,
{
    for state in chunks.iter().filter_map(GptModel::fp8_state) {
        end_fp8_step::<B::InnerBackend>(state, &[&ctx.tp, &ctx.dp_cp]);
    }
}

/// The chunks' scaling states as checkpoint tensors, written by one rank of each tp × dp
/// group (they hold equal states).
pub(crate) fn checkpoint_shards<B>(
    chunks: &[GptModel<B>],
    ctx: &ParallelContext,
) -> Vec<ShardTensor>
where
    B: AutodiffBackend,
{
    if ctx.tp.rank() != 0 || ctx.dp_cp.rank() != 0 {
        return Vec::new();
    }
    chunks
        .iter()
        .filter_map(GptModel::fp8_state)
        .flat_map(|state| state.rows::<B::InnerBackend>())
        .map(|(name, values)| ShardTensor {
            spec: ShardSpec {
                global_name: format!("{name}.{FP8_SCALING}"),
                global_shape: vec![values.len()],
                splits: Vec::new(),
            },
            values: values.into(),
        })
        .collect()
}

/// Restores the chunks' scaling states from `checkpoint` (layers it has no state for, e.g. a
/// bf16 run's checkpoint, start fresh).
pub(crate) fn restore<B>(
    chunks: &[GptModel<B>],
    checkpoint: &ShardedCheckpoint,
    device: &B::Device,
) -> Result<(), TrainError>
where
    B: AutodiffBackend,
{
    for state in chunks.iter().filter_map(GptModel::fp8_state) {
        let mut rows = HashMap::new();
        for name in state.names() {
            let key = format!("{name}.{FP8_SCALING}");
            if checkpoint.contains(&key) {
                rows.insert(name.clone(), checkpoint.global(&key)?.values.clone());
            }
        }
        state
            .restore::<B::InnerBackend>(&rows, device)
            .map_err(|e| TrainError::checkpoint(checkpoint.dir(), e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recipe_maps_to_the_kernels_settings() {
        let mut p = Precision::default();
        assert_eq!(settings(&p).expect("no fp8"), None);
        p.fp8 = Fp8::Hybrid;
        p.fp8_margin = 2;
        let s = settings(&p).expect("hybrid").expect("fp8");
        assert_eq!(
            (s.forward, s.backward, s.margin),
            (Fp8Format::E4m3, Fp8Format::E5m2, 2)
        );
        // Megatron's defaults: a history of one step, the most recent amax
        assert_eq!(
            s.scaling,
            Fp8Scaling::Delayed {
                history: 1,
                algo: AmaxAlgo::MostRecent
            }
        );
        p.fp8 = Fp8::E4m3;
        p.fp8_recipe = Fp8Recipe::Tensorwise;
        let s = settings(&p).expect("e4m3").expect("fp8");
        assert_eq!(
            (s.backward, s.scaling),
            (Fp8Format::E4m3, Fp8Scaling::Current)
        );
        p.fp8_recipe = Fp8Recipe::Blockwise;
        let err = settings(&p).expect_err("not implemented");
        assert!(
            err.to_string().contains("blockwise is not implemented"),
            "{err}"
        );
    }

    #[test]
    fn the_cpu_backend_is_refused_with_the_reason() {
        type Cpu = crate::CpuTrainBackend;
        let mut p = Precision::default();
        with_fp8::<Cpu>(Vec::new(), &p, &Default::default()).expect("bf16 runs");
        p.fp8 = Fp8::Hybrid;
        let err =
            with_fp8::<Cpu>(Vec::new(), &p, &Default::default()).expect_err("no fp8 on the CPU");
        let message = err.to_string();
        assert!(
            message.contains("precision.fp8 hybrid cannot train here"),
            "{message}"
        );
        assert!(message.contains("no fp8 GEMMs"), "{message}");
    }
}
