//! Multi-latent attention rules (`model.mla`, Megatron's `--multi-latent-attention`). MLA has
//! its own query, key and value projections, so the switches of the fused grouped-query
//! projection do not apply to it: Megatron refuses query groups with it, it has no QKV bias,
//! it rotates a decoupled part of queries and keys (so it needs RoPE) and its core attention
//! has no sliding window here. The model refuses the same when it is built; these rules say it
//! first, at the key's line, with the fix. Its linears take fp8 GEMMs like the other layers'
//! (ferrotron-model's `crate::fp8`), so fp8 asks their widths to be multiples of 16.

use crate::{Finding, Fp8, PositionEmbedding, Recipe};

pub(super) fn check(recipe: &Recipe, out: &mut Vec<Finding>) {
    let m = &recipe.model;
    let Some(mla) = &m.mla else {
        return;
    };
    if m.position_embedding != PositionEmbedding::Rope {
        out.push(
            Finding::error(
                "mla::needs-rope",
                "model.position_embedding",
                "multi-latent attention rotates a decoupled part of each query and key, so it \
                 needs rotary position embeddings",
            )
            .with_help("set model.position_embedding: rope"),
        );
    }
    if let Some(groups) = m.num_query_groups
        && groups != m.num_attention_heads
    {
        out.push(
            Finding::error(
                "mla::no-query-groups",
                "model.num_query_groups",
                format!(
                    "multi-latent attention has no query groups (Megatron refuses \
                     --group-query-attention with it), got num_query_groups {groups}"
                ),
            )
            .with_help("remove model.num_query_groups: the key/value latent is already shared"),
        );
    }
    if m.add_qkv_bias {
        out.push(
            Finding::error(
                "mla::no-qkv-bias",
                "model.add_qkv_bias",
                "add_qkv_bias puts a bias on the fused QKV projection, which multi-latent \
                 attention does not have (its projections have no bias)",
            )
            .with_help("remove model.add_qkv_bias"),
        );
    }
    if !mla.qk_pos_emb_head_dim.is_multiple_of(2) {
        out.push(
            Finding::error(
                "mla::odd-rotary-dim",
                "model.mla.qk_pos_emb_head_dim",
                format!(
                    "rotary embeddings rotate pairs of channels, got qk_pos_emb_head_dim {}",
                    mla.qk_pos_emb_head_dim
                ),
            )
            .with_help(format!(
                "use an even size, e.g. qk_pos_emb_head_dim: {} (DeepSeek-V3 uses 64)",
                mla.qk_pos_emb_head_dim + 1
            )),
        );
    }
    if m.window_size.is_some() {
        out.push(
            Finding::error(
                "mla::no-window",
                "model.window_size",
                "multi-latent attention here attends to every earlier key: it has no sliding \
                 window",
            )
            .with_help("remove model.window_size"),
        );
    }
    if let Some(channels) = m.kv_channels {
        out.push(
            Finding::warning(
                "mla::kv-channels-unused",
                "model.kv_channels",
                format!(
                    "kv_channels {channels} is not read by multi-latent attention: its head \
                     sizes are model.mla.qk_head_dim, qk_pos_emb_head_dim and v_head_dim"
                ),
            )
            .with_help("remove model.kv_channels"),
        );
    }
    if recipe.precision.fp8 != Fp8::None {
        let widths = [
            ("q_lora_rank", mla.q_lora_rank.unwrap_or(16)),
            ("kv_lora_rank", mla.kv_lora_rank),
            (
                "kv_lora_rank + qk_pos_emb_head_dim",
                mla.kv_lora_rank + mla.qk_pos_emb_head_dim,
            ),
            ("qk_head_dim + qk_pos_emb_head_dim", mla.q_head_dim()),
            ("qk_head_dim + v_head_dim", mla.qk_head_dim + mla.v_head_dim),
            ("v_head_dim", mla.v_head_dim),
        ];
        let odd: Vec<String> = widths
            .iter()
            .filter(|(_, width)| !width.is_multiple_of(16))
            .map(|(name, width)| format!("{name} = {width}"))
            .collect();
        if !odd.is_empty() {
            out.push(
                Finding::error(
                    "mla::fp8-shapes",
                    "model.mla",
                    format!(
                        "fp8 GEMMs need the widths of multi-latent attention's projections (per \
                         head) divisible by 16: {}",
                        odd.join(", ")
                    ),
                )
                .with_help(
                    "use fp8: none, or MLA sizes that are multiples of 16 (DeepSeek-V3's are)",
                ),
            );
        }
    }
    if !m.qk_layernorm {
        out.push(
            Finding::warning(
                "mla::latents-without-norm",
                "model.qk_layernorm",
                "without qk_layernorm the query and key/value latents are not normalised; \
                 DeepSeek-V2 and V3 normalise both (q_a_layernorm, kv_a_layernorm)",
            )
            .with_help("set model.qk_layernorm: true (Megatron's --qk-layernorm)"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Mla;
    use crate::rules::fixture::{codes, recipe};

    fn run(recipe: &Recipe) -> Vec<Finding> {
        crate::rules::fixture::run(check, recipe)
    }

    fn mla_recipe() -> Recipe {
        let mut r = recipe();
        r.model.position_embedding = PositionEmbedding::Rope;
        r.model.qk_layernorm = true;
        r.model.mla = Some(Mla {
            q_lora_rank: Some(48),
            kv_lora_rank: 32,
            qk_head_dim: 16,
            qk_pos_emb_head_dim: 16,
            v_head_dim: 16,
        });
        r
    }

    #[test]
    fn a_deepseek_style_recipe_passes_and_grouped_attention_is_untouched() {
        assert!(run(&mla_recipe()).is_empty());
        let mut gqa = recipe();
        gqa.model.num_query_groups = Some(2);
        gqa.model.add_qkv_bias = true;
        assert!(run(&gqa).is_empty());
    }

    #[test]
    fn switches_of_the_fused_qkv_projection_are_refused_at_their_key() {
        let mut r = mla_recipe();
        r.model.position_embedding = PositionEmbedding::Learned;
        r.model.num_query_groups = Some(2);
        r.model.add_qkv_bias = true;
        r.model.window_size = Some([8, 0]);
        if let Some(mla) = r.model.mla.as_mut() {
            mla.qk_pos_emb_head_dim = 7;
        }
        let findings = run(&r);
        assert_eq!(
            codes(&findings),
            [
                "mla::needs-rope",
                "mla::no-query-groups",
                "mla::no-qkv-bias",
                "mla::odd-rotary-dim",
                "mla::no-window"
            ]
        );
        assert_eq!(findings[3].path, "model.mla.qk_pos_emb_head_dim");
        assert_eq!(
            findings[3].help.as_deref(),
            Some("use an even size, e.g. qk_pos_emb_head_dim: 8 (DeepSeek-V3 uses 64)")
        );
        // As many query groups as heads is multi-head attention: nothing to refuse.
        r = mla_recipe();
        r.model.num_query_groups = Some(r.model.num_attention_heads);
        assert!(run(&r).is_empty());
    }

    #[test]
    fn fp8_needs_projection_widths_of_multiples_of_16() {
        let mut r = mla_recipe();
        r.precision.fp8 = Fp8::Hybrid;
        assert!(run(&r).is_empty());
        if let Some(mla) = r.model.mla.as_mut() {
            mla.qk_pos_emb_head_dim = 4;
            mla.v_head_dim = 8;
        }
        let findings = run(&r);
        assert_eq!(codes(&findings), ["mla::fp8-shapes"]);
        assert_eq!(
            findings[0].message,
            "fp8 GEMMs need the widths of multi-latent attention's projections (per head) \
             divisible by 16: kv_lora_rank + qk_pos_emb_head_dim = 36, qk_head_dim + \
             qk_pos_emb_head_dim = 20, qk_head_dim + v_head_dim = 24, v_head_dim = 8"
        );
    }

    #[test]
    fn unread_kv_channels_and_missing_latent_norms_are_warnings() {
        let mut r = mla_recipe();
        r.model.kv_channels = Some(16);
        r.model.qk_layernorm = false;
        let findings = run(&r);
        assert_eq!(
            codes(&findings),
            ["mla::kv-channels-unused", "mla::latents-without-norm"]
        );
        assert!(findings.iter().all(|f| !f.is_error()));
    }
}
