"""Rows of bench/transport_quic.py through a real node: QUIC peer door against the HTTP door.

The node holds one dense f32 expert of Qwen3-30B-A3B's shape (bench/transport.py's), and the
same rows go through each door; the expert's compute, timed in this process, is subtracted
so what remains is each door's own cost. The HTTP door is `POST /peer/moe/execute` with a TZ
request frame (application/x-tenzro-frame) where the node serves it; a node without that
route is measured through JSON-RPC `tenzro_moeExecute` (base64 rows) and the table says so.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from apps.experts.runtime import ExpertRuntime
from apps.transport.framing import FrameDecoder, request_frame
from apps.transport.pool import QuicPool
from apps.transport.quic import QuicSettings
from testkit.nodes import TOKEN, NodeProcess

from ._quic_echo import SIZES, median_ms
from .transport import D_MODEL, MODEL, expert_payload, time_rpc

FRAME_TYPE = "application/x-tenzro-frame"
REDIS_DB = 13


def _params(tokens: int) -> dict[str, Any]:
    return {"model_id": MODEL, "layer": 0, "expert": 0, "tokens": tokens, "d_model": D_MODEL}


def _http_frame(client: httpx.Client, node: NodeProcess, frame: bytes) -> tuple[float, dict[str, Any], bytes]:
    start = time.perf_counter()
    answer = client.post(f"{node.url}/peer/moe/execute", content=frame, headers={"Content-Type": FRAME_TYPE})
    elapsed = time.perf_counter() - start
    if answer.headers.get("content-type", "").split(";")[0] != FRAME_TYPE:
        return elapsed, {"ok": False, "status": answer.status_code}, b""
    frames = FrameDecoder(max_body=1 << 30).feed(answer.content)
    return elapsed, frames[0].header, bytes(frames[0].body)


def _http_frame_served(client: httpx.Client, node: NodeProcess, raw: bytes, tokens: int) -> bool:
    _, header, body = _http_frame(client, node, request_frame("moe/execute", _params(tokens), raw))
    return bool(header.get("ok")) and len(body) == len(raw)


async def _time_quic(node: NodeProcess, library: str, pin: str, raw: bytes, tokens: int, repeats: int) -> list[float]:
    pool = QuicPool(QuicSettings(max_body=64 << 20, library=library))
    samples = []
    try:
        for i in range(repeats + 1):
            start = time.perf_counter()
            _, out = await pool.call(host="127.0.0.1", port=node.quic_port, pin_sha256=pin, method="moe/execute",
                                     params=_params(tokens), body=raw, timeout_s=120)
            if i:
                samples.append(time.perf_counter() - start)
            assert len(out) == len(raw)
    finally:
        await pool.close()
    return samples


def run_node(libraries: tuple[str, ...], work: Path, repeats: dict[str, int]) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    payload = expert_payload(rng)
    runtime = ExpertRuntime(data_dir=work / "local-runtime", memory_budget_bytes=1 << 30)
    runtime.expert_load(payload=payload)
    load = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tenzro_moeExpertLoad",
                       "params": {"payload": base64.b64encode(payload).decode()}}).encode()
    rows: list[dict[str, Any]] = []
    for library in libraries:
        node = NodeProcess(data_dir=work / f"node-{library}", redis_db=REDIS_DB).start(TENZRO_QUIC_LIB=library)
        try:
            with httpx.Client(timeout=120, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
                time_rpc(client, node, load)
            pin = node.result("tenzro_nodeInfo")["endpoints"]["quic_cert_sha256"]
            with httpx.Client(timeout=120) as client:
                for name, size in SIZES.items():
                    tokens = size // (D_MODEL * 4)
                    hidden = rng.standard_normal((tokens, D_MODEL)).astype("<f4")
                    raw = hidden.tobytes()
                    count = repeats[name] * 2
                    compute = []
                    for _ in range(count):
                        start = time.perf_counter()
                        runtime.execute(model_id=MODEL, layer=0, expert=0, hidden=hidden)
                        compute.append(time.perf_counter() - start)
                    quic = asyncio.run(_time_quic(node, library, pin, raw, tokens, count))
                    framed = _http_frame_served(client, node, raw, tokens)
                    if framed:
                        frame = request_frame("moe/execute", _params(tokens), raw)
                        http = [_http_frame(client, node, frame)[0] for _ in range(count)]
                    else:
                        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tenzro_moeExecute", "params": {
                            "model_id": MODEL, "layer": 0, "expert": 0, "d_model": D_MODEL,
                            "hidden": base64.b64encode(raw).decode()}}).encode()
                        time_rpc(client, node, body)  # warm
                        http = [time_rpc(client, node, body) for _ in range(count)]
                    rows.append({"library": library, "size": name, "rows": tokens, "compute_ms": median_ms(compute),
                                 "quic_ms": median_ms(quic), "http_ms": median_ms(http),
                                 "http_path": "POST /peer/moe/execute (TZ frame)" if framed
                                 else "JSON-RPC tenzro_moeExecute (base64)"})
        finally:
            node.stop()
    return rows


def node_table(rows: list[dict[str, Any]]) -> tuple[str, list[str], list[list[Any]]]:
    paths = sorted({row["http_path"] for row in rows})
    title = (f"moe/execute through a real node (one f32 expert, d_model {D_MODEL}), median ms; "
             f"HTTP door = {', '.join(paths)}")
    columns = ["node + client library", "body", "rows", "compute", "quic", "quic - compute", "http",
               "http - compute", "http / quic"]
    table = [[row["library"], row["size"], row["rows"], row["compute_ms"], row["quic_ms"],
              row["quic_ms"] - row["compute_ms"], row["http_ms"], row["http_ms"] - row["compute_ms"],
              f"{row['http_ms'] / row['quic_ms']:.2f}x"] for row in rows]
    return title, columns, table
