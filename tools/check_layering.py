#!/usr/bin/env python3
"""Checks that Ridge's folders include only the layers below them (docs/architecture.md).

Reads every `#include "..."` of the library's, the tools' and the benchmarks' sources,
resolves it the way the build does (the including file's folder, then include/, src/ and
the repository root), maps both ends to their layer and reports

  - every include whose edge the layer table below does not allow, naming the file, the
    line and the include, and
  - every include cycle between folders (a folder here is a unit of the table: src/coll
    with its subfolders, each transport's folder, ...), naming the folders and one include
    of each edge.

Exit status 0 when there is neither, 1 otherwise, 2 for bad usage. Standard library only.

    tools/check_layering.py [--root DIR] [--quiet]
"""

import argparse
import os
import re
import sys

# The folders scanned, relative to the root.
SCANNED = ("include", "src", "transports", "kernels", "nccl", "tools", "bench")
# Where a quoted include is looked for after the including file's own folder (the layers'
# include directories, CMakeLists.txt: ridge_layer).
INCLUDE_DIRS = ("include", "src", ".")
SOURCE_SUFFIXES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".inc", ".def")

# Folder prefix -> (unit, layer). The longest matching prefix wins. A unit is what the cycle
# check sees as one folder: src/coll/device is part of the coll unit, since the device
# collectives run the host algorithms (executor, algorithms) and the host algorithms call
# their data-ops seam; every transport folder is a unit of its own.
UNITS = (
    ("include", "include", "public"),
    ("src/core", "src/core", "core"),
    ("src/reduce", "src/reduce", "reduce"),
    ("src/bootstrap", "src/bootstrap", "bootstrap"),
    ("src/device", "src/device", "device"),
    ("src/topo", "src/topo", "topo"),
    ("src/plan", "src/plan", "plan"),
    ("src/coll", "src/coll", "coll"),
    ("src/api", "src/api", "api"),
    ("kernels", "kernels", "kernels"),
    ("kernels/gdr", "kernels/gdr", "kernels"),
    ("transports", "transports", "transports"),
    ("transports/*", "transports/*", "transports"),  # each transport folder: its own unit
    ("nccl", "nccl", "nccl"),
    ("tools", "tools", "programs"),
    ("bench", "bench", "programs"),
)

# Layer -> the layers it may include (besides itself). api -> coll -> plan -> topo;
# coll -> transports -> core; everything may use core and the public headers; the kernels
# (device code and its launchers) sit below every host layer that launches them, and use
# nothing above them but the element sizes of reduce. The programs (tools, benchmarks) may use
# any library layer; no library layer uses them.
_EVERYONE = {"core", "public"}
ALLOWED = {
    "public": {"public"},
    "core": _EVERYONE,
    "reduce": _EVERYONE,
    "kernels": _EVERYONE | {"reduce"},
    "bootstrap": _EVERYONE,
    "topo": _EVERYONE,
    # The device runtime launches the kernels; the emulated runtime may place its GPUs as a
    # topology says (issue 18: RIDGE_DEVICE=emulated with RIDGE_TOPO_FILE).
    "device": _EVERYONE | {"reduce", "kernels", "topo"},
    "plan": _EVERYONE | {"topo"},
    "transports": _EVERYONE | {"reduce", "kernels", "bootstrap", "device", "topo"},
    "coll": _EVERYONE | {"reduce", "kernels", "bootstrap", "device", "topo", "plan", "transports"},
    "api": _EVERYONE | {"reduce", "kernels", "bootstrap", "device", "topo", "plan", "transports", "coll"},
    "nccl": _EVERYONE,
    "programs": _EVERYONE
    | {"reduce", "kernels", "bootstrap", "device", "topo", "plan", "transports", "coll", "api", "programs"},
}

# Known violations, each with who removes it: (including file, include as written) -> why.
# An entry that no longer matches anything is reported (not an error) so it can be dropped.
KNOWN_EXCEPTIONS = {}  # none today: the last one (gdr_device.h in kernels/) moved to its transport

