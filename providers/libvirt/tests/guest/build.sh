#!/usr/bin/env bash
# Builds the tiny test guest for the real QEMU test: Debian's kernel (linux-image-amd64) and a
# busybox initramfs (~2 MB) that loads the virtio (network, disks)/AHCI/iso9660 modules, gets an address by
# DHCP, mounts the NoCloud seed (the `cidata` cdrom), prints its meta-data and the sha256 of
# its user-data to the serial console, and runs the user-data if it starts with `#!`.
# Usage: build.sh OUTDIR  → OUTDIR/vmlinuz, OUTDIR/initrd.gz
set -euo pipefail
out=$1
kernel=$(ls /boot/vmlinuz-* | sort -V | tail -1)
version=${kernel#/boot/vmlinuz-}
moddir=/lib/modules/$version
busybox=$(command -v busybox || echo /bin/busybox)
[ -f "$kernel" ] && [ -d "$moddir" ] && [ -x "$busybox" ] || {
    echo "needs linux-image-amd64 and busybox-static" >&2
    exit 1
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/root
mkdir -p "$root"/{bin,dev,proc,sys,seed,etc,lib/modules,tmp}
cp "$busybox" "$root/bin/busybox"

# Modules and their dependencies, dependencies first (modules.dep lists a module's
# dependencies; loading them in reverse order satisfies each one).
order=()
add() {
    local m=$1 path deps dep
    path=$(grep -E "(^|/)$m\.ko(\.[a-z]+)?:" "$moddir/modules.dep" | head -1 | cut -d: -f1)
    [ -n "$path" ] || return 0 # built in
    deps=$(grep -E "^$path:" "$moddir/modules.dep" | cut -d: -f2)
    for dep in $(echo "$deps" | tr ' ' '\n' | tac); do
        add "$(basename "$dep" | sed -E 's/\.ko(\.[a-z]+)?$//')"
    done
    for o in "${order[@]:-}"; do [ "$o" = "$path" ] && return 0; done
    order+=("$path")
}
for m in ahci sr_mod isofs virtio_pci virtio_net virtio_blk; do add "$m"; done
for p in "${order[@]}"; do
    cp "$moddir/$p" "$root/lib/modules/"
    basename "$p" >>"$root/lib/modules/order"
done

cat >"$root/udhcpc.sh" <<'SH'
#!/bin/sh
case "$1" in
bound|renew)
    ip addr flush dev "$interface"
    ip addr add "$ip/${mask:-24}" dev "$interface"
    [ -n "$router" ] && ip route add default via "$router" dev "$interface"
    echo "BANLIEUE address $ip"
    ;;
esac
SH
cat >"$root/init" <<'SH'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for _ in 1 2; do
    for m in $(cat /lib/modules/order); do insmod "/lib/modules/$m" 2>/dev/null; done
done
ip link set lo up
ip link set eth0 up
udhcpc -i eth0 -s /udhcpc.sh -b -t 30 -T 1
for _ in $(seq 1 50); do [ -b /dev/sr0 ] && break; sleep 0.2; done
if mount -t iso9660 -o ro /dev/sr0 /seed; then
    echo "BANLIEUE meta-data begin"
    cat /seed/meta-data
    echo "BANLIEUE meta-data end"
    echo "BANLIEUE user-data sha256 $(sha256sum /seed/user-data | cut -d' ' -f1)"
    if [ "$(head -c 2 /seed/user-data)" = '#!' ]; then
        sh /seed/user-data
    fi
else
    echo "BANLIEUE no seed"
fi
echo "BANLIEUE ready"
while true; do sleep 3600; done
SH
chmod +x "$root/init" "$root/udhcpc.sh"
mkdir -p "$out"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) >"$out/initrd.gz.tmp"
mv "$out/initrd.gz.tmp" "$out/initrd.gz"
cp "$kernel" "$out/vmlinuz"
chmod 644 "$out/vmlinuz" "$out/initrd.gz"
