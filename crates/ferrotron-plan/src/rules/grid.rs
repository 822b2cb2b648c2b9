//! The rank grid: world = tp·pp·cp·dp for the dense part and etp·ep·pp·edp for the experts
//! (`parallel_state.initialize_model_parallel`), and the batch arithmetic
//! (`num_microbatches_calculator`).

use super::Check;
use crate::layout::{divisors, list};

pub(super) fn check(c: &mut Check<'_>) {
    dense_grid(c);
    expert_grid(c);
    batch(c);
    sequence(c);
    optimizer_instances(c);
}

/// `--num-distributed-optimizer-instances` (parallel_state: the intra-instance data-parallel
/// group is dp·cp / instances ranks) only means something with the distributed optimizer.
fn optimizer_instances(c: &mut Check<'_>) {
    let p = &c.recipe.parallel;
    let instances = p.distributed_optimizer_instances;
    if instances <= 1 {
        return;
    }
    if !p.distributed_optimizer {
        c.error(
            "layout::optimizer-instances-need-distributed-optimizer",
            "parallel.distributed_optimizer_instances",
            format!("distributed_optimizer_instances: {instances} needs the distributed optimizer"),
            "set parallel.distributed_optimizer: true, or distributed_optimizer_instances: 1"
                .to_owned(),
        );
        return;
    }
    let (Some(dp), Some(cp)) = (c.open.dp, c.open.cp) else {
        return;
    };
    let replicas = dp * cp;
    if replicas % instances != 0 {
        c.error(
            "layout::optimizer-instances-divide-dp-cp",
            "parallel.distributed_optimizer_instances",
            format!(
                "distributed_optimizer_instances: {instances} does not divide data × context = {dp}×{cp} = {replicas}"
            ),
            format!("valid: {}", list(&divisors(replicas))),
        );
    }
}

fn dense_grid(c: &mut Check<'_>) {
    let (Some(world), Some(tp), Some(pp), Some(cp)) =
        (c.open.world, c.open.tp, c.open.pp, c.open.cp)
    else {
        return;
    };
    let model_parallel = tp * pp * cp;
    if world % model_parallel != 0 {
        let path = largest_key(&[
            (tp, "parallel.tensor"),
            (pp, "parallel.pipeline"),
            (cp, "parallel.context"),
        ]);
        c.error(
            "layout::world-divisible-by-model-parallel",
            path,
            format!(
                "tensor × pipeline × context = {tp}×{pp}×{cp} = {model_parallel} does not divide the world size {world}"
            ),
            format!("tensor × pipeline × context must divide {world}; valid products: {}", list(&divisors(world))),
        );
        return;
    }
    let derived = world / model_parallel;
    if let Some(dp) = c.recipe.parallel.data.fixed()
        && dp != derived
    {
        c.error(
            "layout::data-parallel-mismatch",
            "parallel.data",
            format!(
                "data: {dp} but world {world} / (tensor × pipeline × context = {model_parallel}) = {derived}"
            ),
            format!("set data: {derived}, or data: auto"),
        );
    }
}

fn expert_grid(c: &mut Check<'_>) {
    let (Some(world), Some(etp), Some(ep), Some(pp)) =
        (c.open.world, c.open.etp, c.open.ep, c.open.pp)
    else {
        return;
    };
    // Without experts, the expert grid is the dense one: its failure is already reported.
    let dense = c.open.tp.unwrap_or(1) * c.open.cp.unwrap_or(1) * pp;
    if ep == 1 && world % dense != 0 {
        return;
    }
    let expert_model_parallel = etp * ep * pp;
    if world % expert_model_parallel != 0 {
        let base = etp * pp;
        let help = if world % base == 0 {
            format!(
                "valid expert degrees here: {}",
                list(&divisors(world / base))
            )
        } else {
            format!("expert_tensor × pipeline = {base} must itself divide {world}")
        };
        let path = if ep > 1 {
            "parallel.expert"
        } else {
            c.etp_path()
        };
        c.error(
            "layout::world-divisible-by-expert-grid",
            path,
            format!(
                "expert_tensor × expert × pipeline = {etp}×{ep}×{pp} = {expert_model_parallel} does not divide the world size {world}"
            ),
            help,
        );
    }
}

