"""The README runs as written: each ``sh`` and ``python`` block, copied verbatim, in order,
against an ``evq serve`` on the default ports it names, from a fresh directory.

A block the suite cannot run says why in the README source, in a comment right before it
(``<!-- not run by tests/test_readme.py: REASON -->``): the set-up commands CI itself runs,
servers that run until stopped, the chaos suite.  Every other block runs, so a new block is
tested by default; ``text`` blocks are usage synopses and never run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from tests.processes import REPO_ROOT, python_env, running_evq, wait_registered

README = REPO_ROOT / "README.md"
NOT_RUN = re.compile(r"<!-- not run by tests/test_readme\.py: (?P<why>[^>]+) -->\n*$")
FENCE = re.compile(r"^```(?P<lang>[a-z]*)\n(?P<body>.*?)^```$", re.S | re.M)
BLOCK_TIMEOUT_S = 120.0


@attrs.frozen
class Block:
    line: int
    lang: str
    body: str
    not_run: str | None


def blocks() -> list[Block]:
    text = README.read_text()
    found = []
    for m in FENCE.finditer(text):
        skip = NOT_RUN.search(text[: m.start()])
        found.append(Block(text.count("\n", 0, m.start()) + 1, m["lang"], m["body"],
                           skip["why"] if skip else None))
    return found


RUNNABLE = [b for b in blocks() if b.lang in ("sh", "python")]


def test_every_block_the_suite_skips_says_why() -> None:
    assert RUNNABLE, "no sh or python blocks found in the README"
    for b in blocks():
        assert b.lang in ("sh", "python", "text", ""), f"README line {b.line}: {b.lang!r}"
    assert [b for b in RUNNABLE if b.not_run is None], "the README test would run nothing"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Path]:
    """``evq serve`` on the README's ports (9876, 10911) and a fresh working directory."""
    work = tmp_path / "work"
    work.mkdir()
    with running_evq("--log-level", "warning", "serve", "--data", str(tmp_path / "server"),
                     servers=2) as evq:
        wait_registered(evq.addresses["namesrv"], evq.addresses["broker"])
        yield work
        assert evq.stop() == 0


def run_block(block: Block, work: Path) -> subprocess.CompletedProcess[str]:
    env = {**python_env(), "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
                                   f"{os.environ.get('PATH', '')}"}
    command = (["bash", "-euo", "pipefail", "-c", block.body] if block.lang == "sh"
               else [sys.executable, "-c", block.body])
    return subprocess.run(command, cwd=work, env=env, capture_output=True, text=True,
                          timeout=BLOCK_TIMEOUT_S, check=False)


def test_the_readme_runs_as_written(served: Path) -> None:
    (served / "examples").symlink_to(REPO_ROOT / "examples")  # `python examples/...` as written
    for block in RUNNABLE:
        if block.not_run is not None:
            continue
        out = run_block(block, served)
        assert out.returncode == 0, (
            f"README line {block.line} ({block.lang}) failed with {out.returncode}:\n"
            f"{block.body}\n--- stdout\n{out.stdout[-2000:]}\n--- stderr\n{out.stderr[-3000:]}")
