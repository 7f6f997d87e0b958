"""A router's dispute with another holder's verdict (docs/protocol.md, "Disputes by another holder"), through
the service the Celery task runs: the verifier is a real QUIC server on loopback (this node's own
`receipt/verify`, or a lying one written here), the expert's blob is served over HTTP, and this
process is the router, without a copy of the expert.

A planted lie upheld by an honest verifier is upheld again by the router's own re-execution and
penalized; an honest batch a lying verifier calls upheld is dismissed by the router's own check,
which names the verifier; a verdict that is not the asked holder's is passed over."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from nacl.signing import SigningKey

from apps.blobs.selectors import blob_store
from apps.blobs.store import BLOB_URI_PREFIX, blob_hash
from apps.governance.selectors import policy_active
from apps.node.identity import load_or_create_identity
from apps.providers.models import Holding, Provider
from apps.receipts import services
from apps.receipts.evidence import kept_batch, sign_verdict, verdict_body
from apps.receipts.verdict import Comparison
from apps.receipts.verify_method import VerifyMethod
from apps.reputation.selectors import reputation_scores
from apps.worker.doors import CallContext, Door
from core.experts.runtime import ExpertRuntime
from core.transport.framing import Reply
from core.transport.quic import PeerRequest, QuicSettings, start_server
from testkit.checkpoints import FileServer
from testkit.nodes import free_port
from tests.experts.factories import expert_payload, expert_weights
from tests.receipts.test_disputes import D_FF, D_MODEL, MODEL, _kept

pytestmark = pytest.mark.django_db
Handler = Callable[[PeerRequest], "asyncio.Future[Reply]"]


@contextlib.contextmanager
def verifier_server(data_dir: Path, handler: Callable[..., object]) -> Iterator[tuple[object, int]]:
    """A QUIC server on its own thread and loop (the router's dispute runs its own loop): handler(request, key)."""
    identity = load_or_create_identity(data_dir)
    loop, port, ready = asyncio.new_event_loop(), free_port(socket.SOCK_DGRAM), threading.Event()

    async def handle(request: PeerRequest) -> Reply:
        try:
            result, body = await handler(request, identity.signing_key)
        except Exception as exc:  # an error frame, as the worker's door would answer
            return Reply.error(getattr(exc, "reason", "internal_error"), str(exc))
        return Reply.ok(result, body)

    async def serve() -> None:
        server = await start_server(host="127.0.0.1", port=port, cert_path=str(identity.cert_path),
                                    key_path=str(identity.cert_key_path), handler=handle,
                                    settings=QuicSettings(max_body=1 << 24))
        ready.set()
        try:
            await asyncio.Event().wait()
        finally:
            server.close()

    def run() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(serve())
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield identity, port
    finally:
        loop.call_soon_threadsafe(lambda: [t.cancel() for t in asyncio.all_tasks(loop)])
        thread.join(10)


def announce(identity, port: int, http: str, uri: str) -> None:
    """The verifier as this router's gossip view would know it: its record's doors, holding the blob."""
    provider = Provider.objects.create(provider_id=identity.provider_id, seq=1, issued_at_ms=1, alive_ms=1,
                                       record_text="{}", signature="0" * 128, http_endpoint=http,
                                       quic_endpoint=f"127.0.0.1:{port}", quic_cert_sha256=identity.cert_sha256,
                                       price_per_input_token="0")
    Holding.objects.create(provider=provider, model_id=MODEL, layer=0, expert=2, residency="Warm", committed_tps=0,
                           blob_uri=uri)


@pytest.fixture
def expert(tmp_path):
    """The expert's payload, served over HTTP as a blob (not in this router's store), and its URI."""
    payload = expert_payload(expert_weights(np.random.default_rng(1), D_MODEL, D_FF), expert=2, model_id=MODEL,
                             quant="q8_0")
    digest = blob_hash(payload)
    (tmp_path / "served" / "blobs").mkdir(parents=True)
    (tmp_path / "served" / "blobs" / digest).write_bytes(payload)
    blob_store().delete(digest)  # the router starts without a copy (another test may have fetched it)
    with FileServer(tmp_path / "served") as server:
        yield payload, BLOB_URI_PREFIX + digest, server.url
    blob_store().delete(digest)


def honest_verifier(payload: bytes, uri: str, data_dir: Path):
    runtime = ExpertRuntime(data_dir=data_dir, memory_budget_bytes=1 << 26)
    runtime.expert_load(payload=payload, blob_uri=uri)
    executor = ThreadPoolExecutor(1)
    methods: dict[str, VerifyMethod] = {}

    async def handle(request: PeerRequest, key: SigningKey):
        method = methods.setdefault("m", VerifyMethod(runtime=runtime, executor=executor, signing_key=key,
                                                      compute_tolerance=0.05, max_rows=64, rate_per_min=60))
        return await method.verify(request.params, request.body, CallContext(Door.PEER, peer=request.peer))

    return handle


def test_a_planted_lie_upheld_by_an_honest_verifier_is_upheld_by_the_routers_own_re_execution(expert, tmp_path):
    payload, uri, http = expert
    liar = SigningKey(bytes([2]) * 32)
    with verifier_server(tmp_path / "verifier", honest_verifier(payload, uri, tmp_path / "runtime")) as (ident, port):
        announce(ident, port, http, uri)
        receipt = _kept(liar, payload, uri, lie=1.3, seed=2)
        assert not blob_store().has(uri.rsplit("/", 1)[1])
        fraud = services.dispute_run(dispute_id=services.dispute_open(receipt_id=receipt.pk).pk)
    assert fraud.state == "upheld" and fraud.reexecuted_here and fraud.verifier_id == ident.provider_id, fraud.detail
    assert fraud.verdict["upheld"] is True and "found the same" in fraud.detail
    assert fraud.penalty == policy_active().fraud_penalty
    liar_id = liar.verify_key.encode().hex()
    assert reputation_scores([liar_id])[liar_id] == pytest.approx(-fraud.penalty)


def test_an_honest_batch_is_dismissed_on_an_honest_verifiers_word_without_fetching_the_expert(expert, tmp_path):
    payload, uri, http = expert
    with verifier_server(tmp_path / "verifier", honest_verifier(payload, uri, tmp_path / "runtime")) as (ident, port):
        announce(ident, port, http, uri)
        receipt = _kept(SigningKey(bytes([1]) * 32), payload, uri, seed=1)
        dismissed = services.dispute_run(dispute_id=services.dispute_open(receipt_id=receipt.pk).pk)
    assert dismissed.state == "dismissed" and not dismissed.reexecuted_here and dismissed.penalty is None
    assert dismissed.verifier_id == ident.provider_id and dismissed.verdict["upheld"] is False
    assert not blob_store().has(uri.rsplit("/", 1)[1])  # the router never needed the expert


def test_a_verifier_that_calls_an_honest_batch_a_lie_is_caught_by_the_routers_own_check(expert, tmp_path, caplog):
    payload, uri, http = expert

    async def lying(request: PeerRequest, key: SigningKey):
        """Signs a verdict of fraud without computing anything: a made-up worst row."""
        params, body = request.params, bytes(request.body)
        split = len(body) - 6 * 16 * 8  # the test batch: 6 rows, k 16
        kept = kept_batch(params["receipt"], params["batch"], body[:split], body[split:])
        row = np.full(D_MODEL, 3.0, "<f4").tobytes()
        verdict = verdict_body(verifier_id=key.verify_key.encode().hex(), kept=kept, blob_uri=params["blob_uri"],
                               comparison=Comparison(True, 9.0, 0.05, 0, "made up"), worst_row=row)
        return {"verdict": sign_verdict(verdict, key), "detail": "made up"}, row

    honest = SigningKey(bytes([1]) * 32)
    with verifier_server(tmp_path / "verifier", lying) as (ident, port), caplog.at_level(logging.WARNING):
        announce(ident, port, http, uri)
        receipt = _kept(honest, payload, uri, seed=1)
        decided = services.dispute_run(dispute_id=services.dispute_open(receipt_id=receipt.pk).pk)
    assert decided.state == "dismissed" and decided.reexecuted_here and decided.penalty is None, decided.detail
    assert decided.verifier_id == ident.provider_id and decided.verdict["upheld"] is True
    assert f"holder {ident.provider_id[:16]}…'s upheld verdict was not confirmed here" in decided.detail
    assert any(ident.provider_id[:16] in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    honest_id = honest.verify_key.encode().hex()
    assert reputation_scores([honest_id]).get(honest_id, 0) == 0


def test_a_verdict_that_is_not_the_asked_holders_is_passed_over(expert, tmp_path):
    payload, uri, http = expert
    impostor = SigningKey(bytes([5]) * 32)
    honest = honest_verifier(payload, uri, tmp_path / "runtime")

    async def forged(request: PeerRequest, key: SigningKey):
        result, row = await honest(request, impostor)  # signed by a key that is not the record's
        return result, row

    with verifier_server(tmp_path / "verifier", forged) as (ident, port):
        announce(ident, port, http, uri)
        receipt = _kept(SigningKey(bytes([1]) * 32), payload, uri, seed=1)
        decided = services.dispute_run(dispute_id=services.dispute_open(receipt_id=receipt.pk).pk)
    assert decided.state == "dismissed" and decided.reexecuted_here and decided.verifier_id == ""
    assert f"verifier {ident.provider_id[:16]}…" in decided.detail and "passed over" in decided.detail
