"""Tiny Hugging Face-layout checkpoints and a loopback HTTP file server that counts bytes.

Checkpoints: ``config.json`` plus ``model.safetensors`` or shards with
``model.safetensors.index.json``, real hub tensor names. F32/F16 shards are written by
``safetensors.numpy.save_file``; shards holding BF16 or F8_E4M3 (which numpy cannot
express) by ``write_safetensors`` below, the same container byte for byte.
"""

from __future__ import annotations

import contextlib
import json
import re
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from apps.catalog.checkpoint import FP8_E4M3_LUT
from apps.generation.spec import spec_from_config
from apps.generation.weights import dense_tensor_shapes

# ---- encoders -----------------------------------------------------------------------------------


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even f32 -> bf16 bits (u16)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def bf16_bits_to_f32(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)


_POS = FP8_E4M3_LUT[:0x7F].astype(np.float64)  # codes 0x00..0x7E: finite, increasing


def f32_to_e4m3(x: np.ndarray) -> np.ndarray:
    """f32 -> float8_e4m3fn codes (u8), round to nearest, ties to even code; saturates at ±448."""
    x = np.asarray(x, dtype=np.float64)
    a = np.minimum(np.abs(x), 448.0)
    hi = np.clip(np.searchsorted(_POS, a), 1, len(_POS) - 1)
    lo = hi - 1
    d_lo, d_hi = a - _POS[lo], _POS[hi] - a
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo).astype(np.uint8)
    code = np.where(a <= 0.0, 0, code).astype(np.uint8)
    return code | np.where(np.signbit(x), 0x80, 0).astype(np.uint8)


def fp8_block_quantize(w: np.ndarray, block: int = 128) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """DeepSeek-style FP8: (codes u8 [r, c], scale_inv f32 [ceil(r/b), ceil(c/b)], dequantized f32)."""
    r, c = w.shape
    br, bc = -(-r // block), -(-c // block)
    scale = np.zeros((br, bc), np.float32)
    for i in range(br):
        for j in range(bc):
            amax = float(np.abs(w[i * block:(i + 1) * block, j * block:(j + 1) * block]).max())
            scale[i, j] = amax / 448.0 if amax > 0 else 1.0
    full = np.repeat(np.repeat(scale, block, 0), block, 1)[:r, :c]
    codes = f32_to_e4m3(w / full)
    deq = (FP8_E4M3_LUT[codes] * full).astype(np.float32)
    return codes, scale, deq


# ---- safetensors writer -------------------------------------------------------------------------

_ST_DTYPE = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F8_E4M3": np.uint8, "I32": np.int32,
             "U8": np.uint8}


def write_safetensors(path: Path, tensors: dict[str, tuple[str, np.ndarray]], *, metadata: dict | None = None
                      ) -> None:
    """Write {name: (dtype, stored array)} as safetensors; tensors in name order, header padded to 8."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = metadata
    blobs, offset = [], 0
    for name in sorted(tensors):
        dtype, arr = tensors[name]
        raw = np.ascontiguousarray(arr, dtype=_ST_DTYPE[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def write_checkpoint(root: Path, config: dict, tensors: dict[str, tuple[str, np.ndarray]], *,
                     shards: int = 1) -> Path:
    """Write an HF-layout checkpoint; tensors are dealt round-robin (in name order) over `shards` files."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config, indent=2))
    names = sorted(tensors)
    groups = [names[i::shards] for i in range(shards)]
    files = ["model.safetensors"] if shards == 1 else \
        [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    weight_map = {}
    for fname, group in zip(files, groups, strict=True):
        part = {n: tensors[n] for n in group}
        if all(d in ("F32", "F16") for d, _ in part.values()):
            save_file({n: a for n, (_, a) in part.items()}, str(root / fname))
        else:
            write_safetensors(root / fname, part)
        weight_map.update(dict.fromkeys(group, fname))
    if shards > 1:
        (root / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}, indent=2))
    return root


# ---- model builders -----------------------------------------------------------------------------


