"""Choosing a backend by name, and the errors a backend's driver raises."""

from __future__ import annotations

from pathlib import Path

import pytest

from evq.backends.config import StoreConfig
from evq.backends.kvlog.driver import DriverError
from evq.backends.registry import BACKENDS, TRAITS, UnknownBackend, open_log
from evq.domain.log import LogError, LogLocked


def test_every_backend_is_registered_with_its_traits() -> None:
    assert sorted(BACKENDS) == ["lmdb", "memory", "mmap", "rocks"]
    assert set(TRAITS) == set(BACKENDS)


@pytest.mark.parametrize("name", ["nope", "", "MMAP", "rocksdb"])
def test_an_unknown_backend_names_every_choice(tmp_path: Path, name: str) -> None:
    with pytest.raises(UnknownBackend) as info:
        open_log(name, tmp_path / "store")
    message = str(info.value)
    assert repr(name) in message
    for choice in BACKENDS:
        assert choice in message
    assert not (tmp_path / "store").exists()


def test_a_store_in_use_is_locked(backend: str, tmp_path: Path) -> None:
    with open_log(backend, tmp_path / "s", background=False), pytest.raises(LogLocked):
        open_log(backend, tmp_path / "s", background=False)
    open_log(backend, tmp_path / "s", background=False).close()  # released on close


@pytest.mark.parametrize(("backend_name", "garbage"), [
    ("lmdb", "lmdb/data.mdb"),
    ("rocks", "rocks/CURRENT"),
])
def test_driver_errors_become_log_errors(tmp_path: Path, backend_name: str,
                                         garbage: str) -> None:
    open_log(backend_name, tmp_path / "s", StoreConfig(), background=False).close()
    target = tmp_path / "s" / garbage
    target.write_bytes(b"\x00not a database file\xff" * 300)
    with pytest.raises(DriverError) as info:
        open_log(backend_name, tmp_path / "s", background=False)
    assert isinstance(info.value, LogError)
    assert ("LMDB" if backend_name == "lmdb" else "RocksDB") in str(info.value)
