"""One request per holder per layer step: the router gathers a holder's batches into one multi-expert
moe/execute, over real QUIC endpoints on loopback. The forward equals the one made of single-expert
requests (each expert's rows are bit for bit the same, tests/worker/test_expert_methods.py; the
combine adds them in arrival order, so the sums may differ in the last bit); a holder that lies
about one expert of the frame is refused and its batches fail over; holders on the old frame and
on the new serve one forward together."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from apps.forward.callers import HolderCaller
from apps.forward.combine import StreamingCombine
from apps.forward.engine import ForwardLimits, run_forward
from apps.forward.hedging import HedgePolicy, LatencyBook
from apps.forward.report import ForwardReport
from apps.node.identity import load_or_create_identity
from apps.receipts.commitment import ReceiptSigner, batch_commitment
from apps.worker.doors import CallContext, Door
from apps.worker.expert_methods import ExpertHandlers
from core.experts.runtime import ExpertRuntime
from core.formats.wire import decode_rows, encode_rows
from core.shardmap.gossip_view import HoldingView, ProviderView, ReplicationPolicy
from core.shardmap.index import ShardIndex
from core.shardmap.planner import plan_pairs
from core.transport.framing import Reply
from core.transport.pool import QuicPool
from core.transport.quic import PeerRequest, start_server
from tests.experts.factories import expert_payload, expert_weights
from tests.receipts.test_inline import SETTINGS, _free_udp_port

MODEL, D_MODEL, D_FF, N_EXPERTS, TOP_K = "batches-test", 64, 32, 6, 3


class LyingSigner:
    """The holder's own signer, except that a multi-expert answer's expert `lie_about` is committed
    as the honest rows while the rows sent for it are scaled (Holder.handle does the scaling)."""

    def __init__(self, signer: ReceiptSigner) -> None:
        self._signer = signer

    def __call__(self, **kwargs):
        return self._signer(**kwargs)

    def batches(self, **kwargs):
        return self._signer.batches(**kwargs)


class Holder:
    """A real holder (runtime, moe/execute handlers, node key) behind a real QUIC server; it counts
    requests and the experts in them. `batches`: it takes the multi-expert frame (else it is a node
    from before it); `lie_about`: an expert whose rows it scales after signing."""

    def __init__(self, tmp_path, name: str, *, batches: bool = True, lie_about: int | None = None) -> None:
        self.identity = load_or_create_identity(tmp_path / name)
        self.port = _free_udp_port()
        self.batches, self.lie_about = batches, lie_about
        self.runtime = ExpertRuntime(data_dir=tmp_path / name / "data", memory_budget_bytes=1 << 26)
        rng = np.random.default_rng(11)  # every holder the same weights: any of them may serve any batch
        for e in range(N_EXPERTS):
            self.runtime.expert_load(payload=expert_payload(expert_weights(rng, D_MODEL, D_FF), expert=e,
                                                            model_id=MODEL, quant="q8_0"))
        self.executor = ThreadPoolExecutor(2)
        self.handlers = ExpertHandlers(runtime=self.runtime, executor=self.executor, max_payload_bytes=1 << 24,
                                       sign_receipt=ReceiptSigner(self.identity.signing_key),
                                       accept_batches=batches)
        self.requests: list[list[int]] = []  # the experts of each request, in order

    async def handle(self, request: PeerRequest) -> Reply:
        params = request.params
        self.requests.append([b["expert"] for b in params["batches"]] if "batches" in params else [params["expert"]])
        try:
            result, data = await self.handlers.execute(params, request.body, CallContext(door=Door.PEER))
        except Exception as exc:  # an old node's refusal of a frame it does not know travels back as an error
            return Reply.error(getattr(exc, "reason", "internal_error"), getattr(exc, "message", str(exc)))
        if self.lie_about is not None and "batches" in result:
            data = self._scaled(result, bytes(data))
        return Reply.ok(result, data)

    def _scaled(self, result: dict, data: bytes) -> bytes:
        codec, parts, offset = result["encoding"], [], 0
        row_bytes = len(encode_rows(np.zeros((1, D_MODEL), np.float32), codec))
        for batch in result["batches"]:
            part = data[offset: offset + batch["tokens"] * row_bytes]
            offset += len(part)
            if batch["expert"] == self.lie_about:
                rows = decode_rows(part, codec, tokens=batch["tokens"], d_model=D_MODEL) * np.float32(1.25)
                part = encode_rows(rows, codec)
            parts.append(part)
        return b"".join(parts)

    async def start(self) -> None:
        self.server = await start_server(host="127.0.0.1", port=self.port, cert_path=str(self.identity.cert_path),
                                         key_path=str(self.identity.cert_key_path), handler=self.handle,
                                         settings=SETTINGS)

    def view(self, latency_ms: float) -> ProviderView:
        return ProviderView(self.identity.provider_id, ("ExpertHolder",), None, f"127.0.0.1:{self.port}",
                            self.identity.cert_sha256, False, latency_ms, ("q8_0", "f32"),
                            execute_batches=self.batches)


def _routing(n_tokens: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    hidden = rng.standard_normal((n_tokens, D_MODEL)).astype(np.float32)
    experts = np.stack([rng.permutation(N_EXPERTS)[:TOP_K] for _ in range(n_tokens)]).ravel()
    tokens = np.repeat(np.arange(n_tokens), TOP_K)
    weights = rng.random(n_tokens * TOP_K).astype(np.float32)
    return hidden, tokens, experts, weights


def _forward(holders: list[Holder], latencies: list[float], *, codec: str, gather: bool, n_tokens: int = 10,
             only: dict[int, list[int]] | None = None) -> tuple[np.ndarray, ForwardReport, list[str]]:
    """One layer forward over `holders`; `only` {holder index: experts} limits what each holds in the view."""
    hidden, tokens, experts, weights = _routing(n_tokens)

    async def scenario():
        for h in holders:
            await h.start()
        views = [h.view(ms) for h, ms in zip(holders, latencies, strict=True)]
        holdings = [HoldingView(v.provider_id, MODEL, 0, e, "Warm", 1000, None, 1000) for i, v in enumerate(views)
                    for e in (only or {}).get(i, range(N_EXPERTS))]
        shard = ShardIndex.build(MODEL, views, holdings, ReplicationPolicy(1, 8, 1e9))

        def plan(t, ly, ex, exclude):
            return plan_pairs(t, ly, ex, shard, exclude=exclude)

        kept: list[str] = []
        made: list[httpx.AsyncClient] = []  # every holder has a pinned QUIC door: no HTTP client is ever asked for
        async with httpx.AsyncClient() as http:
            pool = QuicPool(SETTINGS)
            caller = HolderCaller(self_id="router", model_id=MODEL, d_model=D_MODEL, run_local=None, pool=pool,
                                  http=lambda: made.append(http) or http, codecs=(codec,),
                                  codec_executor=ThreadPoolExecutor(2),
                                  max_body=1 << 24, timeout_s=10, receipt_topk=16,
                                  keep_receipt=lambda h: kept.append(h) or True, gather_batches=gather)
            combine = StreamingCombine(n_tokens=n_tokens, d_model=D_MODEL, layer=0, tokens=tokens, experts=experts,
                                       weights=weights, n_routed=N_EXPERTS)
            report = await run_forward(combine, hidden, np.zeros(len(experts), np.int64), plan, caller,
                                       LatencyBook(HedgePolicy(default_s=5.0, floor_s=5.0)), ForwardLimits())
            await pool.close()
        for h in holders:
            h.server.close()
        assert made == []
        return combine.finish(allow_partial=False).out, report, kept

    try:
        return asyncio.run(scenario())
    finally:
        for h in holders:
            h.executor.shutdown()


@pytest.mark.parametrize("codec", ["q8_0", "f32"])
def test_one_request_per_holder_serves_the_forward_the_single_expert_requests_serve(tmp_path, codec) -> None:
    gathered = [Holder(tmp_path, "a"), Holder(tmp_path, "b")]
    one_each = [Holder(tmp_path, "c"), Holder(tmp_path, "d")]
    only = {0: [0, 1, 2], 1: [3, 4, 5]}  # each holder is the only one of its three experts
    out, report, kept = _forward(gathered, [1.0, 1.0], codec=codec, gather=True, only=only)
    ref, ref_report, _ = _forward(one_each, [1.0, 1.0], codec=codec, gather=False, only=only)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)  # the same rows, added in another order
    # one request per holder, carrying every expert it serves; the single form sends one per expert
    assert sorted(len(h.requests) for h in gathered) == [1, 1]
    assert [sorted(h.requests[0]) for h in gathered] == [[0, 1, 2], [3, 4, 5]]
    assert sorted(len(h.requests) for h in one_each) == [3, 3]
    # every batch still has its own verified commitment, sampled on its own and bound to the one receipt
    served = [v for s in report.holders.values() for v in s.receipts]
    assert len(served) == report.batches == ref_report.batches == N_EXPERTS
    assert sorted(kept) == sorted(v.commitment for v in served)
    for v in served:
        assert v.batch is not None and v.commitment == batch_commitment(v.receipt.commitment_hash, v.batch)
        assert v.receipt.body["batches"][v.batch]["expert"] == v.expert


def test_a_holder_that_lies_about_one_expert_is_refused_and_its_batches_fail_over(tmp_path) -> None:
    liar, honest = Holder(tmp_path, "liar", lie_about=4), Holder(tmp_path, "honest")
    out, report, _ = _forward([liar, honest], [0.1, 50.0], codec="f32", gather=True)
    ref, _, _ = _forward([Holder(tmp_path, "ref")], [1.0], codec="f32", gather=False)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)
    failed = {(f.provider, f.reason) for f in report.failures}
    assert failed == {(liar.identity.provider_id, "bad_receipt")}
    # the whole frame failed (one signature covers it), so every batch it carried went to the backup
    assert len(liar.requests) == 1 and len(honest.requests) == 1
    assert sorted(liar.requests[0]) == sorted(honest.requests[0])


def test_holders_on_the_old_frame_and_the_new_serve_one_forward(tmp_path) -> None:
    new, old = Holder(tmp_path, "new"), Holder(tmp_path, "old", batches=False)
    only = {0: [0, 1, 2], 1: [3, 4, 5]}
    out, report, _ = _forward([new, old], [1.0, 1.0], codec="q8_0", gather=True, only=only)
    ref, _, _ = _forward([Holder(tmp_path, "r1"), Holder(tmp_path, "r2")], [1.0, 1.0], codec="q8_0",
                         gather=False, only=only)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)
    assert not report.failures
    assert len(new.requests) == 1 and sorted(len(r) for r in old.requests) == [1, 1, 1]
    versions = {v.receipt.body["v"] for s in report.holders.values() for v in s.receipts}
    assert versions == {1, 2}


def test_an_old_node_refuses_the_multi_expert_frame_it_does_not_know(tmp_path) -> None:
    """What a router that ignored the record would meet: an old holder reads `expert` and finds none."""
    old = Holder(tmp_path, "old", batches=False)
    body = encode_rows(np.ones((2, D_MODEL), np.float32), "f32")
    params = {"model_id": MODEL, "layer": 0, "d_model": D_MODEL, "tokens": 2, "encoding": "f32",
              "batches": [{"expert": 0, "rows": [0, 1]}]}
    reply = asyncio.run(old.handle(PeerRequest(method="moe/execute", params=params, body=body, peer=("x", 1))))
    old.executor.shutdown()
    assert reply.header["error"]["reason"] == "invalid_input" and "'expert'" in reply.header["error"]["message"]


@pytest.mark.parametrize("seed", range(6))
def test_the_carrier_holds_each_token_once_and_every_batch_finds_its_rows_in_it(seed) -> None:
    """A decode step's batches share one token (one batch's rows are the carrier); a prefill's hold
    overlapping subsets (no batch holds them all); either way each batch's positions give back its rows."""
    from apps.forward.callers import _carrier

    rng = np.random.default_rng(seed)
    hidden = rng.standard_normal((12, D_MODEL)).astype(np.float32)
    if seed == 0:
        token_sets = [np.array([3])] * 8
    else:
        token_sets = [np.flatnonzero(rng.random(12) < 0.4) for _ in range(int(rng.integers(1, 6)))]
        token_sets = [t if len(t) else np.array([int(rng.integers(12))]) for t in token_sets]
    calls = [(e, hidden[t], t.astype(np.int64)) for e, t in enumerate(token_sets)]
    carrier, tokens, positions = _carrier(calls)
    union = sorted(set(np.concatenate(token_sets).tolist()))
    assert tokens == union and all(type(t) is int for t in tokens)
    assert np.array_equal(carrier, hidden[union])
    for (_, rows, _), where in zip(calls, positions, strict=True):
        assert np.array_equal(carrier[where], rows)
