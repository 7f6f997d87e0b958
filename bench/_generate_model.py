"""The models bench/generate.py serves: Qwen3-MoE checkpoints at Qwen3-30B-A3B's widths, and the
one-process reference that runs them.

A `Shape` names how deep and how wide: `2x128` is two MoE layers of Qwen3-30B-A3B's 128 experts
(the benchmark's historical setup); `24x16` is 24 MoE layers of 16 experts, so a deep model's cost
per layer shows (each decode step crosses 24 layers, every one of the four holders in each). Both
keep top-8 and the real widths (hidden 2048, 32 query / 4 KV heads of 128, expert d_ff 768).

The checkpoint is written to a temp dir: config.json and model.safetensors with the dense tensors in
BF16 under their hub names, small-magnitude random (~1/sqrt(fan_in)). The experts are Q8_0 expert
payload files (core.formats.expert_payload.encode_expert_payload of random f32 weights), the
realistic format of a holder. The vocabulary keeps the LM head's real share of a step: Qwen3's
151,936 x layers / 48, rounded up to a multiple of 64 (the real head, the same work in both runs,
would otherwise be most of a step with a few of the 48 layers and hide what is measured).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from apps.catalog.checkpoint import CheckpointReader
from apps.catalog.shapes import shape_from_config
from apps.catalog.slicing import gate_payload_for_layer
from apps.generation.model import WholeModel, drive
from apps.generation.spec import spec_from_config
from apps.generation.weights import dense_tensor_shapes, load_dense_weights
from core.experts.runtime import ExpertRuntime
from core.formats.expert_payload import encode_expert_payload
from testkit.checkpoints import f32_to_bf16_bits, write_checkpoint

D_MODEL, D_FF, TOP_K = 2048, 768, 8
REAL_LAYERS, REAL_VOCAB = 48, 151_936
N_HOLDERS = 4

MoeLayer = Callable[[int, np.ndarray], np.ndarray]  # (layer, hidden f32 [t, d_model]) -> f32 [t, d_model]


@dataclass(frozen=True)
class Shape:
    layers: int
    experts: int
    vocab: int | None = None  # None: REAL_VOCAB x layers / REAL_LAYERS (the LM head's real share)

    @property
    def name(self) -> str:
        return f"{self.layers}x{self.experts}"

    @property
    def model_id(self) -> str:
        return f"bench/qwen3-30b-a3b-{self.name}"

    @property
    def vocab_size(self) -> int:
        return self.vocab or -(-REAL_VOCAB * self.layers // REAL_LAYERS // 64) * 64

    @classmethod
    def parse(cls, text: str, vocab: int | None = None) -> Shape:
        layers, experts = (int(x) for x in text.lower().split("x"))
        return cls(layers, experts, vocab)


def model_config(shape: Shape) -> dict[str, Any]:
    """Qwen3-30B-A3B's config.json (Qwen/Qwen3-30B-A3B), `shape.layers` layers of `shape.experts` experts."""
    vocab = shape.vocab_size
    return {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": min(151_643, vocab - 2), "eos_token_id": min(151_645, vocab - 1),
        "decoder_sparse_step": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": D_MODEL,
        "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 40_960,
        "max_window_layers": shape.layers, "mlp_only_layers": [], "moe_intermediate_size": D_FF,
        "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": shape.experts,
        "num_experts_per_tok": TOP_K, "num_hidden_layers": shape.layers, "num_key_value_heads": 4,
        "output_router_logits": False, "rms_norm_eps": 1e-6, "rope_scaling": None, "rope_theta": 1_000_000.0,
        "router_aux_loss_coef": 0.001, "sliding_window": None, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False, "vocab_size": vocab,
    }


def write_model(root: Path, shape: Shape, rng: np.random.Generator) -> tuple[Path, list[Path]]:
    """(checkpoint folder, the layers x experts Q8_0 expert payload files)."""
    config = model_config(shape)
    spec = spec_from_config(config, model_id=shape.model_id)
    tensors: dict[str, tuple[str, np.ndarray]] = {}
    for name, dims in dense_tensor_shapes(spec).items():
        if name.endswith("norm.weight"):  # RMSNorm weights near 1, as trained ones are
            w = 1.0 + 0.05 * rng.standard_normal(dims, dtype=np.float32)
        else:
            w = rng.standard_normal(dims, dtype=np.float32) / np.float32(np.sqrt(dims[-1]))
        tensors[name] = ("BF16", f32_to_bf16_bits(w))
    for layer in spec.moe_layers:
        w = rng.standard_normal((shape.experts, D_MODEL), dtype=np.float32) / np.float32(np.sqrt(D_MODEL))
        tensors[f"model.layers.{layer}.mlp.gate.weight"] = ("BF16", f32_to_bf16_bits(w))
    folder = write_checkpoint(root / "checkpoint", config, tensors)

    # Drawing a billion normals would take minutes on 2 cores: every expert's projections are windows
    # of one pool at random offsets, with a random sign, then really quantized to Q8_0.
    pool = rng.standard_normal(1 << 24, dtype=np.float32)
    experts = root / "experts"
    experts.mkdir()
    paths = []
    for layer in spec.moe_layers:
        for e in range(shape.experts):
            def w(rows: int, cols: int) -> np.ndarray:
                start = int(rng.integers(0, pool.size - rows * cols))
                sign = np.float32(rng.choice((-1.0, 1.0)) / np.sqrt(cols))
                return pool[start: start + rows * cols].reshape(rows, cols) * sign

            payload = encode_expert_payload(gate=w(D_FF, D_MODEL), up=w(D_FF, D_MODEL), down=w(D_MODEL, D_FF),
                                            quant="Q8_0", model_id=shape.model_id, layer=layer, expert=e)
            path = experts / f"l{layer}e{e}.safetensors"
            path.write_bytes(payload)
            paths.append(path)
    return folder, paths


