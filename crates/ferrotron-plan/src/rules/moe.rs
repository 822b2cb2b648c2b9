//! Mixture-of-Experts layout and router rules (`validate_args` and `TransformerConfig`'s MoE
//! section, `TopKRouter`).

use ferrotron_recipe::{LoadBalancing, ScoreFunction};

use super::Check;
use crate::layout::{divisors, list};

pub(super) fn check(c: &mut Check<'_>) {
    let Some(moe) = c.recipe.model.moe.clone() else {
        if let Some(ep) = c.open.ep
            && ep > 1
        {
            c.error(
                "layout::expert-parallel-without-moe",
                "parallel.expert",
                format!("expert: {ep} but the model has no MoE layers"),
                "set expert: 1, or add model.moe".to_owned(),
            );
        }
        return;
    };
    let experts = moe.num_experts;
    if let Some(ep) = c.open.ep
        && experts % ep != 0
    {
        c.error(
            "layout::experts-divisible-by-ep",
            "parallel.expert",
            format!("expert: {ep} does not divide moe.num_experts: {experts}"),
            format!("valid: {}", list(&divisors(experts))),
        );
    }
    if let Some(tp) = c.open.tp
        && tp > 1
        && !c.recipe.parallel.sequence_parallel
    {
        c.error(
            "layout::moe-tensor-needs-sequence-parallel",
            "parallel.sequence_parallel",
            format!("MoE layers with tensor: {tp} need sequence_parallel (Megatron requires it)"),
            "set sequence_parallel: true".to_owned(),
        );
    }
    if moe.router_topk > experts {
        c.error(
            "moe::topk-exceeds-experts",
            "model.moe.router_topk",
            format!(
                "router_topk: {} exceeds num_experts: {experts}",
                moe.router_topk
            ),
            format!("valid: 1 to {experts}"),
        );
    }
    if moe.capacity_factor.is_some()
        && !matches!(
            moe.load_balancing,
            LoadBalancing::AuxLoss | LoadBalancing::SeqAuxLoss | LoadBalancing::None
        )
    {
        c.error(
            "moe::capacity-factor-load-balancing",
            "model.moe.capacity_factor",
            "capacity_factor works only with load_balancing aux_loss, seq_aux_loss or none"
                .to_owned(),
            "remove capacity_factor (dropless) or use load_balancing: aux_loss".to_owned(),
        );
    }
    if moe.pad_to_capacity && moe.capacity_factor.is_none() {
        c.error(
            "moe::pad-needs-capacity",
            "model.moe.pad_to_capacity",
            "pad_to_capacity needs a capacity_factor".to_owned(),
            "set capacity_factor (e.g. 1.0) or remove pad_to_capacity".to_owned(),
        );
    }
    if moe.expert_bias && moe.score_function != ScoreFunction::Sigmoid {
        c.error(
            "moe::expert-bias-needs-sigmoid",
            "model.moe.expert_bias",
            "expert_bias (aux-loss-free balancing) supports only score_function: sigmoid"
                .to_owned(),
            "set score_function: sigmoid, or remove expert_bias".to_owned(),
        );
    }
    if moe.router_topk == 1 && moe.score_function == ScoreFunction::Softmax && !moe.pre_softmax {
        c.error(
            "moe::top1-softmax-needs-pre-softmax",
            "model.moe.pre_softmax",
            "router_topk: 1 with softmax scores needs pre_softmax (a softmax over one score is always 1)".to_owned(),
            "set pre_softmax: true".to_owned(),
        );
    }
    group_limited_routing(c, &moe);
}

