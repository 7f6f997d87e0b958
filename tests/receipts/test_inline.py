"""Inline verification in a real forward: holders on real QUIC endpoints on loopback, one of them
lying about its receipt in each of the ways a holder can, and the forward still served, exactly,
by the honest backup, with the liar reported as a failure (a penalty) under the receipt's reason."""

from __future__ import annotations

import asyncio
import socket
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from nacl.signing import SigningKey

from apps.forward.callers import HolderCaller
from apps.forward.combine import StreamingCombine
from apps.forward.engine import ForwardLimits, run_forward
from apps.forward.hedging import HedgePolicy, LatencyBook
from apps.node.identity import load_or_create_identity
from apps.receipts.commitment import RECEIPT_DOMAIN, ReceiptSigner, canonical_text
from apps.worker.doors import CallContext, Door
from apps.worker.expert_methods import ExpertHandlers
from core.experts.runtime import ExpertRuntime
from core.formats.wire import decode_rows, encode_rows
from core.shardmap.gossip_view import HoldingView, ProviderView, ReplicationPolicy
from core.shardmap.index import ShardIndex
from core.shardmap.planner import plan_pairs
from core.transport.framing import Reply
from core.transport.pool import QuicPool
from core.transport.quic import PeerRequest, QuicSettings, start_server
from tests.experts.factories import expert_payload, expert_weights

MODEL, D_MODEL, D_FF, N_EXPERTS = "receipts-test", 64, 32, 4
SETTINGS = QuicSettings(max_body=1 << 24)


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Holder:
    """A real holder's moe/execute (runtime, handlers, node key) behind a real QUIC server, which
    misbehaves as `mode` says."""

    def __init__(self, tmp_path, name: str, mode: str) -> None:
        self.identity = load_or_create_identity(tmp_path / name)
        self.mode = mode
        self.port = _free_udp_port()
        self.runtime = ExpertRuntime(data_dir=tmp_path / name / "data", memory_budget_bytes=1 << 26)
        rng = np.random.default_rng(7)
        for e in range(N_EXPERTS):
            self.runtime.expert_load(payload=expert_payload(expert_weights(rng, D_MODEL, D_FF), expert=e,
                                                            model_id=MODEL, quant="q8_0"))
        honest = ReceiptSigner(self.identity.signing_key)
        other = SigningKey(bytes(32))

        def sign(**kwargs):
            if mode == "wrong_tokens":
                kwargs["token_indices"] = [t + 1 for t in kwargs["token_indices"]]
            elif mode == "other_input":
                kwargs["input_carrier"] = b"not what the router sent"
            elif mode == "other_provider":  # a receipt of another provider, honestly signed by it
                return ReceiptSigner(other)(**kwargs)
            wire = honest(**kwargs)
            if mode == "forged_signature":  # this holder's body, another key's signature
                body = {k: v for k, v in wire.items() if k not in ("commitment_hash", "signature")}
                wire["signature"] = other.sign(RECEIPT_DOMAIN + canonical_text(body).encode()).signature.hex()
            return wire

        self.executor = ThreadPoolExecutor(2)
        self.handlers = ExpertHandlers(runtime=self.runtime, executor=self.executor, max_payload_bytes=1 << 24,
                                       sign_receipt=None if mode == "receiptless" else sign)
        self.calls = 0

    async def handle(self, request: PeerRequest) -> Reply:
        self.calls += 1
        result, data = await self.handlers.execute(request.params, request.body, CallContext(door=Door.PEER))
        if self.mode == "altered_rows":  # the receipt is over the honest rows; the rows sent are not
            rows = decode_rows(data, result["encoding"], tokens=result["tokens"], d_model=D_MODEL) * 1.25
            data = encode_rows(rows, result["encoding"])
        return Reply.ok(result, data)

    async def start(self) -> None:
        self.server = await start_server(host="127.0.0.1", port=self.port, cert_path=str(self.identity.cert_path),
                                         key_path=str(self.identity.cert_key_path), handler=self.handle,
                                         settings=SETTINGS)

    def view(self, latency_ms: float) -> ProviderView:
        return ProviderView(self.identity.provider_id, ("ExpertHolder",), None, f"127.0.0.1:{self.port}",
                            self.identity.cert_sha256, False, latency_ms, ("q8_0", "f32"))

    def stop(self) -> None:
        self.executor.shutdown()


