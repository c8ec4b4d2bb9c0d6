#!/usr/bin/env python3
"""tools/check_layering.py on small synthetic trees: a clean one passes, and a seeded
disallowed edge, a seeded include cycle between folders and a kernel including a transport
each fail, naming the file and the include. Standard library only."""

import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "check_layering.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import check_layering  # noqa: E402

# A tree whose every include goes down the layers.
CLEAN = {
    "include/ridge/ridge.h": "",
    "src/core/status.h": '#include "ridge/ridge.h"\n',
    "src/core/host_device.h": "",
    "src/topo/model.h": '#include "core/status.h"\n',
    "src/plan/plan.h": '#include "topo/model.h"\n',
    "transports/transport.h": '#include "core/status.h"\n',
    "transports/shm/shm.cpp": '#include "transports/transport.h"\n',
    "kernels/line.h": '#include "core/host_device.h"\n',
    "src/coll/comm.h": '#include "plan/plan.h"\n#include "transports/transport.h"\n',
    "src/coll/device/proxy.cpp": '#include "coll/comm.h"\n#include "kernels/line.h"\n',
    "src/api/api.cpp": '#include "coll/comm.h"\n',
    "tools/tool.cpp": '#include "plan/plan.h"\n#include "tool.h"\n',
    "tools/tool.h": "",
}


def make_tree(root, files):
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            fh.write(text)


class CheckLayering(unittest.TestCase):
    def run_check(self, extra, exceptions=None):
        with tempfile.TemporaryDirectory() as root:
            make_tree(root, {**CLEAN, **extra})
            return check_layering.check(root, exceptions=exceptions if exceptions is not None else {})

    def run_script(self, extra):
        with tempfile.TemporaryDirectory() as root:
            make_tree(root, {**CLEAN, **extra})
            return subprocess.run([sys.executable, SCRIPT, "--root", root], capture_output=True, text=True)

    def test_clean_tree_passes(self):
        errors, notes = self.run_check({})
        self.assertEqual(errors, [])
        self.assertEqual(notes, [])
        done = self.run_script({})
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)

    def test_upward_include_fails_naming_file_and_include(self):
        # No cycle: the clean tree's transports use nothing of topo.
        errors, _ = self.run_check({"src/topo/graph.cpp": '#include "core/status.h"\n#include "transports/transport.h"\n'})
        self.assertEqual(len(errors), 1, errors)
        self.assertIn('src/topo/graph.cpp:2: #include "transports/transport.h"', errors[0])
        self.assertIn("layer topo (src/topo) may not use layer transports (transports)", errors[0])

    def test_upward_include_that_closes_a_cycle_reports_both(self):
        errors, _ = self.run_check({"src/topo/graph.cpp": '#include "coll/comm.h"\n'})
        self.assertEqual(len(errors), 2, errors)
        self.assertIn('src/topo/graph.cpp:1: #include "coll/comm.h": layer topo', errors[0])
        self.assertIn("include cycle between folders src/coll, src/plan, src/topo", errors[1])

    def test_cycle_between_folders_fails(self):
        # Both transports: the edges are allowed, the cycle is not.
        errors, _ = self.run_check({
            "transports/a/a.h": '#include "transports/b/b.h"\n',
            "transports/b/b.h": '#include "core/status.h"\n',
            "transports/b/b.cpp": '#include "transports/a/a.h"\n',
        })
        self.assertEqual(len(errors), 1, errors)
        self.assertIn("include cycle between folders transports/a, transports/b", errors[0])
        self.assertIn('transports/a -> transports/b: transports/a/a.h:1: #include "transports/b/b.h"', errors[0])
        self.assertIn('transports/b -> transports/a: transports/b/b.cpp:1: #include "transports/a/a.h"', errors[0])

    def test_kernel_including_a_transport_fails_and_closes_a_cycle(self):
        errors, _ = self.run_check({
            "transports/verbs/layout.h": '#include "kernels/line.h"\n',
            "kernels/wqe.h": '#include "transports/verbs/layout.h"\n',
        })
        text = "\n".join(errors)
        self.assertIn('kernels/wqe.h:1: #include "transports/verbs/layout.h": layer kernels', text)
        self.assertIn("include cycle between folders kernels, transports/verbs", text)

    def test_seeded_violation_and_cycle_fail_the_script(self):
        done = self.run_script({
            "src/plan/bad.cpp": '#include "transports/transport.h"\n',
            "src/api/helper.h": '#include "tools/tool.h"\n',
            "src/coll/x.h": '#include "api/helper.h"\n',
        })
        self.assertEqual(done.returncode, 1, done.stdout + done.stderr)
        self.assertIn('src/plan/bad.cpp:1: #include "transports/transport.h"', done.stdout)
        self.assertIn('src/api/helper.h:1: #include "tools/tool.h"', done.stdout)
        self.assertIn("include cycle between folders src/api, src/coll", done.stdout)

    def test_known_exception_is_skipped_and_a_stale_one_noted(self):
        bad = {"kernels/wqe.h": '#include "transports/transport.h"\n'}
        errors, notes = self.run_check(bad, exceptions={("kernels/wqe.h", "transports/transport.h"): "test"})
        self.assertEqual(errors, [])
        self.assertEqual(notes, [])
        errors, notes = self.run_check({}, exceptions={("kernels/wqe.h", "transports/transport.h"): "test"})
        self.assertEqual(errors, [])
        self.assertEqual(len(notes), 1)
        self.assertIn("no longer occurs", notes[0])

    def test_folder_in_no_layer_fails(self):
        errors, _ = self.run_check({"src/newthing/a.h": "", "src/coll/y.cpp": '#include "newthing/a.h"\n'})
        self.assertEqual(len(errors), 1, errors)
        self.assertIn("src/newthing is in no layer", errors[0])


if __name__ == "__main__":
    unittest.main()
