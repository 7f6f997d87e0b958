"""The peer door as an outsider sees it: a plain aioquic client written from docs/protocol.md.

No operator token, no pinned certificate, none of the node's own client code: the frame is
packed here from the protocol page. Every operator method must answer `forbidden` and change
nothing; status, execute and blob reads must work; a peer over its limits gets an error while
others are still served.
"""

import asyncio
import base64
import json
import ssl
import stat
import struct
import time

import httpx
import numpy as np
import pytest
from aioquic.asyncio import QuicConnectionProtocol, connect
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import StopSendingReceived, StreamDataReceived
from blake3 import blake3
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from prometheus_client.parser import text_string_to_metric_families

from testkit.nodes import TOKEN
from testkit.secrets import assert_no_secrets
from tests.experts.factories import MODEL, expert_payload, expert_weights, qwen_gate

pytestmark = pytest.mark.e2e
D_MODEL, D_FF = 32, 16
PREFIX = struct.Struct(">2sBBIQ")  # "TZ", version 1, kind, header length, body length (docs/protocol.md)
LIMIT = 1 << 20  # the node's HTTP body limit and peer-door body limit, both set small here


def frame(method: str, params: dict, body: bytes = b"") -> bytes:
    header = json.dumps({"method": method, "params": params}).encode()
    return PREFIX.pack(b"TZ", 1, 1, len(header), len(body)) + header + body


def parse(data: bytes) -> tuple[dict, bytes]:
    magic, version, kind, header_len, body_len = PREFIX.unpack_from(data)
    assert (magic, version, kind) == (b"TZ", 1, 2)
    header = json.loads(data[16:16 + header_len])
    return header, data[16 + header_len:16 + header_len + body_len]


