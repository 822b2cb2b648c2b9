//! Precision exclusions: fp8 needs bf16 master weights and fp8 tensor cores (MXFP8 needs
//! Blackwell), fp8 GEMM shapes must be multiples of 16 per shard, and a static loss scale only
//! means something for fp16.

use ferrotron_recipe::{Dtype, Fp8, Fp8Recipe, GpuKind};

use super::Check;
use crate::hardware::{GpuSpec, dtype_name, gpu_name};

pub(super) fn check(c: &mut Check<'_>) {
    let precision = c.recipe.precision.clone();
    if precision.loss_scale.is_some() && precision.dtype != Dtype::Fp16 {
        c.error(
            "precision::loss-scale-needs-fp16",
            "precision.loss_scale",
            format!(
                "loss_scale applies only to dtype fp16, not {}",
                dtype_name(precision.dtype)
            ),
            "remove loss_scale, or use dtype: fp16".to_owned(),
        );
    }
    if precision.fp8 == Fp8::None {
        return;
    }
    if precision.dtype != Dtype::Bf16 {
        c.error(
            "precision::fp8-needs-bf16",
            "precision.fp8",
            format!(
                "fp8 training needs dtype bf16 (it keeps bf16 weights and activations); dtype is {}",
                dtype_name(precision.dtype)
            ),
            "set precision.dtype: bf16, or fp8: none".to_owned(),
        );
    }
    if let Some(gpu) = c.gpu {
        if !GpuSpec::of(gpu).supports_fp8() {
            c.error(
                "precision::fp8-needs-hardware",
                "precision.fp8",
                format!("{} has no fp8 tensor cores", gpu_name(gpu)),
                "use fp8: none, or an h100/h200/b200 cluster".to_owned(),
            );
        } else if precision.fp8_recipe == Fp8Recipe::Mxfp8 && gpu != GpuKind::B200 {
            c.error(
                "precision::mxfp8-needs-blackwell",
                "precision.fp8_recipe",
                "fp8_recipe mxfp8 needs Blackwell (b200) tensor cores".to_owned(),
                "use fp8_recipe: delayed or tensorwise on Hopper".to_owned(),
            );
        }
    }
    let hidden = c.recipe.model.hidden_size;
    let ffn = c.recipe.model.ffn_hidden_size();
    let tp = c.open.tp.unwrap_or(1);
    if !hidden.is_multiple_of(16) || (ffn.is_multiple_of(tp) && !(ffn / tp).is_multiple_of(16)) {
        c.error(
            "precision::fp8-shapes",
            "precision.fp8",
            format!(
                "fp8 GEMMs need dimensions divisible by 16: hidden_size {hidden}, ffn_hidden_size / tensor = {}",
                ffn / tp.max(1)
            ),
            "use fp8: none, or sizes that are multiples of 16 per tensor shard".to_owned(),
        );
    }
    // multi-latent attention has no QKV projection of kv_channels; its own widths are checked
    // by the recipe's `mla::fp8-shapes`
    let head_dim = c.recipe.model.kv_channels();
    if c.recipe.model.mla.is_none() && !head_dim.is_multiple_of(16) {
        c.error(
            "precision::fp8-shapes",
            "model.kv_channels",
            format!("fp8 GEMMs need the QKV width divisible by 16: kv_channels {head_dim}"),
            "use fp8: none, or a head dimension that is a multiple of 16".to_owned(),
        );
    }
    // The weight gradient contracts over the tokens of a microbatch, so they count too.
    if let (Some(micro), Some(cp)) = (c.open.micro_batch_size, c.open.cp) {
        let tokens = u64::from(micro) * u64::from(c.recipe.model.seq_length) / u64::from(cp);
        if !tokens.is_multiple_of(16) {
            c.error(
                "precision::fp8-tokens",
                "training.micro_batch_size",
                format!(
                    "fp8 weight gradients contract over a microbatch's tokens, which must be \
                     divisible by 16: micro_batch_size × seq_length / context = {tokens}"
                ),
                "use fp8: none, or a micro batch and sequence length whose product (per context \
                 rank) is a multiple of 16"
                    .to_owned(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use ferrotron_recipe::{Cluster, Dtype, Fp8, Fp8Recipe, GpuKind};

    use crate::rules::test_support::{codes, only};
    use crate::testing::llama3_8b;

    #[test]
    fn multi_latent_attention_is_not_held_to_kv_channels() {
        let mut recipe = llama3_8b();
        recipe.precision.fp8 = Fp8::Hybrid;
        recipe.model.num_query_groups = None;
        // hidden 4096 over 73 heads: kv_channels 56, which MLA never reads
        recipe.model.num_attention_heads = 73;
        only(&recipe, None, "precision::fp8-shapes");
        recipe.model.mla = Some(ferrotron_recipe::Mla {
            q_lora_rank: Some(1536),
            kv_lora_rank: 512,
            qk_head_dim: 128,
            qk_pos_emb_head_dim: 64,
            v_head_dim: 128,
        });
        assert!(
            !codes(&recipe, None).contains(&"precision::fp8-shapes".to_owned()),
            "{:?}",
            codes(&recipe, None)
        );
    }

    #[test]
    fn fp8_exclusions() {
        let mut recipe = llama3_8b();
        recipe.precision.fp8 = Fp8::Hybrid;
        assert!(codes(&recipe, None).is_empty());
        recipe.precision.dtype = Dtype::Fp16;
        only(&recipe, None, "precision::fp8-needs-bf16");
        recipe.precision.dtype = Dtype::Bf16;
        let a100 = Cluster {
            nodes: 1,
            gpus_per_node: 8,
            gpu: GpuKind::A100,
        };
        let finding = only(&recipe, Some(&a100), "precision::fp8-needs-hardware");
        assert_eq!(finding.message, "A100 has no fp8 tensor cores");
        recipe.precision.fp8_recipe = Fp8Recipe::Mxfp8;
        let h100 = Cluster {
            gpu: GpuKind::H100,
            ..a100.clone()
        };
        only(&recipe, Some(&h100), "precision::mxfp8-needs-blackwell");
        let b200 = Cluster {
            gpu: GpuKind::B200,
            ..a100
        };
        assert!(codes(&recipe, Some(&b200)).is_empty());
        recipe.model.hidden_size = 4100;
        only(&recipe, None, "precision::fp8-shapes");
        recipe.model.hidden_size = 4096;
        recipe.model.kv_channels = Some(72);
        let finding = only(&recipe, None, "precision::fp8-shapes");
        assert_eq!(finding.path, "model.kv_channels");
        recipe.model.kv_channels = None;
        recipe.model.seq_length = 4100;
        recipe.training.micro_batch_size = ferrotron_recipe::Degree::Fixed(1);
        let finding = only(&recipe, None, "precision::fp8-tokens");
        assert_eq!(finding.path, "training.micro_batch_size");
    }

    #[test]
    fn loss_scale_is_fp16_only() {
        let mut recipe = llama3_8b();
        recipe.precision.loss_scale = Some(1024.0);
        only(&recipe, None, "precision::loss-scale-needs-fp16");
        recipe.precision.dtype = Dtype::Fp16;
        assert!(codes(&recipe, None).is_empty());
    }
}
