//! Parallel degrees, fixed or still open.
//!
//! The layout rules must run both on a recipe whose degrees may still be `auto` (from `recipe
//! validate`, where a rule whose inputs are open is simply skipped) and on each candidate of the
//! `auto` search (where everything is fixed). [`OpenLayout`] is the one shape both use, so there
//! is exactly one implementation of every rule.

pub use ferrotron_recipe::Degrees;
use ferrotron_recipe::{Cluster, Recipe};

/// A fully fixed layout: degrees and micro batch size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Layout {
    pub degrees: Degrees,
    pub micro_batch_size: u32,
}

impl Layout {
    /// Microbatches per data-parallel rank and iteration.
    pub(crate) fn num_microbatches(&self, global_batch_size: u32) -> u32 {
        global_batch_size / (self.micro_batch_size * self.degrees.dp)
    }
}

/// Degrees as far as they are known: `None` is `auto` (or not derivable yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct OpenLayout {
    pub world: Option<u32>,
    pub tp: Option<u32>,
    pub pp: Option<u32>,
    pub vpp: Option<u32>,
    pub cp: Option<u32>,
    pub ep: Option<u32>,
    pub etp: Option<u32>,
    pub dp: Option<u32>,
    pub micro_batch_size: Option<u32>,
}

impl OpenLayout {
    /// The degrees the recipe fixes; dp is derived when the world and tp, pp, cp are known.
    pub(crate) fn from_recipe(recipe: &Recipe, cluster: Option<&Cluster>) -> OpenLayout {
        let p = &recipe.parallel;
        let tp = p.tensor.fixed();
        let mut layout = OpenLayout {
            world: cluster.map(Cluster::world_size),
            tp,
            pp: p.pipeline.fixed(),
            vpp: p.virtual_pipeline.fixed(),
            cp: p.context.fixed(),
            ep: p.expert.fixed(),
            etp: match p.expert_tensor {
                Some(degree) => degree.fixed(),
                None => tp,
            },
            dp: p.data.fixed(),
            micro_batch_size: recipe.training.micro_batch_size.fixed(),
        };
        if layout.dp.is_none()
            && let (Some(world), Some(tp), Some(pp), Some(cp)) =
                (layout.world, layout.tp, layout.pp, layout.cp)
        {
            let model_parallel = tp * pp * cp;
            if model_parallel > 0 && world % model_parallel == 0 {
                layout.dp = Some(world / model_parallel);
            }
        }
        layout
    }

    /// The fixed layout's view for the rules.
    pub(crate) fn from_layout(layout: &Layout) -> OpenLayout {
        let d = layout.degrees;
        OpenLayout {
            world: Some(d.world_size()),
            tp: Some(d.tp),
            pp: Some(d.pp),
            vpp: Some(d.vpp),
            cp: Some(d.cp),
            ep: Some(d.ep),
            etp: Some(d.etp),
            dp: Some(d.dp),
            micro_batch_size: Some(layout.micro_batch_size),
        }
    }
}

/// Divisors of `n` in increasing order.
pub fn divisors(n: u32) -> Vec<u32> {
    let mut small = Vec::new();
    let mut large = Vec::new();
    let mut d = 1;
    while d * d <= n {
        if n.is_multiple_of(d) {
            small.push(d);
            if d * d != n {
                large.push(n / d);
            }
        }
        d += 1;
    }
    small.extend(large.into_iter().rev());
    small
}

/// `values` as "1, 2, 4" for a finding's help text (at most 12, then "…").
pub(crate) fn list(values: &[u32]) -> String {
    let mut shown: Vec<String> = values.iter().take(12).map(u32::to_string).collect();
    if values.len() > 12 {
        shown.push("…".to_owned());
    }
    shown.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::gpt2_small;
    use ferrotron_recipe::{Degree, GpuKind};

    #[test]
    fn divisors_are_sorted_and_complete() {
        assert_eq!(divisors(32), vec![1, 2, 4, 8, 16, 32]);
        assert_eq!(divisors(36), vec![1, 2, 3, 4, 6, 9, 12, 18, 36]);
        assert_eq!(divisors(1), vec![1]);
    }

    #[test]
    fn data_parallel_is_derived_from_the_world() {
        let mut recipe = gpt2_small();
        recipe.parallel.tensor = Degree::Fixed(2);
        let cluster = Cluster {
            nodes: 2,
            gpus_per_node: 8,
            gpu: GpuKind::H100,
        };
        let open = OpenLayout::from_recipe(&recipe, Some(&cluster));
        assert_eq!(open.dp, Some(8));
        assert_eq!(open.etp, Some(2), "expert tensor defaults to tensor");
        assert_eq!(OpenLayout::from_recipe(&recipe, None).dp, None);
    }
}
