#!/usr/bin/env python3
"""Checks tools/chaos_table.py on GoogleTest JSON written here: a passed, a failed and a
skipped case, a case without chaos properties, and a document whose text around the table
must survive. Exit status 0 when every check holds."""
import json
import os
import subprocess
import sys
import tempfile

TOOL = sys.argv[1]


def case(name, area, tried, failures=None, result="COMPLETED", lost="0", leaks="0"):
    c = {"name": name, "status": "RUN", "result": result, "classname": "Chaos"}
    if area is not None:
        c.update({"chaos_area": area, "chaos_tried": tried, "chaos_outcome": "clean error",
                  "chaos_lost_data": lost, "chaos_leaks": leaks})
    if failures:
        c["failures"] = [{"failure": failures, "type": ""}]
    return c


def main():
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        jsondir = os.path.join(tmp, "json")
        os.mkdir(jsondir)
        suite = {"testsuites": [{"name": "Chaos", "testsuite": [
            case("Good", "mismatch/shm", "root 0 vs root 1"),
            case("Bad", "mismatch/tcp", "count | pipe", failures="boom", lost="3"),
            case("Skipped", "softnic", "not here", result="SKIPPED"),
            case("Plain", None, None),
        ]}]}
        with open(os.path.join(jsondir, "a.json"), "w") as f:
            json.dump(suite, f)
        doc = os.path.join(tmp, "reliability.md")
        with open(doc, "w") as f:
            f.write("# Title\n\nbefore\n\n<!-- chaos-table begin -->\nold table\n<!-- chaos-table end -->\n\nafter\n")
        proc = subprocess.run([sys.executable, TOOL, "--from-json", jsondir, "--doc", doc],
                              capture_output=True, text=True)
        text = open(doc).read()
        if proc.returncode != 1:
            problems.append("exit status %d, expected 1 (a case did not pass)" % proc.returncode)
        for want in ["before\n", "\nafter\n", "| mismatch/shm | root 0 vs root 1 | clean error | 0 | 0 | yes |",
                     "| mismatch/tcp | count \\| pipe | clean error | 3 | 0 | no |",
                     "| softnic | not here | clean error | 0 | 0 | skipped |",
                     "2 cases ran (1 skipped), 1 did not pass", "lost data 3"]:
            if want not in text:
                problems.append("missing: %r" % want)
        if "old table" in text:
            problems.append("the old table was kept")
        if "Plain" in text:
            problems.append("a case without chaos properties got a row")
        # A document without markers gets the table appended; a missing one is created.
        fresh = os.path.join(tmp, "new.md")
        subprocess.run([sys.executable, TOOL, "--from-json", jsondir, "--doc", fresh], capture_output=True)
        if "<!-- chaos-table begin -->" not in open(fresh).read():
            problems.append("a new document has no table")
    for p in problems:
        print("FAIL:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
