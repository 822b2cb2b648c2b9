//! The end of an fp8 optimizer step across ranks: the one fp8 piece that needs collectives.

use ferrotron_ops::Fp8State;
use ferrotron_ops::end_local_fp8_step;
use ferrotron_ops::fp8::scaling::Fp8Scaling;

use crate::{Comm, ParallelOps, ReduceOp};

/// Ends an optimizer step: amaxes max-reduced over `groups` (every rank of them then casts
/// with the same scales, so their states stay equal and a checkpoint holds one), the delayed
/// update, the step's weight casts dropped. `B` runs the kernels (the inner backend).
pub fn end_fp8_step<B: ParallelOps>(state: &Fp8State, groups: &[&Comm]) {
    if matches!(state.settings().scaling, Fp8Scaling::Delayed { .. }) {
        for comm in groups.iter().filter(|comm| comm.size() > 1) {
            state.update_tensor::<B>(|t| {
                *t = B::all_reduce_detached(t.clone(), ReduceOp::Max, comm);
            });
        }
    }
    end_local_fp8_step::<B>(state);
}
