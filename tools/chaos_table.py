#!/usr/bin/env python3
"""Rebuilds the chaos table of docs/reliability.md from the chaos suite (issue 19).

    tools/chaos_table.py [BUILD_DIR] [--doc docs/reliability.md] [--timeout SECONDS]
    tools/chaos_table.py --from-json DIR [--doc ...]      # tables from earlier JSON files

Runs every executable behind a ctest test labelled `chaos` (as `ctest -L chaos` lists them)
once with --gtest_output=json, reads the chaos_* properties each test case recorded
(tests/chaos/chaos_record.h) and rewrites the part of the document between
`<!-- chaos-table begin -->` and `<!-- chaos-table end -->`, leaving the rest alone (the file
is created with an introduction when absent). Python 3 standard library only.

A case that failed its assertions shows "no" under "passed"; an executable that crashed or
ran past the timeout (no JSON written) gets a row of its own saying so; the exit status is
1 when any row did not pass.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

BEGIN = "<!-- chaos-table begin -->"
END = "<!-- chaos-table end -->"
INTRO = """# Reliability

What Ridge does when things go wrong: peers killed or stopped at every stage, forged and silent
connections, mismatched calls, garbage settings, network faults. Every row below is one test
case of the chaos suite (`ctest -L chaos`, sources in `tests/chaos/`); the table is generated,
do not edit it by hand.
"""


def chaos_executables(build_dir):
    """Executables of the ctest tests labelled chaos, in first-seen order."""
    out = subprocess.run(["ctest", "--test-dir", build_dir, "-L", "chaos", "--show-only=json-v1"],
                         check=True, capture_output=True, text=True).stdout
    exes = []
    for test in json.loads(out).get("tests", []):
        command = test.get("command") or []
        if command and command[0] not in exes:
            exes.append(command[0])
    return exes


def run_executable(exe, json_path, timeout):
    """Runs every test case of one executable; returns a problem text or None."""
    try:
        proc = subprocess.run([exe, "--gtest_output=json:" + json_path], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "ran past %d s (hang)" % timeout
    if proc.returncode < 0:
        return "killed by signal %d (crash)" % -proc.returncode
    if not os.path.exists(json_path):
        return "exited with %d without writing its JSON" % proc.returncode
    return None


def rows_from_json(path):
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    rows = []
    for suite in doc.get("testsuites", []):
        for case in suite.get("testsuite", []):
            if "chaos_area" not in case:
                continue
            if case.get("result") == "SKIPPED" or case.get("status") == "NOTRUN":
                passed = "skipped"
            else:
                passed = "no" if case.get("failures") else "yes"
            rows.append({
                "area": case["chaos_area"],
                "tried": case.get("chaos_tried", ""),
                "outcome": case.get("chaos_outcome", ""),
                "lost": case.get("chaos_lost_data", "?"),
                "leaks": case.get("chaos_leaks", "?"),
                "passed": passed,
                "test": suite.get("name", "") + "." + case.get("name", ""),
            })
    return rows


def cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def render(rows, problems, command):
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    ran = [r for r in rows if r["passed"] != "skipped"]
    failed = [r for r in ran if r["passed"] != "yes"]
    lost = sum(int(r["lost"]) for r in ran if str(r["lost"]).lstrip("-").isdigit())
    leaks = sum(int(r["leaks"]) for r in ran if str(r["leaks"]).lstrip("-").isdigit())
    lines = [BEGIN, "",
             "Generated %s by `%s`: %d cases ran (%d skipped), %d did not pass, %d crashed or hung "
             "executables, lost data %d, leaks %d." % (when, command, len(ran), len(rows) - len(ran),
                                                       len(failed), len(problems), lost, leaks),
             "",
             "| area | tried | outcome | lost data | leaks | passed |",
             "|---|---|---|--:|--:|---|"]
    for r in sorted(rows, key=lambda r: (r["area"], r["test"])):
        lines.append("| %s | %s | %s | %s | %s | %s |" % (cell(r["area"]), cell(r["tried"]), cell(r["outcome"]),
                                                         cell(r["lost"]), cell(r["leaks"]), cell(r["passed"])))
    for exe, problem in problems:
        lines.append("| %s | every case of `%s` | %s | ? | ? | no |" % ("harness", os.path.basename(exe), cell(problem)))
    lines += ["", END]
    return "\n".join(lines)


def rewrite(doc_path, table):
    text = open(doc_path, encoding="utf-8").read() if os.path.exists(doc_path) else INTRO + "\n## Chaos table\n\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        text = head + table + tail
    else:
        text = text.rstrip("\n") + "\n\n" + table + "\n"
    if not text.endswith("\n"):
        text += "\n"
    with open(doc_path, "w", encoding="utf-8") as f:
        f.write(text)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build_dir", nargs="?", default="build")
    ap.add_argument("--doc", default=os.path.join(here, "..", "docs", "reliability.md"))
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per executable")
    ap.add_argument("--from-json", metavar="DIR", help="read *.json from DIR instead of running")
    args = ap.parse_args()

    rows, problems = [], []
    if args.from_json:
        for name in sorted(os.listdir(args.from_json)):
            if name.endswith(".json"):
                rows += rows_from_json(os.path.join(args.from_json, name))
        command = "tools/chaos_table.py --from-json %s" % args.from_json
    else:
        exes = chaos_executables(args.build_dir)
        if not exes:
            print("no test labelled chaos in %s (configure and build it first)" % args.build_dir, file=sys.stderr)
            return 2
        with tempfile.TemporaryDirectory() as tmp:
            for i, exe in enumerate(exes):
                path = os.path.join(tmp, "%d.json" % i)
                print("running %s" % exe, file=sys.stderr)
                problem = run_executable(exe, path, args.timeout)
                if problem:
                    problems.append((exe, problem))
                if os.path.exists(path):
                    rows += rows_from_json(path)
        command = "tools/chaos_table.py %s" % args.build_dir
    rewrite(os.path.normpath(args.doc), render(rows, problems, command))
    bad = problems or [r for r in rows if r["passed"] == "no"]
    print("%d rows written to %s%s" % (len(rows), os.path.normpath(args.doc), ", some did not pass" if bad else ""),
          file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
