"""A broker install (``pip install -e .``, no extras) runs: no module a broker, a client or
the admin tools load needs a package that only an extra brings (test tools, Spark, plotting,
Redis, certificates for tests, the stock client).  The suite itself runs with every extra
installed, so this runs the quick start's server in a process where those packages cannot be
imported, and imports every module outside the extras' own subpackages there."""

from __future__ import annotations

import subprocess
import sys

from tests.processes import REPO_ROOT, python_env

EXTRAS_ONLY = ("pytest", "hypothesis", "trustme", "pyspark", "pyarrow", "matplotlib", "redis",
               "rocketmq", "ruff", "eventsourcing")
"""What pyproject's extras (dev, spark, bench) bring and the dependencies do not."""
EXTRA_SUBPACKAGES = ("evq.spark", "evq.bench")
"""Subpackages that are the extras' features: they may import their packages."""

PROGRAM = f"""
import importlib, pkgutil, sys
for name in {EXTRAS_ONLY!r}:
    sys.modules[name] = None  # importing it now raises ImportError, as when not installed
import evq
for module in pkgutil.walk_packages(evq.__path__, "evq."):
    if not module.name.startswith({EXTRA_SUBPACKAGES!r}) and module.name != "evq.__main__":
        importlib.import_module(module.name)  # (evq.__main__ would run the command)
from evq.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_the_quick_start_server_needs_no_extra() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM, "serve", "--help"], capture_output=True, text=True,
        cwd=REPO_ROOT, env=python_env(), timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "name server and a broker in one process" in out.stdout

