#!/usr/bin/env bash
# The test command (README "Testing"): formatting, lints, then every test in the workspace against
# the real control plane built by tests/controlplane/build.sh. With kopium 0.24.1 on PATH it also
# checks that regenerating the CAPI types changes nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { echo "==> [tests] $*"; }

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
step "cargo test"
cargo test --workspace --locked
if kopium --version 2>/dev/null | grep -q '0\.24\.1'; then
    step "CAPI types regeneration check (kopium)"
    cargo test --locked -p banlieue-capi --test generated -- --ignored
fi