fn group_limited_routing(c: &mut Check<'_>, moe: &ferrotron_recipe::Moe) {
    let experts = moe.num_experts;
    match (moe.num_groups, moe.group_topk) {
        (None, None) => {}
        (Some(_), None) => c.error(
            "moe::group-topk-missing",
            "model.moe.num_groups",
            "num_groups needs group_topk (groups selected per token)".to_owned(),
            "add group_topk, or remove num_groups".to_owned(),
        ),
        (None, Some(_)) => c.error(
            "moe::num-groups-missing",
            "model.moe.group_topk",
            "group_topk needs num_groups".to_owned(),
            format!(
                "add num_groups (a divisor of num_experts: {})",
                list(&divisors(experts))
            ),
        ),
        (Some(groups), Some(group_topk)) => {
            if !experts.is_multiple_of(groups) {
                c.error(
                    "moe::experts-divisible-by-groups",
                    "model.moe.num_groups",
                    format!("num_groups: {groups} does not divide num_experts: {experts}"),
                    format!("valid: {}", list(&divisors(experts))),
                );
                return;
            }
            if group_topk > groups {
                c.error(
                    "moe::group-topk-exceeds-groups",
                    "model.moe.group_topk",
                    format!("group_topk: {group_topk} exceeds num_groups: {groups}"),
                    format!("valid: 1 to {groups}"),
                );
                return;
            }
            let reachable = group_topk * (experts / groups);
            if moe.router_topk > reachable {
                c.error(
                    "moe::topk-exceeds-selected-groups",
                    "model.moe.router_topk",
                    format!(
                        "router_topk: {} exceeds the {reachable} experts in the {group_topk} selected groups",
                        moe.router_topk
                    ),
                    format!("router_topk at most {reachable}, or raise group_topk"),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use ferrotron_recipe::{Degree, LoadBalancing, ScoreFunction};

    use crate::rules::test_support::{codes, only};
    use crate::testing::{llama3_8b, mixtral_8x7b};

    #[test]
    fn experts_must_split_over_expert_ranks() {
        let mut recipe = mixtral_8x7b();
        recipe.parallel.expert = Degree::Fixed(3);
        let finding = only(&recipe, None, "layout::experts-divisible-by-ep");
        assert_eq!(finding.help.as_deref(), Some("valid: 1, 2, 4, 8"));
        recipe.parallel.expert = Degree::Fixed(8);
        assert!(codes(&recipe, None).is_empty());
    }

    #[test]
    fn expert_parallel_needs_moe() {
        let mut recipe = llama3_8b();
        recipe.parallel.expert = Degree::Fixed(2);
        only(&recipe, None, "layout::expert-parallel-without-moe");
    }

    #[test]
    fn moe_with_tensor_parallel_needs_sequence_parallel() {
        let mut recipe = mixtral_8x7b();
        recipe.parallel.tensor = Degree::Fixed(2);
        only(&recipe, None, "layout::moe-tensor-needs-sequence-parallel");
        recipe.parallel.sequence_parallel = true;
        assert!(codes(&recipe, None).is_empty());
    }

    #[test]
    fn router_option_combinations() {
        let mut recipe = mixtral_8x7b();
        let moe = recipe.model.moe.as_mut().unwrap();
        moe.capacity_factor = Some(1.25);
        moe.load_balancing = LoadBalancing::Sinkhorn;
        moe.expert_bias = true;
        moe.router_topk = 1;
        let found = codes(&recipe, None);
        assert_eq!(
            found,
            vec![
                "moe::capacity-factor-load-balancing",
                "moe::expert-bias-needs-sigmoid",
                "moe::top1-softmax-needs-pre-softmax"
            ]
        );
        let moe = recipe.model.moe.as_mut().unwrap();
        moe.load_balancing = LoadBalancing::AuxLoss;
        moe.score_function = ScoreFunction::Sigmoid;
        assert!(codes(&recipe, None).is_empty());
        let moe = recipe.model.moe.as_mut().unwrap();
        moe.capacity_factor = None;
        moe.pad_to_capacity = true;
        only(&recipe, None, "moe::pad-needs-capacity");
    }

    #[test]
    fn group_limited_routing_arithmetic() {
        let mut recipe = mixtral_8x7b();
        let moe = recipe.model.moe.as_mut().unwrap();
        moe.num_experts = 64;
        moe.router_topk = 8;
        moe.num_groups = Some(8);
        moe.group_topk = Some(1);
        // one group of 8 experts: top-8 fits exactly.
        assert!(codes(&recipe, None).is_empty());
        recipe.model.moe.as_mut().unwrap().router_topk = 9;
        only(&recipe, None, "moe::topk-exceeds-selected-groups");
        let moe = recipe.model.moe.as_mut().unwrap();
        moe.router_topk = 8;
        moe.num_groups = Some(6);
        only(&recipe, None, "moe::experts-divisible-by-groups");
        let moe = recipe.model.moe.as_mut().unwrap();
        moe.num_groups = Some(8);
        moe.group_topk = Some(9);
        only(&recipe, None, "moe::group-topk-exceeds-groups");
        let moe = recipe.model.moe.as_mut().unwrap();
        moe.num_groups = None;
        only(&recipe, None, "moe::num-groups-missing");
    }
}
