"""The holders of bench/wire_floor.py's own ways: processes that hold experts e % N of bench/generate.py's
model (bench/_generate_model.py) in an ExpertRuntime with a node's C kernels and worker pool, and answer one
request per MoE layer over plain TCP, asyncio streams or the node's QUIC door; with the frames and row
helpers the benchmark's routers share with them (bench/wire_floor.py says what each way measures)."""

from __future__ import annotations

import asyncio
import pickle
import socket
import time
from itertools import accumulate
from pathlib import Path
from typing import Any

import numpy as np
from nacl.signing import SigningKey

from apps.receipts.commitment import ReceiptSigner
from core.experts.runtime import ExpertRuntime
from core.formats.wire import decode_rows, encode_rows, encoded_row_bytes
from core.transport.admission import PeerLimits
from core.transport.framing import Reply
from core.transport.quic import PeerRequest, QuicSettings, start_server

from ._generate_model import D_MODEL, Shape, holders_of

SHAPE = Shape(2, 128)
WIRE, RECEIPT_TOPK = "q8_0", 16  # the node's default wire and TENZRO_RECEIPT_TOPK
MAX_BODY = 64 << 20  # a prefill's carrier and answers, with room


def frame(message: Any) -> bytes:
    """A 4-byte little-endian length, then the pickle."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return len(data).to_bytes(4, "little") + data


def send_frame(sock: socket.socket, message: Any) -> None:
    sock.sendall(frame(message))


def recv_frame(sock: socket.socket) -> Any:
    return pickle.loads(_recv_exactly(sock, int.from_bytes(_recv_exactly(sock, 4), "little")))


def _recv_exactly(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise ConnectionError("the other end closed the connection")
        got += k
    return buf


def write_frame(writer: asyncio.StreamWriter, message: Any) -> None:
    writer.write(frame(message))


async def read_frame(reader: asyncio.StreamReader) -> Any:
    return pickle.loads(await reader.readexactly(int.from_bytes(await reader.readexactly(4), "little")))


def holder_runtime(index: int, holders: int, experts: list[Path], data_dir: Path) -> ExpertRuntime:
    """Experts e % holders == index of every layer, loaded and warm."""
    runtime = ExpertRuntime(data_dir=data_dir, memory_budget_bytes=16 << 30)
    for path in experts:
        if holders_of(path, holders)[0] == index:
            runtime.expert_load(payload=path.read_bytes(), stored_at=path)
    runtime.warm()
    return runtime


def compute(runtime: ExpertRuntime, layer: int, rows: np.ndarray, batches: list[tuple[int, list[int]]]
            ) -> tuple[list[np.ndarray], float]:
    """A holder's answer to one request: each batch's output rows f32 [n_i, d_model], and the seconds they took."""
    start = time.perf_counter()
    out = runtime.execute_carrier(model_id=SHAPE.model_id, layer=layer, hidden=rows, batches=batches)
    return [y for y, _ in out], time.perf_counter() - start


def tcp_holder(index: int, holders: int, experts: list[Path], data_dir: Path, listener: socket.socket) -> None:
    """A holder on plain TCP: one router connection; each request (layer, rows f32 [n, d_model], [(expert,
    ascending rows)]) answered with ([f32 [n_i, d_model]], compute s), until the router closes it."""
    runtime = holder_runtime(index, holders, experts, data_dir)
    listener.listen(1)
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        try:
            layer, rows, batches = recv_frame(conn)
        except ConnectionError:
            return
        send_frame(conn, compute(runtime, layer, rows, batches))


def asyncio_holder(index: int, holders: int, experts: list[Path], data_dir: Path, listener: socket.socket) -> None:
    """tcp_holder's requests and answers on an asyncio stream server, computed on its event loop."""
    runtime = holder_runtime(index, holders, experts, data_dir)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            try:
                layer, rows, batches = await read_frame(reader)
            except asyncio.IncompleteReadError:
                return
            write_frame(writer, compute(runtime, layer, rows, batches))

    async def serve() -> None:
        server = await asyncio.start_server(answer, sock=listener)
        async with server:
            await server.serve_forever()

    asyncio.run(serve())


def quic_holder(index: int, holders: int, experts: list[Path], data_dir: Path, port: int, cert: str, key: str,
                signing_seed: bytes | None, ready: Any) -> None:
    """A holder on the node's own QUIC door (core.transport.quic_server with its default settings): each
    request's params {layer, batches}, its body the rows; the answer's body every batch's output rows in turn,
    its result {compute_s}. With a signing seed, the node's payload: rows in and out as Q8_0 (core.formats.wire,
    the answer encoded in one call) and one v2 receipt over the batches (apps.receipts.commitment), as a
    node's holder answers; without, f32 rows and no receipt. Computed on the event loop, as a node computes a
    decode frame."""
    runtime = holder_runtime(index, holders, experts, data_dir)
    signer = ReceiptSigner(SigningKey(signing_seed)) if signing_seed else None

    async def handle(request: PeerRequest) -> Reply:
        params = request.params
        if signer is None:
            ys, seconds = compute(runtime, params["layer"], rows_of(request.body), params["batches"])
            return Reply.ok({"compute_s": seconds}, b"".join(y.tobytes() for y in ys))
        rows = decode_rows(request.body, WIRE, tokens=len(params["token_indices"]), d_model=D_MODEL)
        ys, seconds = compute(runtime, params["layer"], rows, params["batches"])
        data = encode_rows(np.concatenate(ys), WIRE)
        parts = split_rows(memoryview(data), [len(y) for y in ys], encoded_row_bytes(WIRE, D_MODEL))
        receipt = signer.batches(model_id=SHAPE.model_id, layer=params["layer"], token_indices=params["token_indices"],
                                 d_model=D_MODEL, input_encoding=WIRE, input_carrier=request.body,
                                 output_encoding=WIRE, k=RECEIPT_TOPK,
                                 batches=[(e, r, part) for (e, r), part in zip(params["batches"], parts, strict=True)])
        return Reply.ok({"compute_s": seconds, "receipt": receipt}, data)

    async def serve() -> None:
        limits = PeerLimits(max_body=MAX_BODY, rate_per_s=1e6, burst=1_000_000)
        await start_server(host="127.0.0.1", port=port, cert_path=cert, key_path=key, handler=handle,
                           settings=QuicSettings(max_body=MAX_BODY), limits=limits)
        ready.set()
        await asyncio.Event().wait()  # until the benchmark kills this process

    asyncio.run(serve())


def rows_of(body: bytes | bytearray) -> np.ndarray:
    return np.frombuffer(body, dtype=np.float32).reshape(-1, D_MODEL)


def split_rows(rows: Any, counts: list[int], unit: int = 1) -> list[Any]:
    """rows cut into consecutive parts of counts[i] rows each (`unit`: items per row)."""
    ends = list(accumulate(n * unit for n in counts))
    return [rows[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]
