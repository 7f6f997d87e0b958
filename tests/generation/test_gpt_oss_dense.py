"""gpt-oss's dense half (sinks, sliding-window layers, biases, YaRN without truncation) against transformers'
GptOssForCausalLM on the gpt_oss fixture (scripts/make_generation_fixtures.py), its MoE blocks computed
here in numpy from the fused hub tensors (GptOssTopKRouter and GptOssExperts transcribed), and the KV
cache whose sliding layers keep only the window."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import numpy as np
import pytest

from apps.catalog.checkpoint import CheckpointReader
from apps.generation.model import KVCache, WholeModel, _WindowRows, drive, greedy_generate
from apps.generation.spec import spec_from_config
from apps.generation.weights import DenseWeights, dense_tensor_shapes, load_dense_weights
from core.quantization.mxfp4 import dequantize_hub
from tests.generation.conftest import FIXTURES, fixture_tensors

FOLDER = FIXTURES / "gpt_oss"
LOGITS_RTOL = 1e-5  # relative L2 against transformers' f32 forward (measured ~6e-7)
CACHE_RTOL = 1e-5
ALPHA, LIMIT = 1.702, 7.0  # GptOssExperts: swiglu_alpha, the config's swiglu_limit


def rel(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))


@dataclass
class GptOss:
    model: WholeModel
    dense: DenseWeights
    k: int  # num_experts_per_tok
    tensors: dict[str, np.ndarray]  # the whole checkpoint, hub names
    expected: dict
    logits: np.ndarray  # f32 [prompt_len, vocab] from transformers

    def moe(self, layer: int, x: np.ndarray) -> np.ndarray:
        """GptOssMLP of x f32 [n, d]: router logits x·Wᵀ + b, top-k, softmax over the k chosen; each expert
        gate_up = x @ gate_up_proj[e] + bias (gate and up interleaved), clamped SwiGLU, down + bias."""
        p, t, k = f"model.layers.{layer}.mlp.", self.tensors, self.k
        logits = x @ t[p + "router.weight"].T + t[p + "router.bias"]  # (n, E)
        top = np.argsort(-logits, axis=1, kind="stable")[:, :k]  # (n, k)
        chosen = np.take_along_axis(logits, top, axis=1)
        weights = np.exp(chosen - chosen.max(axis=1, keepdims=True))
        weights /= weights.sum(axis=1, keepdims=True)
        out = np.zeros_like(x)
        w_gate_up, b_gate_up = t[p + "experts.gate_up_proj"], t[p + "experts.gate_up_proj_bias"]  # (E, d, 2f), (E, 2f)
        w_down, b_down = t[p + "experts.down_proj"], t[p + "experts.down_proj_bias"]  # (E, f, d), (E, d)
        for j in range(k):
            e = top[:, j]  # (n,): each row's j-th expert
            gate_up = np.einsum("nd,ndf->nf", x, w_gate_up[e]) + b_gate_up[e]  # (n, 2f)
            gate = np.minimum(gate_up[:, ::2], LIMIT)
            up = np.clip(gate_up[:, 1::2], -LIMIT, LIMIT)
            glu = gate / (1.0 + np.exp(-ALPHA * gate))
            out += weights[:, j:j + 1] * (np.einsum("nf,nfd->nd", (up + 1) * glu, w_down[e]) + b_down[e])
        return out.astype(np.float32)


@pytest.fixture(scope="module")
def g() -> GptOss:
    with CheckpointReader.open(FOLDER) as reader:
        spec = spec_from_config(reader.config, model_id="gpt_oss")
        dense = load_dense_weights(reader, spec)
        k = reader.config["num_experts_per_tok"]
    expected = json.loads((FOLDER / "expected.json").read_text())
    return GptOss(model=WholeModel(dense), dense=dense, k=k, tensors=fixture_tensors(FOLDER),
                  expected=expected, logits=np.load(FOLDER / expected["logits_file"]))


def test_prompt_logits_match_transformers(g):
    logits = g.model.forward(np.array(g.expected["prompt_ids"]), g.model.new_cache(), g.moe)
    assert logits.dtype == np.float32 and logits.shape == g.logits.shape
    assert rel(logits, g.logits) < LOGITS_RTOL
    assert (logits.argmax(axis=1) == g.logits.argmax(axis=1)).all()


def test_greedy_16_tokens_match_generate(g):
    # 8 + 16 positions: the sliding layers' window of 4 is crossed many times over
    assert greedy_generate(g.model, g.expected["prompt_ids"], 16, g.moe) == g.expected["greedy_ids"]


@pytest.mark.parametrize("chunks", [(5, 3), (2, 7, 6), (1, 1, 9)])
def test_chunked_prefill_and_decode_over_the_bounded_cache_equal_one_shot(g, chunks):
    """Chunks of several rows starting anywhere (longer than the window too), then one token a step: every
    position as in one forward over the whole sequence, which sees no cache at all."""
    model = g.model
    seq = np.array(g.expected["prompt_ids"] + g.expected["greedy_ids"])
    one_shot = model.forward(seq, model.new_cache(), g.moe)  # (24, vocab)
    cache, parts, at = model.new_cache(), [], 0
    for n in chunks:
        parts.append(model.forward(seq[at:at + n], cache, g.moe))
        at += n
    parts += [model.forward(seq[i:i + 1], cache, g.moe) for i in range(at, len(seq))]
    stepped = np.concatenate(parts)
    assert rel(stepped, one_shot) < CACHE_RTOL
    assert (stepped.argmax(axis=1) == one_shot.argmax(axis=1)).all()
    # the sliding layers (0, 2) hold the last window-1 = 3 positions, the full layer (1) all of them
    spec = model.spec
    assert cache.length == 24 and [cache.first(i) for i in range(3)] == [21, 0, 21]
    assert [len(cache.past(i)[0]) for i in range(3)] == [3, 24, 3]
    np.testing.assert_array_equal(cache.past(0)[0].shape[1:], (spec.n_kv_heads, spec.head_dim))


def test_sequences_at_different_positions_step_together(g):
    model = g.model
    prompts = [[5, 9], [3, 4, 5, 6, 7, 8, 9], g.expected["prompt_ids"]]
    caches = [model.new_cache() for _ in prompts]
    tokens = [[int(np.argmax(lg[-1]))] for lg in drive(
        model.run_batch([(np.array(p), c) for p, c in zip(prompts, caches, strict=True)], last_only=True), g.moe)]
    for _ in range(7):
        step = model.run_batch([(np.array(t[-1:]), c) for t, c in zip(tokens, caches, strict=True)], last_only=True)
        for t, lg in zip(tokens, drive(step, g.moe), strict=True):
            t.append(int(np.argmax(lg[-1])))
    assert tokens == [greedy_generate(model, p, 8, g.moe) for p in prompts]
    assert tokens[2] == g.expected["greedy_ids"][:8]


def test_a_long_generation_keeps_the_sliding_layers_memory_flat(g):
    """Every layer sliding: the cache's bytes stop growing once its buffers are full, however long it runs."""
    spec = dataclasses.replace(g.model.spec, sliding_layers=(0, 1, 2))
    model = WholeModel(DenseWeights(spec=spec, tensors=g.dense.tensors))
    seq = np.random.default_rng(5).integers(2, spec.vocab_size, 40)
    cache, sizes, stepped = model.new_cache(), [], []
    for i in range(len(seq)):
        stepped.append(model.forward(seq[i:i + 1], cache, g.moe)[0])
        sizes.append(cache.nbytes)
    assert len(set(sizes[10:])) == 1 and sizes[-1] == KVCache.bytes_for(spec, len(seq))
    # and still exact: 40 positions, each decoded over a cache of the last 3
    one_shot = model.forward(seq, model.new_cache(), g.moe)
    assert rel(np.array(stepped), one_shot) < CACHE_RTOL


