#!/usr/bin/env bash
# The property tests of issue 19 at scale: the YAML loader, `extends`, overrides and validation
# (ferrotron-recipe) and planning over extreme sizes (ferrotron-plan). CI runs 48 cases per
# property; this runs PROPTEST_CASES of them (default one million) in a build with overflow
# checks on, so a wrapped integer anywhere is a failure, not a wrong number.
#   tools/fuzz.sh                     # a million cases per property (hours on 2 cores)
#   PROPTEST_CASES=20000 tools/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PROPTEST_CASES="${PROPTEST_CASES:-1000000}"
# opt-level 2 for speed, with overflow checks kept (release builds drop them)
export CARGO_PROFILE_TEST_OPT_LEVEL=2 CARGO_PROFILE_TEST_OVERFLOW_CHECKS=true
exec cargo nextest run --locked -p ferrotron-recipe -p ferrotron-plan \
    --test properties --no-fail-fast --no-tests=fail "$@"
