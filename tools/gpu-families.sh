# shellcheck shell=bash
# The model families the GPU scripts train on shakespeare-tiny, as `--set` words (sourced by
# gpu-train.sh and gpu-resume.sh, so both mean the same models): gpt is the recipe as shipped
# (learned positions, LayerNorm, GELU, biases, tied embeddings); llama the same size LLaMA-style
# (RoPE, RMSNorm, SwiGLU, grouped-query attention, no biases, untied output); moe is llama with 4
# SwiGLU experts, top-2 softmax routing and the aux loss; qwen3 is llama with per-head QK-norm,
# QKV bias, head dim 64 (cuDNN's attention in bf16) and YaRN RoPE scaling past a 16-token
# original context; mistral is llama with a 16-key sliding window, head dim 64 and Llama 3.1's
# RoPE scaling (issue 45: the fused QK-norm, the windowed cuDNN attention, the scaled tables);
# mla is llama with DeepSeek-V3's multi-latent attention in small (issue 46; query latent 48,
# key/value latent 32, 32 + 16 rotary query/key channels and 32 value channels a head, so cuDNN's
# attention in bf16 has d_qk 48 ≠ d_v 32; latent norms; YaRN with mscale 1 past a 16-token
# context) and the dense FFN, its curve free of routing flips; deepseek is mla with a dense first
# layer then MoE layers (Megatron's list form of layer_freq) of 8 SwiGLU experts in 4 groups,
# top-2 within 2 groups by sigmoid scores with the expert bias, weights scaled by 2.5, one shared
# expert, the sequence aux loss; qwen3moe is Qwen3-MoE in small: llama with QK-norm, head dim 64
# and 16 fine-grained experts (FFN 32) top-4, softmax top-k probabilities normalised
# (norm_topk_prob), the aux loss.
# shellcheck disable=SC2034 # used by the scripts that source this
llama_sets=(--set model.position_embedding=rope --set model.normalization=rmsnorm
    --set model.activation=swiglu --set model.tie_embeddings=false --set model.add_bias_linear=false
    --set model.num_query_groups=2 --set model.ffn_hidden_size=176)
# shellcheck disable=SC2034
moe_sets=("${llama_sets[@]}"
    --set 'model.moe={num_experts: 4, router_topk: 2, load_balancing: aux_loss, aux_loss_coeff: 0.01}')
# shellcheck disable=SC2034
qwen3_sets=("${llama_sets[@]}" --set model.qk_layernorm=true --set model.add_qkv_bias=true
    --set model.kv_channels=64
    --set 'model.rope_scaling={type: yarn, factor: 4.0, original_max_position_embeddings: 16}')
# shellcheck disable=SC2034
mistral_sets=("${llama_sets[@]}" --set 'model.window_size=[15, 0]' --set model.kv_channels=64
    --set 'model.rope_scaling={type: llama3, factor: 8.0, original_max_position_embeddings: 16}')
# shellcheck disable=SC2034
mla_sets=("${llama_sets[@]}" --set model.num_query_groups=null --set model.qk_layernorm=true
    --set 'model.mla={q_lora_rank: 48, kv_lora_rank: 32, qk_head_dim: 32, qk_pos_emb_head_dim: 16, v_head_dim: 32}'
    --set 'model.rope_scaling={type: yarn, factor: 4.0, original_max_position_embeddings: 16, mscale: 1.0, mscale_all_dim: 1.0}')
# shellcheck disable=SC2034
deepseek_sets=("${mla_sets[@]}"
    --set 'model.moe={num_experts: 8, router_topk: 2, score_function: sigmoid, expert_bias: true, num_groups: 4, group_topk: 2, router_topk_scaling_factor: 2.5, ffn_hidden_size: 64, shared_expert_ffn_hidden_size: 64, load_balancing: seq_aux_loss, aux_loss_coeff: 0.0001, layer_freq: [0, 1, 1, 1]}')
# shellcheck disable=SC2034
qwen3moe_sets=("${llama_sets[@]}" --set model.qk_layernorm=true --set model.kv_channels=64
    --set 'model.moe={num_experts: 16, router_topk: 4, ffn_hidden_size: 32, load_balancing: aux_loss, aux_loss_coeff: 0.001}')
