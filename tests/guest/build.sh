#!/usr/bin/env bash
# Builds the lab guest image (tests/guest/README.md): a Debian bookworm root filesystem made with
# mmdebstrap from Debian's packages, holding what a node image built by image-builder holds:
# cloud-init (Debian's package), containerd, runc, the CNI plugins, kubelet and kubeadm (the
# harness's pinned Kubernetes) and the images kubeadm deploys, preloaded; plus this folder's
# root/ (the boot without systemd, kubelet's service, containerd's configuration).
#
# Usage: tests/guest/build.sh [OUT]      (OUT defaults to $BANLIEUE_GUEST_IMAGE or tests/guest/out)
# Result: OUT/rootfs (the image), OUT/rootfs.stamp (what it was built from). Cached by content:
# unchanged inputs (package list, root/, the binaries, this script) skip the build.
# When tests/controlplane/build.sh --next has built the next Kubernetes minor (bin/next/), the image
# also gets a layer for it, OUT/kubernetes/<version>/ (its kubelet and kubeadm in usr/bin, the
# images its kubeadm deploys in opt/banlieue/images; beside rootfs, not in it: overlayfs refuses a
# lower layer inside another): a guest whose template was built for that version boots the image
# with the layer over it (CAPI's cluster upgrade spec).
# Needs: root, mmdebstrap and umoci (Debian), Debian's archive, the Go module proxy, and
# tests/controlplane/build.sh --nodes done (kubelet, kubeadm, kube-apiserver, …).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${1:-${BANLIEUE_GUEST_IMAGE:-$here/out}}"
bin="${BANLIEUE_CONTROLPLANE_BIN:-$repo/tests/controlplane/bin}"
node_scripts="$repo/tests/support/node"
log() { printf '[guest/build %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }

# What a Kubernetes node image holds (image-builder's Debian list, less what only real hardware
# needs), plus ifupdown and a DHCP client (cloud-init's eni renderer brings networking up) and
# isoinfo (the seed drive, see root/usr/local/sbin/banlieue-guest-init).
packages=(
    cloud-init containerd runc containernetworking-plugins
    iproute2 iptables conntrack ebtables ethtool socat kmod util-linux mount procps
    ca-certificates ifupdown isc-dhcp-client locales genisoimage openssh-server
)
kube_binaries=(kubelet kubeadm kube-apiserver kube-controller-manager kube-scheduler kube-proxy)
for b in "${kube_binaries[@]}"; do
    [ -x "$bin/$b" ] || { echo "guest/build: $bin/$b missing: run tests/controlplane/build.sh --nodes" >&2; exit 1; }
done
for program in mmdebstrap umoci; do
    command -v "$program" > /dev/null || { echo "guest/build: $program missing (apt-get install $program)" >&2; exit 1; }
done
kube_version="$("$bin/kubeadm" version -o short)"
next_bin="$bin/next"
next_version=""
if [ -x "$next_bin/kubeadm" ]; then
    next_version="$("$next_bin/kubeadm" version -o short)"
    for b in "${kube_binaries[@]}"; do
        [ -x "$next_bin/$b" ] || { echo "guest/build: $next_bin/$b missing: run tests/controlplane/build.sh --next" >&2; exit 1; }
    done
fi

mkdir -p "$out"
stamp="$(
    {
        echo "${packages[*]}"
        sha256sum "$0" "$here/go.mod" "$here/go.sum" "$here"/cmd/*/*.go "$here"/standins/* \
            "$here"/flannel/go.* "$here"/flannel/tencentvpc-stub/*/*.go "$here"/flannel-cni/go.* \
            "$node_scripts"/image.sh "$node_scripts"/binary-image.sh | cut -d' ' -f1
        (cd "$here/root" && find . -type f -print0 | sort -z | xargs -0 sha256sum)
        for b in "${kube_binaries[@]}"; do sha256sum "$bin/$b" | cut -d' ' -f1; done
        # (only when built: an image without the next minor keeps the stamp it had before)
        if [ -n "$next_version" ]; then
            for b in "${kube_binaries[@]}"; do sha256sum "$next_bin/$b" | cut -d' ' -f1; done
            sha256sum "$here"/next/go.* | cut -d' ' -f1
        fi
        go version
    } | sha256sum | cut -d' ' -f1
)"
if [ -d "$out/rootfs" ] && [ "$(cat "$out/rootfs.stamp" 2>/dev/null)" = "$stamp" ] \
    && { [ -z "$next_version" ] || [ -d "$out/kubernetes/$next_version" ]; }; then
    log "up to date: $out/rootfs"
    exit 0
