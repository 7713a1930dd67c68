"""A client opened with credentials signs every request it sends, as RocketMQ's
``AclClientRPCHook`` does, and a server recomputes the same signature from what arrived."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from evq.acl.signature import (
    ACCESS_KEY,
    SIGNATURE,
    UNIQUE_KEY_QUERY,
    Credentials,
    sign,
    signature_matches,
    signed_content,
    signed_fields,
)
from evq.net.protocol import RemotingCommand
from evq.net.security import ClientSecurity
from evq.net.transport import Connection, Dispatcher, RemotingClient, RemotingServer, run

field_names = st.text(st.characters(codec="ascii", exclude_characters="\x00"), min_size=1,
                      max_size=20)
field_values = st.text(st.characters(exclude_categories=["Cs"]), max_size=50)
headers = st.dictionaries(field_names, field_values, max_size=8)


def test_a_known_signature() -> None:
    # From `printf 0Thi | openssl dgst -sha1 -hmac sk -binary | base64`: values in key order.
    assert signed_content({"topic": "T", "queueId": "0"}, b"hi") == b"0Thi"
    assert sign("sk", {"topic": "T", "queueId": "0"}, b"hi") == "6plpJwR5lLQoyChVbaOakIZSn6w="


@settings(max_examples=300)
@given(headers, st.binary(max_size=200), st.text(min_size=1, max_size=20),
       st.text(min_size=1, max_size=20))
def test_only_the_right_secret_matches(fields: dict[str, str], body: bytes, secret: str,
                                       other: str) -> None:
    signed = signed_fields(Credentials("ak", secret), fields, body)
    assert signed[ACCESS_KEY] == "ak"
    assert signature_matches(secret, signed, body)
    assert signature_matches(other, signed, body) == (other == secret)
    assert not signature_matches(secret, signed, body + b"x")
    tampered = {**signed, SIGNATURE: signed[SIGNATURE][::-1]}
    assert signature_matches(secret, tampered, body) == (tampered == signed)


def test_the_secret_stays_out_of_repr() -> None:
    assert "s3cret" not in repr(Credentials("ak", "s3cret"))


def test_a_client_with_credentials_signs_each_request() -> None:
    seen: list[RemotingCommand] = []

    async def record(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        seen.append(cmd)
        return cmd.response()

    async def main() -> None:
        async with RemotingServer("127.0.0.1", 0, Dispatcher({7: record})) as server:
            security = ClientSecurity(credentials=Credentials("ak", "sk"))
            async with RemotingClient("127.0.0.1", server.port, security=security) as client:
                await client.invoke(RemotingCommand.request(7, {"topic": "T", "n": 3}, b"b"), 5)
                await client.invoke_oneway(RemotingCommand.request(7, {"x": "y"}))
                async with asyncio.timeout(5):
                    while len(seen) < 2:
                        await asyncio.sleep(0.01)

    run(main())
    assert [c.ext_fields[ACCESS_KEY] for c in seen] == ["ak", "ak"]
    assert all(signature_matches("sk", c.ext_fields, c.body) for c in seen)
    assert seen[0].ext_fields["n"] == "3"  # signed as the string the server sees


def test_the_unique_key_query_flag_is_not_signed() -> None:
    # As RocketMQ's PlainAccessValidator: the flag may change without breaking the signature.
    fields = {"topic": "T", "key": "k"}
    signed = signed_fields(Credentials("ak", "sk"), {**fields, UNIQUE_KEY_QUERY: "true"}, b"")
    assert signed[SIGNATURE] == sign("sk", {**fields, ACCESS_KEY: "ak"}, b"")
    assert signature_matches("sk", {**signed, UNIQUE_KEY_QUERY: "false"}, b"")
