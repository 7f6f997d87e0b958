"""One gossip round of this node, as the Celery beat task runs it (apps/providers/tasks.py).

1. Re-sign this node's record if what it announces changed, and sign a fresh heartbeat.
2. Drop providers silent past the TTL.
3. Push: offer this round's rumors (and this node's own version) to `fanout` random peers;
   send each the records it answers it wants.
4. Sync with one random peer — and, with probability TENZRO_GOSSIP_SEED_PROBABILITY, with one
   configured peer too: send the digest (SYN), merge its answer (ACK), send the records and
   heartbeats it wants (ACK2).
5. Until a peer has confirmed this node's endpoints, ask one to dial them back before 3 (the push
   then carries them); every TENZRO_REACHABILITY_CHECK_S after, beside 3 and 4. Re-sign if that
   changes what may be announced.

Peers are every provider whose record announces an endpoint, plus the `--peers` URLs (HTTP
only: their pins are unknown until their records arrive). A call goes over QUIC, pinned to the
certificate in the peer's signed record, on a connection kept from round to round, and falls back
to HTTP (`POST <http>/peer/<method>`) when QUIC fails or the peer announces no QUIC endpoint.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
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
from core.transport.loop_thread import LoopThread
from core.transport.pool import QuicPool
from core.transport.quic import QuicSettings, TransportError, quic_connection

logger = logging.getLogger(__name__)
CALL_TIMEOUT_S = 10.0
ROUND_TRIP_TIMEOUT_S = 1.0  # a PING after a gossip call: an answer later than this is no latency sample
DIALBACK_TRIES = 3
MIN_CALL_S = 0.05  # less of a round's time than this left: the call is not started


def round_call_timeout_s() -> float:
    """How long a round's calls may take, QUIC and HTTP fallbacks, a peer's second call and the
    dial-back included: one gossip interval (at least 5 s, at most CALL_TIMEOUT_S). A round waits for its
    slowest call, and rounds run one after another: a dead peer answering nothing must not hold this
    node's heartbeats back from the live ones for longer than an interval, or their views expire
    this node (and everything it holds) while it is up. A live peer answers a gossip call in milliseconds."""
    return min(CALL_TIMEOUT_S, max(5.0, float(settings.TENZRO_GOSSIP_INTERVAL_S)))


# The rounds of this process run on one loop that outlives them, so that its pool keeps a connection
# to each peer from round to round: a new connection per call cost both ends ~7-10 ms of CPU (the
# handshake) and the caller ~95 ms of waiting (QUIC's closing period). Code that calls peer_call on
# a loop of its own (tests, a one-off asyncio.run) gets a connection per call, closed with it.
_ROUNDS_LOOP = LoopThread("gossip-rounds")
_POOL: contextvars.ContextVar[QuicPool | None] = contextvars.ContextVar("gossip_pool", default=None)
_pools: dict[asyncio.AbstractEventLoop, QuicPool] = {}  # one per rounds loop (a forked child has its own)

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
        # with an HTTP door to fall back on, QUIC gets most of the time, not all of it
        quic_timeout_s = timeout_s * (0.6 if target.http_endpoint else 1.0)
        try:
            pool = _POOL.get()
            if pool is None:
                return await _call_once(target, host, port, method, params, timeout_s=quic_timeout_s)
            return await _call_pooled(pool, target, host, port, method, params, timeout_s=quic_timeout_s)
        except TransportError as exc:
            failures.append(f"quic: {exc.reason}: {exc}")
    if target.http_endpoint and (left := deadline - time.monotonic()) > 0:
        try:
            async with httpx.AsyncClient(timeout=left) as client:
                answer = (await client.post(f"{target.http_endpoint.rstrip('/')}/peer/{method}",
                                            json={"params": params})).json()
        except (httpx.HTTPError, ValueError) as exc:
            failures.append(f"http: {exc or type(exc).__name__}")  # a read timeout's text is empty
        else:
            if answer.get("ok"):
                return answer["result"]
            error = answer.get("error") or {}
            raise TransportError(error.get("reason", "remote_error"), error.get("message", "remote error"))
    raise TransportError("unreachable", f"peer {target.key[:24]}: " + ("; ".join(failures) or "no endpoint"))


async def _call_pooled(pool: QuicPool, target: PeerTarget, host: str, port: int, method: str,
                       params: dict[str, Any], *, timeout_s: float) -> dict[str, Any]:
    """The call on the peer's kept connection, after a PING on it: a peer restarted on the same address
    ignores the old connection, and the PING's silence drops it within ROUND_TRIP_TIMEOUT_S, so the
    call reconnects instead of waiting out its timeout. The PING's round trip is the peer's latency
    sample (as a forward folds a holder's wire share: the planner adds compute time from the holder's
    rate, so a call's own work is not latency)."""
    deadline = time.monotonic() + timeout_s
    pin = str(target.quic_cert_sha256)
    try:
        seconds: float | None = await pool.round_trip_s(host=host, port=port, pin_sha256=pin,
                                                        timeout_s=min(ROUND_TRIP_TIMEOUT_S, timeout_s))
    except TransportError as exc:
        if exc.reason in ("connection_failed", "certificate_pin_mismatch"):  # the call would fail the same
            raise
        seconds = None  # the kept connection was silent or closed, and is dropped: the call opens a new one
    result, _ = await pool.call(host=host, port=port, pin_sha256=pin, method=method, params=params,
                                timeout_s=max(0.001, deadline - time.monotonic()))
    if seconds is not None:
        await _record_latency(target, seconds)
    return result


async def _call_once(target: PeerTarget, host: str, port: int, method: str, params: dict[str, Any], *,
                     timeout_s: float) -> dict[str, Any]:
    """The call on a connection of its own, then a PING on it for the peer's latency sample."""
    deadline = time.monotonic() + timeout_s
    async with quic_connection(host=host, port=port, pin_sha256=str(target.quic_cert_sha256),
                               settings=QuicSettings(max_body=settings.TENZRO_QUIC_MAX_BODY),
                               timeout_s=timeout_s) as connection:
        result, _ = await connection.call(method, params, timeout_s=max(0.001, deadline - time.monotonic()))
        left = min(ROUND_TRIP_TIMEOUT_S, deadline - time.monotonic())
        if target.provider_id and left > 0:
            try:
                seconds = await connection.round_trip_s(timeout_s=left)
            except (TimeoutError, ConnectionError):
                return result  # no sample: the call itself was answered, and a slow PING says nothing certain
            await _record_latency(target, seconds)
    return result


async def _record_latency(target: PeerTarget, seconds: float) -> None:
    if target.provider_id:
        await asyncio.to_thread(services.provider_latency_record, provider_id=target.provider_id,
                                latency_ms=seconds * 1000)


def _left_s(deadline: float) -> float:
    """Seconds left of a round's time for its next call; TransportError when none are."""
    left = deadline - time.monotonic()
    if left < MIN_CALL_S:
        raise TransportError("timeout", "the gossip round's time ran out before this call")
    return left


async def _push(targets: list[PeerTarget], offer: dict[str, Any], *, deadline: float) -> None:
    async def one(target: PeerTarget) -> None:
        try:
            answer = await peer_call(target, "gossip/push", offer, timeout_s=_left_s(deadline))
            if answer.get("want"):
                wanted = await asyncio.to_thread(services.gossip_records_for, provider_ids=answer["want"])
                await peer_call(target, "gossip/push", wanted, timeout_s=_left_s(deadline))
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


async def _sync(target: PeerTarget, *, deadline: float) -> None:
    syn = await asyncio.to_thread(lambda: services.gossip_engine().sync_request())
    ack = await peer_call(target, "gossip/sync", syn, timeout_s=_left_s(deadline))
    await asyncio.to_thread(services.gossip_receive, records=ack.get("records", []),
                            heartbeats=ack.get("heartbeats", []))
    if ack.get("want") or ack.get("want_beats"):
        ack2 = await asyncio.to_thread(services.gossip_records_for, provider_ids=ack.get("want", []),
                                       beats_for=ack.get("want_beats", []))
        await peer_call(target, "gossip/push", ack2, timeout_s=_left_s(deadline))


async def _dialback(targets: list[PeerTarget], *, deadline: float) -> None:
    """Ask `targets` in turn, until one answers, to dial this node's endpoints back, within the
    round's deadline (the peer dials both at once within DIALBACK_TIMEOUT_S, less than that)."""
    identity = node_identity()
    params = {"provider_id": identity.provider_id, "http": settings.TENZRO_PUBLIC_HTTP,
              "quic": settings.TENZRO_PUBLIC_QUIC, "quic_cert_sha256": identity.cert_sha256}
    for target in targets:
        try:
            answer = await peer_call(target, "gossip/dialback", params, timeout_s=_left_s(deadline))
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


def _dialback_due() -> str | None:
    """"first": no peer has confirmed an endpoint yet; "again": the periodic check is due; None."""
    reach = Reachability.objects.filter(pk=1).first()
    if reach is None or not (reach.http_ok or reach.quic_ok):
        return "first"
    age = (timezone.now() - reach.checked_at).total_seconds() if reach.checked_at else float("inf")
    return "again" if age >= settings.TENZRO_REACHABILITY_CHECK_S else None


async def _round(rng: random.Random) -> dict[str, Any]:
    self_id = node_identity().provider_id
    await asyncio.to_thread(services.local_record_refresh)
    expired = await asyncio.to_thread(services.gossip_expire)
    targets = await asyncio.to_thread(peer_targets, self_id)
    # At most DIALBACK_TRIES peers a round are asked to dial back (the next round asks others).
    # Before any endpoint is confirmed, first, with a round's time of its own: the record this round
    # pushes then carries them (without, peers know a node they cannot call, and none of them is
    # waiting for its heartbeats yet). A periodic check runs beside the push and syncs.
    due = await asyncio.to_thread(_dialback_due)
    asked = rng.sample(targets, min(DIALBACK_TRIES, len(targets)))
    if due == "first":
        await _dialback(asked, deadline=time.monotonic() + round_call_timeout_s())
    # One deadline for every other call of the round (a peer's second call, the periodic dial-back):
    # the next round, this node's next heartbeat, waits for this one, and a peer slow to answer
    # twice, or a dead one asked to dial back, held it 10 s, past a live peer's TTL of this node.
    deadline = time.monotonic() + round_call_timeout_s()
    dialback = _dialback(asked, deadline=deadline) if due == "again" else asyncio.sleep(0)
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
            await _sync(target, deadline=deadline)
            synced.append(target.key)
        except TransportError as exc:
            await asyncio.to_thread(_peer_failed, target, "gossip sync", exc)
        else:
            await asyncio.to_thread(_peer_answered, target)

    # the push and the syncs side by side: the round lasts as long as its slowest call, not their sum
    await asyncio.gather(dialback, _push(fanout, push, deadline=deadline), *(sync(t) for t in dict.fromkeys(chosen)))
    return {"peers": len(targets), "pushed_to": len(fanout), "synced_with": synced, "expired": expired}


async def _pooled_round() -> dict[str, Any]:
    """One round on the rounds loop, its calls on the loop's pool."""
    loop = asyncio.get_running_loop()
    pool = _pools.get(loop)
    if pool is None:
        # idle connections close after a minute: a peer is called every few rounds at most
        pool = _pools[loop] = QuicPool(QuicSettings(max_body=settings.TENZRO_QUIC_MAX_BODY), idle_close_s=60.0)
    _POOL.set(pool)  # this task's context, and the calls' tasks it starts
    # Each round's database work on threads of its own, as asyncio.run gave it: when they end, their
    # connections go with them, so none is kept across rounds past a database restart.
    executor = concurrent.futures.ThreadPoolExecutor(thread_name_prefix="gossip-round")
    loop.set_default_executor(executor)
    try:
        return await _round(random.Random())
    finally:
        executor.shutdown(wait=False)


def gossip_round() -> dict[str, Any]:
    """Run one round (blocking) on this process's rounds loop; what happened, for the task's log."""
    # a round lasts its first dial-back's time and one more round's time, and its database work
    return _ROUNDS_LOOP.run(_pooled_round(), timeout_s=2 * round_call_timeout_s() + 30.0)