fi
started=$SECONDS
work="$out/work"
rm -rf "$work" "$out/rootfs.partial" "$out/kubernetes.partial"
mkdir -p "$work/images" "$out/rootfs.partial"

# 1. Debian, cached by package list (mmdebstrap takes ~30 s and ~440 MB).
debian="$out/debian-$(echo "${packages[*]}" | sha256sum | cut -c1-16).tar"
if [ ! -s "$debian" ]; then
    log "mmdebstrap bookworm (${#packages[@]} packages and their dependencies)"
    rm -f "$out"/debian-*.tar
    mmdebstrap --quiet --format=tar --variant=minbase --include="$(IFS=,; echo "${packages[*]}")" \
        bookworm "$debian.partial"
    mv "$debian.partial" "$debian"
fi
tar -C "$out/rootfs.partial" -xf "$debian"
root="$out/rootfs.partial"
# As Debian's cloud images ship: no resolver of the build host (DHCP writes the guest's), and an
# empty machine-id (made at first boot).
: > "$root/etc/resolv.conf"
: > "$root/etc/machine-id"
# The locale cloud-init sets by default (en_US.UTF-8), generated as Debian's cloud images have it.
sed -i 's/^# *\(en_US.UTF-8 UTF-8\)/\1/' "$root/etc/locale.gen"
chroot "$root" locale-gen > /dev/null

