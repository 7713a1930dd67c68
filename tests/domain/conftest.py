"""Fixtures for the broker domain: a real store and a real SQLite projection per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest

from evq.backends.registry import open_log
from evq.domain.broker import Broker, tags_code_fn
from evq.domain.broker_config import BrokerConfig
from evq.domain.clock import ManualClock
from evq.domain.delay import DelayLevels
from evq.domain.message import Message, new_message
from evq.domain.topics import TopicConfig
from evq.meta.sql import SqlMetadataStore
from tests.conftest import SMALL

OpenBroker = Callable[..., Broker]


@pytest.fixture
def backend() -> str:
    """Domain tests run on the default store: the conformance suite (tests/backends) proves
    every backend keeps the port's promises, which is all the domain relies on."""
    return "mmap"


@pytest.fixture
def open_broker(tmp_path: Path, clock: ManualClock, backend: str) -> Iterator[OpenBroker]:
    """``open_broker(**config)`` opens (or reopens) the broker at one data dir."""
    opened: list[Broker] = []

    def _open(**overrides: object) -> Broker:
        config = attrs.evolve(BrokerConfig(), **overrides)
        levels = DelayLevels.parse(config.message_delay_level)
        log = open_log(backend, tmp_path / "store", SMALL, clock=clock,
                       tags_code_fn=tags_code_fn(levels), background=False)
        broker = Broker(log, SqlMetadataStore.in_dir(tmp_path / "config"), config, clock=clock)
        opened.append(broker)
        return broker

    yield _open
    for b in opened:
        close(b)


def close(b: Broker) -> None:
    b.close()
    b.log.close()


@pytest.fixture
def broker(open_broker: OpenBroker) -> Broker:
    return open_broker()


def msg(topic: str, body: bytes = b"x", queue_id: int = 0, **props: str) -> Message:
    m = new_message(topic, body, tags=props.pop("tags", None), keys=props.pop("keys", None),
                    properties=props)
    m.queue_id = queue_id
    return m


def topic(b: Broker, name: str = "T", queues: int = 4) -> TopicConfig:
    return b.create_topic(TopicConfig(topic_name=name, read_queue_nums=queues,
                                      write_queue_nums=queues))


def bodies(b: Broker, group: str, topic_: str, queue_id: int, offset: int = 0) -> list[bytes]:
    r = b.pull(group, topic_, queue_id, offset, max_count=1000)
    return [m.body for m in r.messages()]
