//! The fp8 terms of the time and memory models (issue 17).
//!
//! Which GEMMs run in fp8: the attention projections of every layer the recipe puts in fp8
//! (`Precision::fp8_layer`: all but the first and last ones with `first_last_layers_bf16`) and
//! the MLPs of its dense layers; the MoE experts too with `precision.fp8_experts` where they run
//! whole on one rank, at the device-count kernel's fraction of the fp8 peak (its bf16 fraction,
//! until the fp8 kernel is timed), their routed rows cast and each expert's weight copied; the
//! core attention and the output layer stay in bf16. Their rate is the fp8 peak at a lower fraction than bf16 reaches: on the H200,
//! gpt-1.3b's tuned fp8 GEMMs ran at 69 % of the 1979 peak where its bf16 GEMMs ran at 78 % of
//! 989, so fp8 takes [`FP8_EFFICIENCY`] = 0.89 times the bf16 efficiency. The casts move their
//! bytes at [`CAST_BANDWIDTH_EFFICIENCY`] of HBM. With both, the fp8 bench rows are predicted
//! within 12 % of their measured steps (`tests/bench_rows.rs`; the measurements: `tools/README.md`,
//! "Where the planner's fitted numbers come from").
//!
//! What fp8 adds: every fp8 GEMM's operands are cast first, a pass that reads the 16-bit
//! tensor and writes it twice in fp8 (itself and its transpose: 4 bytes per element), for the
//! four layer inputs in the forward and the four output gradients in the backward, less the two
//! the MLP's activation writes in its own passes (GELU and SwiGLU: fc2's input, fc1's output
//! gradient); the weights' two fp8 copies (2 bytes per parameter) live through the step. What it saves: a linear keeps
//! its input for the weight gradient as a 1-byte transpose instead of the 16-bit input, on
//! QKV's, fc1's and fc2's inputs; the output projection's input is the attention output,
//! which attention keeps anyway, so its fp8 copy is an extra byte.

use ferrotron_recipe::{Activation, Fp8, Recipe};

use crate::stages::StageInfo;

/// fp8 GEMMs' fraction of their peak, relative to bf16's fraction of its own.
pub(crate) const FP8_EFFICIENCY: f64 = 0.89;

/// The casts' fraction of HBM bandwidth: what Nsight Compute read for gpt-1.3b's plain
/// cast-transpose on the H200, 68 % of its 4.8 TB/s (the fused activation casts measure about as
/// much in `gpu_check --filter fp8`'s table). The element-wise kernels' fitted 31 % had put the
/// fp8 rows' steps 17 % too long.
pub(crate) const CAST_BANDWIDTH_EFFICIENCY: f64 = 0.68;

/// The layers of a stage whose GEMMs run in fp8.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct Fp8Layers {
    /// Every fp8 layer (its attention projections are fp8).
    pub all: f64,
    /// The dense ones among them (their MLPs are fp8 too).
    pub dense: f64,
    /// The MoE ones whose routed experts are fp8 too (`precision.fp8_experts`).
    pub experts: f64,
}

/// The fp8 layers of `stage`; `whole_experts` where the layout leaves every expert whole on one
/// rank (the runtime's fp8 experts need it).
pub(crate) fn fp8_layers(recipe: &Recipe, stage: &StageInfo, whole_experts: bool) -> Fp8Layers {
    let precision = &recipe.precision;
    if precision.fp8 == Fp8::None {
        return Fp8Layers::default();
    }
    let total = recipe.model.num_layers;
    let moe_layers = recipe.model.moe_layers();
    let mut layers = Fp8Layers::default();
    for chunk in &stage.chunks {
        for index in chunk.first_layer..chunk.first_layer + chunk.num_layers {
            if precision.fp8_layer(index, total) {
                layers.all += 1.0;
                if !moe_layers.get(index as usize).copied().unwrap_or(false) {
                    layers.dense += 1.0;
                } else if precision.fp8_experts && whole_experts {
                    layers.experts += 1.0;
                }
            }
        }
    }
    layers
}

