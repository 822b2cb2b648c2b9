//! Tensor-parallel sharding of the model's dimensions (`TransformerConfig.__post_init__`):
//! attention heads, key/value groups and FFN columns are split over tp ranks, experts' FFN
//! columns over etp ranks. The linear cross-entropy fusion computes the loss over a whole
//! vocabulary, so it takes one tensor rank.

use ferrotron_recipe::{CrossEntropyFusionImpl, Model};

use super::Check;
use crate::layout::{divisors, list};

/// Tensor degrees every tensor-parallel rule accepts: they divide the heads and the FFN sizes
/// and divide (or are divided by) the key/value groups.
fn valid_tensor(model: &Model) -> Vec<u32> {
    let groups = model.num_query_groups();
    let ffn = model.ffn_hidden_size();
    let shared = model
        .moe
        .as_ref()
        .and_then(|m| m.shared_expert_ffn_hidden_size);
    divisors(model.num_attention_heads)
        .into_iter()
        .filter(|t| {
            ffn.is_multiple_of(*t)
                && (groups.is_multiple_of(*t) || t.is_multiple_of(groups))
                && shared.is_none_or(|s| s.is_multiple_of(*t))
        })
        .collect()
}

pub(super) fn check(c: &mut Check<'_>) {
    let model = &c.recipe.model;
    let heads = model.num_attention_heads;
    let groups = model.num_query_groups();
    let ffn = model.ffn_hidden_size();
    if let Some(tp) = c.open.tp {
        let valid = list(&valid_tensor(model));
        if !heads.is_multiple_of(tp) {
            c.error(
                "layout::heads-divisible-by-tp",
                "parallel.tensor",
                format!("tensor: {tp} does not divide num_attention_heads: {heads}"),
                format!("valid: {valid}"),
            );
        } else if !groups.is_multiple_of(tp) && tp % groups != 0 {
            c.error(
                "layout::query-groups-vs-tp",
                "parallel.tensor",
                format!(
                    "tensor: {tp} and num_query_groups: {groups} must divide one another (key/value heads are split or replicated over tensor ranks)"
                ),
                format!("valid: {valid}"),
            );
        }
        if !ffn.is_multiple_of(tp) {
            c.error(
                "layout::ffn-divisible-by-tp",
                "parallel.tensor",
                format!("tensor: {tp} does not divide ffn_hidden_size: {ffn}"),
                format!("valid: {valid}"),
            );
        }
        if let Some(shared) = model
            .moe
            .as_ref()
            .and_then(|m| m.shared_expert_ffn_hidden_size)
            && shared % tp != 0
        {
            c.error(
                "layout::shared-expert-ffn-divisible-by-tp",
                "parallel.tensor",
                format!("tensor: {tp} does not divide moe.shared_expert_ffn_hidden_size: {shared}"),
                format!("valid: {valid}"),
            );
        }
    }
    if let Some(tp) = c.open.tp
        && tp > 1
        && c.recipe.runtime.cross_entropy_fusion_impl == CrossEntropyFusionImpl::Linear
    {
        c.error(
            "layout::linear-loss-needs-one-tensor-rank",
            "runtime.cross_entropy_fusion_impl",
            format!(
                "cross_entropy_fusion_impl: linear computes the loss over a whole vocabulary; with tensor: {tp} the vocabulary is split over ranks"
            ),
            "set runtime.cross_entropy_fusion_impl: native, or parallel.tensor: 1".to_owned(),
        );
    }
    if let (Some(moe), Some(etp)) = (&model.moe, c.open.etp) {
        let expert_ffn = moe.expert_ffn_hidden_size(model);
        if expert_ffn % etp != 0 {
            let path = c.etp_path();
            c.error(
                "layout::expert-ffn-divisible-by-etp",
                path,
                format!("expert tensor degree {etp} does not divide the expert ffn_hidden_size {expert_ffn}"),
                format!("valid expert_tensor: {}", list(&divisors(expert_ffn))),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use ferrotron_recipe::Degree;

    use crate::rules::test_support::{codes, only};
    use crate::testing::{gpt2_small, llama3_8b, mixtral_8x7b};

    #[test]
    fn heads_must_split_over_tensor_ranks() {
        let mut recipe = llama3_8b();
        recipe.parallel.tensor = Degree::Fixed(3);
        let finding = only(&recipe, None, "layout::heads-divisible-by-tp");
        assert_eq!(
            finding.message,
            "tensor: 3 does not divide num_attention_heads: 32"
        );
        assert_eq!(finding.help.as_deref(), Some("valid: 1, 2, 4, 8, 16, 32"));
        assert_eq!(finding.path, "parallel.tensor");
    }

    #[test]
    fn the_linear_loss_fusion_needs_one_tensor_rank() {
        let mut recipe = llama3_8b();
        recipe.runtime.cross_entropy_fusion_impl = ferrotron_recipe::CrossEntropyFusionImpl::Linear;
        recipe.parallel.tensor = Degree::Fixed(1);
        assert!(codes(&recipe, None).is_empty());
        recipe.parallel.tensor = Degree::Fixed(2);
        let finding = only(&recipe, None, "layout::linear-loss-needs-one-tensor-rank");
        assert_eq!(finding.path, "runtime.cross_entropy_fusion_impl");
        recipe.runtime.cross_entropy_fusion_impl = ferrotron_recipe::CrossEntropyFusionImpl::Native;
        assert!(codes(&recipe, None).is_empty());
    }

    #[test]
    fn query_groups_and_tensor_must_divide_one_another() {
        let mut recipe = llama3_8b();
        recipe.model.num_query_groups = Some(4);
        recipe.parallel.tensor = Degree::Fixed(8);
        assert!(
            codes(&recipe, None).is_empty(),
            "8 % 4 == 0: groups replicated"
        );
        recipe.model.num_query_groups = Some(8);
        recipe.parallel.tensor = Degree::Fixed(16);
        recipe.model.ffn_hidden_size = Some(14336);
        assert!(codes(&recipe, None).is_empty(), "16 % 8 == 0");
        recipe.model.num_attention_heads = 24;
        recipe.model.num_query_groups = Some(6);
        recipe.parallel.tensor = Degree::Fixed(4);
        recipe.model.kv_channels = Some(128);
        recipe.model.ffn_hidden_size = Some(14400);
        let finding = only(&recipe, None, "layout::query-groups-vs-tp");
        assert_eq!(finding.help.as_deref(), Some("valid: 1, 2, 3, 6, 12, 24"));
    }

    #[test]
    fn ffn_must_split_over_tensor_ranks() {
        let mut recipe = gpt2_small();
        recipe.model.ffn_hidden_size = Some(3004);
        recipe.parallel.tensor = Degree::Fixed(12);
        // 12 heads % 12 == 0 but 3004 % 12 != 0
        only(&recipe, None, "layout::ffn-divisible-by-tp");
    }

    #[test]
    fn expert_ffn_must_split_over_expert_tensor_ranks() {
        let mut recipe = mixtral_8x7b();
        recipe.model.moe.as_mut().unwrap().ffn_hidden_size = Some(1000);
        recipe.parallel.expert_tensor = Some(Degree::Fixed(16));
        let finding = only(&recipe, None, "layout::expert-ffn-divisible-by-etp");
        assert_eq!(finding.path, "parallel.expert_tensor");
        recipe.parallel.expert_tensor = Some(Degree::Fixed(8));
        assert!(codes(&recipe, None).is_empty());
    }
}
