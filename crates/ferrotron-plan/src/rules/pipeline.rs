//! Splitting layers over pipeline stages and virtual stages (`get_num_layers_to_build`,
//! `get_transformer_layer_offset`, and the interleaved-schedule checks in `validate_args`).

use super::Check;
use crate::layout::{divisors, list};

const FIRST: &str = "parallel.num_layers_in_first_pipeline_stage";
const LAST: &str = "parallel.num_layers_in_last_pipeline_stage";

pub(super) fn check(c: &mut Check<'_>) {
    let Some(pp) = c.open.pp else { return };
    let Some(stage_layers) = stage_layer_counts(c, pp) else {
        return;
    };
    let Some(vpp) = c.open.vpp else { return };
    if vpp == 1 {
        return;
    }
    if pp <= 2 {
        c.error(
            "layout::interleaved-needs-pipeline",
            "parallel.virtual_pipeline",
            format!(
                "virtual_pipeline: {vpp} needs pipeline > 2 (with 2 stages the interleaved schedule sends twice between the same pair of ranks per batch); pipeline is {pp}"
            ),
            "use pipeline ≥ 3, or virtual_pipeline: 1".to_owned(),
        );
        return;
    }
    for (stage, layers) in stage_layers.iter().enumerate() {
        if layers % vpp != 0 {
            c.error(
                "layout::stage-layers-divisible-by-vpp",
                "parallel.virtual_pipeline",
                format!(
                    "pipeline stage {stage} holds {layers} layers, not divisible by virtual_pipeline: {vpp}"
                ),
                format!("valid virtual_pipeline: {}", list(&divisors(*layers))),
            );
            return;
        }
    }
    let (Some(mbs), Some(dp)) = (c.open.micro_batch_size, c.open.dp) else {
        return;
    };
    let gbs = c.recipe.training.global_batch_size;
    if !gbs.is_multiple_of(mbs * dp) {
        return;
    }
    let microbatches = gbs / (mbs * dp);
    if !microbatches.is_multiple_of(pp) {
        c.error(
            "layout::interleaved-microbatches-divisible-by-pp",
            "training.global_batch_size",
            format!(
                "the interleaved schedule needs the number of microbatches ({gbs} / ({mbs}×{dp}) = {microbatches}) to be divisible by pipeline: {pp}"
            ),
            format!(
                "use a global_batch_size that is a multiple of micro_batch_size × data × pipeline = {}",
                mbs * dp * pp
            ),
        );
    }
}

/// Layers (counting the embedding and loss as layers when asked) of every pipeline stage, or
/// `None` after reporting why the split is impossible.
fn stage_layer_counts(c: &mut Check<'_>, pp: u32) -> Option<Vec<u32>> {
    let p = &c.recipe.parallel;
    let layers = c.recipe.model.num_layers;
    let first = p.num_layers_in_first_pipeline_stage;
    let last = p.num_layers_in_last_pipeline_stage;
    let accounts =
        p.account_for_embedding_in_pipeline_split || p.account_for_loss_in_pipeline_split;
    if first.is_none() && last.is_none() {
        let extra = u32::from(p.account_for_embedding_in_pipeline_split)
            + u32::from(p.account_for_loss_in_pipeline_split);
        let total = layers + extra;
        if !total.is_multiple_of(pp) {
            let counted = if extra > 0 {
                format!(
                    "num_layers {layers} + {extra} (embedding/loss counted as layers) = {total}"
                )
            } else {
                format!("num_layers: {total}")
            };
            c.error(
                "layout::layers-divisible-by-pp",
                "parallel.pipeline",
                format!("pipeline: {pp} does not divide {counted}"),
                format!(
                    "valid: {}; or set num_layers_in_first_pipeline_stage / num_layers_in_last_pipeline_stage for an uneven split",
                    list(&divisors(total))
                ),
            );
            return None;
        }
        return Some(vec![total / pp; pp as usize]);
    }
    let key = if first.is_some() { FIRST } else { LAST };
    if accounts {
        c.error(
            "layout::uneven-split-with-accounting",
            key,
            "an uneven pipeline split cannot be combined with account_for_embedding/loss_in_pipeline_split".to_owned(),
            "choose one: the explicit first/last stage sizes, or the accounting flags".to_owned(),
        );
        return None;
    }
    let uneven = u32::from(first.is_some()) + u32::from(last.is_some());
    if pp < uneven.max(2) {
        c.error(
            "layout::uneven-split-needs-pipeline",
            key,
            format!("an uneven first/last stage needs pipeline > 1 (at least {uneven} stages); pipeline is {pp}"),
            "raise pipeline or remove the uneven stage sizes".to_owned(),
        );
        return None;
    }
    let (first_n, last_n) = (first.unwrap_or(0), last.unwrap_or(0));
    if first_n + last_n > layers {
        c.error(
            "layout::uneven-split-too-large",
            key,
            format!(
                "first and last stages hold {} layers, more than num_layers: {layers}",
                first_n + last_n
            ),
            format!("first + last must be at most {layers}"),
        );
        return None;
    }
    let middle_stages = pp - uneven;
    let rest = layers - first_n - last_n;
    let middle = if middle_stages == 0 {
        if rest != 0 {
            c.error(
                "layout::uneven-split-leaves-layers",
                key,
                format!("{rest} layers are left for no middle stage (pipeline: {pp})"),
                format!("first + last must equal num_layers: {layers} when pipeline is {pp}"),
            );
            return None;
        }
        0
    } else {
        if !rest.is_multiple_of(middle_stages) {
            let valid: Vec<u32> = (0..=layers - last_n)
                .filter(|f| (layers - f - last_n).is_multiple_of(middle_stages))
                .collect();
            c.error(
                "layout::uneven-split-middle-divisible",
                key,
                format!(
                    "the {rest} layers left for the {middle_stages} middle stages do not split evenly"
                ),
                if first.is_some() {
                    format!("valid num_layers_in_first_pipeline_stage here: {}", list(&valid))
                } else {
                    format!("num_layers - last ({rest}) must be divisible by {middle_stages}")
                },
            );
            return None;
        }
        rest / middle_stages
    };
    let mut counts = vec![middle; pp as usize];
    if let Some(f) = first {
        counts[0] = f;
    }
    if let Some(l) = last {
        counts[pp as usize - 1] = l;
    }
    Some(counts)
}

