#!/usr/bin/env bash
# The init of one real node of banlieue-testenv (src/nodes.rs), run as PID 1 of the node's own PID,
# mount and UTS namespaces inside its network namespace:
#   ip netns exec NETNS unshare --mount --uts --pid --fork --mount-proc --propagation private \
#       --kill-child=SIGKILL bash boot.sh DIR
# DIR holds the node's files, written by nodes.rs: env (NAME, CGROUP, NODE_IP, IMAGES, PATH,
# HOST_RUN_PATHS),
# containerd.toml, kubelet.yaml, kubelet.kubeconfig, kube-proxy.yaml, kube-proxy.kubeconfig, cni/net.d. Everything the node creates lives in DIR or in its
# namespaces (gone with them); killing this process's parent ends the node, pods included.
set -euo pipefail
dir="$1"
# shellcheck source=/dev/null
. "$dir/env"
log() { printf '[node %s %s] %s\n' "$NAME" "$(date -u +%H:%M:%S)" "$*"; }

hostname "$NAME"
sysctl -qw net.ipv4.ip_forward=1

# `ip netns exec` mounted a fresh /sys, which hides the host's cgroup v1 hierarchies: mount them
# again, and give the node its own cgroup (kubelet's cgroupRoot) in each.
mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup
for controller in cpu cpuacct cpuset memory devices freezer blkio pids; do
    mkdir -p "/sys/fs/cgroup/$controller"
    mount -t cgroup -o "$controller" cgroup "/sys/fs/cgroup/$controller"
    mkdir -p "/sys/fs/cgroup/$controller/$CGROUP"
done
mkdir -p /sys/fs/cgroup/systemd
mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd
mkdir -p "/sys/fs/cgroup/systemd/$CGROUP"
cat /sys/fs/cgroup/cpuset/cpuset.cpus > "/sys/fs/cgroup/cpuset/$CGROUP/cpuset.cpus"
cat /sys/fs/cgroup/cpuset/cpuset.mems > "/sys/fs/cgroup/cpuset/$CGROUP/cpuset.mems"

# Private /run, /var/lib and /var/log: kubelet and the CNI plugins use fixed paths there. The
# host folders under /run named in HOST_RUN_PATHS (e.g. /run/libvirt, for hostPath volumes of
# Pods that talk to a daemon of the host) are held aside first and bound back on top.
for path in ${HOST_RUN_PATHS:-}; do
    held="$dir/host-run/${path//\//_}"
    mkdir -p "$held"
    mount --bind "$path" "$held"
done
mount -t tmpfs -o mode=755 run /run
for path in ${HOST_RUN_PATHS:-}; do
    mkdir -p "$path"
    mount --bind "$dir/host-run/${path//\//_}" "$path"
done
mkdir -p "$dir/var/lib" "$dir/var/log"
mount --bind "$dir/var/lib" /var/lib
mount --bind "$dir/var/log" /var/log

log "starting containerd"
nice -n 19 containerd --config "$dir/containerd.toml" > "$dir/containerd.log" 2>&1 &
# Ready when it answers, not when its socket exists: the socket is bound a moment before
# containerd serves on it, and under load (the node runs niced) a client can land in between
# ("connection refused").
containerd_answers() { ctr --address "$dir/containerd.sock" version > /dev/null 2>&1; }
for _ in $(seq 1 300); do
    containerd_answers && break
    sleep 0.1
done
containerd_answers || { log "containerd did not start within 30 s: $(tail -5 "$dir/containerd.log")"; exit 1; }
for image in $IMAGES; do
    reference="${image%%=*}" tarball="${image#*=}"
    ctr --address "$dir/containerd.sock" -n k8s.io images import --base-name "${reference%:*}" "$tarball" > /dev/null
done
log "images imported; starting kube-proxy and kubelet"
nice -n 19 kube-proxy --config="$dir/kube-proxy.yaml" > "$dir/kube-proxy.log" 2>&1 &
exec nice -n 19 kubelet --config="$dir/kubelet.yaml" --kubeconfig="$dir/kubelet.kubeconfig" \
    --root-dir=/var/lib/kubelet --hostname-override="$NAME" --node-ip="$NODE_IP" -v=1
