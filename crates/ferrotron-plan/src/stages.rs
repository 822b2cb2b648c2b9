//! Which layers live on which pipeline stage and virtual chunk.
//!
//! Megatron orders model chunks chunk-major: virtual stage 0 of ranks 0..pp, then virtual stage
//! 1 of ranks 0..pp, and so on (`get_transformer_layer_offset`). Each (chunk, rank) gets a layer
//! count — uneven first/last stages and the embedding/loss "layers" included — and a layer's
//! offset is the running sum in that order, which reproduces Megatron's offsets for every case
//! it supports. The layout rules have already rejected impossible splits.

use ferrotron_recipe::Recipe;
use serde::{Deserialize, Serialize};

use crate::params::ParameterCount;

/// One model chunk of a pipeline stage: a contiguous range of transformer layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    pub virtual_stage: u32,
    /// Index of the first transformer layer (0-based, global).
    pub first_layer: u32,
    pub num_layers: u32,
}

/// One pipeline stage (every rank with this pipeline coordinate holds the same layers).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageInfo {
    pub pipeline_rank: u32,
    pub num_layers: u32,
    pub moe_layers: u32,
    pub chunks: Vec<Chunk>,
    /// Holds the word (and learned position) embedding.
    pub has_embedding: bool,
    /// Holds the final norm and the output layer (or a copy of the tied embedding).
    pub has_output_layer: bool,
    /// Parameters of this stage before tensor/expert sharding (a tied embedding counted on both
    /// the first and last stage when they differ, as Megatron allocates it).
    pub parameters: u64,
}

/// Layer counts per (virtual stage, pipeline rank), chunk-major.
fn chunk_counts(recipe: &Recipe, pp: u32, vpp: u32) -> Vec<Vec<u32>> {
    let p = &recipe.parallel;
    let layers = recipe.model.num_layers;
    let mut per_stage = match (
        p.num_layers_in_first_pipeline_stage,
        p.num_layers_in_last_pipeline_stage,
    ) {
        (None, None) => {
            let extra = u32::from(p.account_for_embedding_in_pipeline_split)
                + u32::from(p.account_for_loss_in_pipeline_split);
            vec![(layers + extra) / pp; pp as usize]
        }
        (first, last) => {
            let uneven = u32::from(first.is_some()) + u32::from(last.is_some());
            let rest = layers - first.unwrap_or(0) - last.unwrap_or(0);
            let middle = rest.checked_div(pp - uneven).unwrap_or(0);
            let mut counts = vec![middle; pp as usize];
            if let Some(f) = first {
                counts[0] = f;
            }
            if let Some(l) = last {
                counts[pp as usize - 1] = l;
            }
            counts
        }
    };
    for count in &mut per_stage {
        *count /= vpp;
    }
    let mut chunks = vec![per_stage; vpp as usize];
    if p.account_for_embedding_in_pipeline_split {
        chunks[0][0] -= 1;
    }
    if p.account_for_loss_in_pipeline_split {
        chunks[vpp as usize - 1][pp as usize - 1] -= 1;
    }
    chunks
}

