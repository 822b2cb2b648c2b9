"""Reference MoE routing of DeepSeek-V3 and Qwen3-MoE, for ferrotron-model's routing tests:
the combine weights of every (token, expert) from Megatron-Core's own
`topk_routing_with_score_function` and, where transformers has the same router, from
transformers' own `DeepseekV3TopkRouter` / `Qwen3MoeTopKRouter` (given the identity as the
router weight, so the logits are the input). The script checks the two agree before writing.
transformers' DeepSeek router ranks groups by the sum of their top 2 scores whatever
`num_experts_per_tok / topk_group`; Megatron's `group_limited_topk` by the top
`topk // group_topk`: they agree where that ratio is 2 (DeepSeek-V3's 8 / 4), as in both cases.

    /work/pyref/bin/python tools/moe_routing_ref.py \
        > crates/ferrotron-model/src/moe/routing_reference.json
"""

import json

import torch
from megatron.core.transformer.moe.moe_utils import topk_routing_with_score_function
from transformers import DeepseekV3Config, Qwen3MoeConfig
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

TOKENS = 12


def dense(indices, weights, experts):
    out = torch.zeros(indices.shape[0], experts, dtype=torch.float32)
    return out.scatter(1, indices, weights.float())


def deepseek(generator, experts, topk, groups, group_topk, scaling):
    """Sigmoid scores, the expert bias for selection only, group-limited top-k, normalised, scaled."""
    logits = torch.randn(TOKENS, experts, generator=generator, dtype=torch.float32)
    bias = torch.randn(experts, generator=generator, dtype=torch.float32) * 0.1
    config = DeepseekV3Config(hidden_size=experts, n_routed_experts=experts, num_experts_per_tok=topk,
                              n_group=groups, topk_group=group_topk, routed_scaling_factor=scaling,
                              norm_topk_prob=True)
    router = DeepseekV3TopkRouter(config)
    with torch.no_grad():
        router.weight.copy_(torch.eye(experts))
        router.e_score_correction_bias.copy_(bias)
        _, weights, indices = router(logits)
    hf = dense(indices, weights, experts)
    megatron, _ = topk_routing_with_score_function(
        logits, topk, use_pre_softmax=False, num_groups=groups, group_topk=group_topk,
        scaling_factor=scaling, score_function="sigmoid", expert_bias=bias)
    assert torch.allclose(hf, megatron, atol=1e-6), (hf, megatron)
    return dict(
        name=f"deepseek_v3 sigmoid bias groups {groups}/{group_topk} top-{topk} scaling {scaling}",
        moe=dict(num_experts=experts, router_topk=topk, score_function="sigmoid", expert_bias=True,
                 load_balancing="none", aux_loss_coeff=0.0, num_groups=groups,
                 group_topk=group_topk, router_topk_scaling_factor=scaling),
        logits=logits.flatten().tolist(), expert_bias=bias.tolist(),
        weights=megatron.flatten().tolist())


def qwen3(generator, experts, topk, norm_topk_prob):
    """Softmax over all experts, top-k, renormalised over the top-k when norm_topk_prob."""
    logits = torch.randn(TOKENS, experts, generator=generator, dtype=torch.float32)
    config = Qwen3MoeConfig(hidden_size=experts, num_experts=experts, num_experts_per_tok=topk,
                            norm_topk_prob=norm_topk_prob)
    router = Qwen3MoeTopKRouter(config)
    with torch.no_grad():
        router.weight.copy_(torch.eye(experts))
        _, weights, indices = router(logits)
    hf = dense(indices, weights, experts)
    # norm_topk_prob is Megatron's softmax after top-k (pre_softmax false); without it, the
    # softmax over all experts before top-k (pre_softmax true).
    megatron, _ = topk_routing_with_score_function(
        logits, topk, use_pre_softmax=not norm_topk_prob, score_function="softmax")
    assert torch.allclose(hf, megatron, atol=1e-6), (hf, megatron)
    return dict(
        name=f"qwen3_moe softmax top-{topk} norm_topk_prob {norm_topk_prob}",
        moe=dict(num_experts=experts, router_topk=topk, score_function="softmax",
                 pre_softmax=not norm_topk_prob),
        logits=logits.flatten().tolist(), expert_bias=None,
        weights=megatron.flatten().tolist())


def megatron_only(generator, experts, topk, scaling):
    """Megatron's top-k scaling of softmax weights (no transformers router scales them)."""
    logits = torch.randn(TOKENS, experts, generator=generator, dtype=torch.float32)
    megatron, _ = topk_routing_with_score_function(
        logits, topk, use_pre_softmax=False, scaling_factor=scaling, score_function="softmax")
    return dict(
        name=f"megatron softmax top-{topk} scaling {scaling}",
        moe=dict(num_experts=experts, router_topk=topk, score_function="softmax",
                 router_topk_scaling_factor=scaling),
        logits=logits.flatten().tolist(), expert_bias=None,
        weights=megatron.flatten().tolist())


def main():
    generator = torch.Generator().manual_seed(46)
    cases = [
        deepseek(generator, experts=16, topk=4, groups=4, group_topk=2, scaling=2.5),
        deepseek(generator, experts=32, topk=8, groups=8, group_topk=4, scaling=2.5),
        qwen3(generator, experts=16, topk=4, norm_topk_prob=True),
        qwen3(generator, experts=16, topk=4, norm_topk_prob=False),
        megatron_only(generator, experts=8, topk=2, scaling=1.5),
    ]
    print(json.dumps(dict(tokens=TOKENS, cases=cases), indent=1))


if __name__ == "__main__":
    main()
