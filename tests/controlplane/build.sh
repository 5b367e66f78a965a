#!/usr/bin/env bash
# Builds the test control plane and the optional CAPI/vSphere programs from pinned Go modules into
# tests/controlplane/bin/ (git-ignored). Idempotent: a group whose inputs (go.mod, go.sum, sources,
# flags, Go version) are unchanged since its last successful build is skipped without running Go;
# otherwise Go's module and build caches make a rebuild cheap.
#
# Usage: tests/controlplane/build.sh [--core-only | --nodes | --capi | --clusterctl | --next] [--force]
#   --core-only   only etcd, kube-apiserver, kube-controller-manager
#                 (same as BANLIEUE_CONTROLPLANE_CORE_ONLY=1)
#   --nodes       the core and kubelet, kube-scheduler, kube-proxy, kubeadm (tests/dev.sh --pods)
#   --capi        the core and CAPI's managers + clusterctl, not the node binaries nor vcsim
#                 (tests/dev.sh --capi)
#   --clusterctl  only clusterctl (and CAPI's CRDs); the log goes to stderr and stdout is one line,
#                 export PATH="<bin>:$PATH", so: eval "$(tests/controlplane/build.sh --clusterctl)"
#   --next        only the next Kubernetes minor (next/go.mod): kubelet, kubeadm, kube-apiserver,
#                 kube-controller-manager, kube-scheduler, kube-proxy into bin/next/, for the guest
#                 image's layer that CAPI's cluster upgrade spec upgrades to (tests/guest/build.sh
#                 adds it when bin/next/ exists; CI does not need it)
#   --force       rebuild even if up to date
# Without an option: everything, kubelet, kube-scheduler, kube-proxy and kubeadm for real nodes
# (and the workload-cluster guests) included.
# Also copies CAPI's CRDs (core, kubeadm bootstrap, kubeadm control plane) to bin/capi-crds/.
# Environment: BANLIEUE_CONTROLPLANE_BIN names another output folder; GOMODCACHE / GOCACHE /
# GOFLAGS are honoured; GOTOOLCHAIN defaults to "local".
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="${BANLIEUE_CONTROLPLANE_BIN:-$here/bin}"
core_only="${BANLIEUE_CONTROLPLANE_CORE_ONLY:-0}"
force=0
clusterctl_only=0
capi_only=0
nodes_only=0
next_only=0
for arg in "$@"; do
    case "$arg" in
        --core-only) core_only=1 ;;
        --clusterctl) clusterctl_only=1 ;;
        --capi) capi_only=1 ;;
        --nodes) nodes_only=1 ;;
        --next) next_only=1 ;;
        --force) force=1 ;;
        -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
        *) echo "build.sh: unknown argument: $arg" >&2; exit 2 ;;
    esac
done

if [ $((clusterctl_only + core_only + capi_only + nodes_only + next_only)) -gt 1 ]; then
    echo "build.sh: --core-only, --nodes, --capi, --clusterctl and --next exclude each other" >&2; exit 2
fi
if [ "$clusterctl_only" = 1 ]; then
    # stdout carries only the export line (for eval); everything else goes to stderr.
    exec 3>&1 1>&2
fi

export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
export GOFLAGS="${GOFLAGS:-} -buildvcs=false -trimpath"
command -v go >/dev/null || { echo "build.sh: go not found on PATH" >&2; exit 1; }
mkdir -p "$bin"

log() { printf '[controlplane/build %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }

# stamp GROUP DIR FLAGS...: a digest of everything that determines the group's binaries.
stamp() {
    local dir="$2"; shift 2
    {
        go version
        printf '%s\n' "$GOFLAGS" "$@"
        (cd "$dir" && find . -path ./bin -prune -o -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) \
            -not -path './capi/*' -not -path './vcsim/*' -not -path './kustomize/*' -not -path './next/*' -print | LC_ALL=C sort | xargs sha256sum)
    } | sha256sum | cut -d' ' -f1
}

