#!/usr/bin/env bash
# Powers on one lab guest of banlieue-testenv (src/guests.rs): run as PID 1 of the guest's own
# PID, mount and UTS namespaces inside its network namespace:
#   ip netns exec NETNS unshare --mount --uts --pid --fork --propagation private \
#       --kill-child=SIGKILL bash guest-boot.sh DIR
# DIR/env names ROOTFS (the guest image, read-only), KUBERNETES_LAYER (the image's layer of another
# Kubernetes version than its own, laid over it as a template built for that version would hold
# it, or empty), CGROUP (the guest's cgroup in every v1
# hierarchy), SEED (the seed drive's image file, e.g. the NoCloud ISO the provider uploaded,
# or empty), SMBIOS_VENDOR/SMBIOS_PRODUCT/SMBIOS_UUID (the VM's SMBIOS system information as its
# firmware reports it in /sys/class/dmi/id, or empty) and GUESTINFO (a folder of the VM's guestinfo
# values, one file per key, that the guest's vmware-rpctool serves, or empty). The guest's disk is
# an overlay of ROOTFS with DIR/disk as its writable layer; it gets its own /proc, /sys, a /dev
# holding only what a container gets plus its seed drive, and its own cgroup namespace; then
# the image's init (banlieue-guest-init) runs as its PID 1. Killing this process's parent ends
# the guest and everything it runs.
set -euo pipefail
dir="$1"
# shellcheck source=/dev/null
. "$dir/env"
log() { printf '[guest-boot %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }

# The guest's cgroup, entered before the cgroup namespace is made (it becomes the guest's "/").
# `ip netns exec` mounted a fresh /sys, which hides the host's cgroup hierarchies: mount them.
mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup
for controller in cpu cpuacct cpuset memory devices freezer blkio pids; do
    mkdir -p "/sys/fs/cgroup/$controller"
    mount -t cgroup -o "$controller" cgroup "/sys/fs/cgroup/$controller"
done
mkdir -p /sys/fs/cgroup/systemd
mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd
for hierarchy in cpu cpuacct cpuset memory devices freezer blkio pids systemd; do
    mkdir -p "/sys/fs/cgroup/$hierarchy/$CGROUP"
done
cat /sys/fs/cgroup/cpuset/cpuset.cpus > "/sys/fs/cgroup/cpuset/$CGROUP/cpuset.cpus"
cat /sys/fs/cgroup/cpuset/cpuset.mems > "/sys/fs/cgroup/cpuset/$CGROUP/cpuset.mems"
for hierarchy in cpu cpuacct cpuset memory devices freezer blkio pids systemd; do
    echo $$ > "/sys/fs/cgroup/$hierarchy/$CGROUP/cgroup.procs"
done
umount -R /sys/fs/cgroup

# The disk: the image below, the guest's writes in DIR/disk. containerd's and kubelet's state
# cannot live on overlayfs (containerd's snapshotter is overlayfs itself): plain folders of DIR.
root="$dir/root"
mkdir -p "$root" "$dir/disk" "$dir/disk-work" "$dir/containerd" "$dir/kubelet"
lower="$ROOTFS"
[ -z "${KUBERNETES_LAYER:-}" ] || lower="$KUBERNETES_LAYER:$ROOTFS"
mount -t overlay overlay -o "lowerdir=$lower,upperdir=$dir/disk,workdir=$dir/disk-work" "$root"
mkdir -p "$root/var/lib/containerd" "$root/var/lib/kubelet"
mount --bind "$dir/containerd" "$root/var/lib/containerd"
mount --bind "$dir/kubelet" "$root/var/lib/kubelet"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount -t tmpfs -o mode=755 run "$root/run"
mount -t tmpfs -o mode=1777 tmp "$root/tmp"

# /dev as a container runtime makes it, plus the seed drive as /dev/sr0 (read-only).
mount -t tmpfs -o mode=755,nosuid dev "$root/dev"
for device in "null 1 3" "zero 1 5" "full 1 7" "random 1 8" "urandom 1 9" "tty 5 0"; do
    set -- $device
    mknod -m 666 "$root/dev/$1" c "$2" "$3"
done
mknod -m 644 "$root/dev/kmsg" c 1 11
mkdir -p "$root/dev/pts" "$root/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts "$root/dev/pts"
ln -s pts/ptmx "$root/dev/ptmx"
mount -t tmpfs -o mode=1777 shm "$root/dev/shm"
ln -s /proc/self/fd "$root/dev/fd"
ln -s /proc/self/fd/0 "$root/dev/stdin"
ln -s /proc/self/fd/1 "$root/dev/stdout"
ln -s /proc/self/fd/2 "$root/dev/stderr"
if [ -n "${SEED:-}" ]; then
    touch "$root/dev/sr0"
    mount --bind -o ro "$SEED" "$root/dev/sr0"
fi

# The VM's SMBIOS system information (what cloud-init's platform checks and the kubelet's
# systemUUID read): /sys/class/dmi/id as the VM's firmware fills it. sysfs cannot take new files,
# so /sys/class becomes a tmpfs holding the host's classes (bound) and the VM's dmi/id.
if [ -n "${SMBIOS_UUID:-}" ]; then
    mkdir -p "$dir/sys-class"
    mount -t tmpfs -o mode=755 sysclass "$root/sys/class"
    for class in /sys/class/*; do
        name="$(basename "$class")"
        [ "$name" = dmi ] && continue
        mkdir -p "$root/sys/class/$name"
        mount --rbind "$class" "$root/sys/class/$name"
    done
    mkdir -p "$root/sys/class/dmi/id"
    printf '%s\n' "${SMBIOS_VENDOR:-}" > "$root/sys/class/dmi/id/sys_vendor"
    printf '%s\n' "${SMBIOS_PRODUCT:-}" > "$root/sys/class/dmi/id/product_name"
    printf '%s\n' "$SMBIOS_UUID" > "$root/sys/class/dmi/id/product_uuid"
    chmod 0444 "$root/sys/class/dmi/id/"*
fi

# The VM's guestinfo, as its vmware-rpctool would read it from the hypervisor at this boot.
if [ -n "${GUESTINFO:-}" ]; then
    rm -rf "$root/var/lib/banlieue-guestinfo"
    mkdir -p "$root/var/lib/banlieue-guestinfo"
    cp -r "$GUESTINFO/." "$root/var/lib/banlieue-guestinfo/"
fi

log "powering on (image $ROOTFS)"
cd "$root"
mkdir -p .host
pivot_root . .host
umount -l /.host
rmdir /.host
exec unshare --cgroup /usr/local/sbin/banlieue-guest-init