def test_window_rows_keep_the_last_rows_in_bounded_memory():
    rows = _WindowRows((2,), keep=3)
    appended = np.zeros((0, 2), dtype=np.float32)
    for n in [1, 2, 5, 1, 1, 1, 1, 4, 2, 1, 1, 1, 1, 1, 7, 1]:
        chunk = np.random.default_rng(n + len(appended)).standard_normal((n, 2)).astype(np.float32)
        rows.append(chunk)
        appended = np.concatenate([appended, chunk])
        np.testing.assert_array_equal(rows.view(), appended[-3:])
        assert rows.nbytes <= 2 * 3 * 2 * 4
    none = _WindowRows((2,), keep=0)  # sliding_window 1: a query sees only itself
    none.append(np.ones((3, 2), dtype=np.float32))
    assert none.view().shape == (0, 2)


def test_bytes_for_counts_the_bound(g):
    spec = g.model.spec  # 2 kv heads · 16 dims, k and v: 256 bytes per position and layer
    for positions in (0, 1, 3, 6, 7, 50):
        assert KVCache.bytes_for(spec, positions) == g.model.new_cache(positions).nbytes
    # past 2·(window-1) = 6 positions only the full layer grows
    assert KVCache.bytes_for(spec, 51) - KVCache.bytes_for(spec, 50) == 256
    assert KVCache.bytes_for(spec, 50) == 256 * (50 + 2 * 6)
    published = spec_from_config(json.loads((FIXTURES.parent / "configs" / "openai_gpt-oss-120b.json").read_text()),
                                 model_id="gpt-oss-120b")
    per_row = 2 * 8 * 64 * 4
    assert KVCache.bytes_for(published, 4096) == per_row * (18 * 4096 + 18 * 254)  # not 36 · 4096