def _add_moe_layer(add: Callable[[str, tuple[int, ...]], None], layer: int, *, n_experts: int, d_model: int,
                   d_ff: int) -> None:
    """One Qwen3-MoE layer's router and experts, under their hub names, in the order the builders
    draw them (their random weights depend on it)."""
    add(f"model.layers.{layer}.mlp.gate.weight", (n_experts, d_model))
    for e in range(n_experts):
        add(f"model.layers.{layer}.mlp.experts.{e}.gate_proj.weight", (d_ff, d_model))
        add(f"model.layers.{layer}.mlp.experts.{e}.up_proj.weight", (d_ff, d_model))
        add(f"model.layers.{layer}.mlp.experts.{e}.down_proj.weight", (d_model, d_ff))


@dataclass
class TinyModel:
    root: Path
    config: dict
    dense: dict[str, np.ndarray]  # name -> the f32 values the reader must return
    tensors: dict[str, tuple[str, np.ndarray]] = field(default_factory=dict)


def qwen3_moe(root: Path, *, seed: int = 0, d_model: int = 64, d_ff: int = 32, n_experts: int = 4,
              n_layers: int = 2, shards: int = 3, dtype: str = "F16") -> TinyModel:
    """Qwen3-MoE (softmax router, no shared expert), sharded with an index."""
    rng = np.random.default_rng(seed)
    config = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": d_model,
              "moe_intermediate_size": d_ff, "num_experts": n_experts, "num_experts_per_tok": 2,
              "num_hidden_layers": n_layers, "norm_topk_prob": True, "decoder_sparse_step": 1,
              "mlp_only_layers": [], "torch_dtype": "float16" if dtype == "F16" else "float32"}
    tensors, dense = {}, {}

    def add(name: str, shape: tuple[int, ...]) -> None:
        w = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        stored = w.astype(np.float16) if dtype == "F16" else w
        tensors[name] = (dtype, stored)
        dense[name] = stored.astype(np.float32)

    for layer in range(n_layers):
        _add_moe_layer(add, layer, n_experts=n_experts, d_model=d_model, d_ff=d_ff)
        add(f"model.layers.{layer}.self_attn.o_proj.weight", (d_model, d_model))  # bytes nobody should read
    write_checkpoint(root, config, tensors, shards=shards)
    return TinyModel(root=root, config=config, dense=dense, tensors=tensors)


