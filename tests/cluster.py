"""A real cluster in processes: two name servers and two broker groups, each a master with a
slave, deployed as RocketMQ users run them.  Tests of anything that touches more than one node
(admin commands, routing, rebalancing across groups) run against it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs

from tests.processes import Running, running_evq, running_namesrv, wait_registered

GROUPS = ("broker-a", "broker-b")
CONFIG = "mappedFileSizeCommitLog=16777216\nwarmSegments=false\nslaveReadEnable=true\n"


@attrs.frozen
class Cluster:
    namesrvs: tuple[str, str]
    masters: dict[str, Running]
    slaves: dict[str, Running]
    _start_master: Callable[[str, int], Running]

    @property
    def namesrv(self) -> str:
        """Both name servers, as clients and brokers take them (``a;b``)."""
        return ";".join(self.namesrvs)

    def addr(self, broker_name: str, *, slave: bool = False) -> str:
        return (self.slaves if slave else self.masters)[broker_name].addresses["broker"]

    def restart_master(self, broker_name: str) -> Running:
        """Start ``broker_name``'s master again, on its data and its port, once the process
        is gone (a test kills it first), and return when both name servers route to it."""
        old = self.masters[broker_name]
        assert not old.alive(), f"{broker_name}'s master is still running"
        port = int(old.addresses["broker"].rsplit(":", 1)[1])
        self.masters[broker_name] = self._start_master(broker_name, port)
        for ns in self.namesrvs:
            wait_registered(ns, self.masters[broker_name].addresses["broker"])
        return self.masters[broker_name]


@contextlib.contextmanager
def running_cluster(root: Path) -> Iterator[Cluster]:
    """Start everything and return once both name servers route to every broker."""
    config = root / "broker.conf"
    config.write_text(CONFIG)
    with running_namesrv() as ns1, running_namesrv() as ns2, contextlib.ExitStack() as stack:
        names = f"{ns1};{ns2}"

        def broker(name: str, *role: str, port: int = 0) -> Running:
            data = root / f"{name}-{'slave' if role else 'master'}"
            log = stack.enter_context((root / f"{data.name}.log").open("a"))
            return stack.enter_context(running_evq(
                "--log-level", "warning", "broker", "--config", str(config), "--port",
                str(port), "--namesrv", names, "--broker-name", name, "--data", str(data),
                *role, servers=1, stderr=log))

        masters = {name: broker(name) for name in GROUPS}
        slaves = {name: broker(name, "--role", "SLAVE", "--broker-id", "1") for name in GROUPS}
        for ns in (ns1, ns2):
            for running in (*masters.values(), *slaves.values()):
                wait_registered(ns, running.addresses["broker"])
        yield Cluster((ns1, ns2), masters, slaves, lambda name, port: broker(name, port=port))
        for running in (*slaves.values(), *masters.values()):  # the restarted ones too
            if running.alive():  # a test may have killed one
                assert running.stop() == 0
