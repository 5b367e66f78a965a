#!/usr/bin/env bash
# The local environment (README "Getting started"): builds the control plane if needed, then runs
# `banlieue-dev`: a real etcd + kube-apiserver + kube-controller-manager, banlieue's and CAPI's
# CRDs, the Proxmox VE simulator registered as Provider `pve-sim`, the Proxmox provider and the
# banlieue controller. Ctrl-C stops everything. Arguments go to banlieue-dev (`tests/dev.sh --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
tests/controlplane/build.sh --core-only
cargo build --quiet --locked -p banlieue-dev -p banlieue-controllers -p banlieue-proxmox
exec target/debug/banlieue-dev "$@"
