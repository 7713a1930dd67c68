"""The name server's requests: a broker's (UN)REGISTER_BROKER and the answer that tells a slave
its master, a client's GET_ROUTEINFO_BY_TOPIC, and the admin requests on topics and KV config.

Fields are declared in the order the name server has always read them, so that a request
missing several is refused naming the same one as before.
"""

from __future__ import annotations

from evq.net.headers import BOOL, INT, LONG, Header, header, wire


@header
class RegisterBrokerRequest(Header):
    """REGISTER_BROKER (103); the body is the broker's topic table."""

    cluster_name: str = wire("clusterName")
    broker_name: str = wire("brokerName")
    broker_id: int = wire("brokerId", LONG)
    broker_addr: str = wire("brokerAddr")
    ha_server_addr: str = wire("haServerAddr")
    body_crc32: int = wire("bodyCrc32", INT, default=0)
    """:func:`evq.net.register_broker.body_crc32` of the body as sent; 0 is "not checked"."""
    compressed: bool = wire("compressed", BOOL, default=False)
    """The body is the zlib form, not JSON."""


@header
class RegisterBrokerResponse(Header):
    """What a slave learns of its master; both absent (or empty) for a master, or while its
    master has not registered here."""

    master_addr: str | None = wire("masterAddr", default=None, empty_as_absent=True)
    ha_server_addr: str | None = wire("haServerAddr", default=None, empty_as_absent=True)


@header
class UnRegisterBrokerRequest(Header):
    """UNREGISTER_BROKER (104): the identity of REGISTER_BROKER without ``haServerAddr``."""

    cluster_name: str = wire("clusterName")
    broker_name: str = wire("brokerName")
    broker_id: int = wire("brokerId", LONG)
    broker_addr: str = wire("brokerAddr")


@header
class GetRouteInfoRequest(Header):
    """GET_ROUTEINFO_BY_TOPIC (105)."""

    topic: str = wire("topic")


@header
class GetTopicsByClusterRequest(Header):
    """GET_TOPICS_BY_CLUSTER (224)."""

    cluster: str = wire("cluster")


@header
class DeleteTopicFromNamesrvRequest(Header):
    """DELETE_TOPIC_IN_NAMESRV (216)."""

    topic: str = wire("topic")
    cluster_name: str | None = wire("clusterName", default=None, empty_as_absent=True)
    """Forget the topic on this cluster's brokers only; absent or empty, on every broker."""


@header
class PutKVConfigRequest(Header):
    """PUT_KV_CONFIG (100)."""

    namespace: str = wire("namespace")
    key: str = wire("key")
    value: str = wire("value")


@header
class GetKVConfigRequest(Header):
    """GET_KV_CONFIG (101); also DELETE_KV_CONFIG's (102) request."""

    namespace: str = wire("namespace")
    key: str = wire("key")


@header
class GetKVConfigResponse(Header):
    """GET_KV_CONFIG's answer."""

    value: str | None = wire("value", default=None)
    """Absent when the answer is QUERY_NOT_FOUND."""


@header
class GetKVListByNamespaceRequest(Header):
    """GET_KVLIST_BY_NAMESPACE (219)."""

    namespace: str = wire("namespace")


DeleteKVConfigRequest = GetKVConfigRequest
