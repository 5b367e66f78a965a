#!/usr/bin/env bash
# The local environment (README "Getting started"): builds the control plane if needed, then runs
# `banlieue-dev`: a real etcd + kube-apiserver + kube-controller-manager, banlieue's and CAPI's
# CRDs, and the Proxmox VE simulator registered as Provider `pve-sim`. Ctrl-C stops everything.
# Arguments go to banlieue-dev (see `tests/dev.sh --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
tests/controlplane/build.sh --core-only
exec cargo run --quiet --locked -p banlieue-dev -- "$@"
