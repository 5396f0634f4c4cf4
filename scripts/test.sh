#!/usr/bin/env bash
# The whole test suite: installs the compile-check toolchains when missing, then runs every
# crate's tests. On a machine with no GPU the CUDA and HIP tests report themselves skipped;
# with CI=true a missing toolchain fails the compile checks instead of skipping them.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(bash scripts/toolchains.sh)"
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
cargo test --workspace --locked "$@" -- --nocapture
