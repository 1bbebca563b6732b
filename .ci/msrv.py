#!/usr/bin/env python3
"""MSRV check without a second toolchain: every crate the library links (normal dependencies,
all features, this host's target) must declare a rust-version at most the package's own.

Reads `cargo metadata` on stdin. Exits 1 naming each offender (fix: `cargo update -p NAME` with
CARGO_RESOLVER_INCOMPATIBLE_RUST_VERSIONS=fallback, or raise rust-version on purpose)."""
import json
import sys

m = json.load(sys.stdin)
pkgs = {p["id"]: p for p in m["packages"]}
nodes = {n["id"]: n for n in m["resolve"]["nodes"]}
root = next(p for p in m["packages"] if p["name"] == "llm-bulkhead")
def version(v):
    parts = [int(x) for x in v.split(".")[:3]]
    return tuple(parts + [0] * (3 - len(parts)))


msrv = version(root["rust_version"])


seen, stack = set(), [root["id"]]
while stack:
    pid = stack.pop()
    if pid in seen:
        continue
    seen.add(pid)
    for dep in nodes[pid]["deps"]:
        # Normal dependencies only; platform-specific ones for other targets are not linked.
        if any(k["kind"] is None and k["target"] is None for k in dep["dep_kinds"]):
            stack.append(dep["pkg"])

bad = []
for pid in sorted(seen):
    p = pkgs[pid]
    rv = p.get("rust_version")
    if rv and version(rv) > msrv:
        bad.append(f"{p['name']} {p['version']} needs Rust {rv}")
if bad:
    print(f"dependencies above the MSRV {root['rust_version']}:", *bad, sep="\n  ")
    sys.exit(1)
print(f"MSRV {root['rust_version']}: {len(seen) - 1} linked dependencies declare no newer Rust")