fn batch(c: &mut Check<'_>) {
    let gbs = c.recipe.training.global_batch_size;
    let (Some(mbs), Some(dp)) = (c.open.micro_batch_size, c.open.dp) else {
        return;
    };
    if !gbs.is_multiple_of(mbs * dp) {
        let valid: Vec<u32> = if gbs.is_multiple_of(dp) {
            divisors(gbs / dp)
        } else {
            Vec::new()
        };
        let help = if valid.is_empty() {
            format!(
                "global_batch_size must be a multiple of micro_batch_size × data = {}",
                mbs * dp
            )
        } else {
            format!(
                "valid micro_batch_size values for data {dp}: {}; or a global_batch_size that is a multiple of {}",
                list(&valid),
                mbs * dp
            )
        };
        c.error(
            "layout::global-batch-divisible",
            "training.global_batch_size",
            format!(
                "global_batch_size {gbs} is not divisible by micro_batch_size × data = {mbs}×{dp} = {}",
                mbs * dp
            ),
            help,
        );
    }
}

fn sequence(c: &mut Check<'_>) {
    let seq = c.recipe.model.seq_length;
    if let Some(cp) = c.open.cp
        && cp > 1
        && !seq.is_multiple_of(2 * cp)
    {
        let valid: Vec<u32> = divisors(seq)
            .into_iter()
            .filter(|d| seq.is_multiple_of(2 * d) || *d == 1)
            .collect();
        c.error(
            "layout::sequence-divisible-by-context",
            "parallel.context",
            format!(
                "seq_length {seq} is not divisible by 2 × context = {} (causal load balancing splits the sequence into 2·cp chunks)",
                2 * cp
            ),
            format!("valid context degrees: {}", list(&valid)),
        );
    }
    let sp = c.recipe.parallel.sequence_parallel;
    if let Some(tp) = c.open.tp {
        if sp && tp == 1 {
            c.warning(
                "layout::sequence-parallel-needs-tensor",
                "parallel.sequence_parallel",
                "sequence_parallel has no effect with tensor: 1 (Megatron disables it)".to_owned(),
                "remove sequence_parallel or raise tensor above 1".to_owned(),
            );
        }
        let cp = c.open.cp.unwrap_or(1);
        if sp && tp > 1 && seq.is_multiple_of(cp) && !(seq / cp).is_multiple_of(tp) {
            c.error(
                "layout::sequence-divisible-by-tensor",
                "parallel.tensor",
                format!(
                    "with sequence_parallel the local sequence seq_length / context = {} must be divisible by tensor: {tp}",
                    seq / cp
                ),
                format!("valid tensor degrees: {}", list(&divisors(seq / cp))),
            );
        }
    }
}

