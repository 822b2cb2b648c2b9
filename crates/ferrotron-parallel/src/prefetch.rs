//! Waits the forward pass performs layer by layer: the distributed optimizer's parameter
//! all-gathers (Megatron's `overlap_param_gather`) are queued on the communication stream at the
//! end of a step, and the compute stream is ordered after a bucket's gather only when the next
//! forward reaches the first layer that reads it, so the gathers of later layers overlap the
//! forward of earlier ones.
//!
//! The waits are per thread, like the recompute tape: a rank is a thread on the CPU and a process
//! on the GPU, and a rank's next forward is on the thread that queued its gathers. A wait that no
//! forward reached is run by [`settle`], which the trainer calls before anything else reads the
//! parameters (evaluation, checkpoints, the next update).

use std::cell::RefCell;

use crate::ops::Wait;

thread_local! {
    static PENDING: RefCell<Vec<(usize, Wait)>> = const { RefCell::new(Vec::new()) };
}

/// Runs `wait` before layer `layer`'s forward starts (or at the next [`settle`]).
pub fn before_layer_run(layer: usize, wait: Wait) {
    PENDING.with(|pending| pending.borrow_mut().push((layer, wait)));
}

/// Called by the model as layer `layer`'s forward starts: runs every wait registered for it or
/// an earlier layer.
pub fn entering_layer(layer: usize) {
    let due: Vec<Wait> = PENDING.with(|pending| {
        let mut pending = pending.borrow_mut();
        if pending.is_empty() {
            return Vec::new();
        }
        let (due, later): (Vec<_>, Vec<_>) = pending.drain(..).partition(|(l, _)| *l <= layer);
        *pending = later;
        due.into_iter().map(|(_, wait)| wait).collect()
    });
    due.into_iter().for_each(|wait| wait());
}

/// Runs every wait still registered on this thread.
pub fn settle() {
    let all: Vec<(usize, Wait)> = PENDING.with(|pending| pending.borrow_mut().drain(..).collect());
    all.into_iter().for_each(|(_, wait)| wait());
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use super::*;

    #[test]
    fn waits_run_when_their_layer_is_reached_or_at_settle() {
        let ran = Rc::new(Cell::new(0u32));
        for layer in [2, 0, 5] {
            let ran = ran.clone();
            before_layer_run(layer, Box::new(move || ran.set(ran.get() | 1 << layer)));
        }
        entering_layer(1);
        assert_eq!(ran.get(), 0b1, "layer 0's wait only");
        entering_layer(3);
        assert_eq!(ran.get(), 0b101);
        settle();
        assert_eq!(ran.get(), 0b100101);
        settle();
        entering_layer(9);
        assert_eq!(ran.get(), 0b100101, "each wait runs once");
    }
}
