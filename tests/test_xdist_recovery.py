"""The suite's ``-n 2 --dist loadfile`` run survives a worker that segfaults (tests/xdist_recovery.py):
the crashed test fails, every other test runs once, and the run ends."""

import subprocess
import sys
import textwrap
from pathlib import Path

FILES = {
    "test_a.py": "def test_a1(): pass\ndef test_a2(): pass\n",
    "test_b.py": """
        import ctypes
        def test_b1(): pass
        def test_crash(): ctypes.string_at(0)  # a segfault, as XLA's compiler once gave in CI
        def test_b3(): pass
        """,
    "test_c.py": "def test_c1(): pass\n",
    "test_d.py": "def test_d1(): pass\ndef test_d2(): pass\n",
}


def test_a_segfaulting_worker_costs_one_failed_test_and_the_run_ends(tmp_path):
    for name, text in FILES.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadfile", "-p", "xdist_recovery", "-rf",
         "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "-c", "/dev/null", str(tmp_path)],
        cwd=tmp_path, env={"PYTHONPATH": str(Path(__file__).parent), "PATH": ""}, capture_output=True,
        text=True, timeout=120)  # xdist 3.8.0's own scheduler hangs here (or reruns test_crash per worker)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 failed, 7 passed" in out, out
    assert "FAILED test_b.py::test_crash" in out and "crashed while running" in out, out
