#!/usr/bin/env bash
# images.sh OUTDIR: the images every real node of banlieue-testenv imports, built here without a
# registry, into OUTDIR (skipped when already there):
#   registry.k8s.io/pause:3.10         pause.c of the pinned k8s.io/kubernetes module, static
#   docker.io/library/busybox:testenv  Debian's busybox-static
# Prints one line per image: REFERENCE=TARBALL.
set -euo pipefail
out="$1"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

if [ ! -s "$out/pause.tar" ]; then
    kubernetes="$(cd "$here/../../controlplane" && GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' k8s.io/kubernetes)"
    mkdir -p "$work/pause"
    gcc -Os -static -DVERSION=3.10 -o "$work/pause/pause" "$kubernetes/build/pause/linux/pause.c"
    strip "$work/pause/pause"
    "$here/image.sh" "$out/pause.tar.tmp" 3.10 "$work/pause" --config.entrypoint /pause
    mv "$out/pause.tar.tmp" "$out/pause.tar"
fi
if [ ! -s "$out/busybox.tar" ]; then
    root="$work/busybox"
    mkdir -p "$root"/{bin,etc,tmp,proc,sys,dev}
    cp /bin/busybox "$root/bin/busybox"
    for applet in $(/bin/busybox --list); do
        [ "$applet" = busybox ] || ln -sf busybox "$root/bin/$applet"
    done
    echo 'root:x:0:0:root:/root:/bin/sh' > "$root/etc/passwd"
    echo 'root:x:0:' > "$root/etc/group"
    "$here/image.sh" "$out/busybox.tar.tmp" testenv "$root" --config.cmd /bin/sh --config.env PATH=/bin
    mv "$out/busybox.tar.tmp" "$out/busybox.tar"
fi
echo "registry.k8s.io/pause:3.10=$out/pause.tar"
echo "docker.io/library/busybox:testenv=$out/busybox.tar"
