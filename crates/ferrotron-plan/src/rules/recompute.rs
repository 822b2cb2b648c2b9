//! Activation recomputation options (`validate_args`): `method` and `num_layers` belong to full
//! recomputation, which needs both; block recomputation cannot exceed a stage's layers.

use ferrotron_recipe::{RecomputeGranularity, RecomputeMethod};

use super::Check;

pub(super) fn check(c: &mut Check<'_>) {
    let recompute = c.recipe.recompute.clone();
    if recompute.granularity != RecomputeGranularity::Full {
        if recompute.method.is_some() {
            c.error(
                "recompute::method-needs-full",
                "recompute.method",
                "recompute.method applies only to granularity: full".to_owned(),
                "remove method, or set granularity: full".to_owned(),
            );
        }
        if recompute.num_layers.is_some() {
            c.error(
                "recompute::num-layers-needs-full",
                "recompute.num_layers",
                "recompute.num_layers applies only to granularity: full".to_owned(),
                "remove num_layers, or set granularity: full".to_owned(),
            );
        }
        return;
    }
    let Some(method) = recompute.method else {
        c.error(
            "recompute::full-needs-method",
            "recompute.granularity",
            "granularity: full needs a method".to_owned(),
            "add method: uniform (checkpoint every num_layers layers) or block (recompute the first num_layers layers of each stage)".to_owned(),
        );
        return;
    };
    let Some(num_layers) = recompute.num_layers else {
        c.error(
            "recompute::full-needs-num-layers",
            "recompute.method",
            "granularity: full needs num_layers".to_owned(),
            "add num_layers (1 checkpoints every layer with method: uniform)".to_owned(),
        );
        return;
    };
    if method == RecomputeMethod::Block
        && let (Some(pp), Some(vpp)) = (c.open.pp, c.open.vpp)
    {
        let per_chunk = c.recipe.model.num_layers.div_ceil(pp * vpp);
        if num_layers > per_chunk {
            c.error(
                "recompute::block-exceeds-stage",
                "recompute.num_layers",
                format!(
                    "method: block recomputes num_layers: {num_layers} per stage chunk, but a chunk holds about {per_chunk} layers"
                ),
                format!("valid: 1 to {per_chunk}"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use ferrotron_recipe::{Degree, RecomputeGranularity, RecomputeMethod};

    use crate::rules::test_support::{codes, only};
    use crate::testing::llama3_8b;

    #[test]
    fn full_options_need_full_granularity() {
        let mut recipe = llama3_8b();
        recipe.recompute.granularity = RecomputeGranularity::Selective;
        recipe.recompute.method = Some(RecomputeMethod::Uniform);
        recipe.recompute.num_layers = Some(1);
        assert_eq!(
            codes(&recipe, None),
            vec![
                "recompute::method-needs-full",
                "recompute::num-layers-needs-full"
            ]
        );
        recipe.recompute.granularity = RecomputeGranularity::Full;
        assert!(codes(&recipe, None).is_empty());
    }

    #[test]
    fn full_needs_method_and_layers() {
        let mut recipe = llama3_8b();
        recipe.recompute.granularity = RecomputeGranularity::Full;
        only(&recipe, None, "recompute::full-needs-method");
        recipe.recompute.method = Some(RecomputeMethod::Block);
        only(&recipe, None, "recompute::full-needs-num-layers");
        recipe.recompute.num_layers = Some(9);
        recipe.parallel.pipeline = Degree::Fixed(4);
        only(&recipe, None, "recompute::block-exceeds-stage");
        recipe.recompute.num_layers = Some(8);
        assert!(codes(&recipe, None).is_empty());
    }
}