def holders_of(path: Path, holders: int = N_HOLDERS, replication: int = 1) -> list[int]:
    """Expert e of every layer lives on holders e, e + 1, ... (`replication` of them) modulo `holders` (file
    names l{layer}e{expert})."""
    e = int(path.stem.split("e")[1])
    return [(e + i) % holders for i in range(min(replication, holders))]


def dense_ms_per_token(records: list[dict[str, Any]]) -> float:
    """Mean ms per decode step outside the MoE layers, over Local.generate records."""
    return statistics.fmean(s - m for r in records for s, m in zip(r["decode_step_ms"], r["decode_moe_ms"],
                                                                   strict=True))


class Local:
    """WholeModel + ExpertRuntime.forward_local with every expert: greedy_generate, timed per step."""

    def __init__(self, shape: Shape, folder: Path, experts: list[Path], data_dir: Path) -> None:
        with CheckpointReader.open(folder) as reader:
            spec = spec_from_config(reader.config, model_id=shape.model_id)
            weights = load_dense_weights(reader, spec)
            model_shape = shape_from_config(shape.model_id, reader.config)
            gates = [gate_payload_for_layer(reader, model_shape, layer, model_id=shape.model_id)
                     for layer in spec.moe_layers]
        self.shape = shape
        self.model = WholeModel(weights)
        self.runtime = ExpertRuntime(data_dir=data_dir, memory_budget_bytes=16 << 30)
        for payload in gates:
            self.runtime.gate_load(payload=payload)
        for path in experts:
            self.runtime.expert_load(payload=path.read_bytes(), stored_at=path)
        self.moe_s = 0.0

    def _moe(self, layer: int, x: np.ndarray) -> np.ndarray:
        return self.runtime.forward_local(model_id=self.shape.model_id, layer=layer, hidden=x)

    def _timed(self, moe: MoeLayer) -> MoeLayer:
        """`moe`, its time added to self.moe_s."""
        def run(layer: int, x: np.ndarray) -> np.ndarray:
            start = time.perf_counter()
            y = moe(layer, x)
            self.moe_s += time.perf_counter() - start
            return y
        return run

    def generate(self, prompt: list[int], max_new: int, moe: MoeLayer | None = None) -> dict[str, Any]:
        """greedy_generate's steps, each timed: (tokens, ttft_ms and the prefill's MoE ms, decode tokens/s, decode
        step ms and MoE ms). moe(layer, hidden f32 [t, d_model]) -> f32 [t, d_model] runs each MoE layer: every
        expert in this process by default (bench/wire_floor.py asks holder processes instead)."""
        cache = self.model.new_cache()
        ids, tokens, steps = np.asarray(prompt, dtype=np.int64), [], []
        run = self._timed(moe or self._moe)
        for _ in range(max_new):
            self.moe_s, start = 0.0, time.perf_counter()
            logits = self.model.forward(ids, cache, run, last_only=True)
            tokens.append(int(np.argmax(logits[-1])))
            steps.append(((time.perf_counter() - start) * 1e3, self.moe_s * 1e3))
            ids = np.array([tokens[-1]], dtype=np.int64)
        decode = steps[1:]
        return {"tokens": tokens, "ttft_ms": steps[0][0], "prefill_moe_ms": steps[0][1],
                "decode_tokens_per_s": len(decode) / (sum(s for s, _ in decode) / 1e3) if decode else None,
                "decode_step_ms": [s for s, _ in decode], "decode_moe_ms": [m for _, m in decode]}

    def generate_batch(self, prompts: list[list[int]], max_new: int) -> dict[str, Any]:
        """N greedy generations batched as the router's continuous batching runs them, in this process:
        every prompt in one prefill iteration (WholeModel.run_batch), then one decode iteration of all N
        sequences per token. (tokens per sequence, wall seconds, each decode iteration's ms and its MoE ms)."""
        caches = [self.model.new_cache() for _ in prompts]
        ids = [np.asarray(p, dtype=np.int64) for p in prompts]
        tokens: list[list[int]] = [[] for _ in prompts]
        iteration_ms, moe_ms = [], []
        started, run = time.perf_counter(), self._timed(self._moe)
        for _ in range(max_new):
            self.moe_s, start = 0.0, time.perf_counter()
            logits = drive(self.model.run_batch(list(zip(ids, caches, strict=True)), last_only=True), run)
            for out, sequence_logits in zip(tokens, logits, strict=True):
                out.append(int(np.argmax(sequence_logits[-1])))
            iteration_ms.append((time.perf_counter() - start) * 1e3)
            moe_ms.append(self.moe_s * 1e3)
            ids = [np.array([out[-1]], dtype=np.int64) for out in tokens]
        return {"tokens": tokens, "wall_s": time.perf_counter() - started, "decode_iteration_ms": iteration_ms[1:],
                "decode_moe_ms": moe_ms[1:]}

    def close(self) -> None:
        """Free the reference's weights before the next shape loads its own."""
        self.model = None  # type: ignore[assignment]
        for layer, expert, *_ in self.runtime.held(self.shape.model_id):
            self.runtime.expert_unload(model_id=self.shape.model_id, layer=layer, expert=expert)
