"""Credentials reach a client from ``--access-key`` / ``--secret-key``, from
``$EVQ_ACCESS_KEY`` / ``$EVQ_SECRET_KEY``, or from the Spark connector's options; half a pair
is refused before anything connects."""

from __future__ import annotations

import argparse
import pickle

import pytest

from evq.acl.signature import Credentials
from evq.client.security_flags import (
    SecurityFlagError,
    add_security_flags,
    client_security,
)
from evq.spark.options import OptionError, parse_sink, parse_source
from tests.processes import run_evq


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_security_flags(parser)
    return parser.parse_args(argv)


def test_no_flags_and_no_environment_is_an_unsigned_client() -> None:
    assert client_security(parsed(), env={}) is None


def test_flags_win_over_the_environment() -> None:
    env = {"EVQ_ACCESS_KEY": "env-ak", "EVQ_SECRET_KEY": "env-sk"}
    assert client_security(parsed(), env=env).credentials == Credentials("env-ak", "env-sk")
    flags = parsed("--access-key", "ak", "--secret-key", "sk")
    assert client_security(flags, env=env).credentials == Credentials("ak", "sk")


@pytest.mark.parametrize(("argv", "env", "missing"), [
    (("--access-key", "ak"), {}, "secret"),
    (("--secret-key", "sk"), {}, "access"),
    ((), {"EVQ_ACCESS_KEY": "ak"}, "secret"),
])
def test_half_a_pair_is_refused(argv: tuple[str, ...], env: dict[str, str],
                                missing: str) -> None:
    with pytest.raises(SecurityFlagError, match=f"{missing} key"):
        client_security(parsed(*argv), env=env)


@pytest.mark.parametrize("command", [("produce", "-t", "T"), ("consume", "-t", "T", "-g", "G"),
                                     ("admin", "topicList")])
def test_every_client_command_refuses_half_a_pair_as_bad_usage(command: tuple[str, ...]
                                                               ) -> None:
    # The name server address is never dialled: the flags are checked first.
    done = run_evq(*command, "-n", "127.0.0.1:1", "--access-key", "ak", stdin="",
                   env={"EVQ_SECRET_KEY": ""})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == ("evq: error: access key 'ak' needs its secret key "
                                   "(--secret-key or $EVQ_SECRET_KEY)")


def test_spark_options_carry_credentials_to_the_executors() -> None:
    source = parse_source({"namesrv": "h:1", "topic": "T", "accessKey": "ak",
                           "secretKey": "sk"}, streaming=False)
    security = source.security.client_security()
    assert security is not None and security.credentials == Credentials("ak", "sk")
    assert pickle.loads(pickle.dumps(source)) == source  # as Spark ships it to executors
    sink = parse_sink({"namesrv": "h:1", "accesskey": "ak", "secretkey": "sk"})
    assert sink.security == source.security
    assert parse_sink({"namesrv": "h:1"}).security.client_security() is None
    with pytest.raises(OptionError, match="secretKey"):
        parse_sink({"namesrv": "h:1", "accessKey": "ak"})