/// Stages of `recipe` over `pp` pipeline ranks with `vpp` chunks each.
pub(crate) fn stages(
    recipe: &Recipe,
    params: &ParameterCount,
    pp: u32,
    vpp: u32,
) -> Vec<StageInfo> {
    let model = &recipe.model;
    let counts = chunk_counts(recipe, pp, vpp);
    let mut stages: Vec<StageInfo> = (0..pp)
        .map(|rank| StageInfo {
            pipeline_rank: rank,
            num_layers: 0,
            moe_layers: 0,
            chunks: Vec::new(),
            has_embedding: rank == 0,
            has_output_layer: rank == pp - 1,
            parameters: 0,
        })
        .collect();
    let moe_layers = model.moe_layers();
    let mut next_layer = 0;
    for (virtual_stage, ranks) in counts.iter().enumerate() {
        for (rank, &count) in ranks.iter().enumerate() {
            let stage = &mut stages[rank];
            stage.chunks.push(Chunk {
                virtual_stage: virtual_stage as u32,
                first_layer: next_layer,
                num_layers: count,
            });
            for layer in next_layer..next_layer + count {
                if moe_layers.get(layer as usize).copied().unwrap_or(false) {
                    stage.moe_layers += 1;
                    stage.parameters += params.moe_layer();
                } else {
                    stage.parameters += params.dense_layer();
                }
            }
            stage.num_layers += count;
            next_layer += count;
        }
    }
    let last = pp as usize - 1;
    stages[0].parameters += params.embedding + params.position_embedding;
    stages[last].parameters += params.final_norm + params.output_layer;
    if pp > 1 && model.tie_embeddings {
        // Megatron keeps a copy of the word embedding on the last stage and all-reduces its
        // gradient with the first stage over the embedding group.
        stages[last].parameters += params.embedding;
    }
    stages
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::parameter_count;
    use crate::testing::{gpt2_small, llama3_8b};

    fn layout(stages: &[StageInfo]) -> Vec<Vec<(u32, u32)>> {
        stages
            .iter()
            .map(|s| {
                s.chunks
                    .iter()
                    .map(|c| (c.first_layer, c.num_layers))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn even_split() {
        let recipe = llama3_8b();
        let params = parameter_count(&recipe.model, 128256);
        let stages = stages(&recipe, &params, 4, 1);
        assert_eq!(
            layout(&stages),
            vec![vec![(0, 8)], vec![(8, 8)], vec![(16, 8)], vec![(24, 8)]]
        );
        let total: u64 = stages.iter().map(|s| s.parameters).sum();
        assert_eq!(total, params.total, "untied: stages partition the model");
    }

    #[test]
    fn interleaved_chunks_are_chunk_major() {
        // Megatron: pp 4, vpp 2, 32 layers -> rank 0 holds layers 0-3 and 16-19.
        let recipe = llama3_8b();
        let params = parameter_count(&recipe.model, 128256);
        let stages = stages(&recipe, &params, 4, 2);
        assert_eq!(layout(&stages)[0], vec![(0, 4), (16, 4)]);
        assert_eq!(layout(&stages)[3], vec![(12, 4), (28, 4)]);
    }

    #[test]
    fn uneven_first_and_last() {
        let mut recipe = llama3_8b();
        recipe.parallel.num_layers_in_first_pipeline_stage = Some(6);
        recipe.parallel.num_layers_in_last_pipeline_stage = Some(6);
        let params = parameter_count(&recipe.model, 128256);
        let stages = stages(&recipe, &params, 4, 1);
        assert_eq!(
            layout(&stages),
            vec![vec![(0, 6)], vec![(6, 10)], vec![(16, 10)], vec![(26, 6)]]
        );
    }

    #[test]
    fn embedding_and_loss_accounted_as_layers_with_interleaving() {
        // Like Llama 3.1 405B: 126 layers + 2 over pp 8 × vpp 2 = 8 per chunk; the first chunk
        // of rank 0 and the last chunk of rank 7 hold 7.
        let mut recipe = llama3_8b();
        recipe.model.num_layers = 126;
        recipe.parallel.account_for_embedding_in_pipeline_split = true;
        recipe.parallel.account_for_loss_in_pipeline_split = true;
        let params = parameter_count(&recipe.model, 128256);
        let stages = stages(&recipe, &params, 8, 2);
        assert_eq!(layout(&stages)[0], vec![(0, 7), (63, 8)]);
        assert_eq!(layout(&stages)[1], vec![(7, 8), (71, 8)]);
        assert_eq!(layout(&stages)[7], vec![(55, 8), (119, 7)]);
        assert_eq!(stages.iter().map(|s| s.num_layers).sum::<u32>(), 126);
    }

    #[test]
    fn tied_embedding_is_allocated_on_the_last_stage_too() {
        let recipe = gpt2_small();
        let params = parameter_count(&recipe.model, 50304);
        let split = stages(&recipe, &params, 2, 1);
        let total: u64 = split.iter().map(|s| s.parameters).sum();
        assert_eq!(total, params.total + params.embedding);
        let single = stages(&recipe, &params, 1, 1);
        assert_eq!(single[0].parameters, params.total);
    }
}
