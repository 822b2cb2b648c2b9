#!/usr/bin/env bash
# Ferrotron <-> Hugging Face transformers parity, on CPU in fp32 (anywhere with torch and
# transformers: the GPU machine, or here with PYTHON=/work/pyref/bin/python). For GPT-2, LLaMA
# (llama3 / linear / yarn RoPE scaling), Mixtral, Qwen2 (q/k/v biases; a sliding window), Qwen3
# (q/k norms, head_dim != hidden / heads), Mistral (sliding window), Qwen3-MoE (normalised or not,
# dense layers between) and DeepSeek-V3 (MLA, YaRN, sigmoid group-limited routing with a bias, a
# shared expert, a dense first layer; rotary channels as pairs or halves; with or without a query
# latent), each from one rank and from tp2·pp2, the MoE classes also from ep2 and tp2·ep2: train a
# tiny checkpoint with `recipe run`, export it, load it with transformers; and import
# transformers' own randomly initialised models; the same token batch, longer than the RoPE
# scaling's original context and the window, through both sides. Prints one table: max
# |Δ logit| and both losses per row; exit 0 when every row is within 1e-4.
#
#   RECIPE_BIN=target/release/recipe tools/hf-parity.sh        # from the repository root
#   RECIPE_BIN=target/debug/recipe PYTHON=/work/pyref/bin/python tools/hf-parity.sh --only qwen3
#
# Built here, run there (no Rust on the GPU machine):
#   cargo build --release -p ferrotron-cli && mkdir -p dist && cp target/release/recipe dist/
#   device run: RECIPE_BIN=dist/recipe bash tools/hf-parity.sh     (carry: ["dist/recipe"])
#
# Logs and every file written go under $OUT (the device machine's returned folder) or
# ./hf-parity-out.
set -euo pipefail
cd "$(dirname "$0")/.."
RECIPE_BIN="${RECIPE_BIN:-target/release/recipe}"
PYTHON="${PYTHON:-python3}"
WORK="${OUT:-$PWD/hf-parity-out}/hf-parity"
if [[ ! -x "$RECIPE_BIN" ]]; then
  echo "error: no recipe binary at $RECIPE_BIN (build with cargo build --release -p ferrotron-cli, set RECIPE_BIN)" >&2
  exit 2
fi
"$PYTHON" -c 'import torch, transformers, safetensors' || {
  echo "error: $PYTHON needs torch, transformers and safetensors (set PYTHON)" >&2
  exit 2
}
mkdir -p "$WORK"
# transformers must not reach for the network: everything it loads is a local folder.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export TRANSFORMERS_VERBOSITY=error HF_HUB_DISABLE_PROGRESS_BARS=1 PYTHONWARNINGS=ignore
exec "$PYTHON" tools/hf_parity.py --recipe-bin "$RECIPE_BIN" --work "$WORK" "$@"
