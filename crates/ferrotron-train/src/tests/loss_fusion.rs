//! `runtime.cross_entropy_fusion_impl: linear` trains as the native loss does: the output layer
//! and the loss over chunks of rows change only rounding, tied and untied, on one rank and over
//! a pipeline (the loss on the last stage).

use serde_json::{Value, json};

use super::fixture::{
    Layout, assemble, max_weight_difference, options, plan, train_alone, train_world, write_data,
};
use super::{LOSS_TOLERANCE, WEIGHT_TOLERANCE};

fn check(layout: Layout, layers: u32, extra: Value) {
    let dir = tempfile::tempdir().expect("tempdir");
    write_data(dir.path());
    let run = |name: &str, fusion: &str| {
        let mut settings = extra.clone();
        settings["runtime"] = json!({"cross_entropy_fusion_impl": fusion});
        let plan = plan(dir.path(), layout, layers, 3, settings);
        let options = options(&dir.path().join(name));
        let outcomes = if layout.world() == 1 {
            vec![train_alone(&plan, &options).expect("the one-rank run trains")]
        } else {
            train_world(&plan, &options).expect("the parallel run trains")
        };
        let losses = outcomes
            .iter()
            .find(|o| !o.summary.losses.is_empty())
            .expect("a rank reports losses")
            .summary
            .losses
            .clone();
        (
            losses,
            assemble(outcomes.into_iter().flat_map(|o| o.params)),
        )
    };
    let (native, native_weights) = run("native", "native");
    let (linear, linear_weights) = run("linear", "linear");
    assert_eq!(native.len(), linear.len());
    for (step, (a, b)) in native.iter().zip(&linear).enumerate() {
        let relative = (a - b).abs() / a.abs().max(1e-12);
        assert!(
            relative <= LOSS_TOLERANCE,
            "{layout:?} {extra}: step {step} loss {a} vs {b}"
        );
    }
    let difference = max_weight_difference(&native_weights, &linear_weights);
    assert!(
        difference <= WEIGHT_TOLERANCE,
        "{layout:?} {extra}: weights differ by {difference}"
    );
}

#[test]
fn the_linear_loss_fusion_trains_as_the_native_loss() {
    check(Layout::alone(), 2, json!({}));
    check(
        Layout::alone(),
        2,
        json!({"model": {"tie_embeddings": false}}),
    );
    let pp2 = Layout {
        pp: 2,
        ..Layout::alone()
    };
    check(pp2, 4, json!({}));
}
