#!/usr/bin/env bash
# binary-image.sh OUT.tar TAG BINARY PATH USER [PORT...]: an OCI image layout tarball (no registry)
# holding BINARY at PATH with the shared libraries it links (ldd), /etc/passwd and /etc/group
# with root and nonroot (65532, as distroless), /tmp, /run (and /var/run linked to it) and the
# host's CA bundle; entrypoint PATH,
# user USER, the ports exposed. Tag TAG (see image.sh for importing it).
set -euo pipefail
out="$1" tag="$2" binary="$3" path="$4" user="$5"; shift 5
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(mktemp -d)"
# The image's / as in any image (mktemp makes it 0700: then no non-root user could read /etc/passwd).
chmod 0755 "$root"
trap 'rm -rf "$root"' EXIT
install -D -m 0755 "$binary" "$root$path"
# The dynamic loader and every library the binary links, at the paths it expects them.
ldd "$binary" | grep -o '/[^ ]*' | while read -r library; do
    install -D -m 0755 "$library" "$root$library"
done
mkdir -p "$root/etc/ssl/certs" "$root/tmp" "$root/run" "$root/var"
chmod 1777 "$root/tmp"
# /var/run is /run, as in Debian's and distroless images: a volume mounted at /var/run/<x> (the
# libvirt provider's socket folder) is where clients look for it (/run/libvirt/libvirt-sock).
ln -s ../run "$root/var/run"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$root/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' > "$root/etc/group"
# As distroless: user and group lookups (getpwuid, e.g. libvirt's client) read the files above.
printf 'passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n' > "$root/etc/nsswitch.conf"
[ -f /etc/ssl/certs/ca-certificates.crt ] && cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
flags=(--config.entrypoint "$path" --config.user "$user")
for port in "$@"; do
    flags+=(--config.exposedports "$port/tcp")
done
"$here/image.sh" "$out" "$tag" "$root" "${flags[@]}"
