"""`receipt/verify` as an outsider sees it: a client written from docs/protocol.md ("Disputes by another
holder") alone, with its own ed25519 key, its own canonical text and another ed25519 library.

The outsider plays a holder that signs what it computed, honest or not, and hands the kept batch to
the node, which holds the same expert from the same blob: an honest batch gets a verdict that
dismisses, a lie one that upholds, both signed by the node and checked here; evidence that does
not bind, an expert the node does not hold from that blob and a peer past its rate are refused
with their reasons, over QUIC and over the HTTP fallback, without the operator token.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest
from blake3 import blake3
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from testkit.nodes import TOKEN
from tests.e2e.test_peer_door import D_FF, D_MODEL, as_outsider, frame, parse, sketch_of
from tests.experts.factories import MODEL, expert_payload, expert_weights

pytestmark = pytest.mark.e2e
RATE = 8  # re-executions a minute for one peer


def canonical(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def signed_receipt(key: Ed25519PrivateKey, *, carrier: bytes, rows: np.ndarray, k: int) -> dict:
    """A v1 receipt over `rows` (docs/protocol.md, "Receipts"), signed by `key`."""
    body = {"v": 1, "provider_id": key.public_key().public_bytes_raw().hex(), "model_id": MODEL, "layer": 4,
            "expert": 3, "token_indices": list(range(len(rows))), "d_model": D_MODEL, "input_encoding": "f32",
            "input_hash": blake3(carrier).hexdigest(), "output_encoding": "f32", "k": k,
            "sketch_hash": blake3(sketch_of(rows, k)).hexdigest()}
    text = canonical(body)
    return {**body, "commitment_hash": blake3(text).hexdigest(),
            "signature": key.sign(b"tenzro/receipt/v1\n" + text).hex()}


def verdict_holds(verdict: dict, row: bytes, *, verifier_id: str, receipt: dict) -> bool:
    body = {name: value for name, value in verdict.items() if name != "signature"}
    assert sorted(body) == sorted(["v", "verifier_id", "provider_id", "commitment", "model_id", "layer", "expert",
                                   "blob_uri", "upheld", "difference_ppm", "tolerance_ppm", "worst_row",
                                   "worst_row_hash"])
    assert (body["verifier_id"], body["provider_id"], body["commitment"]) == (
        verifier_id, receipt["provider_id"], receipt["commitment_hash"])
    assert body["worst_row_hash"] == blake3(row).hexdigest() and len(row) == 4 * D_MODEL
    Ed25519PublicKey.from_public_bytes(bytes.fromhex(verifier_id)).verify(
        bytes.fromhex(verdict["signature"]), b"tenzro/verdict/v1\n" + canonical(body))  # raises if not
    return True


@pytest.fixture(scope="module")
def node(start_module_node):
    return start_module_node(env={"TENZRO_VERIFY_RATE_PER_MIN": str(RATE)})


def test_receipt_verify_as_an_outsider_honest_lying_and_hostile(node) -> None:
    rng = np.random.default_rng(11)
    payload = expert_payload(expert_weights(rng, D_MODEL, D_FF), expert=3, layer=4)
    digest = blake3(payload).hexdigest()
    (node.data_dir / "blobs" / digest[:2]).mkdir(parents=True, exist_ok=True)  # the store's layout
    (node.data_dir / "blobs" / digest[:2] / digest).write_bytes(payload)
    uri = f"tenzro://blob/{digest}"
    node.result("tenzro_moeExpertLoad", {"blob_uri": uri}, token=TOKEN)  # the operator's set-up, nothing more
    hidden = rng.standard_normal((4, D_MODEL)).astype("<f4")
    carrier, key, k = hidden.tobytes(), Ed25519PrivateKey.generate(), 6

    async def scenario(client):
        status = await client.ask("moe/status", {})
        computed = await client.ask("moe/execute", {"model_id": MODEL, "layer": 4, "expert": 3, "d_model": D_MODEL},
                                    carrier)
        honest_rows = np.frombuffer(computed[1], "<f4").reshape(4, D_MODEL)
        honest = signed_receipt(key, carrier=carrier, rows=honest_rows, k=k)
        lie_rows = honest_rows * np.float32(1.25)
        lie = signed_receipt(key, carrier=carrier, rows=lie_rows, k=k)

        async def verify(receipt, body, *, batch=None, blob=uri):
            return await client.ask("receipt/verify", {"receipt": receipt, "batch": batch, "blob_uri": blob}, body)

        answers = {
            "honest": await verify(honest, carrier + sketch_of(honest_rows, k)),
            "lie": await verify(lie, carrier + sketch_of(lie_rows, k)),
            "tampered carrier": await verify(honest, carrier[:-1] + b"\x01" + sketch_of(honest_rows, k)),
            "forged signature": await verify({**honest, "signature": key.sign(b"other").hex()},
                                             carrier + sketch_of(honest_rows, k)),
            "another blob": await verify(honest, carrier + sketch_of(honest_rows, k), blob="tenzro://blob/" + "0" * 64),
            "a batch of a v1 receipt": await verify(honest, carrier + sketch_of(honest_rows, k), batch=0),
        }
        return status[0]["result"]["provider_id"], honest, lie, honest_rows, answers

    verifier_id, honest, lie, honest_rows, answers = asyncio.run(as_outsider(node.quic_port, scenario))
    header, row = answers["honest"]
    assert header["ok"] and header["result"]["verdict"]["upheld"] is False, header
    assert verdict_holds(header["result"]["verdict"], row, verifier_id=verifier_id, receipt=honest)
    header, row = answers["lie"]
    assert header["ok"] and header["result"]["verdict"]["upheld"] is True, header
    assert verdict_holds(header["result"]["verdict"], row, verifier_id=verifier_id, receipt=lie)
    verdict = header["result"]["verdict"]
    assert verdict["difference_ppm"] > verdict["tolerance_ppm"] and "differs" in header["result"]["detail"]
    for name, reason in (("tampered carrier", "bad_receipt"), ("forged signature", "bad_receipt"),
                         ("another blob", "expert_not_held"), ("a batch of a v1 receipt", "bad_receipt")):
        error = answers[name][0]["error"]
        assert error["reason"] == reason and answers[name][1] == b"", (name, error)

    # The HTTP fallback of the peer door, as curl would send it: the same frame, no token.
    http = httpx.post(f"{node.url}/peer/receipt/verify", headers={"content-type": "application/x-tenzro-frame"},
                      content=frame("receipt/verify", {"receipt": honest, "batch": None, "blob_uri": uri},
                                    carrier + sketch_of(honest_rows, k)))
    assert http.status_code == 200, http.text
    answered, row = parse(http.content)
    assert verdict_holds(answered["result"]["verdict"], row, verifier_id=verifier_id, receipt=honest)

    async def flood(client):  # this peer has used 7 of its 8 a minute: within a few more, refused
        return [await client.ask("receipt/verify", {"receipt": honest, "batch": None, "blob_uri": uri},
                                 carrier + sketch_of(honest_rows, k)) for _ in range(4)]

    refused = [h["error"] for h, _ in asyncio.run(as_outsider(node.quic_port, flood)) if not h["ok"]]
    assert refused and refused[0]["reason"] == "rate_limited", refused
    assert "TENZRO_VERIFY_RATE_PER_MIN" in refused[0]["message"]
    assert node.result("tenzro_workerStatus")["pid"]  # the node stays up
