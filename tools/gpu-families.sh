# shellcheck shell=bash
# The model families the GPU scripts train on shakespeare-tiny, as `--set` words (sourced by
# gpu-train.sh and gpu-resume.sh, so both mean the same models): gpt is the recipe as shipped
# (learned positions, LayerNorm, GELU, biases, tied embeddings); llama the same size LLaMA-style
# (RoPE, RMSNorm, SwiGLU, grouped-query attention, no biases, untied output); moe is llama with 4
# SwiGLU experts, top-2 softmax routing and the aux loss.
# shellcheck disable=SC2034 # used by the scripts that source this
llama_sets=(--set model.position_embedding=rope --set model.normalization=rmsnorm
    --set model.activation=swiglu --set model.tie_embeddings=false --set model.add_bias_linear=false
    --set model.num_query_groups=2 --set model.ffn_hidden_size=176)
# shellcheck disable=SC2034
moe_sets=("${llama_sets[@]}"
    --set 'model.moe={num_experts: 4, router_topk: 2, load_balancing: aux_loss, aux_loss_coeff: 0.01}')