MODES = ["altered_rows", "wrong_tokens", "other_provider", "forged_signature", "other_input", "receiptless"]
REASONS = dict.fromkeys(MODES, "bad_receipt") | {"receiptless": "receipt_missing"}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("codec", ["q8_0", "f32"])
def test_a_lying_holder_is_refused_inline_and_the_backup_serves_the_forward(tmp_path, mode, codec) -> None:
    liar, honest = Holder(tmp_path, "liar", mode), Holder(tmp_path, "honest", "honest")
    rng = np.random.default_rng(3)
    n_tokens = 24
    hidden = rng.standard_normal((n_tokens, D_MODEL)).astype(np.float32)
    experts = np.stack([np.arange(n_tokens) % N_EXPERTS, (np.arange(n_tokens) + 1) % N_EXPERTS], axis=1).ravel()
    tokens = np.repeat(np.arange(n_tokens), 2)
    weights = np.tile(np.array([0.7, 0.3], np.float32), n_tokens)

    async def scenario():
        await liar.start()
        await honest.start()
        # The liar answers fastest, so the planner makes it every batch's primary and the honest holder the backup.
        views = [liar.view(0.1), honest.view(50.0)]
        holdings = [HoldingView(v.provider_id, MODEL, 0, e, "Warm", 1000, None, 1000) for v in views
                    for e in range(N_EXPERTS)]
        shard = ShardIndex.build(MODEL, views, holdings, ReplicationPolicy(2, 8, 1e9))

        def plan(t, ly, ex, exclude):
            return plan_pairs(t, ly, ex, shard, exclude=exclude)

        async with httpx.AsyncClient() as http:
            pool = QuicPool(SETTINGS)
            kept: list[str] = []
            caller = HolderCaller(self_id="router", model_id=MODEL, d_model=D_MODEL, run_local=None, pool=pool,
                                  http=lambda: http, codecs=(codec,), codec_executor=ThreadPoolExecutor(2),
                                  max_body=1 << 24, timeout_s=30, receipt_topk=16,
                                  keep_receipt=lambda h: kept.append(h) or True)
            combine = StreamingCombine(n_tokens=n_tokens, d_model=D_MODEL, layer=0, tokens=tokens, experts=experts,
                                       weights=weights, n_routed=N_EXPERTS)
            # no hedge (60 s, past the 30 s timeout): the backup serves because the liar is refused, never
            # because a loaded machine made an answer slow (nor timed it out: 30 s, not 10)
            report = await run_forward(combine, hidden, np.zeros(len(experts), np.int64), plan, caller,
                                       LatencyBook(HedgePolicy(default_s=60.0, floor_s=60.0)), ForwardLimits())
            await pool.close()
        liar.server.close()
        honest.server.close()
        return combine, report, kept

    try:
        combine, report, kept = asyncio.run(scenario())
    finally:
        liar.stop()
        honest.stop()
    out = combine.finish(allow_partial=False).out
    # The reference: each pair through the honest runtime, on the rows as the wire carried them
    wire_in = decode_rows(encode_rows(hidden, codec), codec, tokens=n_tokens, d_model=D_MODEL)
    expected = np.zeros_like(hidden)
    for t, e, w in zip(tokens, experts, weights, strict=True):
        row = honest.runtime.execute(model_id=MODEL, layer=0, expert=int(e), hidden=wire_in[t:t + 1])
        expected[t] += w * decode_rows(encode_rows(row, codec), codec, tokens=1, d_model=D_MODEL)[0]
    np.testing.assert_allclose(out, expected, rtol=0.05 if codec == "q8_0" else 1e-5,
                               atol=0.05 * np.abs(expected).max() if codec == "q8_0" else 1e-6)
    liar_failures = [f for f in report.failures if f.provider == liar.identity.provider_id]
    assert liar.calls >= 1 and liar_failures, "the liar was never asked or never refused"
    assert {f.reason for f in liar_failures} == {REASONS[mode]}
    assert all(f.provider == liar.identity.provider_id for f in report.failures)
    served = report.holders[honest.identity.provider_id]
    assert served.rows == len(experts) and len(served.receipts) == served.batches
    assert [v.receipt.commitment_hash for v in served.receipts] == kept  # only verified receipts are sampled
