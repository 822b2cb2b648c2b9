//! The global gradient norm over every rank, each unique gradient element counted exactly once:
//! a tp-replicated parameter on tp rank 0 only, the tied embedding on the first stage only, a
//! replicated gradient on the first rank of its data-parallel group (or, with the distributed
//! optimizer, each rank's disjoint shard). The squares are summed in f64 and all-reduced over
//! tp, dp×cp and pp, whose product is the whole world, so every rank gets the same norm and
//! makes the same clipping (and stop) decision.

use ferrotron_parallel::{ParallelContext, ParamRole, ReduceOp};

use super::flat::FlatLayout;
use crate::TrainError;
use crate::error::comm_error;

/// Whether this rank counts `role`'s elements (`sharded`: each data-parallel rank holds a
/// disjoint shard of the reduced gradient rather than a full replica).
pub(super) fn counts_here(role: &ParamRole, ctx: &ParallelContext, sharded: bool) -> bool {
    if role.tp_duplicate && ctx.tp_rank() != 0 {
        return false;
    }
    if role.tied_embedding && !ctx.is_first_stage() {
        return false;
    }
    if sharded {
        return true;
    }
    if role.expert {
        ctx.edp_rank() == 0
    } else {
        ctx.dp_cp_rank() == 0
    }
}

/// Sum of squares this rank contributes from `values`: the full buffer of `layout`, or (when
/// `sharded`) this rank's shard of it.
pub(super) fn local_sum_of_squares(
    layout: &FlatLayout,
    values: &[f32],
    ctx: &ParallelContext,
    sharded: bool,
) -> f64 {
    let square = |xs: &[f32]| xs.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>();
    let counted = layout
        .slots
        .iter()
        .filter(|slot| counts_here(&slot.role, ctx, sharded));
    if !sharded {
        return counted.map(|slot| square(&values[slot.range()])).sum();
    }
    let parts = layout.shard_ranges();
    let mut total = 0.0;
    for slot in counted {
        let mut local = 0;
        for part in &parts {
            let start = slot.offset.max(part.start);
            let end = (slot.offset + slot.numel).min(part.end);
            if start < end {
                let at = local + start - part.start;
                total += square(&values[at..at + end - start]);
            }
            local += part.len();
        }
    }
    total
}

/// The L2 norm of the world's gradients from every rank's `local` sum of squares.
pub(super) fn global_norm(ctx: &ParallelContext, local: f64) -> Result<f64, TrainError> {
    let mut sum = [local];
    for comm in [&ctx.tp, &ctx.dp_cp, &ctx.pp] {
        if comm.size() > 1 {
            comm.all_reduce_f64(&mut sum, ReduceOp::Sum)
                .map_err(|e| comm_error("gradient-norm all-reduce", e))?;
        }
    }
    Ok(sum[0].sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::ParamId;
    use ferrotron_parallel::ShardSpec;

    #[test]
    fn a_shard_counts_only_its_own_elements() {
        let role = |name: &str| ParamRole::new(ParamId::new(), ShardSpec::full(name, vec![1]));
        let layout = FlatLayout::new(vec![(0, role("a"), 3), (0, role("b"), 3)], 4, 2, 1);
        // buckets: a (0..4 padded), b (4..8 padded to 4); part 1 holds 2..4 and 6..8
        let ctx = ParallelContext::single();
        let shard = [2.0, 0.0, 3.0, 0.0];
        assert_eq!(local_sum_of_squares(&layout, &shard, &ctx, true), 4.0 + 9.0);
        let full = [1.0, 1.0, 1.0, 0.0, 2.0, 2.0, 2.0, 0.0];
        assert_eq!(local_sum_of_squares(&layout, &full, &ctx, false), 15.0);
    }
}
