"""JSON-RPC/REST methods about the node itself."""

from typing import Any

from ninja import Field

from apps.api.registry import rpc_method
from apps.api.schemas import Out
from apps.node import selectors


class Endpoints(Out):
    http: str
    quic: str
    quic_cert_sha256: str


class NodeInfoOut(Out):
    provider_id: str
    name: str = Field(description="The short name this node signs into its record (TENZRO_NODE_NAME), for people.")
    roles: list[str]
    version: str
    endpoints: Endpoints
    peers: list[str]


class ProcessOut(Out):
    name: str
    pid: int | None
    state: str
    uptime_s: float
    restarts: int


class NodeProcessesOut(Out):
    supervised: bool
    processes: list[ProcessOut]
    celery_heartbeat_age_s: float | None
    error: str | None = None


@rpc_method("tenzro_nodeInfo", rest="/node/info", http_method="GET", tag="node", response=NodeInfoOut)
def node_info() -> dict[str, Any]:
    """This node's provider id, roles, endpoints (with the QUIC certificate pin) and version."""
    return selectors.node_info()


@rpc_method("tenzro_nodeProcesses", rest="/node/processes", http_method="GET", tag="node", response=NodeProcessesOut)
def node_processes() -> dict[str, Any]:
    """The node's processes as its supervisor sees them, and the Celery heartbeat age."""
    return selectors.node_processes()
