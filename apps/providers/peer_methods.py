"""The gossip methods any peer may call: `gossip/push`, `gossip/sync`, `gossip/dialback`.

Served on the QUIC peer door by the expert worker (apps/worker/doors.py declares them there) and
on the HTTP fallback `POST /peer/<method>` by the web process (apps/providers/views.py); both
call these functions, which run the database work off the event loop.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
from asgiref.sync import sync_to_async
from django.conf import settings

from apps.providers import services
from core.env import split_host_port
from core.errors import Forbidden, InvalidInput
from core.transport.quic import QuicSettings, TransportError, quic_call

DIALBACK_TIMEOUT_S = 4.0  # under the asking round's 5 s at least (apps/providers/rounds.py)


def _list(params: dict[str, Any], name: str) -> list[Any]:
    value = params.get(name, [])
    if not isinstance(value, list):
        raise InvalidInput(f"param {name!r} must be an array")
    return value


async def gossip_push(params: dict[str, Any], *, peer_host: str | None) -> dict[str, Any]:
    """A peer's offer of versions (with heartbeats), or the records it was asked for (ack2);
    answers the verdicts and the offered records this node wants."""
    offer = params.get("offer", {})
    if not isinstance(offer, dict):
        raise InvalidInput("param 'offer' must be an object {provider_id: [seq, alive_ms]}")
    message = {"records": _list(params, "records"), "heartbeats": _list(params, "heartbeats"), "offer": offer}
    return await sync_to_async(services.gossip_answer_push, thread_sensitive=False)(message=message)


async def gossip_sync(params: dict[str, Any], *, peer_host: str | None) -> dict[str, Any]:
    """SYN -> ACK: the records and heartbeats the peer lacks, and the provider ids this node wants."""
    return await sync_to_async(services.gossip_answer_sync, thread_sensitive=False)(digest=params.get("digest"))


async def _dial_http(url: str, provider_id: str) -> str | None:
    """None when `url` answers as `provider_id`, else why not."""
    try:
        async with httpx.AsyncClient(timeout=DIALBACK_TIMEOUT_S) as client:
            answer = (await client.get(f"{url.rstrip('/')}/api/node/info")).json()
    except (httpx.HTTPError, ValueError) as exc:
        return f"http {url}: {exc}"
    return None if answer.get("provider_id") == provider_id else f"http {url}: answered as another provider"


async def _dial_quic(endpoint: str, pin: str, provider_id: str) -> str | None:
    host, port = split_host_port(endpoint, what="quic endpoint")
    try:
        result, _ = await quic_call(host=host, port=port, pin_sha256=pin, method="moe/status", params={},
                                    settings=QuicSettings(max_body=1 << 20), timeout_s=DIALBACK_TIMEOUT_S)
    except TransportError as exc:
        return f"quic {endpoint}: {exc.reason}: {exc}"
    return None if result.get("provider_id") == provider_id else f"quic {endpoint}: answered as another provider"


def _host_of(url_or_endpoint: str) -> str:
    rest = url_or_endpoint.split("://", 1)[-1].split("/", 1)[0]
    return rest.rsplit(":", 1)[0].strip("[]") if ":" in rest else rest


async def gossip_dialback(params: dict[str, Any], *, peer_host: str | None) -> dict[str, Any]:
    """Dial the asking node back at the endpoints it would announce; answer which ones answered.

    Only the asking host is dialed (when the door knows it): a node cannot use this to make a
    peer connect to third parties.
    """
    pid, http, quic, pin = (params.get(k) for k in ("provider_id", "http", "quic", "quic_cert_sha256"))
    if not (isinstance(pid, str) and len(pid) == 64):
        raise InvalidInput("param 'provider_id' must be the asking node's provider id (64 hex)")
    for endpoint in (http, quic):
        if endpoint is not None and not isinstance(endpoint, str):
            raise InvalidInput("endpoints must be strings")
        if endpoint and peer_host is not None and not settings.TENZRO_DIALBACK_ANY_HOST \
                and _host_of(endpoint) != peer_host:
            raise Forbidden(f"dial-back goes only to the asking host {peer_host}, not {_host_of(endpoint)}")
    started = time.monotonic()
    async def given(what: str) -> str:
        return f"no {what} endpoint given"

    # both at once: the asking node's gossip round waits for this answer
    http_error, quic_error = await asyncio.gather(
        _dial_http(http, pid) if http else given("http"),
        _dial_quic(quic, pin, pid) if quic and isinstance(pin, str) else given("quic"))
    detail = "; ".join(e for e in (http_error, quic_error) if e)
    return {"http": http_error is None, "quic": quic_error is None, "detail": detail,
            "took_s": round(time.monotonic() - started, 3)}


PEER_METHODS = {"gossip/push": gossip_push, "gossip/sync": gossip_sync, "gossip/dialback": gossip_dialback}