# 2. Kubernetes' node binaries and this image's boot; the CNI plugins where image-builder puts
#    them (/opt/cni/bin, where a CNI's installer adds its own).
install -m 0755 "$bin/kubelet" "$bin/kubeadm" "$root/usr/bin/"
cp -a "$here/root/." "$root/"
mkdir -p "$root/opt/cni/bin"
for plugin in "$root"/usr/lib/cni/*; do
    ln -sf "/usr/lib/cni/${plugin##*/}" "$root/opt/cni/bin/${plugin##*/}"
done

# 3. The images kubeadm deploys, preloaded as image-builder does (`kubeadm config images list`):
#    the control plane from the harness's binaries, etcd and CoreDNS at kubeadm's versions from
#    their modules, pause from its source; and kube-vip's stand-in (standins/kube-vip.sh).
log "building etcd and CoreDNS (go.mod), flannel (flannel/go.mod) and its CNI plugin (flannel-cni/go.mod)"
go_build() { # DIR OUT PACKAGE...
    local dir="$1" to="$2"; shift 2
    (cd "$dir" && GOTOOLCHAIN="${GOTOOLCHAIN:-local}" GOFLAGS="${GOFLAGS:-} -trimpath -buildvcs=false" \
        nice -n 10 go build -ldflags "-s -w" -o "$to" "$@")
}
go_build "$here" "$work/bin/" ./cmd/etcd ./cmd/coredns
if [ -n "$next_version" ]; then
    log "building the etcd and CoreDNS of Kubernetes $next_version (next/go.mod)"
    go_build "$here/next" "$work/bin/next/" ./cmd/etcd ./cmd/coredns
fi
go_build "$here/flannel" "$work/bin/flanneld" github.com/flannel-io/flannel
go_build "$here/flannel" "$work/bin/install-conf" github.com/flannel-io/flannel/cmd/install_conf
go_build "$here/flannel-cni" "$work/bin/flannel-cni" github.com/containernetworking/plugins/plugins/meta/flannel
images="$root/opt/banlieue/images"
add_image() { # IMAGES REFERENCE TARBALL: adds the image to the folder IMAGES and its index
    local file
    file="$(echo "${2%:*}" | tr '/' '_').tar"
    mv "$3" "$1/$file"
    echo "$2=$file" >> "$1/index"
}
# debian_image OUT TAG ENTRYPOINT FILE...: an image of files of the guest's Debian at their paths
# (symlinks resolved: a multi-call program keeps the name it is called by) with the libraries each
# program and shared object links.
# Copies PATH of the guest's root filesystem to the same path under IMAGE, its symbolic links
# resolved inside the root filesystem (Debian's alternatives are absolute links, e.g.
# /usr/sbin/iptables -> /etc/alternatives/iptables, which cp -L would follow into the host's /).
copy_from_root() {
    local path="$1" image="$2" real
    real="$(chroot "$root" readlink -f "$path")"
    [ -e "$root$real" ] || { echo "guest/build: $path ($real) is not in the guest image" >&2; exit 1; }
    mkdir -p "$image$(dirname "$path")"
    if [ -d "$root$real" ]; then
        mkdir -p "$image$path"
        cp -a "$root$real/." "$image$path/"
    else
        cp -a "$root$real" "$image$path"
    fi
}
debian_image() {
    local out="$1" tag="$2" entrypoint="$3" image="$work/debian-image" file library
    shift 3
    rm -rf "$image"
    mkdir -p "$image/tmp" "$image/run" "$image/etc"
    chmod 1777 "$image/tmp"
    printf 'root:x:0:0:root:/root:/sbin/nologin\n' > "$image/etc/passwd"
    printf 'root:x:0:\n' > "$image/etc/group"
    for file in "$@"; do
        copy_from_root "$file" "$image"
        # programs and shared objects (iptables' extensions link libm, for one) bring their libraries
        [ -f "$root$file" ] && { [ -x "$root$file" ] || [[ "$file" == *.so ]]; } || continue
        # (a static program has no libraries: ldd fails and lists none)
        for library in $(chroot "$root" ldd "$file" 2>/dev/null | grep -o '/[^ ]*' || true); do
            copy_from_root "$library" "$image"
        done
    done
    "$node_scripts/image.sh" "$out" "$tag" "$image" --config.entrypoint "$entrypoint" > /dev/null
    rm -rf "$image"
}
iptables_files=(/usr/sbin/iptables /usr/sbin/iptables-save /usr/sbin/iptables-restore
    /usr/sbin/ip6tables /usr/sbin/ip6tables-save /usr/sbin/ip6tables-restore /usr/lib/x86_64-linux-gnu/xtables)
for extension in "$root"/usr/lib/x86_64-linux-gnu/xtables/*.so; do
    iptables_files+=("${extension#"$root"}")
done
# retag_image TARBALL FROM TO: the OCI layout tarball's image tagged TO instead of FROM.
retag_image() {
    local layout="$work/retag"
    rm -rf "$layout"
    mkdir -p "$layout"
    tar -C "$layout" -xf "$1"
    umoci tag --image "$layout:$2" "$3"
    umoci rm --image "$layout:$2"
    tar -C "$layout" -cf "$1" .
    rm -rf "$layout"
}
# preload_kubeadm_images BINARIES ETCD COREDNS IMAGES CONTAINERD_CONFIG: every image the kubeadm of
# BINARIES (a folder of kube_binaries) deploys, into the folder IMAGES: its control plane and
# kube-proxy from BINARIES, etcd and CoreDNS from the programs ETCD and COREDNS (which must be the
# versions kubeadm wants), pause from its source, tagged as that kubeadm names it; and that pause as
# containerd's sandbox image in CONTAINERD_CONFIG (as image-builder configures it).
preload_kubeadm_images() {
    local binaries="$1" etcd="$2" coredns="$3" images="$4" containerd_config="$5" version wanted reference tag name have
    version="$("$binaries/kubeadm" version -o short)"
    # (assigned first: a failing kubeadm stops the build here, not as an empty image list below)
    wanted="$("$binaries/kubeadm" config images list --kubernetes-version "$version")"
    mkdir -p "$images"
    : > "$images/index"
    while read -r reference; do
        tag="${reference##*:}" name="${reference%:*}"
        case "${name##*/}" in
            kube-proxy)
                # iptables mode: kube-proxy runs iptables-restore and conntrack (Debian's).
                install -D -m 0755 "$binaries/kube-proxy" "$root/usr/local/bin/kube-proxy"
                debian_image "$work/images/x.tar" "$tag" /usr/local/bin/kube-proxy /usr/local/bin/kube-proxy \
                    "${iptables_files[@]}" /usr/sbin/conntrack
                rm "$root/usr/local/bin/kube-proxy" ;;
            kube-apiserver|kube-controller-manager|kube-scheduler)
                "$node_scripts/binary-image.sh" "$work/images/x.tar" "$tag" "$binaries/${name##*/}" \
                    "/usr/local/bin/${name##*/}" 0 > /dev/null ;;
            etcd)
                have="$("$etcd" --version | sed -n 's/^etcd Version: //p')-0"
                [ "$tag" = "$have" ] || { echo "guest/build: kubeadm $version wants $reference; $etcd is $have" >&2; exit 1; }
                "$node_scripts/binary-image.sh" "$work/images/x.tar" "$tag" "$etcd" /usr/local/bin/etcd 0 > /dev/null ;;
            coredns)
                have="v$("$coredns" -version | sed -n 's/^CoreDNS-//p')"
                [ "$tag" = "$have" ] || { echo "guest/build: kubeadm $version wants $reference; $coredns is $have" >&2; exit 1; }
                "$node_scripts/binary-image.sh" "$work/images/x.tar" "$tag" "$coredns" /coredns 0 > /dev/null ;;
            pause)
                # images.sh builds pause once, tagged as the harness's nodes use it.
                [ -n "$pause_built_as" ] || pause_built_as="$("$node_scripts/images.sh" "$work/node-images" \
                    | sed -n 's|^registry.k8s.io/pause:\([^=]*\)=.*|\1|p')"
                cp "$work/node-images/pause.tar" "$work/images/x.tar"
                [ "$tag" = "$pause_built_as" ] || retag_image "$work/images/x.tar" "$pause_built_as" "$tag"
                sed -i "s|^\( *sandbox_image = \).*|\1\"$reference\"|" "$containerd_config"
                grep -q "sandbox_image = \"$reference\"" "$containerd_config" \
                    || { echo "guest/build: no sandbox_image in $containerd_config" >&2; exit 1; } ;;
            *) echo "guest/build: no recipe for image $reference" >&2; exit 1 ;;
        esac
        add_image "$images" "$reference" "$work/images/x.tar"
    done <<< "$wanted"
}
pause_built_as=""
preload_kubeadm_images "$bin" "$work/bin/etcd" "$work/bin/coredns" "$images" "$root/etc/containerd/config.toml"
if [ -n "$next_version" ]; then
    log "the layer of Kubernetes $next_version ($out/kubernetes/$next_version)"
    layer="$out/kubernetes.partial/$next_version"
    install -D -m 0755 -t "$layer/usr/bin" "$next_bin/kubelet" "$next_bin/kubeadm"
    install -D -m 0644 "$root/etc/containerd/config.toml" "$layer/etc/containerd/config.toml"
    preload_kubeadm_images "$next_bin" "$work/bin/next/etcd" "$work/bin/next/coredns" "$layer/opt/banlieue/images" \
        "$layer/etc/containerd/config.toml"
