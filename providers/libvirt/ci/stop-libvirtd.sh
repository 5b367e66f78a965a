#!/usr/bin/env bash
# Undoes start-libvirtd.sh so that a CI run leaves nothing behind: stops the test network (and its
# dnsmasq), the libvirtd started with libvirtd.conf beside this script, and deletes the network
# namespace `banlieue-libvirt`. A libvirtd started otherwise is left alone. virtlogd, shared with
# any other libvirtd, stays.
set -uo pipefail
NETNS=banlieue-libvirt
NETWORK=banlieue-test
CONF="$(cd "$(dirname "$0")" && pwd)/libvirtd.conf"

command -v libvirtd >/dev/null || exit 0
if pgrep -f "libvirtd -d -f $CONF" >/dev/null; then
    virsh -c qemu:///system net-destroy "$NETWORK" >/dev/null 2>&1
    pkill -f "libvirtd -d -f $CONF"
    for _ in $(seq 1 50); do
        pgrep -f "libvirtd -d -f $CONF" >/dev/null || break
        sleep 0.1
    done
fi
[ -e "/run/netns/$NETNS" ] && ip netns delete "$NETNS"
echo "libvirtd of the tests stopped; network namespace $NETNS removed"
