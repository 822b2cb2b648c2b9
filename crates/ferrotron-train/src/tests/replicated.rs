//! Data parallelism with the whole model on every rank (`crate::step::replicas`): the gradient
//! reduction overlapped with the last microbatch's backward, bucket by bucket, gives the numbers
//! of the reduction after the backward bit for bit, with any bucket size, and so does ZeRO-1's
//! parameter all-gather waited for layer by layer in the next forward; each matches one rank
//! (`equivalence.rs`'s tolerances); and a non-finite loss still stops every rank.

use serde_json::{Value, json};

use super::fixture::{Layout, losses_and_weights, options, plan, train_world, write_data};
use crate::TrainError;
use crate::run::entry::RankOutcome;

fn dp2() -> Layout {
    Layout {
        tp: 1,
        pp: 1,
        vpp: 1,
        dp: 2,
        ..Layout::default()
    }
}

fn run(layers: u32, extra: Value) -> Vec<RankOutcome> {
    run_layout(dp2(), layers, extra)
}

fn run_layout(layout: Layout, layers: u32, extra: Value) -> Vec<RankOutcome> {
    let dir = tempfile::tempdir().expect("tempdir");
    write_data(dir.path());
    let plan = plan(dir.path(), layout, layers, 3, extra);
    train_world(&plan, &options(dir.path())).expect("the data-parallel run trains")
}

/// 3 layers, one bucket per layer (`ddp_bucket_size: 1`) and one for all of them: the same
/// bits as no overlap. (Without dropout: thread ranks share burn-flex's generator, so their
/// draws are not reproducible; `backward_tests.rs` shows cut layers draw the uncut masks.)
#[test]
fn overlapped_reduction_gives_the_reduction_after_backwards_numbers() {
    let settings = |overlap: bool, bucket: u64| json!({"parallel": {"overlap_grad_reduce": overlap, "ddp_bucket_size": bucket}});
    let after = losses_and_weights(run(3, settings(false, 40_000_000)));
    for bucket in [1, 40_000_000] {
        let overlapped = losses_and_weights(run(3, settings(true, bucket)));
        assert_eq!(overlapped.0, after.0, "losses, bucket size {bucket}");
        assert!(
            overlapped.1 == after.1,
            "final weights differ with bucket size {bucket}"
        );
    }
}

/// With recomputation the recomputed ranges are the backward's ranges; layers outside them
/// (`block` of 1 of 3 layers) are cut and kept.
#[test]
fn overlapped_reduction_with_recomputation_gives_the_same_numbers() {
    let settings = |overlap: bool| {
        json!({
            "recompute": {"granularity": "full", "method": "block", "num_layers": 1},
            "parallel": {"overlap_grad_reduce": overlap, "ddp_bucket_size": 1}
        })
    };
    let after = losses_and_weights(run(3, settings(false)));
    let overlapped = losses_and_weights(run(3, settings(true)));
    assert_eq!(overlapped.0, after.0);
    assert!(overlapped.1 == after.1, "final weights differ");
}

/// ZeRO-1 over 4 ranks (parts of every padded flat buffer), 3 layers, buckets of one layer:
/// overlapping the gradient reduce-scatter and the parameter all-gather changes nothing.
#[test]
fn distributed_optimizer_overlaps_give_the_same_numbers() {
    let dp4 = Layout { dp: 4, ..dp2() };
    let settings = |grad: bool, param: bool| {
        json!({
            "parallel": {
                "distributed_optimizer": true, "ddp_bucket_size": 1,
                "overlap_grad_reduce": grad, "overlap_param_gather": param
            }
        })
    };
    let none = losses_and_weights(run_layout(dp4, 3, settings(false, false)));
    for (grad, param) in [(true, false), (false, true), (true, true)] {
        let overlapped = losses_and_weights(run_layout(dp4, 3, settings(grad, param)));
        assert_eq!(
            overlapped.0, none.0,
            "losses, overlap grad {grad} param {param}"
        );
        assert!(
            overlapped.1 == none.1,
            "final weights differ, overlap grad {grad} param {param}"
        );
    }
}

/// Tensor parallelism (2, with sequence parallelism: its partial norm gradients summed over tp
/// before the data-parallel reduction, the replicated norms counted once in the clip norm)
/// under data parallelism (2): overlapping the reductions, with and without ZeRO-1, changes
/// nothing, the backward's tp collectives and the buckets' dp ones interleaving alike on
/// every rank.
#[test]
fn tensor_parallel_replicas_overlap_with_the_same_numbers() {
    let tp2_dp2 = Layout { tp: 2, ..dp2() };
    let settings = |overlap: bool, zero: bool| {
        json!({
            "parallel": {
                "sequence_parallel": true, "distributed_optimizer": zero, "ddp_bucket_size": 1,
                "overlap_grad_reduce": overlap, "overlap_param_gather": overlap && zero
            }
        })
    };
    for zero in [false, true] {
        let after = losses_and_weights(run_layout(tp2_dp2, 3, settings(false, zero)));
        let overlapped = losses_and_weights(run_layout(tp2_dp2, 3, settings(true, zero)));
        assert_eq!(overlapped.0, after.0, "losses, ZeRO-1 {zero}");
        assert!(
            overlapped.1 == after.1,
            "final weights differ, ZeRO-1 {zero}"
        );
    }
}

#[test]
fn a_non_finite_loss_stops_every_replicated_rank() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_data(dir.path());
    let exploding = plan(
        dir.path(),
        dp2(),
        2,
        4,
        json!({
            "training": {"optimizer": {"lr": 1e30}, "clip_grad": 0.0},
            "parallel": {"ddp_bucket_size": 1}
        }),
    );
    let err = train_world(&exploding, &options(dir.path())).expect_err("the loss explodes");
    assert!(matches!(err, TrainError::NonFinite { .. }), "{err:?}");
}
