//! The device exchange of pipeline layouts (`crate::step::per_chunk`): each bucket's reductions
//! started during a chunk's last backward as its layers' gradients become final
//! (`parallel.overlap_grad_reduce`) give the numbers of the reductions started after it bit for
//! bit — with interleaved chunks, ZeRO-1's parts and the tied embedding held until the schedule
//! is over, and with sequence parallelism's partial gradients summed over tp.

use serde_json::json;

use super::fixture::{Layout, losses_and_weights, options, plan, train_world, write_data};

fn run(
    layout: Layout,
    layers: u32,
    overlap: bool,
    extra: serde_json::Value,
) -> (Vec<f64>, Vec<(String, Vec<f32>)>) {
    let dir = tempfile::tempdir().expect("tempdir");
    write_data(dir.path());
    // one bucket per layer: each starts during the backward as its layer's gradients are final
    let mut settings = json!({"parallel": {"overlap_grad_reduce": overlap, "ddp_bucket_size": 1}});
    super::fixture::merge(&mut settings, extra);
    let plan = plan(dir.path(), layout, layers, 3, settings);
    losses_and_weights(train_world(&plan, &options(dir.path())).expect("the parallel run trains"))
}

#[test]
fn overlapped_chunk_reductions_give_the_after_schedule_numbers() {
    let interleaved_zero1 = Layout {
        tp: 1,
        pp: 4,
        vpp: 2,
        dp: 2,
        distributed_optimizer: true,
        ..Layout::default()
    };
    let tensor_pipeline = Layout {
        tp: 2,
        pp: 2,
        vpp: 1,
        dp: 1,
        ..Layout::default()
    };
    // four microbatches per data rank: the interleaved schedule takes multiples of pp
    let four_microbatches = json!({"training": {"global_batch_size": 16}});
    let sequence_parallel = json!({"parallel": {"sequence_parallel": true}});
    for (layout, layers, extra) in [
        (interleaved_zero1, 8, four_microbatches),
        (tensor_pipeline, 4, sequence_parallel),
    ] {
        let after = run(layout, layers, false, extra.clone());
        let overlapped = run(layout, layers, true, extra);
        assert_eq!(overlapped.0, after.0, "{layout:?}: losses");
        assert!(overlapped.1 == after.1, "{layout:?}: final weights differ");
    }
}
