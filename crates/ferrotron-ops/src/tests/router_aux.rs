//! The router's balancing and z-loss terms as one op on burn-flex: the composed default against
//! hand-computed masses, counts and log-sum-exps, and the autodiff node (reference kernels)
//! against the composed graph's logits gradient, softmax and sigmoid, one group or several,
//! with the log-sum-exps or alone.

use burn::backend::Flex;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};

use super::{B, assert_close, flat, tensor};
use crate::{
    BalancingSpec, FusedOps, RouterAuxSpec, RouterAuxTerms, RouterScore, moe_router_aux,
    moe_router_aux_node,
};

fn balancing(score: RouterScore, tokens_per_group: usize, count: bool) -> Option<BalancingSpec> {
    Some(BalancingSpec {
        score,
        tokens_per_group,
        count_topk: count.then_some(1),
    })
}

#[test]
fn terms_match_the_hand_computed_values() {
    // Softmax rows [1/2, 1/6, 1/6, 1/6] and [1/6, 1/2, 1/6, 1/6]; top-1 picks 0 and 1; each
    // row's log-sum-exp is ln(3 + 3).
    let ln3 = 3.0f32.ln();
    let logits = Tensor::<B, 2>::from_data(
        TensorData::new(vec![ln3, 0.0, 0.0, 0.0, 0.0, ln3, 0.0, 0.0], [2, 4]),
        &Default::default(),
    );
    let spec = |tokens_per_group| RouterAuxSpec {
        balancing: balancing(RouterScore::Softmax, tokens_per_group, true),
        log_sum_exp: true,
    };
    let whole = moe_router_aux(logits.clone(), spec(2));
    let third = 1.0 / 3.0;
    let sixth = 1.0 / 6.0;
    assert_close(
        &flat(whole.probability_mass.expect("mass")),
        &[2.0 * third, 2.0 * third, third, third],
        "mass",
    );
    assert_eq!(
        flat(whole.topk_counts.expect("counts")),
        [1.0, 1.0, 0.0, 0.0]
    );
    let ln6 = 6.0f32.ln();
    assert_close(&flat(whole.log_sum_exp.expect("lse")), &[ln6, ln6], "lse");

    let per_token = moe_router_aux(logits, spec(1));
    assert_close(
        &flat(per_token.probability_mass.expect("mass")),
        &[0.5, sixth, sixth, sixth, sixth, 0.5, sixth, sixth],
        "mass per token",
    );
    assert_eq!(
        flat(per_token.topk_counts.expect("counts")),
        [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    );
}

#[test]
fn sigmoid_mass_is_the_normalised_sigmoids_and_nothing_else_is_asked() {
    let logits = Tensor::<B, 2>::from_data(
        TensorData::new(vec![0.0f32, 2.0], [1, 2]),
        &Default::default(),
    );
    let terms = moe_router_aux(
        logits,
        RouterAuxSpec {
            balancing: balancing(RouterScore::Sigmoid, 1, false),
            log_sum_exp: false,
        },
    );
    let s = 1.0 / (1.0 + (-2.0f32).exp());
    let total = 0.5 + s + 1e-20;
    assert_close(
        &flat(terms.probability_mass.expect("mass")),
        &[0.5 / total, s / total],
        "mass",
    );
    assert!(terms.topk_counts.is_none() && terms.log_sum_exp.is_none());
}

/// The terms and the logits gradient of `Σ a ∘ mass + Σ b ∘ lse` for `[8, 6]` logits, by the
/// node (`NODE`) or the composed graph: `[mass, counts, lse, gradient]`.
fn run<const NODE: bool>(spec: RouterAuxSpec) -> [Vec<f32>; 4] {
    let logits = (tensor([8, 6], 0.8) * 3.0).require_grad();
    let terms = if NODE {
        let aux = moe_router_aux_node::<Flex, NoCheckpointing>(
            logits.clone().into_primitive().tensor(),
            spec,
        );
        let float = |x| TensorPrimitive::Float(x);
        RouterAuxTerms {
            probability_mass: aux
                .probability_mass
                .map(|x| Tensor::from_primitive(float(x))),
            topk_counts: aux.topk_counts.map(|x| Tensor::from_primitive(float(x))),
            log_sum_exp: aux.log_sum_exp.map(|x| Tensor::from_primitive(float(x))),
        }
    } else {
        moe_router_aux(logits.clone(), spec)
    };
    let mut loss = Tensor::<B, 1>::zeros([1], &Default::default());
    let mut out: [Vec<f32>; 4] = Default::default();
    if let Some(mass) = terms.probability_mass {
        let weighting = tensor(mass.dims(), 1.4);
        loss = loss + (mass.clone() * weighting).sum();
        out[0] = flat(mass);
    }
    if let Some(counts) = terms.topk_counts {
        out[1] = flat(counts);
    }
    if let Some(lse) = terms.log_sum_exp {
        loss = loss + (lse.clone() * tensor([8], 2.2)).sum();
        out[2] = flat(lse);
    }
    let grads = loss.backward();
    out[3] = flat(logits.grad(&grads).expect("a logits gradient"));
    out
}

#[test]
fn aux_node_equals_the_composed_graph() {
    assert!(!Flex::has_moe_router_aux_kernel(
        &tensor([8, 6], 0.8).inner().into_primitive().tensor(),
        &RouterAuxSpec {
            balancing: None,
            log_sum_exp: true,
        },
    ));
    let mut specs = vec![RouterAuxSpec {
        balancing: None,
        log_sum_exp: true,
    }];
    for score in [RouterScore::Softmax, RouterScore::Sigmoid] {
        for (tokens_per_group, count) in [(8, true), (2, true), (4, false)] {
            for log_sum_exp in [false, true] {
                specs.push(RouterAuxSpec {
                    balancing: balancing(score, tokens_per_group, count),
                    log_sum_exp,
                });
            }
        }
    }
    for spec in specs {
        let node = run::<true>(spec);
        let composed = run::<false>(spec);
        for (what, (n, c)) in ["mass", "counts", "log-sum-exps", "logits gradient"]
            .iter()
            .zip(node.iter().zip(&composed))
        {
            assert_close(n, c, &format!("{spec:?}: {what}"));
        }
        assert_eq!(node[1], composed[1], "{spec:?}: counts");
        assert!(
            node[3].iter().any(|g| g.abs() > 1e-3),
            "{spec:?}: the gradient is all zeros"
        );
    }
}
