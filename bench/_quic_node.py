"""Rows of bench/transport_quic.py through a real node: QUIC peer door against the HTTP door.

The node holds one dense f32 expert of Qwen3-30B-A3B's shape (bench/transport.py's), and the
same rows go through each door. Each answer carries the holder's own `compute_ms`; a door's
cost is the round trip less that, per call (the median is shown), so contention on the
machine that slows the expert does not read as a slow door. The HTTP door is
`POST /peer/moe/execute` with a TZ request frame (application/x-tenzro-frame) where the node
serves it; a node without that route is measured through JSON-RPC `tenzro_moeExecute`
(base64 rows, compute timed in this process) and the table says so.
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

from core.experts.runtime import ExpertRuntime
from core.transport.framing import FRAME_CONTENT_TYPE, FrameDecoder, request_frame
from core.transport.pool import QuicPool
from core.transport.quic import QuicSettings
from testkit.nodes import TOKEN, NodeProcess

from ._quic_echo import SIZES
from .transport import D_MODEL, MODEL, expert_payload, time_rpc

REDIS_DB = 13


def _params(tokens: int) -> dict[str, Any]:
    return {"model_id": MODEL, "layer": 0, "expert": 0, "tokens": tokens, "d_model": D_MODEL}


def _compute_s(header: dict[str, Any]) -> float:
    result = header.get("result") or {}
    compute_ms = result.get("compute_ms") if header.get("ok") else None
    return float(compute_ms) / 1000 if isinstance(compute_ms, int | float) else float("nan")


def _http_frame(client: httpx.Client, node: NodeProcess, frame: bytes) -> tuple[float, dict[str, Any], bytes]:
    start = time.perf_counter()
    answer = client.post(f"{node.url}/peer/moe/execute", content=frame, headers={"Content-Type": FRAME_CONTENT_TYPE})
    elapsed = time.perf_counter() - start
    if answer.headers.get("content-type", "").split(";")[0] != FRAME_CONTENT_TYPE:
        return elapsed, {"ok": False, "status": answer.status_code}, b""
    frames = FrameDecoder(max_body=1 << 30).feed(answer.content)
    return elapsed, frames[0].header, bytes(frames[0].body)


def _time_http_frames(client: httpx.Client, node: NodeProcess, raw: bytes, tokens: int,
                      repeats: int) -> list[tuple[float, float]] | None:
    """(round trip s, holder's compute s) per call over HTTP frames; None without the route."""
    frame = request_frame("moe/execute", _params(tokens), raw)
    _, header, body = _http_frame(client, node, frame)  # warm, and is the route there?
    if not header.get("ok") or len(body) != len(raw):
        return None
    out = []
    for _ in range(repeats):
        elapsed, header, _ = _http_frame(client, node, frame)
        out.append((elapsed, _compute_s(header)))
    return out


def _time_json_rpc(client: httpx.Client, node: NodeProcess, runtime: ExpertRuntime, hidden: np.ndarray,
                   repeats: int) -> list[tuple[float, float]]:
    """(round trip s, compute s timed here) per call over JSON-RPC (base64 rows)."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tenzro_moeExecute", "params": {
        "model_id": MODEL, "layer": 0, "expert": 0, "d_model": D_MODEL,
        "hidden": base64.b64encode(hidden.tobytes()).decode()}}).encode()
    time_rpc(client, node, body)  # warm
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        runtime.execute(model_id=MODEL, layer=0, expert=0, hidden=hidden)
        compute = time.perf_counter() - start
        out.append((time_rpc(client, node, body), compute))
    return out


async def _time_quic(node: NodeProcess, library: str, pin: str, raw: bytes, tokens: int,
                     repeats: int) -> list[tuple[float, float]]:
    """(round trip s, holder's compute s) per call over the QUIC peer door, one pooled connection."""
    pool = QuicPool(QuicSettings(max_body=64 << 20, library=library))
    out = []
    try:
        for i in range(repeats + 1):
            start = time.perf_counter()
            result, answer = await pool.call(host="127.0.0.1", port=node.quic_port, pin_sha256=pin,
                                             method="moe/execute", params=_params(tokens), body=raw, timeout_s=120)
            elapsed = time.perf_counter() - start
            assert len(answer) == len(raw)
            if i:  # the first call also pays the handshake
                out.append((elapsed, _compute_s({"ok": True, "result": result})))
    finally:
        await pool.close()
    return out


def _summary(calls: list[tuple[float, float]]) -> dict[str, float]:
    walls = np.array([wall for wall, _ in calls]) * 1000
    computes = np.array([compute for _, compute in calls]) * 1000
    return {"ms": float(np.median(walls)), "compute_ms": float(np.nanmedian(computes)),
            "door_ms": float(np.nanmedian(walls - computes))}


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
                    count = repeats[name] * 3
                    quic = _summary(asyncio.run(_time_quic(node, library, pin, raw, tokens, count)))
                    framed = _time_http_frames(client, node, raw, tokens, count)
                    http = _summary(framed if framed is not None
                                    else _time_json_rpc(client, node, runtime, hidden, count))
                    rows.append({"library": library, "size": name, "rows": tokens, "quic": quic, "http": http,
                                 "http_path": "POST /peer/moe/execute (TZ frame)" if framed is not None
                                 else "JSON-RPC tenzro_moeExecute (base64)"})
        finally:
            node.stop()
    return rows


def node_table(rows: list[dict[str, Any]]) -> tuple[str, list[str], list[list[Any]]]:
    paths = sorted({row["http_path"] for row in rows})
    title = (f"moe/execute through a real node (one f32 expert, d_model {D_MODEL}), median ms; door = round trip "
             f"less the holder's compute_ms, per call; HTTP door = {', '.join(paths)}")
    columns = ["node + client library", "body", "rows", "compute", "quic", "quic door", "http", "http door",
               "http door / quic door"]
    table = [[row["library"], row["size"], row["rows"], row["quic"]["compute_ms"], row["quic"]["ms"],
              row["quic"]["door_ms"], row["http"]["ms"], row["http"]["door_ms"],
              f"{row['http']['door_ms'] / row['quic']['door_ms']:.2f}x"] for row in rows]
    return title, columns, table
