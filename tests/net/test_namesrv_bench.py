"""``python -m evq.bench.namesrv`` (the README's figure for a large registration's stall):
one small size run through, every figure present and sane."""

from __future__ import annotations

from evq.bench import namesrv


def test_the_registration_benchmark_reports_every_figure() -> None:
    result = namesrv.run_size(2_000)
    assert result.topics == 2_000
    assert result.first_apply_s > 0 and result.changed_apply_s > 0
    assert result.heartbeat_round_trip_s > 0 and result.first_round_trip_s > 0
    assert result.max_stall_s >= 0 and result.slowest_lookup_s > 0 and result.lookups > 0
    assert result.drop_s > 0 and result.drop_max_stall_s >= 0
    line = namesrv.format_result(result)
    assert "2,000 topics" in line and "longest loop stall" in line and "table dropped" in line