#[cfg(test)]
mod tests {
    use ferrotron_recipe::Degree;

    use crate::rules::test_support::{cluster, codes, only};
    use crate::testing::llama3_8b;

    #[test]
    fn layers_must_split_over_stages() {
        let mut recipe = llama3_8b();
        recipe.parallel.pipeline = Degree::Fixed(5);
        let finding = only(&recipe, None, "layout::layers-divisible-by-pp");
        assert!(
            finding
                .help
                .unwrap()
                .starts_with("valid: 1, 2, 4, 8, 16, 32")
        );
        recipe.parallel.pipeline = Degree::Fixed(4);
        assert!(codes(&recipe, None).is_empty());
    }

    #[test]
    fn embedding_and_loss_count_as_layers_when_asked() {
        let mut recipe = llama3_8b();
        recipe.model.num_layers = 30;
        recipe.parallel.pipeline = Degree::Fixed(4);
        only(&recipe, None, "layout::layers-divisible-by-pp");
        recipe.parallel.account_for_embedding_in_pipeline_split = true;
        recipe.parallel.account_for_loss_in_pipeline_split = true;
        assert!(codes(&recipe, None).is_empty(), "30 + 2 = 32 over 4 stages");
    }

    #[test]
    fn uneven_first_and_last_stages() {
        let mut recipe = llama3_8b();
        recipe.parallel.pipeline = Degree::Fixed(4);
        recipe.parallel.num_layers_in_first_pipeline_stage = Some(6);
        recipe.parallel.num_layers_in_last_pipeline_stage = Some(6);
        assert!(codes(&recipe, None).is_empty(), "6 + 10 + 10 + 6");
        recipe.parallel.num_layers_in_first_pipeline_stage = Some(7);
        let finding = only(&recipe, None, "layout::uneven-split-middle-divisible");
        assert!(finding.help.unwrap().contains("0, 2, 4, 6"));
        recipe.parallel.num_layers_in_first_pipeline_stage = Some(6);
        recipe.parallel.account_for_loss_in_pipeline_split = true;
        only(&recipe, None, "layout::uneven-split-with-accounting");
        recipe.parallel.account_for_loss_in_pipeline_split = false;
        recipe.parallel.pipeline = Degree::Fixed(1);
        only(&recipe, None, "layout::uneven-split-needs-pipeline");
    }

    #[test]
    fn uneven_stages_must_account_for_every_layer() {
        let mut recipe = llama3_8b();
        recipe.parallel.pipeline = Degree::Fixed(2);
        recipe.parallel.num_layers_in_first_pipeline_stage = Some(20);
        recipe.parallel.num_layers_in_last_pipeline_stage = Some(20);
        only(&recipe, None, "layout::uneven-split-too-large");
        recipe.parallel.num_layers_in_last_pipeline_stage = Some(10);
        // 2 stages, both explicit: 2 layers left for no middle stage.
        only(&recipe, None, "layout::uneven-split-leaves-layers");
        recipe.parallel.num_layers_in_last_pipeline_stage = Some(12);
        assert!(codes(&recipe, None).is_empty());
    }

    #[test]
    fn interleaving_needs_more_than_two_stages_and_divisible_chunks() {
        let mut recipe = llama3_8b();
        recipe.parallel.pipeline = Degree::Fixed(2);
        recipe.parallel.virtual_pipeline = Degree::Fixed(2);
        only(&recipe, None, "layout::interleaved-needs-pipeline");
        recipe.parallel.pipeline = Degree::Fixed(4);
        recipe.parallel.virtual_pipeline = Degree::Fixed(3);
        // 8 layers per stage, not divisible by 3
        let finding = only(&recipe, None, "layout::stage-layers-divisible-by-vpp");
        assert_eq!(
            finding.help.as_deref(),
            Some("valid virtual_pipeline: 1, 2, 4, 8")
        );
        recipe.parallel.virtual_pipeline = Degree::Fixed(4);
        assert!(codes(&recipe, None).is_empty());
    }

    #[test]
    fn interleaving_needs_microbatches_divisible_by_stages() {
        let mut recipe = llama3_8b();
        recipe.parallel.pipeline = Degree::Fixed(4);
        recipe.parallel.virtual_pipeline = Degree::Fixed(2);
        recipe.training.global_batch_size = 24;
        // 16 GPUs: dp = 4, microbatches = 24 / 4 = 6, not divisible by 4.
        only(
            &recipe,
            Some(&cluster(2, 8)),
            "layout::interleaved-microbatches-divisible-by-pp",
        );
        recipe.training.global_batch_size = 32;
        assert!(codes(&recipe, Some(&cluster(2, 8))).is_empty());
    }
}
