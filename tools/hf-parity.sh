#!/usr/bin/env bash
# Ferrotron <-> Hugging Face transformers parity on the GPU machine (which has torch and
# transformers; the comparison itself runs on CPU in fp32). For GPT-2, LLaMA and Mixtral: train a
# tiny checkpoint with `recipe run`, export it, load it with transformers; and import
# transformers' own randomly initialised models; the same token batch through both sides. Prints
# one table: max |Δ logit| and both losses per row; exit 0 when every row is within 1e-4.
#
#   RECIPE_BIN=target/release/recipe tools/hf-parity.sh        # from the repository root
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
WORK="${OUT:-$PWD/hf-parity-out}/hf-parity"
if [[ ! -x "$RECIPE_BIN" ]]; then
  echo "error: no recipe binary at $RECIPE_BIN (build with cargo build --release -p ferrotron-cli, set RECIPE_BIN)" >&2
  exit 2
fi
python3 -c 'import torch, transformers, safetensors' || {
  echo "error: python3 needs torch, transformers and safetensors" >&2
  exit 2
}
mkdir -p "$WORK"
# transformers must not reach for the network: everything it loads is a local folder.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export TRANSFORMERS_VERBOSITY=error HF_HUB_DISABLE_PROGRESS_BARS=1 PYTHONWARNINGS=ignore
exec python3 tools/hf_parity.py --recipe-bin "$RECIPE_BIN" --work "$WORK"
