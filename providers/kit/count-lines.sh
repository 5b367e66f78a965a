#!/usr/bin/env bash
# Counts the provider production code: the non-blank lines of the kit's and each provider
# crate's src/ (not its unit tests: a file's `#[cfg(test)] mod … {` and what follows it, nor
# test-double files: fake.rs, provision_tests.rs), not the hypervisor clients or the simulator.
# Usage: providers/kit/count-lines.sh [REV]   (default: the working tree)
set -euo pipefail
cd "$(dirname "$0")/../.."
rev="${1:-}"
dirs=(providers/kit/src providers/proxmox/provider/src providers/libvirt/src providers/vsphere/provider/src)
files() {
    if [ -n "$rev" ]; then
        git ls-tree -r --name-only "$rev" -- "${dirs[@]}" 2>/dev/null
    else
        git ls-files -co --exclude-standard -- "${dirs[@]}"
    fi
}
show() { if [ -n "$rev" ]; then git show "$rev:$1"; else cat "$1"; fi; }
total=0
for d in "${dirs[@]}"; do
    n=0
    for f in $(files | grep "^$d/" | grep '\.rs$' | grep -v -e '/fake\.rs$' -e '_tests\.rs$'); do
        # A `#[cfg(test)]` that opens a module block ends the production code; one before a
        # module declared in a file of its own (`mod x_tests;`) only skips that declaration. An
        # indented one that opens a module block (a test a macro expands into each crate) skips
        # that block, up to its closing brace at the same indentation.
        c=$(show "$f" | awk 'skip {if ($0 == end) skip=0; next}
            icfg {icfg=0; if ($0 ~ ("^" ind "mod [a-z_0-9]+ *\\{$")) {skip=1; end=ind "}"; next} else if (!stop) n++}
            /^[ \t]+#\[cfg\(test\)\]$/ {icfg=1; match($0, /^[ \t]+/); ind=substr($0, 1, RLENGTH); next}
            cfg && /^mod [a-z_0-9]+ *\{/ {stop=1} cfg {cfg=0; if (/^mod [a-z_0-9]+;/) next}
            /^#\[cfg\(test\)\]/ {cfg=1; next} !stop && NF {n++} END {print n+0}')
        n=$((n + c))
    done
    printf '%-34s %6d\n' "$d" "$n"
    total=$((total + n))
done
printf '%-34s %6d\n' total "$total"