def deepseek_v3(root: Path, *, seed: int = 1, d_model: int = 160, d_ff: int = 136, n_routed: int = 8,
                n_shared: int = 1, n_layers: int = 2, first_k_dense: int = 1, dense_d_ff: int = 408,
                shards: int = 1) -> TinyModel:
    """DeepSeek-V3: sigmoid router with bias, fused shared experts, FP8 block-scaled experts, BF16 router.

    The first `first_k_dense` layers are dense SwiGLU MLPs (``mlp.{gate,up,down}_proj``, FP8 like
    the experts) of width `dense_d_ff` (config ``intermediate_size``), as in first_k_dense_replace.
    d_model 160, d_ff 136 and dense_d_ff 408 are not multiples of 128, so every weight has partial
    edge blocks; 408 is not a multiple of 32 either, so a Q8_0 cut of it ends in a short block.
    """
    rng = np.random.default_rng(seed)
    config = {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": d_model,
              "moe_intermediate_size": d_ff, "intermediate_size": dense_d_ff, "n_routed_experts": n_routed,
              "n_shared_experts": n_shared, "num_experts_per_tok": 2, "num_hidden_layers": n_layers,
              "first_k_dense_replace": first_k_dense, "moe_layer_freq": 1, "n_group": 2, "topk_group": 1,
              "norm_topk_prob": True, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
              "topk_method": "noaux_tc",
              "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                      "weight_block_size": [128, 128]}}
    tensors, dense = {}, {}

    def fp8(name: str, shape: tuple[int, int]) -> None:
        w = (rng.standard_normal(shape) * 0.05).astype(np.float32)
        w[:128, :128] *= 4  # the top-left block's scale differs from the others
        codes, scale, deq = fp8_block_quantize(w)
        tensors[name] = ("F8_E4M3", codes)
        tensors[f"{name}_scale_inv"] = ("F32", scale)
        dense[name] = deq

    for layer in range(first_k_dense, n_layers):
        g = (rng.standard_normal((n_routed, d_model)) * 0.1).astype(np.float32)
        tensors[f"model.layers.{layer}.mlp.gate.weight"] = ("BF16", f32_to_bf16_bits(g))
        dense[f"model.layers.{layer}.mlp.gate.weight"] = bf16_bits_to_f32(f32_to_bf16_bits(g))
        bias = (rng.standard_normal(n_routed) * 0.01).astype(np.float32)
        tensors[f"model.layers.{layer}.mlp.gate.e_score_correction_bias"] = ("F32", bias)
        dense[f"model.layers.{layer}.mlp.gate.e_score_correction_bias"] = bias
        for e in range(n_routed):
            fp8(f"model.layers.{layer}.mlp.experts.{e}.gate_proj.weight", (d_ff, d_model))
            fp8(f"model.layers.{layer}.mlp.experts.{e}.up_proj.weight", (d_ff, d_model))
            fp8(f"model.layers.{layer}.mlp.experts.{e}.down_proj.weight", (d_model, d_ff))
        fp8(f"model.layers.{layer}.mlp.shared_experts.gate_proj.weight", (n_shared * d_ff, d_model))
        fp8(f"model.layers.{layer}.mlp.shared_experts.up_proj.weight", (n_shared * d_ff, d_model))
        fp8(f"model.layers.{layer}.mlp.shared_experts.down_proj.weight", (d_model, n_shared * d_ff))
    for layer in range(first_k_dense):  # after the MoE layers: their values do not depend on these
        fp8(f"model.layers.{layer}.mlp.gate_proj.weight", (dense_d_ff, d_model))
        fp8(f"model.layers.{layer}.mlp.up_proj.weight", (dense_d_ff, d_model))
        fp8(f"model.layers.{layer}.mlp.down_proj.weight", (d_model, dense_d_ff))
    write_checkpoint(root, config, tensors, shards=shards)
    return TinyModel(root=root, config=config, dense=dense, tensors=tensors)


def llama_dense(root: Path, *, seed: int = 2, d_model: int = 96, d_ff: int = 352, n_layers: int = 2,
                shards: int = 2, dtype: str = "BF16") -> TinyModel:
    """A Llama-style dense model: every layer a SwiGLU ``mlp.{gate,up,down}_proj`` of width d_ff
    (config ``intermediate_size``), no experts, no router; BF16 weights by default, as on the hub."""
    rng = np.random.default_rng(seed)
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": d_model,
              "intermediate_size": d_ff, "num_hidden_layers": n_layers, "hidden_act": "silu",
              "torch_dtype": {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}[dtype]}
    tensors, dense = {}, {}

    def add(name: str, shape: tuple[int, int]) -> None:
        w = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
        if dtype == "BF16":
            bits = f32_to_bf16_bits(w)
            tensors[name], dense[name] = ("BF16", bits), bf16_bits_to_f32(bits)
        else:
            stored = w.astype(np.float16) if dtype == "F16" else w
            tensors[name], dense[name] = (dtype, stored), stored.astype(np.float32)

    for layer in range(n_layers):
        add(f"model.layers.{layer}.mlp.gate_proj.weight", (d_ff, d_model))
        add(f"model.layers.{layer}.mlp.up_proj.weight", (d_ff, d_model))
        add(f"model.layers.{layer}.mlp.down_proj.weight", (d_model, d_ff))
        add(f"model.layers.{layer}.self_attn.o_proj.weight", (d_model, d_model))  # bytes nobody should read
    write_checkpoint(root, config, tensors, shards=shards)
    return TinyModel(root=root, config=config, dense=dense, tensors=tensors)


