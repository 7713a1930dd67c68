"""The one stock-client death :func:`tests.compat.conftest.collect` forgives is recognised
from a real faulthandler report: a process that segfaults with its main thread in a
``shutdown`` of ``rocketmq/client.py`` called from ``consume``, and nothing else."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.compat.conftest import SHUTDOWN_CRASH

CRASH = "import ctypes\ndef shutdown():\n    ctypes.string_at(0)\n"


def crash_report(tmp_path: Path, where: str) -> str:
    """faulthandler's stderr for a segfault in ``shutdown`` (``where="shutdown"``) or in the
    consume loop itself (``where="consume"``)."""
    (tmp_path / "rocketmq").mkdir()
    (tmp_path / "rocketmq" / "__init__.py").write_text("")  # before the installed one
    (tmp_path / "rocketmq" / "client.py").write_text(CRASH)
    body = "client.shutdown()" if where == "shutdown" else "__import__('ctypes').string_at(0)"
    (tmp_path / "stock_client.py").write_text(
        f"import faulthandler\nfrom rocketmq import client\ndef consume():\n    {body}\n"
        "faulthandler.enable()\nconsume()\n")
    out = subprocess.run([sys.executable, "stock_client.py"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == -11, out
    return out.stderr


@pytest.mark.parametrize(("where", "forgiven"), [("shutdown", True), ("consume", False)])
def test_only_a_crash_inside_shutdown_is_recognised(tmp_path: Path, where: str,
                                                    forgiven: bool) -> None:
    assert (SHUTDOWN_CRASH.search(crash_report(tmp_path, where)) is not None) is forgiven
