"""Settings: RocketMQ broker.conf names, TOML, EVQ_* variables and flags, in that order."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from evq.backends.config import StoreConfig
from evq.domain.broker_config import BrokerRole
from evq.domain.log import FlushMode
from evq.settings import SettingsError, build, load


def test_defaults_are_the_embedded_default() -> None:
    s = load(env={})
    assert (s.net.host, s.net.listen_port, s.net.backend) == ("127.0.0.1", 10911, "mmap")
    assert s.net.ha_port == 10912
    assert s.broker.store_host == s.store.store_host == ("127.0.0.1", 10911)


def test_a_rocketmq_broker_conf_is_accepted(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "# a stock broker.conf\n"
        "brokerClusterName = DefaultCluster\nbrokerName = broker-b\nbrokerId = 1\n"
        "deleteWhen = 04\nfileReservedTime = 48\nbrokerRole = SLAVE\n"
        "flushDiskType = SYNC_FLUSH\nlistenPort=20911\nnamesrvAddr=127.0.0.1:9876;h:9877\n"
        "autoCreateTopicEnable=false\n"
        "diskMaxUsedSpaceRatio=80\ndiskSpaceCleanForciblyRatio=0.8\n"
        "diskSpaceWarningLevelRatio=0.95\n"
    )
    s = load(config_file=conf, env={})
    assert s.broker.broker_name == "broker-b" and s.broker.broker_role is BrokerRole.SLAVE
    assert s.store.flush is FlushMode.SYNC_FLUSH
    assert s.store.file_reserved_hours == s.broker.file_reserved_hours == 48
    assert s.net.namesrv_list == ["127.0.0.1:9876", "h:9877"]
    assert s.broker.auto_create_topic_enable is False
    assert s.broker.store_host == ("127.0.0.1", 20911)
    assert (s.store.disk_max_used_space_ratio, s.store.disk_space_clean_forcibly_ratio,
            s.store.disk_space_warning_level_ratio) == (80, 0.8, 0.95)


def test_later_sources_win(tmp_path: Path) -> None:
    conf = tmp_path / "evq.toml"
    conf.write_text('broker_name = "from-file"\nlisten_port = 1\nbackend = "mmap"\n')
    s = load(config_file=conf, env={"EVQ_BROKER_NAME": "from-env", "EVQ_LISTEN_PORT": "2"},
             flags={"listen_port": 3, "broker_name": None})
    assert (s.broker.broker_name, s.net.listen_port) == ("from-env", 3)


@pytest.mark.parametrize(("raw", "message"), [
    ({"brokerNme": "x"}, "unknown setting 'brokerNme'"),
    ({"listenPort": "ten"}, "listen_port"),
    ({"brokerRole": "BOSS"}, "broker_role"),
    ({"autoCreateTopicEnable": "maybe"}, "auto_create_topic_enable"),
    ({"brokerRole": "SLAVE"}, "brokerId greater than 0"),
    ({"maxConnections": "0"}, "'max_connections' must be >= 1"),
    ({"maxBufferedBytes": "-1"}, "'max_buffered_bytes' must be >= 1"),
])
def test_bad_settings_name_the_problem(raw: dict[str, object], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        load(env={}, flags=raw)


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="cannot read"):
        load(config_file=tmp_path / "missing.conf", env={})
    bad = tmp_path / "bad.toml"
    bad.write_text("x = = 1")
    with pytest.raises(SettingsError, match=r"bad\.toml"):
        load(config_file=bad, env={})
    props = tmp_path / "bad.conf"
    props.write_text("justakey\n")
    with pytest.raises(SettingsError, match=r"bad\.conf:1"):
        load(config_file=props, env={})


def test_ha_settings_under_rocketmq_names(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("brokerRole=SLAVE\nbrokerId=1\nhaMasterAddress=10.0.0.1:10912\n"
                    "haListenPort=20912\n")
    s = load(config_file=conf, env={})
    assert (s.net.master_ha_addr, s.net.ha_port) == ("10.0.0.1:10912", 20912)
    assert load(env={}, flags={"listen_port": 10911}).net.ha_port == 10912  # RocketMQ's +1
    assert load(env={}, flags={"listen_port": 0}).net.ha_port == 0  # any free port


def test_tls_settings_take_rocketmq_keys_environment_and_flags(tmp_path: Path) -> None:
    from evq.net.tls import ClientAuth, TlsMode

    conf = tmp_path / "broker.conf"
    conf.write_text("brokerName=b\ntls.server.mode=permissive\ntls.server.certPath=/c.pem\n"
                    "tls.server.keyPath=/k.pem\ntls.server.keyPassword=secret\n"
                    "tls.server.need.client.auth=optional\ntls.enable=true\n"
                    "tls.client.authServer=false\n")
    s = load(config_file=conf, env={"EVQ_TLS_CLIENT_TRUST_CERT_PATH": "/ca.pem"},
             flags={"tls_server_mode": "enforcing"})
    assert s.tls.tls_server_mode is TlsMode.ENFORCING
    assert s.tls.tls_server_need_client_auth is ClientAuth.OPTIONAL
    assert (s.tls.tls_enable, s.tls.tls_client_auth_server) == (True, False)
    assert s.tls.tls_client_trust_cert_path == "/ca.pem"
    assert "secret" not in repr(s.tls)
    assert load(env={}).tls.server() is None and load(env={}).tls.client() is None


def test_a_name_server_takes_only_its_own_settings(tmp_path: Path) -> None:
    from evq.net.routes import RouteLimits
    from evq.net.tls import TlsMode
    from evq.settings import load_namesrv

    conf = tmp_path / "namesrv.conf"
    conf.write_text("tls.server.mode=enforcing\ntls.server.certPath=/c\ntls.server.keyPath=/k\n"
                    "maxBrokerAddresses=64\nmaxKvBytes=1024\n")
    settings = load_namesrv(config_file=conf, env={"EVQ_BROKER_NAME": "not the name server's",
                                                   "EVQ_MAX_KV_ENTRIES": "5"})
    assert settings.tls.tls_server_mode is TlsMode.ENFORCING
    assert settings.limits == RouteLimits(max_broker_addresses=64, max_kv_entries=5,
                                          max_kv_bytes=1024)
    assert load_namesrv(env={}).limits == RouteLimits()
    conf.write_text("brokerName=b\n")
    with pytest.raises(SettingsError, match="unknown setting 'brokerName'"):
        load_namesrv(config_file=conf, env={})
    with pytest.raises(SettingsError, match=r"tls.server.mode=enforcing needs"):
        load_namesrv(env={"EVQ_TLS_SERVER_MODE": "enforcing"})
    with pytest.raises(SettingsError, match="'max_topic_queues' must be >= 1"):
        load_namesrv(env={"EVQ_MAX_TOPIC_QUEUES": "0"})


def test_evq_serve_takes_its_name_servers_bounds_with_the_brokers_settings(
        tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("brokerName=b\nmaxTopicQueues=1000\n")
    assert load(config_file=conf, env={}).namesrv_limits.max_topic_queues == 1000


def test_transient_store_pool_keys_reach_the_store(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("transientStorePoolEnable=true\ntransientStorePoolSize=3\n"
                    "commitIntervalCommitLog=50\ncommitCommitLogLeastPages=8\n"
                    "commitCommitLogThoroughInterval=400\n")
    s = load(config_file=conf, env={})
    assert (s.store.transient_store_pool_enable, s.store.transient_store_pool_size,
            s.store.commit_interval_ms, s.store.commit_least_pages,
            s.store.commit_thorough_interval_ms) == (True, 3, 50, 8, 400)
    flagged = load(env={}, flags={"transient_store_pool_enable": True})
    assert flagged.store.transient_store_pool_enable


def test_the_flush_thorough_interval_has_its_rocketmq_name(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("flushCommitLogThoroughInterval=3600000\n")
    assert load(config_file=conf, env={}).store.flush_thorough_interval_ms == 3_600_000


def test_an_ha_port_that_is_the_listen_port_is_refused(tmp_path: Path) -> None:
    """Both servers could bind it (the remoting one binds before it listens), and connections
    would be dealt between them."""
    conf = tmp_path / "broker.conf"
    conf.write_text("listenPort=20911\nhaListenPort=20911\n")
    with pytest.raises(SettingsError, match="haListenPort 20911 is the listenPort"):
        load(config_file=conf, env={})
    conf.write_text("listenPort=20911\nhaListenPort=20912\n")
    assert load(config_file=conf, env={}).net.ha_port == 20912


def test_the_index_write_back_interval_is_a_broker_conf_key(tmp_path: Path) -> None:
    """evq's own key (RocketMQ writes an index file back only once it is full), in the
    camelCase a broker.conf uses; a negative interval is refused."""
    conf = tmp_path / "broker.conf"
    conf.write_text("flushIndexIntervalMs=60000\n")
    assert load(config_file=conf, env={}).store.flush_index_interval_ms == 60_000
    assert StoreConfig().flush_index_interval_ms == 10_000
    with pytest.raises(ValueError, match="flush_index_interval_ms"):
        StoreConfig(flush_index_interval_ms=-1)


def test_store_keys_whose_rocketmq_names_are_not_ours_in_camel_case(tmp_path: Path) -> None:
    """A broker.conf carried over from RocketMQ names these as RocketMQ does; each was an
    "unknown setting" that kept the broker from starting."""
    conf = tmp_path / "broker.conf"
    conf.write_text("flushIntervalConsumeQueue=2000\nmaxHashSlotNum=500000\n"
                    "maxIndexNum=2000000\ncheckCRCOnRecover=false\nwarmMapedFileEnable=false\n")
    store = load(config_file=conf, env={}).store
    assert (store.flush_consume_queue_interval_ms, store.index_slots, store.index_entries,
            store.check_crc_on_recover, store.warm_segments) == (2000, 500_000, 2_000_000,
                                                                 False, False)


@pytest.mark.parametrize(("flags", "reason"), [
    ({"flush": "SYNC_FLUSH"}, "SYNC_FLUSH"),
    ({"broker_role": "SLAVE", "broker_id": 1}, "SLAVE"),
])
def test_the_pool_is_ignored_with_a_warning_off_an_async_flush_master(
    flags: dict[str, object], reason: str,
) -> None:
    """RocketMQ's rule: the pool works under ASYNC_FLUSH on a master only; another config
    starts without it, and says so."""
    with capture_logs() as logs:
        s = load(env={}, flags={"transient_store_pool_enable": True, **flags})
    assert s.store.transient_store_pool_enable is False
    ignored = [e for e in logs if e["event"] == "transient_store_pool_ignored"]
    assert len(ignored) == 1 and reason in ignored[0]["reason"]


def test_an_embedder_may_hand_build_text_or_typed_values(tmp_path: Path) -> None:
    """``build`` reads text as a config file's, so its rules see typed values: a pool under
    SYNC_FLUSH is ignored with the same warning, not an AttributeError on a string."""
    with capture_logs() as logs:
        s = build({"flush": "SYNC_FLUSH", "transient_store_pool_enable": "true",
                   "listen_port": "20911", "store_path_root_dir": str(tmp_path)})
    assert s.store.flush is FlushMode.SYNC_FLUSH and s.net.listen_port == 20911
    assert s.store.transient_store_pool_enable is False
    assert [e["event"] for e in logs] == ["transient_store_pool_ignored"]
    typed = build({"flush": FlushMode.SYNC_FLUSH, "listen_port": 20911,
                   "store_path_root_dir": str(tmp_path)})
    assert (typed.store, typed.net) == (s.store, s.net)
    with pytest.raises(SettingsError, match="listen_port"):
        build({"listen_port": "ten"})
    with pytest.raises(SettingsError, match="unknown setting 'listenport'"):
        build({"listenport": 1})
