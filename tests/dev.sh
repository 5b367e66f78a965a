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
# --capi (CAPI's managers too) needs them built: see `banlieue-dev --help`.
# --pods (managers as Pods on a real node) needs kubelet, kube-scheduler and kube-proxy.
build=--core-only capi=0 pods=0
for arg in "$@"; do
    [ "$arg" = --capi ] && capi=1
    [ "$arg" = --pods ] && pods=1
done
[ $capi = 1 ] && build=--capi
[ $pods = 1 ] && build=--nodes
[ $capi = 1 ] && [ $pods = 1 ] && build=""   # everything
first_go=0 first_rust=0 first_capi=0 first_nodes=0
[ -x "$bin/kube-apiserver" ] || first_go=1
[ -x "$target/debug/banlieue-dev" ] || first_rust=1
[ $capi = 1 ] && { [ -x "$bin/capi-manager" ] || first_capi=1; }
[ $pods = 1 ] && { [ -x "$bin/kubelet" ] || first_nodes=1; }
if [ $first_go = 1 ] || [ $first_rust = 1 ] || [ $first_capi = 1 ] || [ $first_nodes = 1 ]; then
    step "first run: building what is missing, measured on 2 idle cores:"
    [ $first_go = 1 ] && step "  - etcd, kube-apiserver, kube-controller-manager from Go modules: ~7 min (then cached)"
    [ $first_capi = 1 ] && step "  - CAPI's three managers and clusterctl from Go modules: ~5 min (then cached)"
    [ $first_nodes = 1 ] && step "  - kubelet, kube-scheduler and kube-proxy from Go modules: ~1-2 min after the core (then cached)"
    [ $first_rust = 1 ] && step "  - banlieue-dev, banlieue-proxmox and banlieue (cargo, debug): ~2-3 min, plus crate downloads (then incremental)"
    step "  later starts take seconds"
fi

step "control plane binaries (tests/controlplane/build.sh ${build:-(everything)})"
tests/controlplane/build.sh $build
step "building banlieue-dev, banlieue-proxmox and banlieue (cargo build)"
cargo build --locked -p banlieue-dev -p banlieue-controllers -p banlieue-proxmox
step "starting the environment"
exec "$target/debug/banlieue-dev" "$@"
