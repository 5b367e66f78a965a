#!/usr/bin/env bash
# The full matrix of CAPI's e2e specs with real kubeadm nodes (docs/conformance.md, "With real
# kubeadm nodes"): every scenario of tests/conformance/tests/capi/workload.rs, one after the other,
# then the report (spec × provider, pass or fail, duration) in docs/reports/workload-matrix.md
# with the commit it ran on. About 30 minutes after the first build (the first also builds the
# next Kubernetes minor: ~4 minutes here with a warm Go cache, longer cold); needs root, as the tests do
# (the guest image and the control plane are built on the way if missing).
#
#   tests/workload-matrix.sh            # run, print and write the report
#   tests/workload-matrix.sh --no-write # run and print only
set -euo pipefail
cd "$(dirname "$0")/.."
write=1
case "${1:-}" in
    --no-write) write=0 ;;
    "") ;;
    *) echo "usage: $0 [--no-write]" >&2; exit 2 ;;
esac
step() { echo "==> [workload-matrix] $*"; }

step "building the control plane, the next Kubernetes minor, the guest image and the managers"
tests/controlplane/build.sh
tests/controlplane/build.sh --next   # the upgrade spec's target: a layer of the guest image
tests/guest/build.sh
cargo build --locked -p banlieue-proxmox -p banlieue-vsphere -p banlieue-controllers --bins

reports="$(mktemp -d)"
trap 'rm -rf "$reports"' EXIT
step "running every scenario (progress below; the report follows)"
status=0
BANLIEUE_CONFORMANCE_REPORT_DIR="$reports" \
    cargo test --locked -p banlieue-conformance --test capi workload_matrix -- --ignored --nocapture \
    || status=$?
report="$reports/workload-matrix.md"
if [ ! -f "$report" ]; then
    echo "the matrix wrote no report (exit status $status): see the output above" >&2
    exit 1
fi
if [ "$write" = 1 ]; then
    mkdir -p docs/reports
    {
        echo "<!-- written by tests/workload-matrix.sh; do not edit -->"
        echo "Commit: \`$(git rev-parse HEAD)\`$([ -z "$(git status --porcelain -- . ':!docs/reports')" ] || echo ' with uncommitted changes'); run $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores."
        echo
        cat "$report"
    } > docs/reports/workload-matrix.md
    step "report written to docs/reports/workload-matrix.md"
fi
exit "$status"