fn widths(recipe: &Recipe) -> (f64, f64, f64, f64) {
    let model = &recipe.model;
    let h = f64::from(model.hidden_size);
    let kv = f64::from(model.kv_channels());
    let q = kv * f64::from(model.num_attention_heads);
    let qkv = q + 2.0 * kv * f64::from(model.num_query_groups());
    let f = f64::from(model.ffn_hidden_size());
    let fc1 = match model.activation {
        Activation::Swiglu => 2.0 * f,
        Activation::Gelu | Activation::GeluTanh => f,
    };
    (h, q, qkv, fc1)
}

/// Bytes the casts move per token of this GPU (forward inputs and backward output gradients,
/// each read in 16 bits and written twice in fp8), for `layers`, sharded over `tp`.
pub(crate) fn cast_bytes_per_token(recipe: &Recipe, layers: Fp8Layers, tp: f64) -> f64 {
    let (h, q, qkv, fc1) = widths(recipe);
    let f = f64::from(recipe.model.ffn_hidden_size());
    // inputs: QKV's (h), the projection's (q); output gradients: QKV's, the projection's (h)
    let attention = (h + q) + (qkv + h);
    // inputs: fc1's (h), fc2's (f); output gradients: fc1's, fc2's (h). With GELU or SwiGLU
    // fc2's input and fc1's output gradient are written by the activation's own passes
    // (`ferrotron_ops::FusedOps::fp8_mlp`), which the element-wise term counts already.
    let mlp = match recipe.model.activation {
        Activation::Gelu | Activation::Swiglu => h + h,
        Activation::GeluTanh => (h + f) + (fc1 + h),
    };
    4.0 * (layers.all * attention + layers.dense * mlp) / tp + layers.experts * routed_casts(recipe)
}

/// The routed experts' per-token widths: `(k, fc1's output, the expert FFN)`.
fn routed_widths(recipe: &Recipe) -> (f64, f64, f64) {
    let model = &recipe.model;
    let Some(moe) = &model.moe else {
        return (0.0, 0.0, 0.0);
    };
    let f = f64::from(moe.expert_ffn_hidden_size(model));
    let fc1 = match model.activation {
        Activation::Swiglu => 2.0 * f,
        Activation::Gelu | Activation::GeluTanh => f,
    };
    (f64::from(moe.router_topk), fc1, f)
}

/// Cast bytes per token of one fp8-experts layer: fc1's and fc2's routed inputs and output
/// gradients, `k` rows a token, each read in 16 bits and written twice in fp8.
fn routed_casts(recipe: &Recipe) -> f64 {
    let h = f64::from(recipe.model.hidden_size);
    let (k, fc1, f) = routed_widths(recipe);
    4.0 * k * ((h + f) + (fc1 + h))
}

/// The two fp8 copies of the fp8 layers' weights on this GPU, in bytes.
pub(crate) fn weight_cast_bytes(recipe: &Recipe, layers: Fp8Layers, tp: f64) -> f64 {
    let (h, q, qkv, fc1) = widths(recipe);
    let f = f64::from(recipe.model.ffn_hidden_size());
    let attention = h * qkv + q * h;
    let mlp = h * fc1 + f * h;
    let experts = recipe.model.moe.as_ref().map_or(0.0, |moe| {
        let (_, fc1, f) = routed_widths(recipe);
        f64::from(moe.num_experts) * (h * fc1 + f * h)
    });
    2.0 * ((layers.all * attention + layers.dense * mlp) / tp + layers.experts * experts)
}

