"""Broker and name server settings from a config file, ``EVQ_*`` environment variables and
flags.

Later sources win: defaults < config file < environment < command-line flags.  A setting has
one evq name (snake_case, e.g. ``broker_name``) and is also accepted under RocketMQ's
broker.conf name (``brokerName``), so an operator's existing broker.conf works as it is.  Files
ending in ``.toml`` are TOML; anything else is read as Java properties (``key=value``, ``#``
comments), the broker.conf format.  An unknown key is an error naming it, not a silent typo.
"""

from __future__ import annotations

import enum
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from evq import logs
from evq.acl.signature import Credentials
from evq.backends.config import StoreConfig, transient_pool_refusal
from evq.backends.registry import DEFAULT_BACKEND
from evq.domain.broker_config import BrokerConfig, BrokerRole
from evq.domain.config_json import camel
from evq.net import tls
from evq.net.routes import RouteLimits
from evq.net.tls import TlsSettings

ENV_PREFIX = "EVQ_"
log = logs.get_logger(__name__)


class SettingsError(ValueError):
    """A setting that cannot be used; the message names it and where it came from."""


@attrs.frozen(slots=True, kw_only=True)
class NetSettings:
    """Where a broker listens and whom it talks to."""

    host: str = "127.0.0.1"  # brokerIP1: bind address and the address clients are told
    listen_port: int = 10911
    namesrv_addr: str = ""  # "host:port;host:port"
    backend: str = DEFAULT_BACKEND
    store_path_root_dir: str = "./evq-data"
    ha_listen_port: int = 0  # 0: listen_port + 1, as RocketMQ
    master_ha_addr: str = ""  # a slave's master HA address; else learnt from the name server
    register_name_server_period_ms: int = 30_000
    metadata_url: str = ""  # SQLAlchemy URL; default a SQLite file in the data dir
    access_key: str = ""
    """The broker's own account, signing what it sends as a client: registration with the
    name servers, a slave's HA handshake and offset hand-back to its master."""
    secret_key: str = attrs.field(default="", repr=False)
    acl_enable: bool = False  # RocketMQ's aclEnable: check every request against acl_file
    acl_file: str = ""  # plain_acl.yml; default <store_path_root_dir>/conf/plain_acl.yml
    max_connections: int = attrs.field(default=10_000, validator=attrs.validators.ge(1))
    """evq's: client connections the broker holds at once (``TransportConfig``'s bound)."""
    max_buffered_bytes: int = attrs.field(default=1024 * 1024 * 1024,
                                          validator=attrs.validators.ge(1))
    """evq's: bytes of requests the broker holds for all its clients together."""

    @property
    def credentials(self) -> Credentials | None:
        return Credentials(self.access_key, self.secret_key) if self.access_key else None

    @property
    def namesrv_list(self) -> list[str]:
        return [a.strip() for a in self.namesrv_addr.split(";") if a.strip()]

    @property
    def acl_path(self) -> Path:
        return Path(self.acl_file or Path(self.store_path_root_dir) / "conf" / "plain_acl.yml")

    @property
    def ha_port(self) -> int:
        """The HA port to bind: as set, else listen_port + 1 (RocketMQ), else (a broker on
        any free port) any free port too."""
        if self.ha_listen_port:
            return self.ha_listen_port
        return self.listen_port + 1 if self.listen_port else 0


@attrs.frozen(slots=True)
class Settings:
    net: NetSettings
    broker: BrokerConfig
    store: StoreConfig
    tls: TlsSettings = attrs.field(factory=TlsSettings)
    namesrv_limits: RouteLimits = attrs.field(factory=RouteLimits)
    """The bounds of ``evq serve``'s name server; ``evq broker`` reads them too, and runs
    none to apply them to."""


@attrs.frozen(slots=True)
class NamesrvSettings:
    """What ``evq namesrv`` reads: its table bounds and its ``tls.*``."""

    limits: RouteLimits
    tls: TlsSettings


