"""The chaos suite's knobs: how long it runs, and where its figures go.

CI runs the short version (``pytest``); ``pytest tests/chaos --chaos-long`` runs it long, and
``--chaos-report PATH`` appends every test's figures (kill rounds, acknowledged messages,
lost, duplicates, bad inputs tried, memory) to PATH as JSON lines: the README's Reliability
figures come from there.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

SHORT_KILL_ROUNDS = 20
LONG_KILL_ROUNDS = 200

Report = Callable[..., None]


@pytest.fixture
def long_run(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--chaos-long"))


@pytest.fixture
def kill_rounds(long_run: bool) -> int:
    return LONG_KILL_ROUNDS if long_run else SHORT_KILL_ROUNDS


@pytest.fixture
def report(request: pytest.FixtureRequest) -> Report:
    """``report(**figures)``: one JSON line, named by the test, in the ``--chaos-report``
    file; a test's figures are also attached to its result as user properties."""
    path = request.config.getoption("--chaos-report")

    def write(**figures: object) -> None:
        for key, value in figures.items():
            request.node.user_properties.append((key, value))
        if path:
            with Path(path).open("a") as out:
                out.write(json.dumps({"test": request.node.name, **figures}) + "\n")

    return write
