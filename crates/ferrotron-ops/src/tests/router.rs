//! MoE routing as one op on burn-flex: the composed default against hand-computed decisions and
//! weights (ties, the group limit, the bias steering the selection only, the scaling), and the
//! autodiff node (reference backward) against the composed graph's logits gradient for every
//! score function.

use burn::backend::Flex;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};

use super::{B, assert_close, flat, tensor};
use crate::{FusedOps, GroupLimit, RouterScore, RouterSpec, moe_router, moe_router_node};

fn rows<const N: usize>(rows: &[[f32; N]]) -> Tensor<B, 2> {
    let flat: Vec<f32> = rows.iter().flatten().copied().collect();
    Tensor::from_data(TensorData::new(flat, [rows.len(), N]), &Default::default())
}

fn route(logits: Tensor<B, 2>, bias: Option<[f32; 4]>, spec: RouterSpec) -> (Vec<i64>, Vec<f32>) {
    let bias = bias.map(|b| Tensor::<B, 1>::from_floats(b, &Default::default()));
    let (chosen, weights) = moe_router(logits, bias, spec);
    (chosen.into_data().iter::<i64>().collect(), flat(weights))
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

#[test]
fn softmax_after_topk_weights_the_chosen_logits_and_ties_go_to_the_lower_expert() {
    let ln2 = 2.0f32.ln();
    let logits = rows(&[[0.0, 2.0, 1.0, ln2 + 1.0], [0.5, 0.5, 0.5, 0.1]]);
    let (chosen, weights) = route(
        logits,
        None,
        RouterSpec::plain(2, RouterScore::Softmax, false),
    );
    assert_eq!(chosen, [1, 3, 0, 1]);
    // softmax([2, ln2 + 1]): e² / (e² + 2e); the tie splits evenly.
    let e = std::f32::consts::E;
    let first = e * e / (e * e + 2.0 * e);
    assert_close(&weights, &[first, 1.0 - first, 0.5, 0.5], "weights");
}

#[test]
fn pre_softmax_weights_are_the_probabilities_over_all_experts_scaled() {
    let logits = rows(&[[0.0, 0.0, 3.0f32.ln(), 0.0]]);
    let scaled = RouterSpec {
        scaling_factor: 2.5,
        ..RouterSpec::plain(1, RouterScore::Softmax, true)
    };
    let (chosen, weights) = route(logits, None, scaled);
    assert_eq!(chosen, [2]);
    assert_close(&weights, &[0.5 * 2.5], "weights");
}

#[test]
fn the_bias_steers_sigmoid_selection_but_not_the_normalised_weights() {
    let logits = rows(&[[2.0, 0.0, -1.0, 1.0]]);
    let (chosen, weights) = route(
        logits,
        Some([0.0, 0.0, 5.0, 0.0]),
        RouterSpec::plain(2, RouterScore::Sigmoid, false),
    );
    assert_eq!(chosen, [2, 0]);
    let (s2, s0) = (sigmoid(-1.0), sigmoid(2.0));
    let total = s2 + s0 + 1e-20;
    assert_close(&weights, &[s2 / total, s0 / total], "weights");
    let (_, one) = route(
        rows(&[[2.0, 0.0, -1.0, 1.0]]),
        None,
        RouterSpec::plain(1, RouterScore::Sigmoid, false),
    );
    assert_close(&one, &[sigmoid(2.0)], "one expert: not normalised");
}

#[test]
fn a_group_limit_picks_only_inside_the_best_groups() {
    // Groups {0, 1} and {2, 3}: expert 0 is the best alone, but {2, 3} has the higher sum of
    // its best two.
    let limited = RouterSpec {
        group_limit: Some(GroupLimit {
            num_groups: 2,
            group_topk: 1,
        }),
        ..RouterSpec::plain(2, RouterScore::Softmax, false)
    };
    let (chosen, _) = route(rows(&[[0.9, 0.0, 0.8, 0.7]]), None, limited);
    assert_eq!(chosen, [2, 3]);
}

/// Weights and logits gradient of `Σ w ∘ weights` for `[6, 8]` logits, by the node
/// (`NODE`) or the composed graph.
fn run<const NODE: bool>(spec: RouterSpec, bias: bool) -> (Vec<i64>, Vec<f32>, Vec<f32>) {
    let logits = (tensor([6, 8], 0.3) * 2.0).require_grad();
    let bias = bias.then(|| tensor([8], 1.9).detach() * 0.1);
    let (chosen, weights) = if NODE {
        let routing = moe_router_node::<Flex, NoCheckpointing>(
            logits.clone().into_primitive().tensor(),
            bias.map(|b| b.into_primitive().tensor()),
            spec,
        );
        (
            Tensor::<B, 2, burn::tensor::Int>::from_primitive(routing.chosen),
            Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(routing.weights)),
        )
    } else {
        moe_router(logits.clone(), bias, spec)
    };
    let grads = (weights.clone() * tensor([6 * spec.topk], 1.3))
        .sum()
        .backward();
    (
        chosen.into_data().iter::<i64>().collect(),
        flat(weights),
        flat(logits.grad(&grads).expect("a logits gradient")),
    )
}

#[test]
fn router_node_equals_the_composed_graph_for_every_score_function() {
    assert!(!Flex::has_moe_router_kernel(
        &tensor([6, 8], 0.3).inner().into_primitive().tensor(),
        &RouterSpec::plain(2, RouterScore::Softmax, false),
    ));
    let limit = Some(GroupLimit {
        num_groups: 4,
        group_topk: 2,
    });
    let cases = [
        (RouterSpec::plain(3, RouterScore::Softmax, false), false),
        (RouterSpec::plain(1, RouterScore::Softmax, false), false),
        (RouterSpec::plain(2, RouterScore::Softmax, true), true),
        (RouterSpec::plain(1, RouterScore::Softmax, true), false),
        (RouterSpec::plain(4, RouterScore::Sigmoid, false), true),
        (RouterSpec::plain(1, RouterScore::Sigmoid, false), true),
    ];
    for (base, bias) in cases {
        for (group_limit, scaling_factor) in [(None, 1.0), (limit, 2.5)] {
            if group_limit.is_some() && base.topk % 2 != 0 {
                continue;
            }
            let spec = RouterSpec {
                group_limit,
                scaling_factor,
                ..base
            };
            let what = format!("{spec:?}, bias {bias}");
            let (node_chosen, node_weights, node_grad) = run::<true>(spec, bias);
            let (chosen, weights, grad) = run::<false>(spec, bias);
            assert_eq!(node_chosen, chosen, "{what}: decisions");
            assert_close(&node_weights, &weights, &format!("{what}: weights"));
            assert_close(&node_grad, &grad, &format!("{what}: logits gradient"));
            // one expert's softmax over itself is 1 whatever its logit
            let constant =
                spec.topk == 1 && spec.score == RouterScore::Softmax && !spec.pre_softmax;
            assert_eq!(
                grad.iter().any(|g| g.abs() > 1e-4),
                !constant,
                "{what}: gradient"
            );
        }
    }
}
