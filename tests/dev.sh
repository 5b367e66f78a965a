#!/usr/bin/env bash
# The local environment (README "Getting started"): builds the control plane if needed, then runs
# `banlieue-dev`: a real etcd + kube-apiserver + kube-controller-manager, banlieue's and CAPI's
# CRDs, the Proxmox VE simulator registered as Provider `pve-sim`, the Proxmox provider and the
# banlieue controller. Ctrl-C stops everything. Arguments go to banlieue-dev (`tests/dev.sh --help`).
# Everything it reads comes from this repository (no folder beside the clone is needed).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
step() { echo "==> [dev $((SECONDS - started))s] $*" >&2; }

bin="${BANLIEUE_CONTROLPLANE_BIN:-tests/controlplane/bin}"
target="${CARGO_TARGET_DIR:-target}"
first_go=0 first_rust=0
[ -x "$bin/kube-apiserver" ] || first_go=1
[ -x "$target/debug/banlieue-dev" ] || first_rust=1
if [ $first_go = 1 ] || [ $first_rust = 1 ]; then
    step "first run: building what is missing, measured on 2 idle cores:"
    [ $first_go = 1 ] && step "  - etcd, kube-apiserver, kube-controller-manager from Go modules: ~7 min (then cached)"
    [ $first_rust = 1 ] && step "  - banlieue-dev, banlieue-proxmox and banlieue (cargo, debug): ~2-3 min, plus crate downloads (then incremental)"
    step "  later starts take seconds"
fi

step "control plane binaries (tests/controlplane/build.sh --core-only)"
tests/controlplane/build.sh --core-only
step "building banlieue-dev, banlieue-proxmox and banlieue (cargo build)"
cargo build --locked -p banlieue-dev -p banlieue-controllers -p banlieue-proxmox
step "starting the environment"
exec "$target/debug/banlieue-dev" "$@"
