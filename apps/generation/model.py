"""The whole model with its MoE blocks outside: a sans-I/O forward and greedy generation.

Pure module (numpy, f32). The router holds the dense part (apps/generation/weights.py) and runs every
decoder layer here; at each MoE layer the forward stops and hands the post-attention-normed hidden
states out, and resumes with the MoE block's output (routed experts weighted by the gate plus the
shared experts: what ExpertRuntime.forward_local or the distributed forward returns). One layer::

    h ─┬─ input_layernorm ─ attention (KV cache) ─(+)─┬─ post_attention_layernorm ─ FFN ─(+)─ h'
       └──────────────────────────────────────────────┘└─────────────────────────────────┘
                                         FFN = dense SwiGLU here, or  yield (layer, x) / send(y)

Final: logits = lm_head(norm(h)) (embed_tokens when tie_word_embeddings). Every step is the math of
transformers' Qwen3MoeForCausalLM / DeepseekV3ForCausalLM / Glm4MoeForCausalLM / GptOssForCausalLM
(apps/generation/attention.py for attention).

The generator form (`WholeModel.run`) lets an asyncio caller await the network between layers
without this module knowing about I/O; `forward` drives it with a plain callable. `run_batch` steps
several sequences at once (continuous batching): their rows share every matrix product and each MoE
call, each attends over its own KV cache.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any

import numpy as np

from apps.generation.attention import (
    GqaWeights,
    MlaWeights,
    gqa_weights,
    linear,
    mla_weights,
    rms_norm,
    self_attention,
)
from apps.generation.rope import RopeTables
from apps.generation.spec import TransformerSpec
from apps.generation.weights import DenseWeights, dense_tensor_shapes

MoeStep = Generator[tuple[int, np.ndarray], np.ndarray, np.ndarray]


class _Rows:
    """A growable f32 array [n, *row_shape]; capacity doubles so appending T rows one by one copies O(T)."""

    def __init__(self, row_shape: tuple[int, ...], capacity: int = 0) -> None:
        self._data = np.empty((capacity, *row_shape), dtype=np.float32)
        self.n = 0

    def view(self) -> np.ndarray:
        return self._data[: self.n]

    def append(self, rows: np.ndarray) -> None:
        need = self.n + rows.shape[0]
        if need > self._data.shape[0]:
            grown = np.empty((max(need, 2 * self._data.shape[0], 16), *self._data.shape[1:]), dtype=np.float32)
            grown[: self.n] = self._data[: self.n]
            self._data = grown
        self._data[self.n: need] = rows
        self.n = need

    @property
    def nbytes(self) -> int:
        return self._data.nbytes


class _WindowRows:
    """The last `keep` rows appended (f32 [<= keep, *row_shape]) in a buffer of at most 2·keep rows: the
    slack lets appends go without moving rows but once every keep rows or so, and the memory stays flat
    however many rows come."""

    def __init__(self, row_shape: tuple[int, ...], keep: int, capacity: int = 0) -> None:
        self.keep = keep
        self._data = np.empty((min(capacity, self.limit(keep)), *row_shape), dtype=np.float32)
        self._lo = self._hi = 0  # the kept rows are _data[_lo:_hi]

    @staticmethod
    def limit(keep: int) -> int:
        return 2 * keep

    def view(self) -> np.ndarray:
        return self._data[self._lo: self._hi]

    def append(self, rows: np.ndarray) -> None:
        rows = rows[max(rows.shape[0] - self.keep, 0):]  # a chunk longer than keep: only its tail stays
        new = rows.shape[0]
        if self._hi + new > self._data.shape[0]:
            # out of room: the rows still needed (the last keep - new) move to the front, of a larger
            # buffer while it is under its limit
            live = min(self._hi - self._lo, self.keep - new)
            size = min(self.limit(self.keep), max(2 * self._data.shape[0], 16, live + new))
            data = self._data if size <= self._data.shape[0] else \
                np.empty((size, *self._data.shape[1:]), dtype=np.float32)
            data[:live] = self._data[self._hi - live: self._hi]  # numpy copies overlapping ranges safely
            self._data, self._lo, self._hi = data, 0, live
        self._data[self._hi: self._hi + new] = rows
        self._hi += new
        self._lo = max(self._lo, self._hi - self.keep)

    @property
    def nbytes(self) -> int:
        return self._data.nbytes


class KVCache:
    """Per-layer cached attention entries of positions [first(layer), length) (see
    apps/generation/attention.py): GQA keeps k and v [T, n_kv_heads, head_dim]; MLA keeps the kv latent
    [T, kv_lora_rank] and the roped shared key [T, qk_rope_head_dim]. Grows only through WholeModel.run,
    all layers at once. A full-attention layer keeps every position (first 0); a sliding layer of window
    W keeps only the last W-1, all a later query can see (as transformers' DynamicSlidingWindowLayer),
    so its memory stays flat however long the generation. `capacity` positions are allocated at once (a
    generation's prompt and max_new_tokens: the bytes it was admitted for, never copied as it grows);
    past them a full layer doubles."""

    def __init__(self, spec: TransformerSpec, capacity: int = 0) -> None:
        self.spec = spec
        shapes = self.row_shapes(spec)

        def rows(shape: tuple[int, ...], window: int | None) -> _Rows | _WindowRows:
            return _Rows(shape, capacity) if window is None else _WindowRows(shape, window - 1, capacity)

        self._layers = [(rows(shapes[0], spec.window(i)), rows(shapes[1], spec.window(i)))
                        for i in range(spec.n_layers)]
        self._length = 0

    @staticmethod
    def row_shapes(spec: TransformerSpec) -> tuple[tuple[int, ...], tuple[int, ...]]:
        if spec.attention == "gqa":
            return (spec.n_kv_heads, spec.head_dim), (spec.n_kv_heads, spec.v_head_dim)
        return (spec.kv_lora_rank,), (spec.qk_rope_head_dim,)

    @classmethod
    def bytes_for(cls, spec: TransformerSpec, positions: int) -> int:
        """Bytes a cache of `positions` positions holds (f32, every layer; a sliding layer's rows are
        bounded by its buffer's limit): what KVCache(spec, capacity=positions) allocates, and the most it
        holds while its length stays within `positions`."""
        a, b = cls.row_shapes(spec)
        rows = sum(positions if (w := spec.window(i)) is None else min(positions, _WindowRows.limit(w - 1))
                   for i in range(spec.n_layers))
        return 4 * rows * (int(np.prod(a)) + int(np.prod(b)))

    @property
    def length(self) -> int:
        return self._length

    @property
    def nbytes(self) -> int:
        """Bytes allocated (capacity, which runs ahead of length by at most 2x)."""
        return sum(a.nbytes + b.nbytes for a, b in self._layers)

    def past(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """`layer`'s cached entries of positions first(layer) .. length-1, oldest first."""
        a, b = self._layers[layer]
        return a.view(), b.view()

    def first(self, layer: int) -> int:
        """The position of `layer`'s oldest cached entry: 0, or later on a sliding layer."""
        return self._length - self._layers[layer][0].view().shape[0]

    def _commit(self, rows: list[tuple[np.ndarray, np.ndarray]]) -> None:
        # every layer's rows at once, after the whole step succeeded: an abandoned or failed step
        # (a MoE call that raised) leaves the cache exactly as it was
        for (a, b), (ra, rb) in zip(self._layers, rows, strict=True):
            a.append(ra)
            b.append(rb)
        self._length += rows[0][0].shape[0]


def _silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(-x) overflows to inf for x < -88: silu -> -0, as torch
        return x / (1.0 + np.exp(-x))


class WholeModel:
    """The dense part of one model, ready to run. Stateless between calls: state lives in KVCache."""

    def __init__(self, weights: DenseWeights) -> None:
        spec = weights.spec
        want = dense_tensor_shapes(spec)
        missing = [n for n in want if n not in weights.tensors]
        wrong = [n for n, s in want.items() if n in weights.tensors and weights.tensors[n].shape != s]
        if missing or wrong:
            raise ValueError(f"dense weights of {spec.model_id} do not fit its spec: missing {missing[:5]}, "
                             f"wrong shape {wrong[:5]}")
        self.spec = spec
        t = {n: np.ascontiguousarray(weights.tensors[n], dtype=np.float32) for n in want}
        self._embed = t["model.embed_tokens.weight"]  # (vocab, d_model)
        self._lm_head = self._embed if spec.tie_word_embeddings else t["lm_head.weight"]  # (vocab, d_model)
        self._norm = t["model.norm.weight"]
        self._rope = RopeTables(spec.rope)
        prepare = gqa_weights if spec.attention == "gqa" else mla_weights
        self._attn: list[GqaWeights | MlaWeights] = [prepare(spec, t, i) for i in range(spec.n_layers)]
        self._ln = [(t[f"model.layers.{i}.input_layernorm.weight"],
                     t[f"model.layers.{i}.post_attention_layernorm.weight"]) for i in range(spec.n_layers)]
        self._mlp = {i: tuple(t[f"model.layers.{i}.mlp.{p}_proj.weight"] for p in ("gate", "up", "down"))
                     for i in range(spec.n_layers) if not spec.is_moe(i)}

    def new_cache(self, capacity: int = 0) -> KVCache:
        return KVCache(self.spec, capacity)

    def _check_ids(self, token_ids: np.ndarray | Sequence[int]) -> np.ndarray:
        ids = np.asarray(token_ids)
        if ids.ndim != 1 or ids.size == 0:
            raise ValueError(f"token_ids must be a non-empty 1-D sequence of ids, received shape {ids.shape}")
        if ids.dtype.kind not in "iu":
            raise ValueError(f"token_ids must be integers, received dtype {ids.dtype}")
        bad = ids[(ids < 0) | (ids >= self.spec.vocab_size)]
        if bad.size:
            raise ValueError(f"token id {int(bad[0])} out of range 0..{self.spec.vocab_size - 1} "
                             f"({bad.size} id(s) out of range)")
        return ids.astype(np.int64)

    def _check_moe_output(self, layer: int, y: object, t: int) -> np.ndarray:
        try:
            arr = np.asarray(y, dtype=np.float32)
        except (TypeError, ValueError):
            raise ValueError(f"MoE output of layer {layer} must be a float array [t, d_model], received "
                             f"{type(y).__name__}") from None
        if arr.shape != (t, self.spec.d_model):
            raise ValueError(f"MoE output of layer {layer} has shape {arr.shape}, expected {(t, self.spec.d_model)}")
        if not np.isfinite(arr).all():
            raise ValueError(f"MoE output of layer {layer} holds {int((~np.isfinite(arr)).sum())} NaN/inf value(s)")
        return arr

    def run(self, token_ids: np.ndarray, cache: KVCache, *, last_only: bool = False) -> MoeStep:
        """sans-I/O forward of token_ids int [t] at positions cache.length .. cache.length+t-1.

        Yields (layer, x f32 [t, d_model]) at each MoE layer (x: the post-attention-normed hidden
        states; [1, d_model], the last position, at the last layer when `last_only`) and expects the
        MoE block's output y of x's shape sent back. Returns logits
        f32 [t, vocab], or [1, vocab] (the last position) when `last_only`. The cache grows by t
        positions only when the generator returns. ValueError for bad ids, a cache of another model,
        or a y of the wrong shape or with NaN/inf.
        """
        return (yield from self.run_batch([(token_ids, cache)], last_only=last_only))[0]

    def run_batch(self, items: Sequence[tuple[np.ndarray | Sequence[int], KVCache]], *, last_only: bool = False
                  ) -> Generator[tuple[int, np.ndarray], np.ndarray, list[np.ndarray]]:
        """`run` of several sequences at once, each (token_ids int [t_i], its own cache): continuous batching.

        Their rows go through every row-wise part together (embedding, norms, projections, dense FFN,
        LM head: one matrix product for all) and each attends over its own cache only. Yields
        (layer, x f32 [Σ t_i, d_model]) at each MoE layer, the sequences' rows stacked in order ([1, d]
        each at the last layer when `last_only`), and expects y of x's shape back. Returns each
        sequence's logits, as `run` would. No cache grows unless the whole step completes.
        """
        if not items:
            return []
        if len({id(cache) for _, cache in items}) != len(items):
            raise ValueError("a batch holds each sequence once: the same cache was given twice")
        for _, cache in items:
            if not isinstance(cache, KVCache) or cache.spec != self.spec:
                raise ValueError("cache was not made by this model's new_cache()")
        ids = [self._check_ids(token_ids) for token_ids, _ in items]
        spec, sizes = self.spec, [len(i) for i in ids]
        bounds = np.cumsum([0, *sizes])  # sequence i's rows are bounds[i] .. bounds[i+1]-1
        h = self._embed[np.concatenate(ids)]  # (n, d_model)
        new_rows: list[tuple[np.ndarray, np.ndarray]] = []
        for layer in range(spec.n_layers):
            ln_in, ln_post = self._ln[layer]
            x = rms_norm(h, ln_in, spec.rms_norm_eps)
            segments = [(cache.length, t, *cache.past(layer)) for (_, cache), t in zip(items, sizes, strict=True)]
            a, ra, rb = self_attention(spec, self._attn[layer], self._rope, x, segments)
            new_rows.append((ra, rb))
            h = h + a
            if last_only and layer == spec.n_layers - 1:
                # Every position's keys and values are in the cache now; only each sequence's last row goes
                # on to the logits, so the last FFN (a whole network round for an MoE layer) sees those alone.
                h = h[bounds[1:] - 1]
            x = rms_norm(h, ln_post, spec.rms_norm_eps)
            if layer in self._mlp:
                gate, up, down = self._mlp[layer]
                y = linear(_silu(linear(x, gate)) * linear(x, up), down)
            else:
                y = self._check_moe_output(layer, (yield layer, np.ascontiguousarray(x)), len(x))
            h = h + y
        for i, (_, cache) in enumerate(items):
            cache._commit([(ra[bounds[i]:bounds[i + 1]], rb[bounds[i]:bounds[i + 1]]) for ra, rb in new_rows])
        logits = linear(rms_norm(h, self._norm, spec.rms_norm_eps), self._lm_head)
        return list(logits[:, None, :]) if last_only else np.split(logits, bounds[1:-1])

    def forward(self, token_ids: np.ndarray, cache: KVCache, moe: Callable[[int, np.ndarray], np.ndarray],
                *, last_only: bool = False) -> np.ndarray:
        """run() driven synchronously: moe(layer, x f32 [t, d_model]) -> y f32 [t, d_model]."""
        return drive(self.run(token_ids, cache, last_only=last_only), moe)


def drive(steps: Generator[tuple[int, np.ndarray], np.ndarray, Any], moe: Callable[[int, np.ndarray], np.ndarray]
          ) -> Any:
    """A sans-I/O run (WholeModel.run or run_batch) to its end, each MoE layer by moe(layer, x)."""
    try:
        layer, x = next(steps)
        while True:
            layer, x = steps.send(moe(layer, x))
    except StopIteration as done:
        return done.value


def greedy_generate(model: WholeModel, prompt_ids: Sequence[int], max_new_tokens: int,
                    moe: Callable[[int, np.ndarray], np.ndarray]) -> list[int]:
    """max_new_tokens ids by argmax (ties to the lower id): the prompt in one prefill, then one token a step
    through the KV cache. No stop token: the caller trims at its end-of-sequence id."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int | np.integer) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative integer, received {max_new_tokens!r}")
    prompt = model._check_ids(list(prompt_ids) if not isinstance(prompt_ids, np.ndarray) else prompt_ids)
    if max_new_tokens == 0:
        return []
    cache = model.new_cache()
    logits = model.forward(prompt, cache, moe, last_only=True)
    out = [int(np.argmax(logits[-1]))]  # np.argmax returns the first maximum: the lower id on a tie
    while len(out) < max_new_tokens:
        logits = model.forward(np.array([out[-1]]), cache, moe, last_only=True)
        out.append(int(np.argmax(logits[-1])))
    return out


__all__ = ["KVCache", "WholeModel", "drive", "greedy_generate"]