# RocketMQ broker.conf names that are not the camelCase of ours.
ALIASES = {
    "brokerIP1": "host",
    "flushDiskType": "flush",
    "fileReservedTime": "file_reserved_hours",
    "namesrvAddr": "namesrv_addr",
    "mappedFileSizeCommitLog": "commitlog_segment_size",
    "flushIntervalCommitLog": "flush_interval_ms",
    "flushCommitLogLeastPages": "flush_least_pages",
    "flushCommitLogThoroughInterval": "flush_thorough_interval_ms",
    "flushIntervalConsumeQueue": "flush_consume_queue_interval_ms",
    "maxHashSlotNum": "index_slots",
    "maxIndexNum": "index_entries",
    "checkCRCOnRecover": "check_crc_on_recover",
    "warmMapedFileEnable": "warm_segments",
    "commitIntervalCommitLog": "commit_interval_ms",
    "commitCommitLogLeastPages": "commit_least_pages",
    "commitCommitLogThoroughInterval": "commit_thorough_interval_ms",
    "syncFlushTimeout": "sync_flush_timeout_ms",
    "transactionTimeOut": "transaction_timeout_ms",
    "transactionCheckInterval": "transaction_check_interval_ms",
    "brokerPermission": "broker_permission",
    "haMasterAddress": "master_ha_addr",
} | tls.ALIASES
_TARGETS: dict[str, type] = {"net": NetSettings, "broker": BrokerConfig, "store": StoreConfig,
                             "tls": TlsSettings, "namesrv": RouteLimits}
# Settings both the broker and the store read; one value feeds both.
_SHARED = {"file_reserved_hours", "sync_flush_timeout_ms"}


def _fields() -> dict[str, tuple[str, attrs.Attribute[Any]]]:
    out: dict[str, tuple[str, attrs.Attribute[Any]]] = {}
    for target, cls in _TARGETS.items():
        attrs.resolve_types(cls)
        for f in attrs.fields(cls):
            out.setdefault(f.name, (target, f))
    return out


FIELDS = _fields()
_BY_ROCKETMQ = {camel(name): name for name in FIELDS} | ALIASES


def canonical(key: str) -> str | None:
    """Our name for ``key`` (evq or RocketMQ spelling), or None when it is unknown."""
    if key in FIELDS:
        return key
    return _BY_ROCKETMQ.get(key)


def _convert(name: str, raw: object, source: str) -> object:
    _target, f = FIELDS[name]
    typ = f.type
    try:
        if typ is bool:
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text not in ("true", "false", "1", "0"):
                raise ValueError("expected true or false")
            return text in ("true", "1")
        if typ is int:
            return int(raw)  # type: ignore[call-overload]
        if typ is float:
            return float(raw)  # type: ignore[arg-type]
        if typ is str:
            return str(raw)
        if isinstance(typ, type) and issubclass(typ, enum.Enum):
            return typ(str(raw).upper())
        if name == "store_host":
            host, _, port = str(raw).rpartition(":")
            return (host, int(port))
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"{source}: {name} = {raw!r}: {exc}") from None
    raise SettingsError(f"{source}: {name} cannot be set from a config file")


def read_file(path: Path) -> dict[str, object]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise SettingsError(f"cannot read config file {path}: {exc.strerror}") from None
    if path.suffix == ".toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"{path}: {exc}") from None
    out: dict[str, object] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise SettingsError(f"{path}:{n}: expected key=value, got {line!r}")
        out[key.strip()] = value.strip()
    return out


def from_environment(env: Mapping[str, str]) -> dict[str, object]:
    """``EVQ_BROKER_NAME=a`` sets ``broker_name``; unknown EVQ_ variables are left alone
    (EVQ_HYPOTHESIS_PROFILE and friends belong to other tools)."""
    return {k[len(ENV_PREFIX):].lower(): v for k, v in env.items()
            if k.startswith(ENV_PREFIX) and k[len(ENV_PREFIX):].lower() in FIELDS}


def load(
    *, config_file: Path | None = None, env: Mapping[str, str] | None = None,
    flags: Mapping[str, object] | None = None,
) -> Settings:
    return build(_collect(config_file, env, flags, targets=set(_TARGETS)))