/// How the saved inputs of one fp8 layer change its activation bytes per token: −1 byte for
/// QKV's, fc1's and fc2's inputs (16-bit kept before, 1-byte transposes now), +1 for the
/// projection's (kept by attention as well).
pub(crate) fn saved_input_delta_per_token(recipe: &Recipe, dense: bool, tp: f64) -> f64 {
    let (h, q, _, _) = widths(recipe);
    let f = f64::from(recipe.model.ffn_hidden_size());
    let attention = -h + q / tp;
    let mlp = if dense { -h - f / tp } else { 0.0 };
    attention + mlp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stages::Chunk;
    use crate::testing::gpt3_175b;

    fn stage(layers: u32) -> StageInfo {
        StageInfo {
            pipeline_rank: 0,
            num_layers: layers,
            moe_layers: 0,
            chunks: vec![Chunk {
                virtual_stage: 0,
                first_layer: 0,
                num_layers: layers,
            }],
            has_embedding: true,
            has_output_layer: true,
            parameters: 0,
        }
    }

    #[test]
    fn first_and_last_layers_in_bf16_leave_the_middle() {
        let mut recipe = gpt3_175b();
        assert_eq!(fp8_layers(&recipe, &stage(96), true), Fp8Layers::default());
        recipe.precision.fp8 = Fp8::Hybrid;
        assert_eq!(fp8_layers(&recipe, &stage(96), true).all, 96.0);
        recipe.precision.first_last_layers_bf16 = true;
        recipe.precision.num_layers_at_end_in_bf16 = 2;
        let layers = fp8_layers(&recipe, &stage(96), true);
        assert_eq!((layers.all, layers.dense), (93.0, 93.0));
    }

    #[test]
    fn casts_and_weight_copies_scale_with_the_layer_shapes() {
        let mut recipe = gpt3_175b();
        recipe.precision.fp8 = Fp8::Hybrid;
        let one = Fp8Layers {
            all: 1.0,
            dense: 1.0,
            experts: 0.0,
        };
        let h = 12288.0;
        // MHA: qkv 3h, ffn 4h, GELU; inputs h + h + h (fc2's 4h from the activation's pass),
        // output gradients 3h + h + h (fc1's 4h from the activation's backward)
        assert_eq!(cast_bytes_per_token(&recipe, one, 1.0), 4.0 * 8.0 * h);
        // GELU's tanh form has no fused fp8 MLP: all eight casts
        recipe.model.activation = Activation::GeluTanh;
        assert_eq!(cast_bytes_per_token(&recipe, one, 1.0), 4.0 * 16.0 * h);
        recipe.model.activation = Activation::Gelu;
        // 12h² parameters, two bytes of copies each, halved over two tensor ranks
        assert_eq!(weight_cast_bytes(&recipe, one, 2.0), 12.0 * h * h);
        assert_eq!(saved_input_delta_per_token(&recipe, true, 1.0), -5.0 * h);
    }

    #[test]
    fn fp8_experts_cast_their_routed_rows_and_copy_every_experts_weight() {
        let mut recipe = gpt3_175b();
        recipe.precision.fp8 = Fp8::Hybrid;
        recipe.model.num_layers = 4;
        recipe.model.moe = Some(
            serde_json::from_value(serde_json::json!({
                "num_experts": 8, "router_topk": 2, "layer_freq": 2, "ffn_hidden_size": 1024
            }))
            .expect("moe"),
        );
        let stage = stage(4);
        let without = fp8_layers(&recipe, &stage, true);
        assert_eq!(
            (without.all, without.dense, without.experts),
            (4.0, 2.0, 0.0)
        );
        recipe.precision.fp8_experts = true;
        let with = fp8_layers(&recipe, &stage, true);
        assert_eq!((with.dense, with.experts), (2.0, 2.0));
        assert_eq!(
            fp8_layers(&recipe, &stage, false).experts,
            0.0,
            "cut experts stay bf16"
        );
        let h = 12288.0;
        let (k, f) = (2.0, 1024.0);
        // fc1's and fc2's inputs (h, f) and output gradients (f, h) of k rows, 4 bytes each
        assert_eq!(
            cast_bytes_per_token(&recipe, with, 1.0) - cast_bytes_per_token(&recipe, without, 1.0),
            2.0 * 4.0 * k * (2.0 * h + 2.0 * f)
        );
        // two bytes for each of the 8 experts' 2·h·f weights, in both layers
        assert_eq!(
            weight_cast_bytes(&recipe, with, 1.0) - weight_cast_bytes(&recipe, without, 1.0),
            2.0 * 2.0 * 8.0 * 2.0 * h * f
        );
    }
}