class Outsider(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.streams: dict[int, tuple[bytearray, asyncio.Future]] = {}
        self.stopped: set[int] = set()  # streams the server sent STOP_SENDING for

    def quic_event_received(self, event):
        if isinstance(event, StopSendingReceived):
            self.stopped.add(event.stream_id)
        if isinstance(event, StreamDataReceived) and event.stream_id in self.streams:
            buffer, done = self.streams[event.stream_id]
            buffer += event.data
            if event.end_stream and not done.done():
                done.set_result(bytes(buffer))

    def open(self, data: bytes, *, end: bool = True) -> int:
        stream_id = self._quic.get_next_available_stream_id()
        self.streams[stream_id] = (bytearray(), asyncio.get_running_loop().create_future())
        self._quic.send_stream_data(stream_id, data, end_stream=end)
        self.transmit()
        return stream_id

    async def answer(self, stream_id: int) -> tuple[dict, bytes]:
        return parse(await asyncio.wait_for(self.streams[stream_id][1], 20))

    async def ask(self, method: str, params: dict, body: bytes = b"") -> tuple[dict, bytes]:
        return await self.answer(self.open(frame(method, params, body)))


async def as_outsider(port: int, scenario):
    configuration = QuicConfiguration(is_client=True, alpn_protocols=["tenzro/moe"], verify_mode=ssl.CERT_NONE,
                                      max_datagram_size=1350)
    async with connect("127.0.0.1", port, configuration=configuration, create_protocol=Outsider) as client:
        return await scenario(client)


def q8_0_rows(x: np.ndarray) -> bytes:
    """Q8_0 as docs/protocol.md describes it: per 32 values, f16 scale d = amax/127, then 32 int8
    round(x/d); rows zero-padded to a multiple of 32."""
    tokens, d = x.shape
    padded = np.pad(x, ((0, 0), (0, -d % 32))).reshape(tokens, -1, 32)
    scale = np.abs(padded).max(axis=2) / 127
    q = np.round(np.divide(padded, scale[..., None], out=np.zeros_like(padded), where=scale[..., None] > 0))
    blocks = np.zeros((tokens, padded.shape[1]), dtype=[("d", "<f2"), ("qs", "i1", 32)])
    blocks["d"], blocks["qs"] = scale, q.astype(np.int8)
    return blocks.tobytes()


def q8_0_decode(data: bytes, tokens: int, d: int) -> np.ndarray:
    blocks = np.frombuffer(data, dtype=[("d", "<f2"), ("qs", "i1", 32)]).reshape(tokens, -1)
    return (blocks["d"].astype(np.float32)[..., None] * blocks["qs"]).reshape(tokens, -1)[:, :d]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def sketch_of(rows: np.ndarray, k: int) -> bytes:
    """docs/protocol.md ("Receipts"), per row: the k largest |values| (a full sort, ties to the lower
    index) in ascending index order, as uint32 indices then the f32 values."""
    sketch = bytearray()
    for row in rows.astype("<f4"):
        chosen = sorted(sorted(range(len(row)), key=lambda j: (-abs(float(row[j])), j))[:min(k, len(row))])
        sketch += struct.pack(f"<{len(chosen)}I", *chosen)
        sketch += b"".join(row[j:j + 1].tobytes() for j in chosen)
    return bytes(sketch)


def receipt_verifies(receipt: dict, *, provider_id: str, request_body: bytes, rows: np.ndarray,
                     token_indices: list[int], k: int) -> bool:
    """A second verifier, written from docs/protocol.md ("Receipts") alone: its own top-k (a full
    sort), its own canonical text, and another ed25519 library (cryptography, not pynacl)."""
    sketch = sketch_of(rows, k)
    body = {name: receipt[name] for name in receipt if name not in ("commitment_hash", "signature")}
    if sorted(body) != sorted(["v", "provider_id", "model_id", "layer", "expert", "token_indices", "d_model",
                               "input_encoding", "input_hash", "output_encoding", "k", "sketch_hash"]):
        return False
    if (body["provider_id"], body["token_indices"], body["k"]) != (provider_id, token_indices, k):
        return False
    if body["input_hash"] != blake3(request_body).hexdigest() or body["sketch_hash"] != blake3(sketch).hexdigest():
        return False
    return signed_by(receipt, body, provider_id, b"tenzro/receipt/v1\n")


def signed_by(receipt: dict, body: dict, provider_id: str, domain: bytes) -> bool:
    """The canonical text's hash is the commitment, and the holder signed domain + text."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    if receipt["commitment_hash"] != blake3(text).hexdigest():
        return False
    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(provider_id)).verify(bytes.fromhex(receipt["signature"]),
                                                                           domain + text)
    except InvalidSignature:
        return False
    return True


@pytest.fixture(scope="module")
def node(start_module_node):
    node = start_module_node(env={"TENZRO_PEER_MAX_STREAMS": "3", "TENZRO_PEER_RATE_PER_S": "20",
                                  "TENZRO_PEER_BURST": "40", "TENZRO_RPC_MAX_BYTES": str(LIMIT),
                                  "TENZRO_PEER_MAX_BODY_BYTES": str(LIMIT)})
    yield node
    # Everything this node's processes logged while outsiders abused its doors: no secret in it.
    assert_no_secrets(node.log(), token=TOKEN, data_dir=node.data_dir)


def test_operator_methods_are_forbidden_to_peers_and_change_nothing(node, tmp_path) -> None:
    rng = np.random.default_rng(3)
    weights = expert_weights(rng, D_MODEL, D_FF)
    node.result("tenzro_moeExpertLoad", {"payload": b64(expert_payload(weights, expert=1))}, token=TOKEN)
    gate_payload, _ = qwen_gate(rng, d_model=D_MODEL, n_routed=4, top_k=2, norm=True)
    node.result("tenzro_moeGateLoad", {"payload": b64(gate_payload)}, token=TOKEN)
    on_disk = tmp_path / "expert2.safetensors"
    on_disk.write_bytes(expert_payload(expert_weights(rng, D_MODEL, D_FF), expert=2))
    before = node.result("tenzro_moeExpertStatus", {"live": True})
    hidden = rng.standard_normal((3, D_MODEL)).astype("<f4").tobytes()
    attempts = {
        "moe/expert_load": ({}, expert_payload(expert_weights(rng, D_MODEL, D_FF), expert=3)),
        "moe/gate_load": ({"model_id": MODEL, "layer": 5}, gate_payload),
        "moe/expert_unload": ({"model_id": MODEL, "layer": 0, "expert": 1}, b""),
        "moe/gate_unload": ({"model_id": MODEL, "layer": 0}, b""),
        "moe/expert_status": ({}, b""),
        "moe/route": ({"model_id": MODEL, "layer": 0, "d_model": D_MODEL}, hidden),
        "moe/forward_local": ({"model_id": MODEL, "layer": 0, "d_model": D_MODEL}, hidden),
        "moe/forward": ({"model_id": MODEL, "layer": 0, "d_model": D_MODEL}, hidden),
    }

    async def scenario(client):
        answers = {method: await client.ask(method, params, body) for method, (params, body) in attempts.items()}
        answers["path"] = await client.ask("moe/expert_load", {"path": str(on_disk)})
        return answers

    answers = asyncio.run(as_outsider(node.quic_port, scenario))
    for method, (header, body) in answers.items():
        assert header["ok"] is False and header["error"]["reason"] == "forbidden", (method, header)
        assert body == b""
    after = node.result("tenzro_moeExpertStatus", {"live": True})
    assert after["experts"] == before["experts"] and after["gates"] == before["gates"]
    assert [e["expert"] for e in after["experts"]] == [1]
    calls = node.result("tenzro_workerStatus")["calls"]
    assert calls["peer.forbidden"] >= len(answers)


def test_status_execute_and_blob_reads_work_for_any_peer(node) -> None:
    rng = np.random.default_rng(4)
    weights = expert_weights(rng, D_MODEL, D_FF)
    node.result("tenzro_moeExpertLoad", {"payload": b64(expert_payload(weights, expert=6, layer=1))}, token=TOKEN)
    hidden = rng.standard_normal((5, D_MODEL)).astype("<f4")
    via_rpc = node.result("tenzro_moeExecute", {"model_id": MODEL, "layer": 1, "expert": 6, "d_model": D_MODEL,
                                                "hidden": b64(hidden.tobytes())})
    stored = bytes(range(256)) * 256  # a blob as the store lays it out: blobs/<hh>/<blake3>
    digest = blake3(stored).hexdigest()
    (node.data_dir / "blobs" / digest[:2]).mkdir(parents=True, exist_ok=True)
    (node.data_dir / "blobs" / digest[:2] / digest).write_bytes(stored)

    async def scenario(client):
        status = await client.ask("moe/status", {})
        key = {"model_id": MODEL, "layer": 1, "expert": 6, "d_model": D_MODEL}
        executed = await client.ask("moe/execute", {**key, "token_indices": [3, 4, 5, 6, 9], "receipt_topk": 4},
                                    hidden.tobytes())
        q8 = await client.ask("moe/execute", {**key, "tokens": 5, "encoding": "q8_0"}, q8_0_rows(hidden))
        bad_codec = await client.ask("moe/execute", {**key, "encoding": "bf16"}, hidden.tobytes())
        wrong = await client.ask("moe/execute", key, hidden.tobytes()[:-4])
        nan = await client.ask("moe/execute", key, np.full((1, D_MODEL), np.nan, "<f4").tobytes())
        blob = await client.ask("blob/get", {"hash": digest, "start": 100, "end": 300})
        missing_blob = await client.ask("blob/get", {"hash": "0" * 64})
        whole_blob = await client.ask("blob/get", {"hash": digest})
        return status, executed, wrong, nan, blob, missing_blob, q8, bad_codec, whole_blob

    status, executed, wrong, nan, blob, missing_blob, q8, bad_codec, whole_blob = asyncio.run(
        as_outsider(node.quic_port, scenario))
    assert status[0]["ok"] and status[0]["result"]["provider_id"] == node.result("tenzro_nodeInfo")["provider_id"]
    header, body = executed
    provider_id = status[0]["result"]["provider_id"]
    assert header["ok"] and header["result"].pop("compute_ms") >= 0
    receipt = header["result"].pop("receipt")
    assert header["result"] == {"tokens": 5, "d_model": D_MODEL, "encoding": "f32"}
    assert body == base64.b64decode(via_rpc["output"])
    exact = np.frombuffer(body, "<f4").reshape(5, D_MODEL)
    signed = {"provider_id": provider_id, "request_body": hidden.tobytes(), "token_indices": [3, 4, 5, 6, 9], "k": 4}
    assert receipt_verifies(receipt, rows=exact, **signed)
    tampered = exact.copy()
    tampered[2, int(np.argmax(np.abs(tampered[2])))] *= 1.01
    assert not receipt_verifies(receipt, rows=tampered, **signed)  # rows it did not commit to
    assert not receipt_verifies(receipt, rows=exact, **{**signed, "token_indices": [3, 4, 5, 6, 7]})
    assert not receipt_verifies({**receipt, "layer": 2}, rows=exact, **signed)
    assert q8[0]["result"].pop("compute_ms") >= 0
    q8_receipt = q8[0]["result"].pop("receipt")
    assert q8[0]["result"] == {"tokens": 5, "d_model": D_MODEL, "encoding": "q8_0"}
    assert len(q8[1]) == 5 * 34  # one 34-byte block per row of 32
    decoded = q8_0_decode(q8[1], 5, D_MODEL)
    error = np.linalg.norm(decoded - exact) / np.linalg.norm(exact)
    assert error < 0.05, error
    assert receipt_verifies(q8_receipt, rows=decoded, provider_id=provider_id, request_body=q8_0_rows(hidden),
                            token_indices=list(range(5)), k=16)
    assert bad_codec[0]["error"]["reason"] == "unsupported_encoding"
    assert wrong[0]["error"]["reason"] == "shape_mismatch"
    assert nan[0]["error"]["reason"] == "non_finite_input"
    assert blob[0]["result"] == {"hash": digest, "size": len(stored), "start": 100, "end": 300}
    assert blob[1] == stored[100:300]
    assert missing_blob[0]["error"]["reason"] == "blob_not_found"
    # an answer of 32 KiB or more states the server's congestion window toward us (bytes); a smaller one does not
    assert whole_blob[1] == stored and type(whole_blob[0]["window"]) is int and whole_blob[0]["window"] > 0
    assert "window" not in blob[0] and "window" not in executed[0]


def test_a_peer_over_its_limits_gets_errors_while_others_are_served(node) -> None:
    async def hog(client):
        # Three unfinished requests hold all three stream slots (TENZRO_PEER_MAX_STREAMS=3)...
        held = [client.open(frame("moe/status", {})[:10], end=False) for _ in range(3)]
        await asyncio.sleep(0.2)
        over = await client.ask("moe/status", {})
        # ...while another peer, on its own connection, is served as usual.
        other = await as_outsider(node.quic_port, lambda c: c.ask("moe/status", {}))
        for stream_id in held:  # finish them: each slot is answered and freed
            client._quic.send_stream_data(stream_id, frame("moe/status", {})[10:], end_stream=True)
        client.transmit()
        finished = [await client.answer(s) for s in held]
        # Back-to-back requests past the rate (burst 40, then 20/s) are refused, not queued.
        answers = [await client.ask("moe/status", {}) for _ in range(60)]
        return over, other, finished, answers

    async def run():
        return await as_outsider(node.quic_port, hog)

    over, other, finished, burst = asyncio.run(run())
    assert over[0]["error"]["reason"] == "too_many_streams"
    assert other[0]["ok"] is True
    assert all(answer[0]["ok"] for answer in finished)
    reasons = {a[0]["error"]["reason"] for a in burst if not a[0]["ok"]}
    # ~the burst gets through: the bucket is the host's, so `other`'s request (same host) took a token
    assert reasons == {"rate_limited"} and sum(a[0]["ok"] for a in burst) >= 35
    # the node still serves the JSON-RPC side and new peers
    assert asyncio.run(as_outsider(node.quic_port, lambda c: c.ask("moe/status", {})))[0]["ok"]
    assert node.result("tenzro_workerStatus")["pid"] > 0


def test_malformed_frames_are_answered_and_the_node_stays_up(node) -> None:
    async def scenario(client):
        bad_magic = await client.answer(client.open(b"XX" + frame("moe/status", {})[2:]))
        truncated = await client.answer(client.open(frame("moe/status", {})[:20]))
        not_json = PREFIX.pack(b"TZ", 1, 1, 5, 0) + b"{nope"
        garbled = await client.answer(client.open(not_json))
        huge = await client.answer(client.open(PREFIX.pack(b"TZ", 1, 1, 2, 1 << 40) + b"{}", end=False))
        no_method = await client.ask("", {})
        return bad_magic, truncated, garbled, huge, no_method

    answers = asyncio.run(as_outsider(node.quic_port, scenario))
    assert [a[0]["error"]["reason"] for a in answers] == [
        "bad_magic", "truncated_frame", "bad_frame", "payload_too_large", "method_not_found"]
    assert asyncio.run(as_outsider(node.quic_port, lambda c: c.ask("moe/status", {})))[0]["ok"]


def test_execute_over_the_http_fallback_of_the_peer_door(node) -> None:
    """POST /peer/moe/execute: the same frames as on QUIC, raw bytes both ways, no token."""
    rng = np.random.default_rng(5)
    weights = expert_weights(rng, D_MODEL, D_FF)
    node.result("tenzro_moeExpertLoad", {"payload": b64(expert_payload(weights, expert=7, layer=2))}, token=TOKEN)
    hidden = rng.standard_normal((4, D_MODEL)).astype("<f4")
    key = {"model_id": MODEL, "layer": 2, "expert": 7, "d_model": D_MODEL}
    via_rpc = node.result("tenzro_moeExecute", {**key, "hidden": b64(hidden.tobytes())})
    url = f"{node.url}/peer/moe/execute"
    kind = {"content-type": "application/x-tenzro-frame"}

    answer = httpx.post(url, content=frame("moe/execute", key, hidden.tobytes()), headers=kind)
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/x-tenzro-frame"
    header, body = parse(answer.content)
    assert header["result"].pop("compute_ms") >= 0
    receipt = header["result"].pop("receipt")
    assert header["result"] == {"tokens": 4, "d_model": D_MODEL, "encoding": "f32"}
    assert receipt_verifies(receipt, provider_id=node.result("tenzro_nodeInfo")["provider_id"],
                            request_body=hidden.tobytes(), rows=np.frombuffer(body, "<f4").reshape(4, D_MODEL),
                            token_indices=list(range(4)), k=16)
    assert body == base64.b64decode(via_rpc["output"])

    wrong = httpx.post(url, content=frame("moe/execute", key, hidden.tobytes()[:-4]), headers=kind)
    assert wrong.status_code == 422 and parse(wrong.content)[0]["error"]["reason"] == "shape_mismatch"
    other = httpx.post(url, content=frame("moe/expert_unload", key), headers=kind)
    assert other.status_code == 422 and parse(other.content)[0]["error"]["reason"] == "bad_request"
    as_json = httpx.post(url, json={"params": key})
    assert as_json.status_code == 422 and parse(as_json.content)[0]["error"]["reason"] == "bad_request"
    announced_huge = httpx.post(url, content=PREFIX.pack(b"TZ", 1, 1, 2, 1 << 40) + b"{}", headers=kind)
    assert announced_huge.status_code == 413
    assert parse(announced_huge.content)[0]["error"]["reason"] == "payload_too_large"
    assert node.result("tenzro_workerStatus")["calls"]["peer.calls"] >= 2  # served through the peer door


def test_request_size_limits_on_http_and_quic(node) -> None:
    """Bodies over the limits get a 413 / error frame naming the limit and its setting; the
    stream is stopped, the connection and the node stay up."""
    over = b" " * (LIMIT + 1)  # JSON allows any whitespace: only the size is wrong
    rpc = httpx.post(f"{node.url}/rpc", content=over, headers={"content-type": "application/json"})
    error = rpc.json()["error"]
    assert rpc.status_code == 413 and error["code"] == -32013
    assert error["data"] == {"reason": "payload_too_large", "limit_bytes": LIMIT, "setting": "TENZRO_RPC_MAX_BYTES"}
    assert f"TENZRO_RPC_MAX_BYTES ({LIMIT} bytes)" in error["message"]
    chunked = httpx.post(f"{node.url}/rpc", content=iter([b" " * 65536] * 20))  # no Content-Length
    assert chunked.status_code == 413 and chunked.json()["error"]["data"]["reason"] == "payload_too_large"
    rest = httpx.post(f"{node.url}/api/moe/experts/load", content=over, headers={
        "content-type": "application/json", "authorization": f"Bearer {TOKEN}"})
    assert rest.status_code == 413
    assert rest.json() | {"detail": ""} == {"detail": "", "reason": "payload_too_large", "limit_bytes": LIMIT,
                                            "setting": "TENZRO_RPC_MAX_BYTES"}
    peer = httpx.post(f"{node.url}/peer/moe/execute", content=frame("moe/execute", {}, over),
                      headers={"content-type": "application/x-tenzro-frame"})
    assert peer.status_code == 413 and parse(peer.content)[0]["error"]["reason"] == "payload_too_large"
    assert node.result("tenzro_nodeInfo")["provider_id"]

    async def scenario(client):
        header = json.dumps({"method": "moe/status", "params": {}}).encode()
        sent_over = client.open(PREFIX.pack(b"TZ", 1, 1, len(header), LIMIT + 1) + header + over)
        big_header = client.open(PREFIX.pack(b"TZ", 1, 1, (1 << 20) + 1, 0) + b"{" * 4096, end=False)
        answers = [await client.answer(sent_over), await client.answer(big_header)]
        await asyncio.sleep(0.1)  # the STOP_SENDING frames come with or just after the answers
        same_connection = await client.ask("moe/status", {})
        return answers, same_connection, set(client.stopped), (sent_over, big_header)

    answers, same_connection, stopped, streams = asyncio.run(as_outsider(node.quic_port, scenario))
    body_error, header_error = (a[0]["error"] for a in answers)
    assert body_error["reason"] == header_error["reason"] == "payload_too_large"
    assert body_error["details"] == {"limit_bytes": LIMIT, "setting": "TENZRO_PEER_MAX_BODY_BYTES"}
    assert "TENZRO_PEER_MAX_BODY_BYTES" in body_error["message"]
    assert header_error["details"] == {"limit_bytes": 1 << 20}
    assert streams[1] in stopped  # the unfinished one: the server asked for no more of it
    assert same_connection[0]["ok"]
    assert asyncio.run(as_outsider(node.quic_port, lambda c: c.ask("moe/status", {})))[0]["ok"]


def test_rows_only_the_worker_can_judge_are_refused_with_their_reason(node) -> None:
    """The hostile-input corpus's cases that need a loaded expert and gate (tests/api/test_rpc_fuzz.py
    has the rest): d_model mismatches, NaN and infinite rows, over JSON-RPC; an empty batch is answered."""
    rng = np.random.default_rng(9)
    node.result("tenzro_moeExpertLoad", {"payload": b64(expert_payload(expert_weights(rng, D_MODEL, D_FF),
                                                                       expert=0, layer=3))}, token=TOKEN)
    gate_payload, _ = qwen_gate(rng, d_model=D_MODEL, n_routed=4, top_k=2, norm=True, layer=3)
    node.result("tenzro_moeGateLoad", {"payload": b64(gate_payload)}, token=TOKEN)
    good = rng.standard_normal((2, D_MODEL)).astype("<f4")
    nan, inf = good.copy(), good.copy()
    nan[1, 3], inf[0, 0] = np.nan, -np.inf
    key = {"model_id": MODEL, "layer": 3, "d_model": D_MODEL}
    cases = {
        "rows not whole of d_model": (key, good.tobytes()[:-4], "shape_mismatch"),
        "whole rows of another d_model": ({**key, "d_model": D_MODEL // 2}, good.tobytes(), "shape_mismatch"),
        "NaN row": (key, nan.tobytes(), "non_finite_input"),
        "-inf row": (key, inf.tobytes(), "non_finite_input"),
        "empty batch": (key, b"", None),  # zero rows are whole rows: an empty answer, not an error
    }
    for method in ("tenzro_moeExecute", "tenzro_moeRoute", "tenzro_moeForward"):
        for name, (params, rows, reason) in cases.items():
            extra = {"expert": 0} if method == "tenzro_moeExecute" else {}
            answer = node.rpc(method, {**params, **extra, "hidden": b64(rows)})
            if reason is None:
                assert "result" in answer, (method, name, answer)
                continue
            assert "error" in answer, (method, name, answer)
            error = answer["error"]
            assert (error["code"], error["data"]["reason"]) == (-32602, reason), (method, name, error)
    assert node.result("tenzro_moeExecute", {**key, "expert": 0, "hidden": b64(good.tobytes())})["tokens"] == 2


def test_more_connections_buy_a_peer_no_more_requests(node) -> None:
    """The rate is the peer's (its host's), not each connection's: three connections sending 20
    requests each get about one burst through (40, then 20/s), not three (docs/security.md)."""
    async def scenario():
        configuration = QuicConfiguration(is_client=True, alpn_protocols=["tenzro/moe"], verify_mode=ssl.CERT_NONE,
                                          max_datagram_size=1350)

        async def twenty(client):
            return [await client.ask("moe/status", {}) for _ in range(20)]

        async with connect("127.0.0.1", node.quic_port, configuration=configuration, create_protocol=Outsider) as a, \
                connect("127.0.0.1", node.quic_port, configuration=configuration, create_protocol=Outsider) as b, \
                connect("127.0.0.1", node.quic_port, configuration=configuration, create_protocol=Outsider) as c:
            started = time.monotonic()
            answers = await asyncio.gather(twenty(a), twenty(b), twenty(c))
            return [x for per_connection in answers for x in per_connection], time.monotonic() - started

    answers, elapsed = asyncio.run(scenario())
    admitted = sum(a[0]["ok"] for a in answers)
    assert {a[0]["error"]["reason"] for a in answers if not a[0]["ok"]} == {"rate_limited"}
    # one bucket: at most the burst plus what refilled meanwhile (each connection alone would pass all 20)
    assert admitted <= 40 + 20 * elapsed + 1, (admitted, elapsed)


def test_the_http_peer_door_has_the_same_per_peer_limits(node) -> None:
    async def flood():
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(*(client.post(f"{node.url}/peer/gossip/sync", json={"params": {"digest": {}}})
                                          for _ in range(60)))

    started = time.monotonic()
    answers = asyncio.run(flood())
    elapsed = time.monotonic() - started
    refused = [a for a in answers if a.status_code == 429]
    assert refused and {a.json()["error"]["reason"] for a in refused} == {"rate_limited"}
    assert all(a.status_code in (200, 429) for a in answers)
    assert len(answers) - len(refused) <= 40 + 20 * elapsed + 1
    # both doors' refusals reach /metrics (the QUIC ones counted by the worker, read by the web process)
    metrics = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(httpx.get(f"{node.url}/metrics").text) for s in f.samples}
    assert metrics[("tenzro_peer_refused_total", (("door", "http"), ("reason", "rate_limited")))] >= len(refused)
    assert metrics[("tenzro_peer_refused_total", (("door", "quic"), ("reason", "rate_limited")))] > 0


def test_the_data_dir_is_private_and_every_secret_file_is_0600(node) -> None:
    assert stat.S_IMODE(node.data_dir.stat().st_mode) == 0o700
    secrets = [node.data_dir / name for name in ("node.key", "quic-key.pem", "django.secret", "operator.token")]
    present = [path for path in secrets if path.exists()]
    assert {p.name for p in present} >= {"node.key", "quic-key.pem", "django.secret"}
    for path in present:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path.name


def batches_receipt_verifies(receipt: dict, *, provider_id: str, request_body: bytes, token_indices: list[int],
                             batches: list[tuple[int, list[int], np.ndarray]], k: int) -> bool:
    """A second verifier of multi-expert receipts, from docs/protocol.md ("Multi-expert receipts (v2)")
    alone: each batch's sketch by the v1 rule over its own rows, the v2 body, the v2 domain."""
    entries = [{"expert": expert, "rows": rows, "sketch_hash": blake3(sketch_of(out, k)).hexdigest()}
               for expert, rows, out in batches]
    body = {name: receipt[name] for name in receipt if name not in ("commitment_hash", "signature")}
    want = {"v": 2, "provider_id": provider_id, "token_indices": token_indices, "k": k, "batches": entries,
            "input_hash": blake3(request_body).hexdigest()}
    if any(body.get(name) != value for name, value in want.items()) or len(body) != 11:
        return False
    return signed_by(receipt, body, provider_id, b"tenzro/receipt/v2\n")


