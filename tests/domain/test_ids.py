"""UNIQ_KEY ids: RocketMQ's layout, made one at a time or a batch at a time."""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import itertools
import os
import threading

from evq.domain.ids import new_uniq_key, new_uniq_key_run, new_uniq_keys

NOW = int(dt.datetime(2026, 11, 26, 10, 0, 0, 123_000, dt.UTC).timestamp() * 1000)
MONTH_START = int(dt.datetime(2026, 11, 1, tzinfo=dt.UTC).timestamp() * 1000)


def _counter(key: str) -> int:
    return int(key[28:], 16)


def test_a_batch_of_keys_shares_everything_but_the_counter() -> None:
    keys = new_uniq_keys(NOW, 32, "10.1.2.3")
    assert all(len(k) == 32 and k == k.upper() and int(k, 16) >= 0 for k in keys)
    assert {k[:28] for k in keys} == {keys[0][:28]}
    assert keys[0][:8] == "0A010203"  # the ip
    assert int(keys[0][20:28], 16) == NOW - MONTH_START  # ms since the month began
    counters = [_counter(k) for k in keys]
    assert counters == [(counters[0] + i) % 0x10000 for i in range(32)]


def test_keys_made_one_at_a_time_continue_the_count() -> None:
    batch = new_uniq_keys(NOW, 3)
    single = new_uniq_key(NOW)
    assert single[:28] == batch[0][:28]
    assert _counter(single) == (_counter(batch[-1]) + 1) % 0x10000


def test_the_counter_wraps_at_16_bits_inside_a_batch() -> None:
    keys = new_uniq_keys(NOW, 0x10000 + 2)
    counters = [_counter(k) for k in keys]
    assert all(b == (a + 1) % 0x10000 for a, b in itertools.pairwise(counters))
    assert len(set(keys[:0x10000])) == 0x10000
    assert keys[0x10000] == keys[0]


def test_a_run_of_no_keys_takes_no_counter() -> None:
    before = new_uniq_key(NOW)
    empty = new_uniq_key_run(NOW, 0)
    assert empty.count == 0 and empty.as_list() == []
    assert _counter(new_uniq_key(NOW)) == (_counter(before) + 1) % 0x10000


def test_a_forked_child_makes_keys_of_its_own_in_the_same_millisecond() -> None:
    """The pid and the random part are cached, with the last key's head: a child must not
    reuse its parent's (two processes would make equal keys)."""
    parent = new_uniq_key(NOW)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its key and leave without running pytest's teardown
        os.write(write, new_uniq_key(NOW).encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    assert os.waitpid(pid, 0)[1] == 0
    assert len(child) == 32
    assert child[:8] == parent[:8] and child[20:28] == parent[20:28]  # ip, time
    assert child[8:20] != parent[8:20]  # pid and random part


def test_keys_made_by_threads_at_once_are_all_different() -> None:
    """No lock: each key's counter is one ``next`` on a shared count, which threads cannot
    interleave with."""
    start = threading.Barrier(4)

    def make() -> list[str]:
        start.wait()
        keys = []
        for _ in range(2000):
            keys.append(new_uniq_key(NOW))
            keys += new_uniq_keys(NOW, 3)
        return keys

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        made = [k for keys in pool.map(lambda _: make(), range(4)) for k in keys]
    assert len(made) == 4 * 2000 * 4 < 0x10000
    assert len(set(made)) == len(made)


def test_keys_made_by_threads_as_the_millisecond_turns_carry_their_own_millisecond() -> None:
    """Threads replace the last key's head as their milliseconds turn while others read it:
    a key made at ``now`` must still carry ``now`` (never a head another thread just made
    for another millisecond) and its own counter."""
    start = threading.Barrier(4)

    def make(t: int) -> list[tuple[int, str]]:
        start.wait()
        return [(now, new_uniq_key(now)) for i in range(3000)
                for now in (NOW + (i + t) % 7,)]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        made = [k for keys in pool.map(make, range(4)) for k in keys]
    assert all(int(key[20:28], 16) == now - MONTH_START for now, key in made)
    assert len({key[28:] for _, key in made}) == len(made) == 12000 < 0x10000
