"""Choosing the next token from a step's logits: penalties, temperature, top-k, top-p, min-p, a seeded draw.

Pure module (numpy only). One `Sampler` per generation, fed the logits of each step in order:

    sampler = Sampler(SamplingParams(temperature=0.7, top_p=0.9, seed=7), prompt_ids)
    choice = sampler.choose(logits)        # logits f32 [vocab] -> Choice(token, logprob, top)

The rules, in the order they apply (docs/openai.md, "Sampling"):

1. repetition_penalty r over every token of the prompt and the completion so far (transformers'
   rule: a seen token's logit l becomes l / r if l > 0, else l * r);
2. presence_penalty p and frequency_penalty f over the completion's tokens (OpenAI's rule: a token
   seen c times loses p + c * f);
3. temperature 0: the largest logit, ties to the lower id (numpy's and torch's argmax) — with no
   penalty set, exactly the greedy path of a plain generation, bit for bit;
4. otherwise logits / temperature, then top_k (the k largest; ties at the k-th kept), top_p (the
   smallest set, largest first, whose probability reaches p; the token that crosses p is kept),
   min_p (tokens below min_p x the top probability dropped), each on what the previous left;
5. one uniform draw in [0, 1) from a PCG64 generator seeded with `seed`, over the kept tokens in
   descending probability (ties: lower id first), in float64 — so the same seed, prompt and logits
   give the same tokens on any router.

`logprob` and `top` are the model's own log-probabilities (log-softmax of the raw logits, before
penalties and filters), as OpenAI's `logprobs` report them.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MAX_TOP_LOGPROBS = 20


class SamplingError(ValueError):
    """A sampling parameter out of range; `param` names it (the API reports it as OpenAI's `param`)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None  # None: a fresh one is drawn (and reported, so the generation can be repeated)
    top_logprobs: int | None = None  # None: no log-probabilities; 0 … MAX_TOP_LOGPROBS: the chosen one and that many

    def __post_init__(self) -> None:
        _check(self.temperature, "temperature", 0.0, 2.0)
        _check(self.top_p, "top_p", 0.0, 1.0, low_open=True)
        _check(self.min_p, "min_p", 0.0, 1.0)
        _check(self.repetition_penalty, "repetition_penalty", 0.0, 10.0, low_open=True)
        _check(self.presence_penalty, "presence_penalty", -2.0, 2.0)
        _check(self.frequency_penalty, "frequency_penalty", -2.0, 2.0)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise SamplingError("top_k", f"top_k must be a whole number ≥ 0 (0: off), got {self.top_k!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed < 2**63):
            raise SamplingError("seed", f"seed must be a whole number from 0 to 2^63 - 1, got {self.seed!r}")
        if self.top_logprobs is not None and (isinstance(self.top_logprobs, bool)
                                              or not isinstance(self.top_logprobs, int)
                                              or not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS):
            raise SamplingError("top_logprobs", f"top_logprobs must be a whole number from 0 to {MAX_TOP_LOGPROBS}, "
                                                f"got {self.top_logprobs!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def with_seed(self) -> SamplingParams:
        """These params with a seed: the given one, or a fresh one to report."""
        if self.seed is not None:
            return self
        return dataclasses.replace(self, seed=secrets.randbits(63))


def _check(value: object, name: str, low: float, high: float, *, low_open: bool = False) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and np.isfinite(value) \
        and (low < value if low_open else low <= value) and value <= high
    if not ok:
        raise SamplingError(name, f"{name} must be a number in {'(' if low_open else '['}{low}, {high}], "
                                  f"got {value!r}")


@dataclass(frozen=True)
class Choice:
    token: int
    logprob: float | None  # the model's log-probability of `token`; None unless top_logprobs was asked
    top: list[tuple[int, float]]  # the top_logprobs most likely tokens and theirs, most likely first


class Sampler:
    """The token choices of one generation; see the module docstring for the rules."""

    def __init__(self, params: SamplingParams, prompt_ids: Sequence[int]) -> None:
        self.params = params.with_seed()
        self._rng = np.random.Generator(np.random.PCG64(self.params.seed))
        self._seen = {int(t) for t in prompt_ids}  # for repetition_penalty: prompt and completion
        self._counts: dict[int, int] = {}  # completion tokens, for presence and frequency penalties

    @property
    def seed(self) -> int:
        return int(self.params.seed)  # type: ignore[arg-type]  # with_seed set it

    def choose(self, logits: np.ndarray) -> Choice:
        """The next token from logits f32 [vocab] (not modified)."""
        p = self.params
        scores = self._penalized(logits)
        token = int(np.argmax(scores)) if p.greedy else self._draw(scores)
        self._seen.add(token)
        self._counts[token] = self._counts.get(token, 0) + 1
        if p.top_logprobs is None:
            return Choice(token, None, [])
        logp = _log_softmax(logits)
        top = np.argsort(-logp, kind="stable")[: p.top_logprobs]
        return Choice(token, float(logp[token]), [(int(t), float(logp[t])) for t in top])

    def _penalized(self, logits: np.ndarray) -> np.ndarray:
        p = self.params
        if p.repetition_penalty == 1.0 and not (self._counts and (p.presence_penalty or p.frequency_penalty)):
            return logits
        scores = np.array(logits, dtype=np.float32)
        if p.repetition_penalty != 1.0 and self._seen:
            seen = np.fromiter(self._seen, dtype=np.int64)
            seen = seen[seen < scores.shape[0]]
            values = scores[seen]
            scores[seen] = np.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
        if self._counts and (p.presence_penalty or p.frequency_penalty):
            ids = np.fromiter(self._counts, dtype=np.int64)
            counts = np.fromiter(self._counts.values(), dtype=np.float32)
            keep = ids < scores.shape[0]
            scores[ids[keep]] -= p.presence_penalty + counts[keep] * p.frequency_penalty
        return scores

    def _draw(self, scores: np.ndarray) -> int:
        probs, ids = kept_distribution(scores, self.params)
        u = self._rng.random()
        index = int(np.searchsorted(np.cumsum(probs), u * probs.sum(), side="right"))
        return int(ids[min(index, len(ids) - 1)])


def kept_distribution(scores: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities f64 [m], token ids int64 [m]) that a draw picks from, most likely first (ties: lower
    id first), after temperature, top_k, top_p and min_p; not renormalized (the draw scales by the sum)."""
    z = scores.astype(np.float64) / params.temperature
    order = np.argsort(-z, kind="stable")  # descending, ties to the lower id
    z = z[order]
    if params.top_k and params.top_k < len(z):
        z = z[: int(np.searchsorted(-z, -z[params.top_k - 1], side="right"))]  # ties at the k-th stay
        order = order[: len(z)]
    probs = np.exp(z - z[0])
    probs /= probs.sum()
    if params.top_p < 1.0:
        cut = int(np.searchsorted(np.cumsum(probs), params.top_p, side="left")) + 1  # the one crossing p stays
        probs, order = probs[:cut], order[:cut]
    if params.min_p > 0.0:
        keep = probs >= params.min_p * probs[0]
        probs, order = probs[keep], order[keep]
    return probs, order


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z = z - z.max()
    return z - np.log(np.exp(z).sum())