def test_a_multi_expert_execute_as_an_outsider_sends_it_honest_and_hostile(node) -> None:
    """docs/protocol.md, "Multi-expert execute": one frame for two experts answers what two single
    frames answer, under one receipt this test verifies itself; every malformed frame is refused
    whole with its reason, and the holder serves on."""
    rng = np.random.default_rng(12)
    for expert in (0, 2):
        node.result("tenzro_moeExpertLoad", {"payload": b64(expert_payload(expert_weights(rng, D_MODEL, D_FF),
                                                                           expert=expert, layer=4))}, token=TOKEN)
    carrier = rng.standard_normal((4, D_MODEL)).astype("<f4")
    base = {"model_id": MODEL, "layer": 4, "d_model": D_MODEL, "token_indices": [5, 6, 8, 13], "receipt_topk": 6}
    batches = [{"expert": 2, "rows": [0, 3]}, {"expert": 0, "rows": [1, 2, 3]}]
    hostile = {
        "an expert twice": ({**base, "batches": [*batches, {"expert": 2, "rows": [1]}]}, carrier, "duplicate_expert"),
        "an expert not held": ({**base, "batches": [*batches, {"expert": 9, "rows": [1]}]}, carrier,
                               "expert_not_loaded"),
        "a row past the carrier": ({**base, "batches": [{"expert": 0, "rows": [1, 4]}]}, carrier, "invalid_input"),
        "rows out of order": ({**base, "batches": [{"expert": 0, "rows": [3, 1]}]}, carrier, "invalid_input"),
        "batches not a list": ({**base, "batches": "all"}, carrier, "invalid_input"),
        "both forms": ({**base, "expert": 0, "batches": batches}, carrier, "invalid_input"),
        "rows that are not whole": ({**base, "batches": batches}, carrier.tobytes()[:-4], "shape_mismatch"),
    }

    async def scenario(client):
        multi = await client.ask("moe/execute", {**base, "batches": batches}, carrier.tobytes())
        singles = [await client.ask("moe/execute", {"model_id": MODEL, "layer": 4, "d_model": D_MODEL,
                                                    "expert": b["expert"]}, carrier[b["rows"]].tobytes())
                   for b in batches]
        refused = {}
        for name, (params, rows, _) in hostile.items():
            refused[name] = await client.ask("moe/execute", params, rows if isinstance(rows, bytes) else rows.tobytes())
        after = await client.ask("moe/execute", {**base, "batches": batches[:1]}, carrier.tobytes())
        return multi, singles, refused, after

    (header, body), singles, refused, after = asyncio.run(as_outsider(node.quic_port, scenario))
    assert header["ok"], header
    result = header["result"]
    assert [(b["expert"], b["tokens"]) for b in result["batches"]] == [(2, 2), (0, 3)]
    assert body == singles[0][1] + singles[1][1]  # the same rows, bit for bit, batch after batch
    provider_id = node.result("tenzro_nodeInfo")["provider_id"]
    outs = [np.frombuffer(singles[0][1], "<f4").reshape(2, D_MODEL),
            np.frombuffer(singles[1][1], "<f4").reshape(3, D_MODEL)]
    signed = {"provider_id": provider_id, "request_body": carrier.tobytes(), "token_indices": [5, 6, 8, 13], "k": 6}
    listed = [(2, [0, 3], outs[0]), (0, [1, 2, 3], outs[1])]
    assert batches_receipt_verifies(result["receipt"], batches=listed, **signed)
    tampered = outs[1].copy()
    tampered[0, int(np.argmax(np.abs(tampered[0])))] *= 1.01
    assert not batches_receipt_verifies(result["receipt"], batches=[listed[0], (0, [1, 2, 3], tampered)], **signed)
    for name, (_, _, reason) in hostile.items():
        error = refused[name][0]["error"]
        assert error["reason"] == reason and refused[name][1] == b"", (name, error)
    assert refused["an expert not held"][0]["error"]["details"] == {"experts": [9]}
    assert after[0]["ok"] and after[0]["result"]["batches"] == [{"expert": 2, "tokens": 2,
                                                                 "compute_ms": after[0]["result"]["batches"][0][
                                                                     "compute_ms"]}]