fi
extras_from="$(wc -l < "$images/index")"
# flannel, the CNI the workload clusters of the tests run (installed by a ClusterResourceSet from
# flannel/kube-flannel.yml): flanneld and install-conf with iptables (Debian's), and the CNI plugin
# image whose init container copies /flannel to /opt/cni/bin.
mkdir -p "$root/opt/bin"
install -m 0755 "$work/bin/flanneld" "$work/bin/install-conf" "$root/opt/bin/"
install -m 0755 "$work/bin/flannel-cni" "$root/flannel"
debian_image "$work/images/x.tar" v0.28.10 /opt/bin/flanneld /opt/bin/flanneld /opt/bin/install-conf \
    "${iptables_files[@]}"
add_image "$images" ghcr.io/flannel-io/flannel:v0.28.10 "$work/images/x.tar"
debian_image "$work/images/x.tar" v1.9.1-flannel3 /usr/bin/cp /flannel /usr/bin/cp
add_image "$images" ghcr.io/flannel-io/flannel-cni-plugin:v1.9.1-flannel3 "$work/images/x.tar"
rm -rf "$root/opt/bin" "$root/flannel"
# kube-vip's stand-in: Debian's busybox-static (its `ip`) and the script.
busybox_root="$work/busybox-root"
mkdir -p "$busybox_root/bin"
cp /bin/busybox "$busybox_root/bin/busybox"
for applet in sh ip grep sleep echo; do ln -sf busybox "$busybox_root/bin/$applet"; done
install -m 0755 "$here/standins/kube-vip.sh" "$busybox_root/kube-vip"
"$node_scripts/image.sh" "$work/images/x.tar" v0.8.9 "$busybox_root" \
    --config.entrypoint /kube-vip --config.env PATH=/bin > /dev/null
add_image "$images" ghcr.io/kube-vip/kube-vip:v0.8.9 "$work/images/x.tar"
# The layer's guests run the same CNI and kube-vip: its index names those images' tarballs of the
# image below it (they stay visible through the layer).
[ -z "$next_version" ] || tail -n "+$((extras_from + 1))" "$images/index" >> "$layer/opt/banlieue/images/index"

rm -rf "$out/rootfs" "$out/kubernetes" "$work"
mv "$root" "$out/rootfs"
[ -z "$next_version" ] || mv "$out/kubernetes.partial" "$out/kubernetes"
echo "$stamp" > "$out/rootfs.stamp"
log "built $out/rootfs in $((SECONDS - started))s ($(du -sh "$out/rootfs" | cut -f1); images: $(cut -d= -f1 "$out/rootfs/opt/banlieue/images/index" | tr '\n' ' '))"
[ -z "$next_version" ] || log "with the layer of Kubernetes $next_version ($(du -sh "$out/kubernetes/$next_version" | cut -f1))"
