"""Prepare benchmark: slice + quantize experts of Qwen3-30B-A3B size out of a checkpoint served over HTTP.

Run: .venv/bin/python -m bench.prepare

Builds a BF16 checkpoint with one MoE layer of Qwen3-30B-A3B's shape (d_model 2048,
moe_intermediate_size 768, 128-expert router; only the first few experts are written) in a
temp dir, serves it from a loopback HTTP server that honours Range and counts the bytes it
sends, and runs apps.catalog.slicing.prepare_layer for q8_0 and q4_k_m. Reported:

* experts/s and MB/s read (checkpoint bytes fetched per second of wall time, end to end:
  ranged HTTP reads + BF16 decode + quantize + encode);
* HTTP bytes / bytes strictly needed (the tensors' own bytes): the target is 1.0 plus the
  shard headers and config.json — the second ratio column leaves those out and must be 1.0.
The reference for the read side is the same bytes fetched back to back with plain ranged
httpx GETs (no decode/quantize), measured in the same run.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from apps.catalog.checkpoint import CheckpointReader
from apps.catalog.shapes import shape_from_config
from apps.catalog.slicing import expert_tensor, gate_tensor, prepare_layer
from core.quantization.registry import quantize
from core.quantization.types import GGMLType
from testkit.checkpoints import FileServer, f32_to_bf16_bits, write_checkpoint

from .report import headline, print_table, write_results

D_MODEL, D_FF, N_ROUTED, LAYER = 2048, 768, 128, 0
N_EXPERTS = 6  # experts written and prepared
QUANTS = ["q8_0", "q4_k_m"]


def build(root: Path) -> dict:
    rng = np.random.default_rng(0)
    config = {"model_type": "qwen3_moe", "hidden_size": D_MODEL, "moe_intermediate_size": D_FF,
              "num_experts": N_ROUTED, "num_experts_per_tok": 8, "num_hidden_layers": 1, "norm_topk_prob": True,
              "decoder_sparse_step": 1, "mlp_only_layers": [], "torch_dtype": "bfloat16"}
    tensors = {gate_tensor(LAYER): ("BF16", f32_to_bf16_bits(rng.standard_normal((N_ROUTED, D_MODEL)) * 0.02))}
    for e in range(N_EXPERTS):
        for proj, shape in (("gate", (D_FF, D_MODEL)), ("up", (D_FF, D_MODEL)), ("down", (D_MODEL, D_FF))):
            w = (rng.standard_normal(shape) * 0.02).astype(np.float32)
            tensors[expert_tensor(LAYER, e, proj)] = ("BF16", f32_to_bf16_bits(w))
    write_checkpoint(root, config, tensors, shards=2)
    return config


def warm_up() -> None:
    x = np.random.default_rng(1).standard_normal((4, 256)).astype(np.float32)
    for t in (GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K):
        quantize(x, t)  # numba JIT compile outside the timed region


def plain_reads(url: str, reader: CheckpointReader, names: list[str]) -> float:
    """Seconds to fetch the same tensor ranges with bare httpx ranged GETs (the I/O floor)."""
    infos = [reader.tensor_info(n) for n in names]
    with httpx.Client() as client:
        t0 = time.perf_counter()
        for info in infos:
            r = client.get(f"{url}/{info.shard}", headers={"Range": f"bytes={info.start}-{info.end - 1}"})
            assert r.status_code == 206 and len(r.content) == info.nbytes
        return time.perf_counter() - t0


def main() -> None:
    warm_up()
    rows, results = [], []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "qwen3-30b-a3b-layer0"
        config = build(root)
        shape = shape_from_config("qwen3-30b-a3b", config)
        experts = list(range(N_EXPERTS))
        names = [gate_tensor(LAYER)] + [expert_tensor(LAYER, e, p) for e in experts for p in ("gate", "up", "down")]
        with FileServer(root) as server:
            for quant in QUANTS:
                server.reset()
                t0 = time.perf_counter()
                with CheckpointReader.open(server.url) as reader:
                    prepared = prepare_layer(reader, shape, model_id="qwen3-30b-a3b", layer=LAYER,
                                             experts=experts, quant=quant)
                    seconds = time.perf_counter() - t0
                    http_bytes = server.bytes_sent  # everything the server sent for this prepare
                    assert http_bytes == reader.bytes_read
                    needed = sum(reader.tensor_info(n).nbytes for n in names)  # headers are cached: no I/O
                    plain_s = plain_reads(server.url, reader, names)
                payload_bytes = sum(len(p) for p in prepared.experts.values())
                row = {
                    "quant": quant, "experts": N_EXPERTS, "seconds": seconds, "experts_per_s": N_EXPERTS / seconds,
                    "mb_read_per_s": reader.bytes_read / seconds / 1e6, "http_bytes": http_bytes,
                    "needed_bytes": needed, "ratio": http_bytes / needed,
                    "ratio_tensors_only": reader.bytes_by_kind["tensor"] / needed,
                    "header_and_json_bytes": reader.bytes_by_kind["header"] + reader.bytes_by_kind["json"],
                    "plain_read_mb_s": needed / plain_s / 1e6, "payload_bytes": payload_bytes,
                    "formats": prepared.formats[0],
                }
                results.append(row)
                rows.append([quant, N_EXPERTS, round(seconds, 3), row["experts_per_s"], row["mb_read_per_s"],
                             row["plain_read_mb_s"], http_bytes, needed, f"{row['ratio']:.6f}",
                             f"{row['ratio_tensors_only']:.6f}", "/".join(prepared.formats[0].values())])
    print_table(
        f"prepare_layer over loopback HTTP: {N_EXPERTS} experts of Qwen3-30B-A3B size (d_model {D_MODEL}, "
        f"d_ff {D_FF}, BF16, 2 shards)",
        ["quant", "experts", "s", "experts/s", "MB/s read", "plain GET MB/s", "HTTP bytes", "needed bytes",
         "HTTP/needed", "tensor/needed", "formats g/u/d"],
        rows,
    )
    write_results("prepare", {"d_model": D_MODEL, "d_ff": D_FF, "n_experts": N_EXPERTS, "results": results}, [
        *(headline(f"prepare {r['quant']}: checkpoint read rate, end to end", r["mb_read_per_s"], "MB/s",
                   reference="plain ranged GETs of the same bytes", reference_value=r["plain_read_mb_s"])
          for r in results),
        *(headline(f"prepare {r['quant']}: tensor bytes fetched / needed", r["ratio_tensors_only"], "x",
                   reference="bytes strictly needed", reference_value=1.0, target="1.0") for r in results)])


if __name__ == "__main__":
    main()