/// The key of the largest degree: the one a user most likely mistyped.
fn largest_key(degrees: &[(u32, &'static str)]) -> &'static str {
    degrees
        .iter()
        .max_by_key(|(value, _)| *value)
        .map_or("parallel", |(_, key)| key)
}

#[cfg(test)]
mod tests {
    use ferrotron_recipe::Degree;

    use crate::rules::test_support::{cluster, codes, only};
    use crate::testing::gpt2_small;

    #[test]
    fn optimizer_instances_need_the_distributed_optimizer_and_divide_dp_cp() {
        let mut recipe = gpt2_small();
        recipe.parallel.distributed_optimizer_instances = 2;
        only(
            &recipe,
            Some(&cluster(1, 8)),
            "layout::optimizer-instances-need-distributed-optimizer",
        );
        recipe.parallel.distributed_optimizer = true;
        assert!(codes(&recipe, Some(&cluster(1, 8))).is_empty());
        recipe.parallel.distributed_optimizer_instances = 3;
        let finding = only(
            &recipe,
            Some(&cluster(1, 8)),
            "layout::optimizer-instances-divide-dp-cp",
        );
        assert_eq!(finding.path, "parallel.distributed_optimizer_instances");
        assert_eq!(finding.help.as_deref(), Some("valid: 1, 2, 4, 8"));
    }

    #[test]
    fn world_must_be_divisible_by_model_parallel() {
        let mut recipe = gpt2_small();
        recipe.parallel.tensor = Degree::Fixed(3);
        let finding = only(
            &recipe,
            Some(&cluster(1, 8)),
            "layout::world-divisible-by-model-parallel",
        );
        assert_eq!(finding.path, "parallel.tensor");
        assert!(finding.help.unwrap().contains("1, 2, 4, 8"));
        recipe.parallel.tensor = Degree::Fixed(2);
        assert!(codes(&recipe, Some(&cluster(1, 8))).is_empty());
    }

    #[test]
    fn fixed_data_parallel_must_match_the_world() {
        let mut recipe = gpt2_small();
        recipe.parallel.tensor = Degree::Fixed(2);
        recipe.parallel.data = Degree::Fixed(8);
        let finding = only(
            &recipe,
            Some(&cluster(1, 8)),
            "layout::data-parallel-mismatch",
        );
        assert_eq!(finding.help.as_deref(), Some("set data: 4, or data: auto"));
        recipe.parallel.data = Degree::Fixed(4);
        assert!(codes(&recipe, Some(&cluster(1, 8))).is_empty());
        recipe.parallel.data = Degree::Fixed(8);
        assert!(codes(&recipe, None).is_empty(), "no world, no grid rule");
    }

    #[test]
    fn expert_grid_must_divide_the_world() {
        let mut recipe = crate::testing::mixtral_8x7b();
        recipe.parallel.pipeline = Degree::Fixed(2);
        recipe.parallel.expert = Degree::Fixed(8);
        // etp 1 · ep 8 · pp 2 = 16 does not divide 8.
        only(
            &recipe,
            Some(&cluster(1, 8)),
            "layout::world-divisible-by-expert-grid",
        );
        recipe.parallel.expert = Degree::Fixed(4);
        assert!(codes(&recipe, Some(&cluster(1, 8))).is_empty());
    }

    #[test]
    fn global_batch_must_split_into_microbatches() {
        let mut recipe = gpt2_small();
        recipe.training.micro_batch_size = Degree::Fixed(3);
        // gbs 32, dp 8: 32 % 24 != 0
        let finding = only(
            &recipe,
            Some(&cluster(1, 8)),
            "layout::global-batch-divisible",
        );
        assert!(finding.help.unwrap().contains("1, 2, 4"));
        recipe.training.micro_batch_size = Degree::Fixed(4);
        assert!(codes(&recipe, Some(&cluster(1, 8))).is_empty());
    }

    #[test]
    fn context_parallel_needs_two_chunks_per_rank() {
        let mut recipe = gpt2_small();
        recipe.model.seq_length = 1000;
        recipe.model.max_position_embeddings = Some(1000);
        recipe.parallel.context = Degree::Fixed(8);
        // 1000 % 16 != 0
        only(&recipe, None, "layout::sequence-divisible-by-context");
        recipe.parallel.context = Degree::Fixed(4);
        assert!(codes(&recipe, None).is_empty());
    }

    #[test]
    fn sequence_parallel_rules() {
        let mut recipe = gpt2_small();
        recipe.parallel.sequence_parallel = true;
        let warning = only(&recipe, None, "layout::sequence-parallel-needs-tensor");
        assert!(!warning.is_error());
        recipe.model.seq_length = 1020;
        recipe.parallel.tensor = Degree::Fixed(8);
        recipe.model.num_attention_heads = 8;
        recipe.model.hidden_size = 512;
        only(&recipe, None, "layout::sequence-divisible-by-tensor");
        recipe.parallel.tensor = Degree::Fixed(4);
        assert!(codes(&recipe, None).is_empty());
    }
}
