#!/usr/bin/env bash
# The real cloud-init for the tests that read our seeds with it (tests/cloud-init/support.rs):
# Debian bookworm's `cloud-init` package, unpacked into tests/cloud-init/root (not installed: none
# of its services is registered on this machine), and the Debian Python packages it imports.
# Idempotent; run by .ci/run. Tests run it with Debian's /usr/bin/python3 and PYTHONPATH set.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$here/root"
if [ -x "$root/usr/bin/cloud-init" ]; then
    echo "cloud-init is unpacked in $root"
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "needs root and apt-get (Debian) to fetch Debian's cloud-init package" >&2
    exit 1
fi
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    python3-yaml python3-jinja2 python3-jsonschema python3-configobj python3-jsonpatch \
    python3-netifaces python3-requests python3-oauthlib python3-serial >/dev/null
download="$(mktemp -d)"
trap 'rm -rf "$download"' EXIT
chmod 0755 "$download"
# (apt warns that it downloads as root, outside its sandbox: expected here.)
(cd "$download" && apt-get download -qq cloud-init 2>/dev/null) \
    || { echo "apt-get download cloud-init failed (is Debian's archive reachable?)" >&2; exit 1; }
rm -rf "$root.partial"
dpkg-deb -x "$download"/cloud-init_*.deb "$root.partial"
mv "$root.partial" "$root"
echo "cloud-init $(dpkg-deb -f "$download"/cloud-init_*.deb Version) unpacked in $root"
