"""How long the in-memory backend keeps a store's tables: as long as its directory holds
them (:mod:`evq.backends.memory.tables`), so a process that makes and removes many stores
does not keep every one of them in memory."""

from __future__ import annotations

import shutil
from pathlib import Path

from evq.backends.memory import tables
from evq.backends.registry import open_log
from evq.domain.message import new_message
from evq.domain.record import put_record


def test_the_tables_of_removed_directories_are_let_go_at_the_next_open(tmp_path: Path) -> None:
    paths = [tmp_path / f"s{i}" for i in range(3)]
    for path in paths:
        with open_log("memory", path, background=False) as log:
            log.append([put_record(new_message("T", b"x" * 1000))])
    held = {str(p.resolve()) for p in paths}
    assert held <= set(tables._VOLUMES)
    shutil.rmtree(paths[0])
    shutil.rmtree(paths[1])
    with open_log("memory", paths[2], background=False) as log:
        assert log.max_physical_offset > 0  # a live directory keeps its tables
    assert set(tables._VOLUMES) & held == {str(paths[2].resolve())}


def test_an_open_store_keeps_its_tables_while_its_directory_goes(tmp_path: Path) -> None:
    """As an open file outlives its unlinking: the store in use is not pruned by another open."""
    with open_log("memory", tmp_path / "a", background=False) as log:
        log.append([put_record(new_message("T", b"kept"))])
        shutil.rmtree(tmp_path / "a")
        open_log("memory", tmp_path / "b", background=False).close()
        assert log.read("T", 0, 0, 32).records
