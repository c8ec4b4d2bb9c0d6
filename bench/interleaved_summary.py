"""Medians over the rounds of bench/interleaved_small.sh's output: per build and size, the
out-of-place time (ridge-bench's mean over the timed calls) and i_min (the fastest call)."""
import collections
import statistics
import sys

rows = collections.defaultdict(lambda: collections.defaultdict(list))
build = None
for line in open(sys.argv[1]):
    if line.startswith("### ") and " round " in line:
        build = line.split()[1].rstrip("/").split("/")[-1]
        continue
    f = line.split()
    if build and len(f) > 10 and f[0].isdigit():
        rows[build][int(f[0])].append((float(f[5]), float(f[9]), f[8]))
builds = list(rows)
sizes = sorted({s for b in builds for s in rows[b]})
for title, col in (("out-of-place time us, median (min-max)", 0), ("i_min us, median", 1)):
    print(f"| size | " + " | ".join(f"{b}: {title}" for b in builds) + " |")
    print("| ---: |" + " --- |" * len(builds))
    for s in sizes:
        cells = []
        for b in builds:
            v = [r[col] for r in rows[b][s]]
            cells.append(f"{statistics.median(v):.2f}" + (f" ({min(v):.2f}-{max(v):.2f})" if col == 0 else ""))
        print(f"| {s // 1024} KiB | " + " | ".join(cells) + " |")
    print()
print("rounds:", {b: len(rows[b][sizes[0]]) for b in builds},
      "#wrong:", sorted({r[2] for b in builds for s in sizes for r in rows[b][s]}))
