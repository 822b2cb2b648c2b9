//! Which validation samples each evaluation reads, as Megatron-LM reads them. Megatron builds
//! `(train_iters // eval_interval + 1) · eval_iters · global_batch` validation samples (one run
//! of `eval_iters` global batches per evaluation point: one per `eval_interval`, and the one
//! after training) and its validation iterator moves on, so no two evaluations share a batch.
//! Here the position is a function of the iteration alone, never a counter the loop keeps, so a
//! resumed run evaluates exactly the batches the uninterrupted one does (Megatron restores it the
//! same way, `consumed_valid_samples = iteration // eval_interval · eval_iters · global_batch`).
//!
//! The loop evaluates at every multiple of `eval_interval` and at the last iteration. The
//! evaluation at iteration `i` is number k = ⌈i / eval_interval⌉ − 1 = (i − 1) // eval_interval
//! and starts at sample k · eval_iters · global_batch:
//! - at i = j · eval_interval, k = j − 1: Megatron's j-th evaluation in its loop;
//! - at a last iteration T that is no multiple, k = T // eval_interval: Megatron's evaluation
//!   after training (the "+ 1" of its count);
//! - when T is a multiple, Megatron evaluates at T in its loop and once more after it on the next
//!   batches; the loop here evaluates once at T (k = T / eval_interval − 1) and the samples built
//!   for that extra point stay unread.
//!
//! The count is Megatron's even then: the validation split's epochs and shuffle depend on it.
//! `training.eval_batches: fixed` reads the first `eval_iters` global batches every time and
//! builds only those.

use ferrotron_recipe::{EvalBatches, Training};

/// Validation samples a run of `train_iters` iterations asks the data layer for (0 when it
/// does not evaluate).
pub(crate) fn valid_samples(training: &Training, train_iters: u64, global_batch: u32) -> u64 {
    if training.eval_interval == 0 {
        return 0;
    }
    let points = match training.eval_batches {
        EvalBatches::Advance => train_iters / training.eval_interval + 1,
        EvalBatches::Fixed => 1,
    };
    points * training.eval_iters * u64::from(global_batch)
}

/// The validation sample where the evaluation at `iteration` (a multiple of `eval_interval`, or
/// the last iteration; `eval_interval` > 0) starts.
pub(crate) fn eval_start(training: &Training, iteration: u64, global_batch: u32) -> u64 {
    match training.eval_batches {
        EvalBatches::Advance => {
            let k = iteration.saturating_sub(1) / training.eval_interval;
            k * training.eval_iters * u64::from(global_batch)
        }
        EvalBatches::Fixed => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn training(eval_interval: u64, eval_iters: u64, eval_batches: EvalBatches) -> Training {
        let mut training: Training = serde_json::from_value(serde_json::json!({
            "micro_batch_size": 1, "global_batch_size": 8, "train_iters": 10,
            "eval_interval": eval_interval, "eval_iters": eval_iters
        }))
        .expect("a training section");
        training.eval_batches = eval_batches;
        training
    }

    /// Megatron's evaluations of a run (`pretrain`): `(iteration, first sample)` of each, the
    /// validation iterator moving on by `eval_iters` global batches per evaluation; a resume at
    /// `resumed_at` restores its position from the iteration alone.
    fn megatron(
        interval: u64,
        eval_iters: u64,
        train_iters: u64,
        resumed_at: u64,
    ) -> Vec<(u64, u64)> {
        let span = eval_iters * 8;
        let mut consumed_valid = resumed_at / interval * span;
        let mut evaluations = Vec::new();
        for iteration in resumed_at + 1..=train_iters {
            if iteration % interval == 0 {
                evaluations.push((iteration, consumed_valid));
                consumed_valid += span;
            }
        }
        // after `train()` returns: once more, on the batches after the last ones
        evaluations.push((train_iters, consumed_valid));
        evaluations
    }

    #[test]
    fn each_evaluation_starts_where_megatrons_iterator_stands_and_none_overlap() {
        for (interval, eval_iters, train_iters) in [(2, 1, 10), (3, 2, 10), (5, 3, 5), (4, 1, 3)] {
            let t = training(interval, eval_iters, EvalBatches::Advance);
            let span = eval_iters * 8;
            for resumed_at in 0..train_iters {
                let mut expected = megatron(interval, eval_iters, train_iters, resumed_at);
                if train_iters % interval == 0 {
                    // one evaluation at the last iteration here: Megatron's in its loop
                    expected.pop();
                }
                let ours: Vec<(u64, u64)> = (resumed_at + 1..=train_iters)
                    .filter(|i| i % interval == 0 || *i == train_iters)
                    .map(|i| (i, eval_start(&t, i, 8)))
                    .collect();
                assert_eq!(
                    ours, expected,
                    "interval {interval}, resumed at {resumed_at}"
                );
                for pair in ours.windows(2) {
                    assert!(pair[0].1 + span <= pair[1].1, "{ours:?}");
                }
            }
            // Megatron's count, which covers every evaluation's samples
            let built = valid_samples(&t, train_iters, 8);
            assert_eq!(built, (train_iters / interval + 1) * span);
            let last = megatron(interval, eval_iters, train_iters, 0);
            assert!(last.iter().all(|&(_, start)| start + span <= built));
        }
    }

    #[test]
    fn fixed_batches_start_at_the_beginning_and_build_one_evaluation() {
        let t = training(2, 3, EvalBatches::Fixed);
        assert!((1..=10).all(|i| eval_start(&t, i, 8) == 0));
        assert_eq!(valid_samples(&t, 10, 8), 24);
        assert_eq!(
            valid_samples(&training(0, 3, EvalBatches::Advance), 10, 8),
            0
        );
    }
}
