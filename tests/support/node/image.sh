#!/usr/bin/env bash
# image.sh OUT.tar TAG ROOTFS [umoci config flags...]: an OCI image layout tarball of ROOTFS (a
# folder) tagged TAG, without a registry (umoci). containerd imports it with
#   ctr -n k8s.io images import --base-name <name> OUT.tar    →  <name>:TAG
set -euo pipefail
out="$1" tag="$2" rootfs="$3"; shift 3
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
umoci init --layout "$work/oci"
umoci new --image "$work/oci:$tag"
umoci unpack --image "$work/oci:$tag" "$work/bundle" > /dev/null
cp -a "$rootfs/." "$work/bundle/rootfs/"
umoci repack --image "$work/oci:$tag" "$work/bundle"
[ "$#" -gt 0 ] && umoci config --image "$work/oci:$tag" "$@"
umoci gc --layout "$work/oci"
tar -C "$work/oci" -cf "$out" .
