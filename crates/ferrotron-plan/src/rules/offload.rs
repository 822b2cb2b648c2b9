//! The optimizer CPU offload moves optimizer state from a GPU to its host; a `cpu` rank's state
//! is in host memory already, so there it changes nothing, and the plan says so.

use ferrotron_recipe::GpuKind;

use super::Check;

pub(super) fn check(c: &mut Check<'_>) {
    if c.recipe.training.optimizer.optimizer_cpu_offload && c.gpu == Some(GpuKind::Cpu) {
        c.warning(
            "offload::cpu-ranks",
            "training.optimizer.optimizer_cpu_offload",
            "the optimizer CPU offload does nothing on cpu ranks: their optimizer state is in host memory already".to_owned(),
            "plan for a GPU cluster (cluster.gpu), or drop the key".to_owned(),
        );
    }
}

#[cfg(test)]
mod tests {
    use ferrotron_recipe::{Cluster, GpuKind};

    use crate::rules::test_support::{cluster, codes, only};
    use crate::testing::llama3_8b;

    #[test]
    fn offload_on_cpu_ranks_is_a_warning_and_on_gpus_nothing() {
        let mut recipe = llama3_8b();
        recipe.parallel.distributed_optimizer = true;
        recipe.training.optimizer.use_precision_aware_optimizer = true;
        recipe.training.optimizer.optimizer_cpu_offload = true;
        let cpu = Cluster {
            gpu: GpuKind::Cpu,
            ..cluster(1, 1)
        };
        let finding = only(&recipe, Some(&cpu), "offload::cpu-ranks");
        assert!(!finding.is_error());
        assert_eq!(finding.path, "training.optimizer.optimizer_cpu_offload");
        assert!(codes(&recipe, Some(&cluster(1, 1))).is_empty());
    }
}