def test_dense_tensors_are_attention_norms_embeddings_and_head_only(g):
    shapes = dense_tensor_shapes(g.model.spec)
    assert not any(".mlp." in n for n in shapes)  # router and experts go to the network
    p = "model.layers.1.self_attn."
    assert {n: shapes[n] for n in shapes if n.startswith(p)} == {
        p + "q_proj.weight": (64, 64), p + "k_proj.weight": (32, 64), p + "v_proj.weight": (32, 64),
        p + "o_proj.weight": (64, 64), p + "q_proj.bias": (64,), p + "k_proj.bias": (32,), p + "v_proj.bias": (32,),
        p + "o_proj.bias": (64,), p + "sinks": (4,)}
    assert len(shapes) == 1 + 3 * (2 + 9) + 2  # embed, per layer 2 norms + attention, final norm, lm_head
    assert shapes["lm_head.weight"] == (256, 64)


def test_the_mxfp4_checkpoint_has_the_same_dense_part_and_expert_weights():
    """gpt_oss_mxfp4 stores the experts' weights as the published checkpoints do: the dense part reads the
    same (U8 tensors are never touched), and the blocks decode to the F32 folder's parameters."""
    with CheckpointReader.open(FOLDER) as reader:
        spec = spec_from_config(reader.config, model_id="gpt_oss")
        plain = load_dense_weights(reader, spec).tensors
    with CheckpointReader.open(FIXTURES / "gpt_oss_mxfp4") as reader:
        assert reader.config["quantization_config"]["quant_method"] == "mxfp4"
        packed = load_dense_weights(reader, spec_from_config(reader.config, model_id="gpt_oss")).tensors
    assert plain.keys() == packed.keys() and all(np.array_equal(plain[n], packed[n]) for n in plain)
    f32, u8 = fixture_tensors(FOLDER), fixture_tensors(FIXTURES / "gpt_oss_mxfp4")
    for layer in range(3):
        p = f"model.layers.{layer}.mlp.experts."
        # hub orientation [E, rows_out, cols_in/32, 16]; transformers' parameter is [E, cols_in, rows_out]
        for name, shape in (("gate_up_proj", (8, 64, 2)), ("down_proj", (8, 64, 1))):
            assert u8[p + name + "_blocks"].shape == (*shape, 16) and u8[p + name + "_scales"].shape == shape
            decoded = dequantize_hub(u8[p + name + "_blocks"], u8[p + name + "_scales"]).transpose(0, 2, 1)
            np.testing.assert_array_equal(decoded, f32[p + name])
        assert p + "gate_up_proj" not in u8 and np.array_equal(u8[p + "down_proj_bias"], f32[p + "down_proj_bias"])
