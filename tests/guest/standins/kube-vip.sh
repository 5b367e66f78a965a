#!/bin/sh
# Stand-in for kube-vip in the lab (its module is not served here, so it cannot be built): holds
# the control plane's virtual address on the interface the manifest names, as kube-vip's leader
# does with ARP mode, for as long as the Pod runs. Reads kube-vip's own environment variables
# (address, vip_interface); ignores its arguments.
set -u
: "${address:?kube-vip stand-in: no address}" "${vip_interface:=eth0}"
echo "kube-vip stand-in: holding $address on $vip_interface"
ip addr add "$address/32" dev "$vip_interface" 2>/dev/null || true
trap 'ip addr del "$address/32" dev "$vip_interface" 2>/dev/null; exit 0' TERM INT
while true; do
    ip addr show dev "$vip_interface" | grep -q " $address/" || ip addr add "$address/32" dev "$vip_interface" 2>/dev/null
    sleep 2
done
