#!/usr/bin/env bash
# The test command (README, .ci/run): every test of the workspace under cargo-nextest, which
# runs each test in its own process (thread ranks and burn's process-wide state stay per test).
# Installs cargo-nextest first where it is missing, so a machine with only a Rust toolchain
# runs it as is; and pre-commit (from PyPI, with the machine's python3), which tests/it/review.rs
# runs against the repository's hook definition. Extra arguments go to `cargo nextest run` (e.g. `-p ferrotron-train`).
# Then the kernel-source tests: NVRTC and the CUDA headers (CUDA 13.0 wheels from PyPI, into a
# cache folder of their own) compile every hand-written kernel for sm_90, no GPU needed. Last,
# the TensorBoard test: TensorBoard's own event reader (the `tensorboard` package from PyPI, into
# a cache folder of its own) reads back the event files of a training run.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo nextest --version >/dev/null 2>&1; then
    echo "== installing cargo-nextest (once)" >&2
    cargo install cargo-nextest --locked
fi
if ! command -v pre-commit >/dev/null 2>&1; then
    echo "== installing pre-commit (once)" >&2
    python3 -m pip install --quiet pre-commit ||
        python3 -m pip install --quiet --break-system-packages pre-commit
fi
cargo nextest run --workspace --locked --no-fail-fast "$@"

# The Slurm end-to-end test (#[ignore]d: it installs Debian's slurm-wlm and munge) where that can
# work, as root with apt (CI); there a Slurm that cannot be installed or started fails the run.
if [[ $# -gt 0 ]]; then
    : # a narrowed run (`tools/test.sh -p ferrotron-train`) leaves it out
elif [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    cargo nextest run -p ferrotron-cli --test it --locked --run-ignored only -E 'test(/^slurm::/)'
else
    echo "== the Slurm test needs root and apt-get; skipped here (as root: tools/test.sh)" >&2
fi

cuda=${FERROTRON_NVRTC_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ferrotron/nvrtc-13.0}
if [[ ! -e $cuda/nvidia/cu13/lib/libnvrtc.so ]]; then
    echo "== installing NVRTC and the CUDA headers (once) into $cuda" >&2
    python3 -m pip install --quiet --target "$cuda" 'nvidia-cuda-nvrtc==13.0.*' \
        'nvidia-cuda-runtime==13.0.*' 'nvidia-cuda-crt==13.0.*'
    ln -sf "$(basename "$(ls "$cuda"/nvidia/cu13/lib/libnvrtc.so.1*)")" "$cuda/nvidia/cu13/lib/libnvrtc.so"
fi
FERROTRON_CUDA_INCLUDE=$cuda/nvidia/cu13/include LD_LIBRARY_PATH=$cuda/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
    cargo nextest run --workspace --locked --run-ignored only -E 'test(sources_compile)'

tensorboard=${FERROTRON_TENSORBOARD_PYTHONPATH:-${XDG_CACHE_HOME:-$HOME/.cache}/ferrotron/tensorboard}
if [[ ! -e $tensorboard/tensorboard/__init__.py ]]; then
    echo "== installing the tensorboard Python package (once) into $tensorboard" >&2
    python3 -m pip install --quiet --target "$tensorboard" tensorboard
fi
FERROTRON_TENSORBOARD_PYTHONPATH=$tensorboard \
    cargo nextest run --workspace --locked --run-ignored only -E 'test(tensorboard_reads_the_same_scalars)'
