"""One gossip round of this node, as the Celery beat task runs it (apps/providers/tasks.py).

1. Re-sign this node's record if what it announces changed, and sign a fresh heartbeat.
2. Drop providers silent past the TTL.
3. Push: offer this round's rumors (and this node's own version) to `fanout` random peers;
   send each the records it answers it wants.
4. Sync with one random peer — and, with probability TENZRO_GOSSIP_SEED_PROBABILITY, with one
   configured peer too: send the digest (SYN), merge its answer (ACK), send the records and
   heartbeats it wants (ACK2).
5. Until a peer has confirmed this node's endpoints (and every TENZRO_REACHABILITY_CHECK_S
   after), ask one to dial them back, and re-sign if that changes what may be announced.

Peers are every provider whose record announces an endpoint, plus the `--peers` URLs (HTTP
only: their pins are unknown until their records arrive). A call goes over QUIC, pinned to the
certificate in the peer's signed record, and falls back to HTTP (`POST <http>/peer/<method>`)
when QUIC fails or the peer announces no QUIC endpoint.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx
from django.conf import settings
from django.utils import timezone
from redis import RedisError

from apps.node.selectors import node_identity, redis_client
from apps.providers import services
from apps.providers.models import Provider, Reachability
from core.env import split_host_port
from core.transport.quic import QuicSettings, TransportError, quic_call

logger = logging.getLogger(__name__)
CALL_TIMEOUT_S = 10.0
DIALBACK_TRIES = 3


def round_call_timeout_s() -> float:
    """How long one peer call of a round may take, QUIC and its HTTP fallback together: one gossip
    interval (at least 5 s, at most CALL_TIMEOUT_S). A round waits for its slowest call, and rounds
    run one after another: a dead peer answering nothing must not hold this node's heartbeats back
    from the live ones for longer than an interval, or their views expire this node (and everything
    it holds) while it is up. A live peer answers a gossip call in milliseconds."""
    return min(CALL_TIMEOUT_S, max(5.0, float(settings.TENZRO_GOSSIP_INTERVAL_S)))
# Peers whose last gossip call failed, in the node's Redis: a peer going down is logged once at
# WARNING and its return once at INFO, however many rounds it stays away (each failure at DEBUG).
DOWN_KEY = "tenzro:gossip:down"


@dataclass(frozen=True)
class PeerTarget:
    key: str  # the provider id, or the configured URL of a peer not yet known by its record
    provider_id: str | None
    quic_endpoint: str | None
    quic_cert_sha256: str | None
    http_endpoint: str | None


def configured_urls() -> set[str]:
    return {url.rstrip("/") for url in settings.TENZRO_PEERS}


def peer_targets(self_id: str) -> list[PeerTarget]:
    """Known providers with an endpoint, then configured peers no record covers yet."""
    rows = Provider.objects.exclude(provider_id=self_id).values_list(
        "provider_id", "quic_endpoint", "quic_cert_sha256", "http_endpoint")
    known = [PeerTarget(pid, pid, quic, pin, http) for pid, quic, pin, http in rows if quic or http]
    covered = {t.http_endpoint.rstrip("/") for t in known if t.http_endpoint}
    own = settings.TENZRO_PUBLIC_HTTP.rstrip("/")
    configured = [PeerTarget(url, None, None, None, url) for url in settings.TENZRO_PEERS
                  if url.rstrip("/") not in covered and url.rstrip("/") != own]
    return known + configured


async def peer_call(target: PeerTarget, method: str, params: dict[str, Any], *,
                    timeout_s: float = CALL_TIMEOUT_S) -> dict[str, Any]:
    """Call a peer method: QUIC (pinned) first, HTTP second, both within `timeout_s`. Raises
    TransportError when both fail."""
    failures = []
    deadline = time.monotonic() + timeout_s
    if target.quic_endpoint and target.quic_cert_sha256:
        host, port = split_host_port(target.quic_endpoint, what="quic endpoint")
        started = time.monotonic()
        try:
            # with an HTTP door to fall back on, QUIC gets most of the time, not all of it
            result, _ = await quic_call(host=host, port=port, pin_sha256=target.quic_cert_sha256, method=method,
                                        params=params, settings=QuicSettings(max_body=settings.TENZRO_QUIC_MAX_BODY),
                                        timeout_s=timeout_s * (0.6 if target.http_endpoint else 1.0))
            if target.provider_id:
                await asyncio.to_thread(services.provider_latency_record, provider_id=target.provider_id,
                                        latency_ms=(time.monotonic() - started) * 1000)
            return result
        except TransportError as exc:
            failures.append(f"quic: {exc.reason}: {exc}")
    if target.http_endpoint and (left := deadline - time.monotonic()) > 0:
        try:
            async with httpx.AsyncClient(timeout=left) as client:
                answer = (await client.post(f"{target.http_endpoint.rstrip('/')}/peer/{method}",
                                            json={"params": params})).json()
        except (httpx.HTTPError, ValueError) as exc:
            failures.append(f"http: {exc}")
        else:
            if answer.get("ok"):
                return answer["result"]
            error = answer.get("error") or {}
            raise TransportError(error.get("reason", "remote_error"), error.get("message", "remote error"))
    raise TransportError("unreachable", f"peer {target.key[:24]}: " + ("; ".join(failures) or "no endpoint"))


async def _push(targets: list[PeerTarget], offer: dict[str, Any]) -> None:
    timeout_s = round_call_timeout_s()

    async def one(target: PeerTarget) -> None:
        try:
            answer = await peer_call(target, "gossip/push", offer, timeout_s=timeout_s)
            if answer.get("want"):
                wanted = await asyncio.to_thread(services.gossip_records_for, provider_ids=answer["want"])
                await peer_call(target, "gossip/push", wanted, timeout_s=timeout_s)
        except TransportError as exc:
            await asyncio.to_thread(_peer_failed, target, "gossip push", exc)
        else:
            await asyncio.to_thread(_peer_answered, target)

    await asyncio.gather(*(one(t) for t in targets))


def _peer_failed(target: PeerTarget, what: str, exc: TransportError) -> None:
    try:
        newly = bool(redis_client().sadd(DOWN_KEY, target.key))
    except RedisError:  # no Redis: say it every time rather than never
        newly = True
    if newly:
        logger.warning("peer %s does not answer (%s: %s); it stays in the view until its record expires",
                       target.key[:24], what, exc)
    else:
        logger.debug("%s to %s failed again: %s", what, target.key[:24], exc)


def _peer_answered(target: PeerTarget) -> None:
    try:
        back = bool(redis_client().srem(DOWN_KEY, target.key))
    except RedisError:
        back = False
    if back:
        logger.info("peer %s answers again", target.key[:24])


async def _sync(target: PeerTarget) -> None:
    timeout_s = round_call_timeout_s()
    syn = await asyncio.to_thread(lambda: services.gossip_engine().sync_request())
    ack = await peer_call(target, "gossip/sync", syn, timeout_s=timeout_s)
    await asyncio.to_thread(services.gossip_receive, records=ack.get("records", []),
                            heartbeats=ack.get("heartbeats", []))
    if ack.get("want") or ack.get("want_beats"):
        ack2 = await asyncio.to_thread(services.gossip_records_for, provider_ids=ack.get("want", []),
                                       beats_for=ack.get("want_beats", []))
        await peer_call(target, "gossip/push", ack2, timeout_s=timeout_s)


async def _dialback(targets: list[PeerTarget]) -> None:
    identity = node_identity()
    params = {"provider_id": identity.provider_id, "http": settings.TENZRO_PUBLIC_HTTP,
              "quic": settings.TENZRO_PUBLIC_QUIC, "quic_cert_sha256": identity.cert_sha256}
    for target in targets:
        try:
            # the peer dials this node's endpoints back before it answers: the plain call's timeout
            answer = await peer_call(target, "gossip/dialback", params)
        except TransportError as exc:
            await asyncio.to_thread(_peer_failed, target, "dial-back request", exc)
            continue
        await asyncio.to_thread(_peer_answered, target)
        changed = await asyncio.to_thread(services.reachability_record, http_ok=bool(answer.get("http")),
                                          quic_ok=bool(answer.get("quic")), checked_by=target.key,
                                          detail=str(answer.get("detail", ""))[:2000])
        if changed:
            await asyncio.to_thread(services.local_record_refresh)
        return


def _dialback_due() -> bool:
    reach = Reachability.objects.filter(pk=1).first()
    if reach is None or not (reach.http_ok or reach.quic_ok):
        return True
    age = (timezone.now() - reach.checked_at).total_seconds() if reach.checked_at else float("inf")
    return age >= settings.TENZRO_REACHABILITY_CHECK_S


async def _round(rng: random.Random) -> dict[str, Any]:
    self_id = node_identity().provider_id
    await asyncio.to_thread(services.local_record_refresh)
    expired = await asyncio.to_thread(services.gossip_expire)
    targets = await asyncio.to_thread(peer_targets, self_id)
    if await asyncio.to_thread(_dialback_due):
        # at most DIALBACK_TRIES peers a round (the next round asks others): each may take the plain
        # call's timeout, and the next round (this node's next heartbeat) waits for this one to end
        await _dialback(rng.sample(targets, min(DIALBACK_TRIES, len(targets))))
    push = await asyncio.to_thread(services.gossip_push_message)
    fanout = rng.sample(targets, min(settings.TENZRO_GOSSIP_FANOUT, len(targets)))
    synced: list[str] = []
    chosen = [rng.choice(targets)] if targets else []
    # Now and then a configured peer too (Cassandra syncs with a seed so): groups that met no
    # one in common cannot stay apart.
    seeds = [t for t in targets if t.http_endpoint and t.http_endpoint.rstrip("/") in configured_urls()]
    if seeds and rng.random() < settings.TENZRO_GOSSIP_SEED_PROBABILITY:
        chosen.append(rng.choice(seeds))

    async def sync(target: PeerTarget) -> None:
        try:
            await _sync(target)
            synced.append(target.key)
        except TransportError as exc:
            await asyncio.to_thread(_peer_failed, target, "gossip sync", exc)
        else:
            await asyncio.to_thread(_peer_answered, target)

    # the push and the syncs side by side: the round lasts as long as its slowest call, not their sum
    await asyncio.gather(_push(fanout, push), *(sync(t) for t in dict.fromkeys(chosen)))
    return {"peers": len(targets), "pushed_to": len(fanout), "synced_with": synced, "expired": expired}


def gossip_round() -> dict[str, Any]:
    """Run one round (blocking); what happened, for the task's log."""
    return asyncio.run(_round(random.Random()))
