# shellcheck shell=bash
# The model families the GPU scripts train on shakespeare-tiny, as `--set` words (sourced by
# gpu-train.sh and gpu-resume.sh, so both mean the same models): gpt is the recipe as shipped
# (learned positions, LayerNorm, GELU, biases, tied embeddings); llama the same size LLaMA-style
# (RoPE, RMSNorm, SwiGLU, grouped-query attention, no biases, untied output); moe is llama with 4
# SwiGLU experts, top-2 softmax routing and the aux loss; qwen3 is llama with per-head QK-norm,
# QKV bias, head dim 64 (cuDNN's attention in bf16) and YaRN RoPE scaling past a 16-token
# original context; mistral is llama with a 16-key sliding window, head dim 64 and Llama 3.1's
# RoPE scaling (issue 45: the fused QK-norm, the windowed cuDNN attention, the scaled tables).
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
