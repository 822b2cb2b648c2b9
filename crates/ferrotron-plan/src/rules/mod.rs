//! Megatron-Core's parallel-layout rules (`validate_args`, `TransformerConfig.__post_init__`,
//! `parallel_state.initialize_model_parallel`, the MoE router and pipeline split checks), each a
//! [`Finding`] at the key a user would edit, with a help text that names valid values.
//!
//! A rule whose inputs are still open (`auto`, or the world size when no cluster is known) is
//! skipped: the `auto` search runs the same rules on every fully fixed candidate.

mod grid;
mod model;
mod moe;
mod offload;
mod pipeline;
mod precision;
mod recompute;

use ferrotron_recipe::{Finding, GpuKind, Recipe};

use crate::layout::OpenLayout;

/// The recipe and the degrees the rules see, plus the findings collected so far.
pub(crate) struct Check<'a> {
    pub recipe: &'a Recipe,
    pub open: OpenLayout,
    pub gpu: Option<GpuKind>,
    pub findings: Vec<Finding>,
}

impl Check<'_> {
    pub(crate) fn error(&mut self, code: &str, path: &str, message: String, help: String) {
        self.findings
            .push(Finding::error(code, path, message).with_help(help));
    }

    pub(crate) fn warning(&mut self, code: &str, path: &str, message: String, help: String) {
        self.findings
            .push(Finding::warning(code, path, message).with_help(help));
    }

    /// Where the expert-tensor degree comes from: its own key, or `parallel.tensor` by default.
    pub(crate) fn etp_path(&self) -> &'static str {
        if self.recipe.parallel.expert_tensor.is_some() {
            "parallel.expert_tensor"
        } else {
            "parallel.tensor"
        }
    }
}

/// Every layout rule for `recipe` with the degrees in `open`, on `gpu` when known.
pub(crate) fn check(recipe: &Recipe, open: OpenLayout, gpu: Option<GpuKind>) -> Vec<Finding> {
    let mut check = Check {
        recipe,
        open,
        gpu,
        findings: Vec::new(),
    };
    if !positive_degrees(&mut check) {
        return check.findings;
    }
    grid::check(&mut check);
    model::check(&mut check);
    pipeline::check(&mut check);
    moe::check(&mut check);
    offload::check(&mut check);
    precision::check(&mut check);
    recompute::check(&mut check);
    check.findings
}

/// Every other rule divides by the degrees; a zero (possible only for recipes built in code,
/// the schema forbids it) is reported instead.
fn positive_degrees(c: &mut Check<'_>) -> bool {
    let o = c.open;
    let degrees = [
        (o.world, "cluster"),
        (o.tp, "parallel.tensor"),
        (o.pp, "parallel.pipeline"),
        (o.vpp, "parallel.virtual_pipeline"),
        (o.cp, "parallel.context"),
        (o.ep, "parallel.expert"),
        (o.etp, c.etp_path()),
        (o.dp, "parallel.data"),
        (o.micro_batch_size, "training.micro_batch_size"),
    ];
    let mut positive = true;
    for (value, path) in degrees {
        let reported = c.findings.iter().any(|f| f.path == path);
        if value == Some(0) && !reported {
            c.error(
                "layout::zero-degree",
                path,
                format!("{path} is 0"),
                "degrees and sizes start at 1".to_owned(),
            );
            positive = false;
        }
    }
    positive
}

#[cfg(test)]
pub(crate) mod test_support {
    use ferrotron_recipe::{Cluster, Finding, GpuKind, Recipe};

    use crate::layout::OpenLayout;

    pub(crate) fn cluster(nodes: u32, gpus_per_node: u32) -> Cluster {
        Cluster {
            nodes,
            gpus_per_node,
            gpu: GpuKind::H100,
        }
    }

    pub(crate) fn findings(recipe: &Recipe, cluster: Option<&Cluster>) -> Vec<Finding> {
        super::check(
            recipe,
            OpenLayout::from_recipe(recipe, cluster),
            cluster.map(|c| c.gpu),
        )
    }

    pub(crate) fn codes(recipe: &Recipe, cluster: Option<&Cluster>) -> Vec<String> {
        findings(recipe, cluster)
            .into_iter()
            .map(|f| f.code)
            .collect()
    }

    /// The single finding with `code`, panicking with all findings otherwise.
    pub(crate) fn only(recipe: &Recipe, cluster: Option<&Cluster>, code: &str) -> Finding {
        let all = findings(recipe, cluster);
        let mut hits: Vec<&Finding> = all.iter().filter(|f| f.code == code).collect();
        assert_eq!(hits.len(), 1, "expected one {code}, got {all:#?}");
        hits.remove(0).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{cluster, codes};
    use crate::testing::gpt2_small;

    #[test]
    fn zero_degrees_are_reported_not_divided_by() {
        let mut recipe = gpt2_small();
        recipe.parallel.tensor = ferrotron_recipe::Degree::Fixed(0);
        assert_eq!(
            codes(&recipe, Some(&cluster(1, 8))),
            vec!["layout::zero-degree"]
        );
    }
}
