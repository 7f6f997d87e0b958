"""Real signed provider records for tests, the gossip simulation and the benchmarks."""

from __future__ import annotations

import random

from nacl.signing import SigningKey

from apps.providers.records import Holding, ProviderRecord, SignedRecord, sign_heartbeat, sign_record


def new_key(seed: int) -> SigningKey:
    return SigningKey(random.Random(seed).randbytes(32))


def holdings(n: int, *, model_id: str = "qwen3-30b-a3b", seed: int = 0, tps: int = 800) -> tuple[Holding, ...]:
    rng = random.Random(seed)
    keys = rng.sample([(layer, expert) for layer in range(48) for expert in range(128)], n)
    return tuple(Holding(model_id, layer, expert, rng.choice(("Warm", "Cold")), tps,
                         "tenzro://blob/" + rng.randbytes(32).hex()) for layer, expert in sorted(keys))


def signed_record(key: SigningKey, *, seq: int = 1, at_ms: int = 1_000_000, n_holdings: int = 4,
                  port: int = 4433, **fields) -> SignedRecord:
    pid = key.verify_key.encode().hex()
    record = ProviderRecord(
        provider_id=pid, seq=seq, issued_at_ms=at_ms, roles=fields.pop("roles", ("ExpertHolder", "Router")),
        http_endpoint=fields.pop("http_endpoint", f"http://127.0.0.1:{port - 4433 + 8000}"),
        quic_endpoint=fields.pop("quic_endpoint", f"127.0.0.1:{port}"),
        quic_cert_sha256=fields.pop("quic_cert_sha256", "ab" * 32), moe_gpu=fields.pop("moe_gpu", False),
        price_per_input_token=fields.pop("price_per_input_token", "0.000002"),
        holdings=fields.pop("holdings", None) or holdings(n_holdings, seed=seq),
        activation_codecs=fields.pop("activation_codecs", ("q8_0", "f32")),
    )
    assert not fields, fields
    return sign_record(record, key)


def heartbeat(key: SigningKey, *, seq: int, at_ms: int):
    return sign_heartbeat(provider_id=key.verify_key.encode().hex(), seq=seq, at_ms=at_ms, key=key)
