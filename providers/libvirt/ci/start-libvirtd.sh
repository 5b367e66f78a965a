#!/usr/bin/env bash
# Starts virtlogd and libvirtd for the libvirt provider's real tests (as root, no systemd), with
# libvirtd inside the network namespace `banlieue-libvirt`: the guests' bridge and dnsmasq live
# only there, so guest traffic never reaches the host network, while clients still reach
# libvirtd's unix socket (unix sockets are not per network namespace). Then makes sure the
# isolated network `banlieue-test` (no <forward>, DHCP) and the `default` dir pool exist.
# Idempotent: a running daemon is reused. The daemon's configuration is libvirtd.conf beside this
# script: clients in group `libvirt` (e.g. the provider's Pod in tests/devenv/tests/pods.rs) may
# use its socket without polkit.
set -euo pipefail
NETNS=banlieue-libvirt
NETWORK=banlieue-test
POOL_DIR=/var/lib/libvirt/images

if ! command -v libvirtd >/dev/null; then
    echo "libvirtd not installed (see .ci/run); skipping" >&2
    exit 0
fi
# libvirtd names every client by its uid and gid (SO_PEERCRED) and refuses one without a user or
# group record ("Failed to find user record for uid '65532'"): the provider's Pod runs as
# 65532:65532 (distroless nonroot), so the host needs both (no home, no shell, no password).
getent group 65532 >/dev/null || groupadd --gid 65532 banlieue-provider
getent passwd 65532 >/dev/null \
    || useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin banlieue-provider
# libvirt runs swtpm (a machine's `tpm: true`) as user tss; its local CA's directory must be
# tss's (a swtpm run as root earlier, e.g. by a daemon started before swtpm was installed,
# leaves root's files there and every later TPM fails to start).
if [ -d /var/lib/swtpm-localca ] && getent passwd tss >/dev/null; then
    chown -R tss /var/lib/swtpm-localca
fi
pgrep -x virtlogd >/dev/null || virtlogd -d || true
if ! virsh -c qemu:///system version >/dev/null 2>&1; then
    [ -e "/run/netns/$NETNS" ] || ip netns add "$NETNS"
    ip netns exec "$NETNS" ip link set lo up
    ip netns exec "$NETNS" libvirtd -d -f "$(cd "$(dirname "$0")" && pwd)/libvirtd.conf"
    for _ in $(seq 1 100); do
        virsh -c qemu:///system version >/dev/null 2>&1 && break
        sleep 0.2
    done
fi
virsh -c qemu:///system version >/dev/null

if ! virsh -c qemu:///system net-info "$NETWORK" >/dev/null 2>&1; then
    xml=$(mktemp)
    cat >"$xml" <<XML
<network>
  <name>$NETWORK</name>
  <bridge name='virbr-banlieue' stp='off'/>
  <ip address='10.213.0.1' netmask='255.255.255.0'>
    <dhcp>
      <range start='10.213.0.10' end='10.213.0.250'/>
    </dhcp>
  </ip>
</network>
XML
    virsh -c qemu:///system net-define "$xml" >/dev/null
    rm -f "$xml"
fi
# Output captured first: `virsh … | grep -q` under pipefail fails when grep exits early and virsh
# gets SIGPIPE, which made CI try to start an already active network.
net_info=$(virsh -c qemu:///system net-info "$NETWORK")
if ! grep -q 'Active: *yes' <<<"$net_info"; then
    virsh -c qemu:///system net-start "$NETWORK" >/dev/null
fi

if ! virsh -c qemu:///system pool-info default >/dev/null 2>&1; then
    mkdir -p "$POOL_DIR"
    virsh -c qemu:///system pool-define-as default dir --target "$POOL_DIR" >/dev/null
fi
pool_info=$(virsh -c qemu:///system pool-info default)
if ! grep -q 'State: *running' <<<"$pool_info"; then
    virsh -c qemu:///system pool-start default >/dev/null
fi
echo "libvirtd running in network namespace $NETNS; network $NETWORK, pool default ($POOL_DIR)"
