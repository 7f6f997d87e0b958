"""A holder whose QUIC certificate is not the one its signed record pins is refused, counted and penalized.

A real QUIC server presents an impostor's certificate on the port a holder's record advertises;
the router's real caller (HolderCaller over the QuicPool) must refuse the connection before
sending anything, fail over to the other holder, and the failure must become a penalty row and
a reputation penalty.
"""

import asyncio
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from apps.forward.callers import HolderCaller
from apps.forward.combine import StreamingCombine
from apps.forward.engine import ForwardLimits, run_forward
from apps.forward.hedging import LatencyBook
from apps.forward.models import HolderPenalty
from apps.forward.services import forward_outcome_record
from apps.node.identity import load_or_create_identity
from apps.reputation.selectors import reputation_scores
from core.shardmap.gossip_view import ProviderView
from core.shardmap.index import ShardIndex
from core.shardmap.planner import plan_pairs
from core.transport.framing import Reply
from core.transport.pool import QuicPool
from core.transport.quic import QuicSettings, start_server
from testkit.shard_views import MODEL, POLICY, holding, provider_id
from tests.transport.test_quic import _free_udp_port

pytestmark = pytest.mark.django_db

D, N_EXPERTS, TOKENS = 4, 2, 6
ROUTER = provider_id(2)  # the router is also the backup holder: its batches run locally


def test_a_holder_presenting_another_certificate_is_refused_and_penalized(tmp_path) -> None:
    pinned = load_or_create_identity(tmp_path / "holder")  # the certificate the holder's record pins
    impostor = load_or_create_identity(tmp_path / "impostor")  # the one answering on its port
    assert pinned.cert_sha256 != impostor.cert_sha256
    port = _free_udp_port()
    holder = ProviderView(provider_id=provider_id(1), roles=("ExpertHolder",), http_endpoint=None,
                          quic_endpoint=f"127.0.0.1:{port}", quic_cert_sha256=pinned.cert_sha256, moe_gpu=False)
    router = ProviderView(provider_id=ROUTER, roles=("Router", "ExpertHolder"), http_endpoint=None,
                          quic_endpoint=None, quic_cert_sha256=None, moe_gpu=False)
    # The holder ranks first for every expert (more committed tps), so every batch dials it first.
    shard = ShardIndex.build(MODEL, [holder, router], [holding(n, 0, e, tps=1000 - n) for e in range(N_EXPERTS)
                                                       for n in (1, 2)], POLICY)
    served: list[str] = []

    async def impostor_handler(request):
        served.append(request.method)
        return Reply.error("internal_error", "an impostor must never be asked anything")

    async def run_local(layer, expert, rows):
        return rows * np.float32(expert + 1)

    rng = np.random.default_rng(0)
    hidden = rng.standard_normal((TOKENS, D)).astype(np.float32)
    experts = np.stack([rng.permutation(N_EXPERTS) for _ in range(TOKENS)])
    weights = np.full((TOKENS, N_EXPERTS), 1.0 / N_EXPERTS, np.float32)
    tokens = np.repeat(np.arange(TOKENS), N_EXPERTS)
    combine = StreamingCombine(n_tokens=TOKENS, d_model=D, layer=0, tokens=tokens, experts=experts.ravel(),
                               weights=weights.ravel(), n_routed=N_EXPERTS)

    def plan(t, layer, e, exclude):
        return plan_pairs(t, layer, e, shard, exclude=exclude, min_batch_rows=1 << 20)

    async def scenario():
        settings = QuicSettings(max_body=1 << 20)
        server = await start_server(host="127.0.0.1", port=port, cert_path=str(impostor.cert_path),
                                    key_path=str(impostor.cert_key_path), handler=impostor_handler,
                                    settings=settings)
        pool = QuicPool(settings)
        try:
            with ThreadPoolExecutor(1) as codecs:
                async with httpx.AsyncClient() as http:
                    caller = HolderCaller(self_id=ROUTER, model_id=MODEL, d_model=D, run_local=run_local, pool=pool,
                                          http=lambda: http, codecs=("f32",), codec_executor=codecs, max_body=1 << 20,
                                          timeout_s=5, receipt_topk=4, keep_receipt=lambda _: False)
                    return await run_forward(combine, hidden, np.zeros(len(tokens), np.int64), plan, caller,
                                             LatencyBook(), ForwardLimits(attempt_timeout_s=5))
        finally:
            await pool.close()
            server.close()

    report = asyncio.run(scenario())
    expected = (hidden[:, None, :] * (experts[:, :, None] + 1) * weights[:, :, None]).sum(axis=1)
    np.testing.assert_allclose(combine.finish(allow_partial=False).out, expected, rtol=1e-6)
    assert served == []  # refused during the handshake: not one request frame reached the impostor
    assert report.failures and {(f.provider, f.reason) for f in report.failures} == {
        (holder.provider_id, "certificate_pin_mismatch")}
    assert holder.provider_id in report.failed_providers

    forward_outcome_record(model_id=MODEL, failures=report.failures, latencies_ms={}, self_id=ROUTER)
    rows = HolderPenalty.objects.filter(provider_id=holder.provider_id)
    assert set(rows.values_list("reason", flat=True)) == {"certificate_pin_mismatch"}
    assert rows.count() == len(report.failures)
    assert reputation_scores()[holder.provider_id] < 0
