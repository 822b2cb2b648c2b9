#!/usr/bin/env bash
# The test command (README, .ci/run): every test of the workspace under cargo-nextest, which
# runs each test in its own process (thread ranks and burn's process-wide state stay per test).
# Installs cargo-nextest first where it is missing, so a machine with only a Rust toolchain
# runs it as is; and pre-commit (from PyPI, with the machine's python3), which tests/review.rs
# runs against the repository's hook definition. Extra arguments go to `cargo nextest run` (e.g. `-p ferrotron-train`).
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
exec cargo nextest run --workspace --locked --no-fail-fast "$@"