def load_namesrv(
    *, config_file: Path | None = None, env: Mapping[str, str] | None = None,
    flags: Mapping[str, object] | None = None,
) -> NamesrvSettings:
    """The name server's settings alone, its ``tls.*`` and its bounds (``maxBrokerAddresses``
    ...): its config file may hold nothing else, and the broker's ``EVQ_*`` variables in its
    environment are not its business."""
    values = _collect(config_file, env, flags, targets={"tls", "namesrv"})
    per_target: dict[str, dict[str, Any]] = {"tls": {}, "namesrv": {}}
    for name, value in values.items():
        per_target[FIELDS[name][0]][name] = value
    try:
        return NamesrvSettings(RouteLimits(**per_target["namesrv"]),
                               TlsSettings(**per_target["tls"]))
    except (TypeError, ValueError) as exc:
        raise SettingsError(str(exc)) from None


def _collect(config_file: Path | None, env: Mapping[str, str] | None,
             flags: Mapping[str, object] | None, *, targets: set[str]) -> dict[str, object]:
    """Every source's values by our setting name, later sources winning; a key that is not a
    setting of ``targets`` is an error naming its source (environment variables of other
    targets are skipped: one environment serves several programs)."""
    values: dict[str, object] = {}
    environment = from_environment(os.environ if env is None else env)
    sources: list[tuple[str, Mapping[str, object]]] = []
    if config_file is not None:
        sources.append((str(config_file), read_file(config_file)))
    sources.append(("environment", {k: v for k, v in environment.items()
                                    if FIELDS[k][0] in targets}))
    sources.append(("command line", {k: v for k, v in (flags or {}).items() if v is not None}))
    for source, raw in sources:
        for key, value in raw.items():
            name = canonical(key)
            if name is None or FIELDS[name][0] not in targets:
                raise SettingsError(f"{source}: unknown setting {key!r}")
            values[name] = _convert(name, value, source)
    return values


def build(values: Mapping[str, object]) -> Settings:
    """The settings of ``values``, by evq name.  An embedder may hand typed values or text;
    text is read as a config file's would be (``"SYNC_FLUSH"``, ``"10911"``), so every rule
    below sees typed values, and text that cannot be read is a SettingsError naming it."""
    per_target: dict[str, dict[str, object]] = {t: {} for t in _TARGETS}
    for name, value in values.items():
        if name not in FIELDS:
            raise SettingsError(f"settings: unknown setting {name!r}")
        target, _f = FIELDS[name]
        if isinstance(value, str):
            value = _convert(name, value, "settings")
        per_target[target][name] = value
        if name in _SHARED:
            for other, cls in _TARGETS.items():
                if any(f.name == name for f in attrs.fields(cls)):
                    per_target[other][name] = value
    try:
        net = NetSettings(**per_target["net"])  # type: ignore[arg-type]
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    if net.listen_port and net.ha_listen_port == net.listen_port:
        # The remoting port is bound before it listens, and a second server may then bind it
        # too: slaves' and clients' connections would be dealt between the two at random.
        raise SettingsError(f"haListenPort {net.ha_listen_port} is the listenPort: the HA "
                            "listener needs a port of its own")
    if bool(net.access_key) != bool(net.secret_key):
        raise SettingsError("accessKey and secretKey are set together (the broker's own "
                            "account), or neither")
    try:
        tls_settings = TlsSettings(**per_target["tls"])  # type: ignore[arg-type]
        namesrv_limits = RouteLimits(**per_target["namesrv"])  # type: ignore[arg-type]
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    broker_values = {"store_host": (net.host, net.listen_port)} | per_target["broker"]
    store_values = {"store_host": broker_values["store_host"]} | per_target["store"]
    try:
        broker = BrokerConfig(**broker_values)  # type: ignore[arg-type]
        store = StoreConfig(**store_values)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise SettingsError(str(exc)) from None
    if broker.broker_role is BrokerRole.SLAVE and broker.broker_id == 0:
        raise SettingsError("a SLAVE needs a brokerId greater than 0")
    if broker.broker_role is not BrokerRole.SLAVE and broker.broker_id != 0:
        raise SettingsError("a master has brokerId 0; set brokerRole=SLAVE for other ids")
    why = transient_pool_refusal(store, slave=broker.is_slave)
    if why:  # RocketMQ runs such a config without the pool; so do we, saying so
        log.warning("transient_store_pool_ignored", reason=why)
        store = attrs.evolve(store, transient_store_pool_enable=False)
    return Settings(net, broker, store, tls_settings, namesrv_limits)