# build GROUP DIR "OUT PKG" ... -- LDFLAGS
build_group() {
    local group="$1" dir="$2"; shift 2
    local targets=()
    while [ "$1" != "--" ]; do targets+=("$1"); shift; done
    shift
    local ldflags="$1"
    local want have="" missing=0 t out
    want="$(stamp "$group" "$dir" "$ldflags" "${targets[@]}")"
    [ -f "$bin/.stamp-$group" ] && have="$(cat "$bin/.stamp-$group")"
    for t in "${targets[@]}"; do
        out="${t%% *}"
        [ -x "$bin/$out" ] || missing=1
    done
    if [ "$force" = 0 ] && [ "$missing" = 0 ] && [ "$want" = "$have" ]; then
        log "$group: up to date"
        return 0
    fi
    local started=$SECONDS
    rm -f "$bin/.stamp-$group"
    if [ "${#targets[@]}" -gt 1 ]; then
        # Compile every package of the group in one go invocation first (parallel across all of
        # them, nothing linked); the per-binary steps below then only link.
        local pkgs=()
        for t in "${targets[@]}"; do pkgs+=("${t#* }"); done
        log "$group: compiling ${#pkgs[@]} programs"
        (cd "$dir" && go build -ldflags "$ldflags" "${pkgs[@]}")
        log "$group: compiled in $((SECONDS - started))s"
    fi
    for t in "${targets[@]}"; do
        out="${t%% *}"
        local pkg="${t#* }" t0=$SECONDS
        log "$group: building $out ($pkg)"
        (cd "$dir" && go build -ldflags "$ldflags" -o "$bin/$out" "$pkg")
        log "$group: $out done in $((SECONDS - t0))s ($(du -h "$bin/$out" | cut -f1))"
    done
    echo "$want" > "$bin/.stamp-$group"
    log "$group: built in $((SECONDS - started))s"
}

modver() { (cd "$1" && go list -m -f '{{.Version}}' "$2"); }

total=$SECONDS

# version_ldflags VERSION: what upstream's build stamps into component-base's version package.
version_ldflags() {
    local minor="${1#v1.}"
    minor="${minor%%.*}"
    local kv=k8s.io/component-base/version
    echo "-s -w -X $kv.gitVersion=$1 -X $kv.gitMajor=1 -X $kv.gitMinor=$minor \
-X $kv.gitTreeState=clean -X $kv.buildDate=1970-01-01T00:00:00Z"
}

# --- next: the next Kubernetes minor's node binaries and control plane (upgrade target) -------------
if [ "$next_only" = 1 ]; then
    next_version="$(modver "$here/next" k8s.io/kubernetes)"
    mkdir -p "$bin/next"
    next_targets=()
    for program in kubelet kubeadm kube-apiserver kube-controller-manager kube-scheduler kube-proxy; do
        next_targets+=("next/$program k8s.io/kubernetes/cmd/$program")
    done
    build_group next "$here/next" "${next_targets[@]}" -- "$(version_ldflags "$next_version")"
    log "next: Kubernetes $next_version in $bin/next (done in $((SECONDS - total))s)"
    exit 0
fi

# --- core: etcd, kube-apiserver, kube-controller-manager -------------------------------------------
if [ "$clusterctl_only" = 0 ]; then
kube_version="$(modver "$here" k8s.io/kubernetes)"   # e.g. v1.33.13
build_group core "$here" \
    "etcd ./cmd/etcd" \
    "kube-apiserver ./cmd/kube-apiserver" \
    "kube-controller-manager ./cmd/kube-controller-manager" \
    -- "$(version_ldflags "$kube_version")"
fi

# --- node: kubelet, kube-scheduler, kube-proxy, kubeadm for the harness's real nodes and guests ---
if [ "$clusterctl_only" = 0 ] && [ "$core_only" = 0 ] && [ "$capi_only" = 0 ]; then
build_group node "$here" \
    "kubelet ./cmd/kubelet" \
    "kube-scheduler ./cmd/kube-scheduler" \
    "kube-proxy ./cmd/kube-proxy" \
    "kubeadm ./cmd/kubeadm" \
    -- "$(version_ldflags "$kube_version")"
fi

if [ "$nodes_only" = 1 ]; then
    log "core and node binaries only: skipping CAPI and vcsim (done in $((SECONDS - total))s)"
    exit 0
fi
if [ "$core_only" = 1 ]; then
    log "core only: skipping CAPI and vcsim (done in $((SECONDS - total))s)"
    exit 0
fi

