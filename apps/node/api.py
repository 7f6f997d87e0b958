"""JSON-RPC/REST methods about the node itself."""

from typing import Any

from apps.api.registry import rpc_method
from apps.node import selectors
from apps.transport.bridge import worker_call


@rpc_method("tenzro_nodeInfo", rest="/node/info", http_method="GET", tag="node")
def node_info() -> dict[str, Any]:
    """This node's provider id, roles, endpoints (with the QUIC certificate pin) and version."""
    return selectors.node_info()


@rpc_method("tenzro_nodeProcesses", rest="/node/processes", http_method="GET", tag="node")
def node_processes() -> dict[str, Any]:
    """The node's processes as its supervisor sees them, and the Celery heartbeat age."""
    return selectors.node_processes()


@rpc_method("tenzro_workerStatus", rest="/node/worker", http_method="GET", tag="node")
async def worker_status() -> dict[str, Any]:
    """Ask the expert worker process for its `moe/status` over the Channels layer."""
    result, _ = await worker_call("moe/status", {})
    return result
