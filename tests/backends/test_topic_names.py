"""Every legal topic name round-trips through every backend's on-disk naming.

A store names things after topics (the mmap store a ConsumeQueue directory, the key-value
stores their queue keys).  A name that comes back different after a restart orphans its queue:
pulls from offset 0 find nothing and the next send takes offset 0 again, overwriting what was
acknowledged.  ``%RETRY%default`` once came back as ``%RETRY\\ufffdfault`` (``%de`` decoded as
a percent escape), so these properties draw from the whole legal alphabet, ``%`` included, at
every length up to the limit, through a clean close and reopen, and through SIGKILL and
reopen (recovery rebuilds what a clean close would have written).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from evq.backends.registry import TRAITS
from evq.domain.log import GetStatus, MessageLog
from evq.domain.message import new_message
from evq.domain.record import decode, put_record
from tests.backends import crash_child, names_child
from tests.processes import REPO_ROOT, python_env
from tests.strategies import topics

topic_sets = st.lists(topics, min_size=1, max_size=4, unique=True)
PER_TOPIC = names_child.PER_TOPIC
_body = names_child.body
CHILD_TIMEOUT_S = 60.0
_FIXTURE = [HealthCheck.function_scoped_fixture]  # each example makes its own directory


def _check_topics(log: MessageLog, names: list[str]) -> None:
    """Each topic reads back its messages from offset 0, and the next append continues the
    queue instead of overwriting it."""
    for t in names:
        page = log.read(t, 0, 0, max_count=32)
        assert page.status is GetStatus.FOUND, f"{t!r}: {page.status}"
        assert [decode(r).body for r in page.records] == [
            _body(t, n) for n in range(PER_TOPIC)], t
    for t in names:
        [res] = log.append([put_record(new_message(t, b"next", compress_over=None))])
        assert res.queue_offset == PER_TOPIC, f"{t!r} restarted its queue at {res.queue_offset}"


@settings(max_examples=25, suppress_health_check=_FIXTURE)
@given(names=topic_sets)
@example(names=["%RETRY%default", "%DLQ%cafe", "%RETRY%abc", "%DLQ%12x"])
@example(names=["%" * 127, "%25", "%2F..", "a|b%7Cc"])
def test_every_legal_name_survives_close_and_reopen(open_log, names: list[str]) -> None:
    with tempfile.TemporaryDirectory() as d:
        store = Path(d) / "store"
        log = open_log(path=store)
        log.append([put_record(new_message(t, _body(t, n), compress_over=None))
                    for n in range(PER_TOPIC) for t in names])
        log.close()
        reopened = open_log(path=store, **crash_child.SIZES)
        _check_topics(reopened, names)
        reopened.close()  # before its directory goes


def _store_and_kill(backend: str, store: Path, names: list[str]) -> None:
    """Run :mod:`tests.backends.names_child` until it acknowledged, then SIGKILL it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.backends.names_child", backend, str(store),
         json.dumps(names)], cwd=REPO_ROOT, env=python_env(), stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    first: list[str] = []
    reader = threading.Thread(target=lambda: first.append(proc.stdout.readline()), daemon=True)
    reader.start()
    try:
        reader.join(CHILD_TIMEOUT_S)
        assert first == ["ACKED\n"], (
            f"the child did not acknowledge in {CHILD_TIMEOUT_S:g} s: {first} rc={proc.poll()}")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc.stdout.close()


@pytest.mark.parametrize("backend", sorted(b for b, t in TRAITS.items() if t.persistent))
@settings(max_examples=10, suppress_health_check=_FIXTURE)
@given(names=topic_sets)
@example(names=["%RETRY%default", "%DLQ%cafe", "%" * 127, "a|b%7Cc"])
def test_every_legal_name_survives_sigkill_and_reopen(open_log, backend: str,
                                                      names: list[str]) -> None:
    """On the backends that keep data past their process (memory keeps nothing to reopen)."""
    with tempfile.TemporaryDirectory() as d:
        store = Path(d) / "store"
        _store_and_kill(backend, store, names)
        reopened = open_log(path=store, **crash_child.SIZES)
        _check_topics(reopened, names)
        reopened.close()


def test_a_name_ending_in_a_newline_is_refused() -> None:
    """``$`` matches before a final newline; validation must match the whole name."""
    from evq.domain.codes import BrokerError
    from evq.domain.groups import validate_group
    from evq.domain.topics import validate_topic

    for validate, name in ((validate_topic, "t\n"), (validate_group, "g\n")):
        try:
            validate(name)
        except BrokerError:
            continue
        raise AssertionError(f"{name!r} was accepted")