# --- capi: core manager, kubeadm bootstrap + control plane providers, clusterctl ------------------
capi_version="$(modver "$here/capi" sigs.k8s.io/cluster-api)"   # e.g. v1.14.2
capi_minor="${capi_version#v1.}"; capi_minor="${capi_minor%%.*}"
cv=sigs.k8s.io/cluster-api/version
capi_ldflags="-s -w -X $cv.gitVersion=$capi_version -X $cv.gitMajor=1 -X $cv.gitMinor=$capi_minor \
-X $cv.gitTreeState=clean -X $cv.buildDate=1970-01-01T00:00:00Z"
clusterctl_target="clusterctl sigs.k8s.io/cluster-api/cmd/clusterctl"
capi_targets=(
    "capi-manager sigs.k8s.io/cluster-api/core"
    "capi-kubeadm-bootstrap-manager sigs.k8s.io/cluster-api/bootstrap/kubeadm"
    "capi-kubeadm-control-plane-manager sigs.k8s.io/cluster-api/controlplane/kubeadm"
    "$clusterctl_target"
)
if [ "$clusterctl_only" = 0 ]; then
    build_group capi "$here/capi" "${capi_targets[@]}" -- "$capi_ldflags"
elif [ "$force" = 0 ] && [ -x "$bin/clusterctl" ] && [ -f "$bin/.stamp-capi" ] \
    && [ "$(cat "$bin/.stamp-capi")" = "$(stamp capi "$here/capi" "$capi_ldflags" "${capi_targets[@]}")" ]; then
    # An up-to-date full CAPI build includes clusterctl.
    log "clusterctl: up to date (full CAPI build)"
else
    build_group clusterctl "$here/capi" "$clusterctl_target" -- "$capi_ldflags"
fi

# CAPI's CRDs, as shipped in the same release, for tests that run the CAPI managers.
capi_dir="$(cd "$here/capi" && go list -m -f '{{.Dir}}' sigs.k8s.io/cluster-api)"
mkdir -p "$bin/capi-crds"
install -m 0644 "$capi_dir"/core/config/crd/bases/*.yaml "$capi_dir"/bootstrap/kubeadm/config/crd/bases/*.yaml \
    "$capi_dir"/controlplane/kubeadm/config/crd/bases/*.yaml "$bin/capi-crds/"
log "capi: $(ls "$bin/capi-crds" | wc -l) CRDs of $capi_version in $bin/capi-crds"

if [ "$clusterctl_only" = 1 ]; then
    log "clusterctl $("$bin/clusterctl" version -o short 2>/dev/null || echo "?") is $bin/clusterctl (done in $((SECONDS - total))s)"
    printf 'export PATH="%s:$PATH"\n' "$bin" >&3
    exit 0
fi

if [ "$capi_only" = 1 ]; then
    log "core and CAPI only: skipping vcsim (done in $((SECONDS - total))s)"
    exit 0
fi

# --- vcsim: govmomi's vSphere simulator -------------------------------------------------------------
build_group vcsim "$here/vcsim" "vcsim ." -- "-s -w"

# --- kustomize, and CAPI's release components rendered with it --------------------------------------
# CAPI's release (`make release-manifests` after `manifest-modification`) sets each manager's image
# to registry.k8s.io/cluster-api/<name>:<tag> and its pull policy to IfNotPresent, then runs
# `kustomize build <provider>/config/default`. The same here, on a copy of the pinned module's
# config/ folders (the module cache is read-only): bin/capi-components/ holds core-, bootstrap- and
# control-plane-components.yaml as CAPI publishes them (tests/devenv's Pods tier installs them).
build_group kustomize "$here/kustomize" "kustomize sigs.k8s.io/kustomize/kustomize/v5" -- "-s -w"
render_capi_components() {
    local out="$bin/capi-components" work spec file folder image
    work="$(mktemp -d)"
    rm -rf "$out"; mkdir -p "$out"
    for spec in "core-components core cluster-api-controller" \
        "bootstrap-components bootstrap/kubeadm kubeadm-bootstrap-controller" \
        "control-plane-components controlplane/kubeadm kubeadm-control-plane-controller"; do
        read -r file folder image <<<"$spec"
        mkdir -p "$work/$file"
        cp -r "$capi_dir/$folder/config" "$work/$file/"
        chmod -R u+w "$work/$file"
        sed -i -e "s@image: .*@image: registry.k8s.io/cluster-api/$image:$capi_version@" \
            "$work/$file/config/default/manager_image_patch.yaml"
        sed -i -e "s@imagePullPolicy: .*@imagePullPolicy: IfNotPresent@" \
            "$work/$file/config/default/manager_pull_policy.yaml"
        "$bin/kustomize" build "$work/$file/config/default" > "$out/$file.yaml"
    done
    rm -rf "$work"
    log "capi: release components of $capi_version in $out ($(cat "$out"/*.yaml | wc -l) lines)"
}
render_capi_components

log "all done in $((SECONDS - total))s; $(du -sh "$bin" | cut -f1) in $bin"
