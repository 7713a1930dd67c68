"""The pure parts of ``evq bench net``: percentiles, counting pulled records, reading the
broker child's listening line, and the options it refuses."""

from __future__ import annotations

import math
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evq.bench.broker_process import listening_address, process_cpu_seconds
from evq.bench.net import NetBenchOptions, count_records, percentile
from evq.bench.store import BenchError
from evq.domain.record import PutRecord
from tests.strategies import ipv4_hosts, put_records

latencies = st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=200)
percents = st.floats(0.001, 100)


@given(latencies, percents)
def test_percentile_is_a_measured_value_with_that_share_at_or_below_it(
    values: list[float], p: float
) -> None:
    ordered = sorted(values)
    got = percentile(ordered, p)
    assert got in ordered
    rank = math.ceil(p / 100 * len(ordered))
    assert sum(v <= got for v in ordered) >= rank
    assert sum(v < got for v in ordered) < rank


@given(latencies, percents, percents)
def test_percentile_grows_with_p(values: list[float], p: float, q: float) -> None:
    ordered = sorted(values)
    low, high = sorted((p, q))
    assert percentile(ordered, low) <= percentile(ordered, high)


def test_percentile_examples_and_refusals() -> None:
    ordered = [float(v) for v in range(1, 101)]
    assert (percentile(ordered, 50), percentile(ordered, 99), percentile(ordered, 100)) == (
        50.0, 99.0, 100.0)
    assert percentile([7.0], 1) == 7.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match="not in"):
        percentile([1.0], 0)


@given(st.lists(put_records(), max_size=12))
def test_count_records_counts_a_pull_body(records: list[PutRecord]) -> None:
    assert count_records(b"".join(bytes(r.data) for r in records)) == len(records)


@given(st.lists(put_records(), min_size=1, max_size=6), st.data())
def test_count_records_refuses_a_body_cut_inside_a_record(
    records: list[PutRecord], data: st.DataObject
) -> None:
    body = b"".join(bytes(r.data) for r in records)
    cut = data.draw(st.integers(1, len(records[-1].data) - 1))
    with pytest.raises(BenchError, match="ends inside a record"):
        count_records(body[:-cut])


@given(ipv4_hosts(st.integers(1, 65535)), st.text(max_size=40))
def test_listening_address_reads_the_cli_line(host: tuple[str, int], tail: str) -> None:
    line = f"evq broker listening on {host[0]}:{host[1]} (backend mmap, data {tail})\n"
    assert listening_address(line) == host


@pytest.mark.parametrize("line", [
    "", "evq broker starting\n", "listening on 127.0.0.1:0\n",
    "listening on 127.0.0.1:70000\n", "listening on 127.0.0.1:\n",
])
def test_listening_address_ignores_other_lines(line: str) -> None:
    assert listening_address(line) is None


def test_process_cpu_seconds_of_this_process_and_of_none() -> None:
    mine = process_cpu_seconds(os.getpid())
    if mine is not None:  # a /proc to read (Linux)
        assert mine >= 0
    assert process_cpu_seconds(-1) is None


@pytest.mark.parametrize(("values", "error"), [
    ({"messages": 0}, "messages must be at least 1"),
    ({"in_flight": 0}, "in_flight must be at least 1"),
    ({"size": -1}, "size must not be negative"),
    ({"latency_seconds": 0.0}, "latency_seconds must be positive"),
    ({"size": 1 << 20, "batch": 32}, "frame limit"),
])
def test_options_refuse_what_cannot_run(values: dict[str, object], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        NetBenchOptions(**values)  # type: ignore[arg-type]