def qwen3_moe_whole(root: Path, *, seed: int = 3, d_model: int = 256, d_ff: int = 256, n_experts: int = 4,
                    n_layers: int = 2, vocab: int = 64, n_heads: int = 4, n_kv_heads: int = 2, head_dim: int = 32,
                    shards: int = 1) -> TinyModel:
    """A whole Qwen3-MoE (embeddings, GQA attention, norms, LM head, gates, experts), F32, every layer MoE.

    Random weights scaled by 1/sqrt(fan-in), norms near 1, no end-of-sequence id (a generation runs
    to its max_new_tokens). The dense tensor list comes from the generation spec itself, so the
    router's load-dense reads exactly what it needs. d_model and d_ff default to 256, the K-quant
    block, so q4_k_m really stores Q4_K/Q6_K blocks (a smaller row falls back to Q8_0).
    """
    rng = np.random.default_rng(seed)
    config = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": d_model,
              "moe_intermediate_size": d_ff, "num_experts": n_experts, "num_experts_per_tok": 2,
              "num_hidden_layers": n_layers, "norm_topk_prob": True, "decoder_sparse_step": 1,
              "mlp_only_layers": [], "num_attention_heads": n_heads, "num_key_value_heads": n_kv_heads,
              "head_dim": head_dim, "vocab_size": vocab, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
              "max_position_embeddings": 256, "tie_word_embeddings": False, "hidden_act": "silu",
              "torch_dtype": "float32"}
    tensors: dict[str, tuple[str, np.ndarray]] = {}

    def add(name: str, shape: tuple[int, ...]) -> None:
        if len(shape) == 1:  # a norm's weight
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            w = rng.standard_normal(shape) / np.sqrt(shape[1])
        tensors[name] = ("F32", w.astype(np.float32))

    for name, shape in dense_tensor_shapes(spec_from_config(config, model_id="builder")).items():
        add(name, shape)
    for layer in range(n_layers):
        _add_moe_layer(add, layer, n_experts=n_experts, d_model=d_model, d_ff=d_ff)
    write_checkpoint(root, config, tensors, shards=shards)
    return TinyModel(root=root, config=config, dense={n: a for n, (_, a) in tensors.items()}, tensors=tensors)


# ---- loopback HTTP server -----------------------------------------------------------------------

_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


class FileServer:
    """Serves a folder over HTTP/1.1 on 127.0.0.1 with single-range support and byte accounting.

    Switches: ``ignore_range`` (answer 200 with the whole file), ``short_body`` (announce the
    asked range but send one byte less), ``fail_next`` (answer 503 that many times).
    ``served`` lists (path, start, end_exclusive, body bytes sent) per response.
    """

    def __init__(self, root: Path, *, port: int = 0) -> None:
        self.root = Path(root)
        self.ignore_range = False
        self.short_body = False
        self.fail_next = 0
        self.served: list[tuple[str, int, int, int]] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                with server.lock:
                    if server.fail_next > 0:
                        server.fail_next -= 1
                        self.send_response(503)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                path = server.root / self.path.lstrip("/")
                if not path.is_file():
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                size = path.stat().st_size
                match = _RANGE.match(self.headers.get("Range", ""))
                if match and not server.ignore_range:
                    start = int(match.group(1))
                    end = min(int(match.group(2)) if match.group(2) else size - 1, size - 1)
                    if start >= size:
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{size}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    with path.open("rb") as fh:
                        fh.seek(start)
                        body = fh.read(end + 1 - start)
                    if server.short_body:
                        body = body[:-1]
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
                else:
                    start, end, body = 0, size - 1, path.read_bytes()
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()
                sent = 0
                try:
                    for i in range(0, len(body), 65536):
                        self.wfile.write(body[i:i + 65536])
                        sent += len(body[i:i + 65536])
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client hung up (a reader refusing a 200 does exactly that)
                with server.lock:
                    server.served.append((self.path.lstrip("/"), start, end + 1, sent))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)  # port 0: any free one
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    @property
    def bytes_sent(self) -> int:
        with self.lock:
            return sum(s[3] for s in self.served)

    def reset(self) -> None:
        with self.lock:
            self.served.clear()

    def __enter__(self) -> FileServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        with contextlib.suppress(Exception):
            self.httpd.server_close()