_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def unit_of(rel_dir):
    """The (unit, layer) of a folder relative to the root, or None when no rule covers it."""
    best = None
    for prefix, unit, layer in UNITS:
        if prefix.endswith("/*"):
            base = prefix[:-2]
            if rel_dir.startswith(base + "/"):
                sub = rel_dir[len(base) + 1 :].split("/")[0]
                cand = (len(base) + 1, base + "/" + sub, layer)
            else:
                continue
        elif rel_dir == prefix or rel_dir.startswith(prefix + "/"):
            cand = (len(prefix), unit, layer)
        else:
            continue
        if best is None or cand[0] > best[0]:
            best = cand
    return None if best is None else (best[1], best[2])


def resolve(root, including_dir, name):
    """The included file's path relative to root, or None when it is not in the tree."""
    for base in (including_dir,) + INCLUDE_DIRS:
        candidate = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(os.path.join(root, candidate)):
            return candidate
    return None


def collect(root):
    """Every quoted include in the scanned folders: (file, line, include, resolved file)."""
    found = []
    for top in SCANNED:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames.sort()
            for f in sorted(filenames):
                if not f.endswith(SOURCE_SUFFIXES):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, root)
                with open(path, encoding="utf-8", errors="replace") as fh:
                    for lineno, line in enumerate(fh, 1):
                        m = _INCLUDE.match(line)
                        if not m:
                            continue
                        target = resolve(root, os.path.dirname(rel), m.group(1))
                        found.append((rel, lineno, m.group(1), target))
    return found


def find_cycles(edges):
    """Strongly connected components of more than one unit (Tarjan), each sorted."""
    index, low, on_stack, stack, comps = {}, {}, set(), [], []
    counter = [0]
    nodes = sorted(set(edges) | {b for bs in edges.values() for b in bs})

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in nodes:
        if v not in index:
            visit(v)
    return sorted(comps)


def check(root, exceptions=None):
    """(errors, notes): lists of lines. No errors means the layering holds."""
    exceptions = KNOWN_EXCEPTIONS if exceptions is None else exceptions
    errors, notes = [], []
    used_exceptions = set()
    unit_edges = {}  # unit -> {unit: first (file, line, include)}
    for rel, lineno, name, target in collect(root):
        if target is None:
            continue  # a system or generated header: not ours to place
        src = unit_of(os.path.dirname(rel))
        dst = unit_of(os.path.dirname(target))
        if src is None or dst is None:
            where = rel if src is None else target
            errors.append(f"{rel}:{lineno}: #include \"{name}\": {os.path.dirname(where)} is in no layer "
                          "(add it to tools/check_layering.py)")
            continue
        if (rel, name) in exceptions:
            used_exceptions.add((rel, name))
            continue
        (src_unit, src_layer), (dst_unit, dst_layer) = src, dst
        if dst_layer != src_layer and dst_layer not in ALLOWED[src_layer]:
            errors.append(f"{rel}:{lineno}: #include \"{name}\": layer {src_layer} ({src_unit}) may not use "
                          f"layer {dst_layer} ({dst_unit})")
        if src_unit != dst_unit:
            unit_edges.setdefault(src_unit, {}).setdefault(dst_unit, (rel, lineno, name))
    for comp in find_cycles({u: set(v) for u, v in unit_edges.items()}):
        members = set(comp)
        lines = [f"include cycle between folders {', '.join(comp)}:"]
        for a in comp:
            for b, (rel, lineno, name) in sorted(unit_edges.get(a, {}).items()):
                if b in members:
                    lines.append(f"  {a} -> {b}: {rel}:{lineno}: #include \"{name}\"")
        errors.append("\n".join(lines))
    for key in sorted(set(exceptions) - used_exceptions):
        notes.append(f"known exception {key[0]} -> {key[1]} no longer occurs: drop it from KNOWN_EXCEPTIONS")
    return errors, notes


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=os.path.dirname(here), help="the repository root (default: this tree)")
    parser.add_argument("--quiet", action="store_true", help="print only problems")
    args = parser.parse_args(argv)
    if not os.path.isdir(os.path.join(args.root, "src")):
        print(f"check_layering: {args.root} has no src/ folder", file=sys.stderr)
        return 2
    errors, notes = check(args.root)
    for n in notes:
        print(f"note: {n}")
    for e in errors:
        print(f"layering: {e}")
    if errors:
        print(f"layering: {len(errors)} problem(s); the allowed edges are in tools/check_layering.py "
              "(docs/architecture.md)")
        return 1
    if not args.quiet:
        print(f"layering: ok ({len(KNOWN_EXCEPTIONS)} known exception(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
