"""The expert worker's two doors, and the one table that says which door serves each method.

* The **peer door** is the QUIC endpoint: anyone on the network may call it, so it serves
  only what any peer may ask — status, execute, blob reads, gossip and receipts (a verdict
  on another holder's kept batch).
* The **operator door** is a Redis mailbox from this node's own web process, which has
  already checked the operator token where the method needs it. It serves every method.

METHOD_DOORS below is the only place a method is given a door. The worker refuses to start
when a handler has no entry there (MethodTable checks both ways), so a new method cannot be
exposed to peers by accident: it is operator-only until someone writes PEER_AND_OPERATOR next
to it here, in review.

Pure module (no Django, no aioquic): the adapters (QUIC server, Channels listener) turn
their messages into `call(...)` and its Reply back into bytes.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from core import metrics
from core.errors import Forbidden, NotFound, TenzroError, Unavailable
from core.transport.framing import Reply

logger = logging.getLogger(__name__)
T = TypeVar("T")


class Door(enum.Enum):
    PEER = "peer"  # QUIC, ALPN tenzro/moe: any peer on the network
    OPERATOR = "operator"  # a Redis mailbox from this node's web process (apps/worker/mailbox.py)


PEER_AND_OPERATOR = frozenset({Door.PEER, Door.OPERATOR})
OPERATOR_ONLY = frozenset({Door.OPERATOR})

# Every worker method and the doors that serve it. Anything that loads, unloads, reads node
# files, or exposes the tier internals (which experts sit in memory, byte counts) is
# operator-only; `moe/route` and `moe/forward_local` run this node's gates, which are the
# operator's business, not a service to peers.
METHOD_DOORS: dict[str, frozenset[Door]] = {
    "moe/status": PEER_AND_OPERATOR,
    "moe/execute": PEER_AND_OPERATOR,
    "blob/get": PEER_AND_OPERATOR,
    "gossip/push": PEER_AND_OPERATOR,
    "gossip/sync": PEER_AND_OPERATOR,
    "gossip/dialback": PEER_AND_OPERATOR,
    "receipt/verify": PEER_AND_OPERATOR,  # re-executes another holder's kept batch: a signed verdict, rate-limited
    "moe/expert_load": OPERATOR_ONLY,
    "moe/expert_unload": OPERATOR_ONLY,
    "moe/gate_load": OPERATOR_ONLY,
    "moe/gate_unload": OPERATOR_ONLY,
    "moe/expert_status": OPERATOR_ONLY,
    "moe/route": OPERATOR_ONLY,
    "moe/forward_local": OPERATOR_ONLY,
    "moe/forward": OPERATOR_ONLY,  # dispatches to peers on this node's behalf: the operator door decides
    "moe/load_dense": OPERATOR_ONLY,  # reads a checkpoint into this node's memory
    "moe/generate": OPERATOR_ONLY,  # a whole model over the network, paid by this node
    "moe/model_forward": OPERATOR_ONLY,  # the same, one forward's logits
    "moe/generation_cancel": OPERATOR_ONLY,  # stops a generation this node runs
    "moe/models": OPERATOR_ONLY,  # the models whose dense part this router holds (what /v1/models lists)
    "moe/batching": OPERATOR_ONLY,  # its running and waiting generations and iterations (the live view)
}


@dataclass(frozen=True)
class CallContext:
    """Who is calling, through which door, and until when the answer is wanted.

    `deadline` is wall-clock seconds (time.time(), same machine as the caller) or None.
    """

    door: Door
    peer: tuple[str, int] | None = None
    deadline: float | None = None
    counts: Counter[str] | None = field(default=None, compare=False, repr=False)  # the table's, set by call()

    def count(self, what: str) -> None:
        if self.counts is not None:
            self.counts[f"{self.door.value}.{what}"] += 1

    def expired(self) -> bool:
        return self.deadline is not None and time.time() > self.deadline

    async def run_blocking(self, executor: Executor, func: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run `func` on `executor`, unless the deadline passed before a thread picked it up.

        The check runs in the worker thread right before `func`, so a call that waited in
        the queue past its caller's timeout is dropped without computing. Cancelling the
        awaiting task (the caller gave up) also cancels the job if it has not started.
        """

        started = False

        def guarded() -> T:
            nonlocal started
            started = True
            self._check_deadline()
            return func(*args, **kwargs)

        try:
            return await asyncio.get_running_loop().run_in_executor(executor, guarded)
        except asyncio.CancelledError:
            if not started:  # cancelled while queued: the job is withdrawn and never runs
                self.count("dropped_past_deadline")
            raise

    def run_inline(self, func: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run `func` now, on the calling thread (the event loop), with run_blocking's deadline
        check: for work that costs less than the hop to a thread and back (counted as
        computed_inline)."""
        self._check_deadline()
        self.count("computed_inline")
        return func(*args, **kwargs)

    def _check_deadline(self) -> None:
        if self.expired():
            self.count("dropped_past_deadline")
            raise DeadlineExceeded(f"dropped without computing: the caller's deadline passed "
                                   f"{time.time() - (self.deadline or 0):.3f} s ago")


class DeadlineExceeded(Unavailable):
    reason = "deadline_exceeded"


Handler = Callable[[dict[str, Any], bytes | bytearray, CallContext], Awaitable[tuple[dict[str, Any], bytes]]]


@dataclass(frozen=True)
class WorkerParts:
    """What the worker lends the handlers other parts contribute: its runtime (an
    core.experts.runtime.ExpertRuntime), its compute executor, this node's provider id, its
    view of the control plane (apps.worker.control_plane.ControlPlaneView), and the router's
    receipt-sampling key (apps.receipts.sampling: derived from the node seed, never the seed).
    `shared` holds what one part builds and another drives within this worker, by name (the
    distributed forward that generation runs layer by layer: apps.forward.handlers). `on_start`: coroutine
    functions a part adds to be run once the worker's doors are open (generation restores its dense parts)."""

    runtime: Any
    executor: Executor
    provider_id: str
    control_plane: Any
    sampling_key: bytes = b""
    shared: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    on_start: list[Callable[[], Awaitable[None]]] = field(default_factory=list, compare=False, repr=False)


# Handlers that other parts contribute to the worker (gossip from apps/providers, the distributed
# forward from apps/forward, whole-model generation from apps/generation), registered from their
# AppConfig.ready(): the worker serves them without importing those parts, which sit above it.
# Each still needs its door in METHOD_DOORS above.
HandlerFactory = Callable[[WorkerParts], Mapping[str, Handler]]
_CONTRIBUTED: list[HandlerFactory] = []


def contribute_handlers(factory: HandlerFactory) -> None:
    """Register a factory of {method: handler}; the worker calls it with its parts when it starts."""
    if factory not in _CONTRIBUTED:
        _CONTRIBUTED.append(factory)


def contributed_handlers(parts: WorkerParts) -> dict[str, Handler]:
    handlers: dict[str, Handler] = {}
    for factory in _CONTRIBUTED:
        handlers.update(factory(parts))
    return handlers


class MethodTable:
    """Every worker method, dispatched with its door checked; errors become error replies."""

    def __init__(self, handlers: Mapping[str, Handler]) -> None:
        undeclared = sorted(set(handlers) - set(METHOD_DOORS))
        unserved = sorted(set(METHOD_DOORS) - set(handlers))
        if undeclared or unserved:
            raise ValueError(f"worker methods without a door in METHOD_DOORS: {undeclared}; "
                             f"doors declared for methods nobody serves: {unserved}")
        self._handlers = dict(handlers)
        self.counts: Counter[str] = Counter()  # calls, forbidden, dropped_past_deadline, errors, per door

    async def call(self, method: str, params: dict[str, Any], body: bytes | bytearray, ctx: CallContext) -> Reply:
        reply = await self._call(method, params, body, ctx)
        error = reply.header.get("error")
        # Only declared methods get a label of their own: a peer's made-up names all count as "other".
        metrics.WORKER_REQUESTS.labels(ctx.door.value, method if method in METHOD_DOORS else "other",
                                       "ok" if error is None else metrics.reason_label(error.get("reason"))).inc()
        return reply

    async def _call(self, method: str, params: dict[str, Any], body: bytes | bytearray, ctx: CallContext) -> Reply:
        door = ctx.door.value
        ctx = replace(ctx, counts=self.counts)
        self.counts[f"{door}.calls"] += 1
        try:
            handler = self._handlers.get(method)
            if handler is None:
                raise NotFound(f"unknown worker method {method!r}", reason="method_not_found")
            if ctx.door not in METHOD_DOORS[method]:
                self.counts[f"{door}.forbidden"] += 1
                raise Forbidden(f"{method} is not served on the peer door: it changes or inspects this node and "
                                "only its operator may call it (JSON-RPC with the operator token)")
            if ctx.expired():
                ctx.count("dropped_past_deadline")
                raise DeadlineExceeded(f"{method} arrived after its caller's deadline; not started")
            result, out = await handler(params, body, ctx)
            return Reply.ok(result, out)
        except DeadlineExceeded as exc:
            return Reply.error(exc.reason, exc.message)
        except TenzroError as exc:
            self.counts[f"{door}.errors"] += 1
            return Reply.error(exc.reason, exc.message, exc.details)
        except Exception:
            self.counts[f"{door}.errors"] += 1
            logger.exception("worker method %s failed", method)
            return Reply.error("internal_error", f"internal error in {method}")
