"""JSON-RPC/REST of whole-model generation.

`tenzro_moeLoadDense` and `tenzro_moeGenerate` change the node (they fill its memory; a
generation pays the holders it uses), so they need the operator token and go to the expert
worker over the operator door. The records of generations are open reads.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import Annotated, Any, Literal

from asgiref.sync import sync_to_async
from django.conf import settings
from ninja import Field

from apps.api.b64 import b64_encode, base64_field
from apps.api.registry import rpc_method
from apps.api.schemas import DB_INT_MAX, Int, Out, Params, QueryParams, bounded_int
from apps.catalog.selectors import default_checkpoint
from apps.generation import selectors
from apps.worker.client import worker_call
from core.errors import InvalidInput

_MODEL_ID = {"min_length": 1, "max_length": 200}
TokenId = bounded_int(0, DB_INT_MAX)  # whether it is in the model's vocabulary only the worker knows
WAIT_POLL_S = 0.1  # how often a waiting tenzro_moeGenerate reads the record


class LoadDenseParams(Params):
    model_id: str = Field(**_MODEL_ID)
    checkpoint: str | None = Field(None, min_length=1, max_length=4096, description=(
        "A local folder or an http(s) URL of a Hugging Face-layout checkpoint; default: the catalog's source."))


class LoadDenseOut(Out):
    model_id: str
    family: str
    checkpoint: str
    n_layers: int
    moe_layers: list[int]
    vocab_size: int
    d_model: int
    dense_bytes: int = Field(description="Bytes of f32 dense weights now held in this router's memory.")
    gates_loaded: int = Field(description="MoE layers whose gate was loaded from the checkpoint.")
    eos_token_ids: list[int]
    context_length: int | None = Field(description="The model's max_position_embeddings: prompt and new tokens.")
    text: bool = Field(description="The checkpoint's tokenizer.json was read: prompts may be text (and /v1 serves it).")
    chat_template: bool = Field(description="Its tokenizer_config.json has a chat template: chat completions work.")
    no_text_reason: str | None = Field(description="Why text is not served (no or a broken tokenizer.json).")
    elapsed_ms: float


class ChatMessage(Params):
    role: str = Field(min_length=1, max_length=64)
    content: str = Field(max_length=1_000_000)


class SamplingIn(Params):
    """How each token is chosen (docs/openai.md, "Sampling"); absent: greedy."""

    temperature: float | None = Field(None, ge=0.0, le=2.0, description="0: greedy (the largest logit).")
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: bounded_int(0, DB_INT_MAX) | None = Field(None, description="0: off.")
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    seed: bounded_int(0, 2**63 - 1) | None = Field(None, description="The same seed and prompt give the same tokens.")
    use_model_defaults: bool = Field(False, description="Fill what is not given from generation_config.json.")


class GenerateParams(Params):
    model_id: str = Field(**_MODEL_ID)
    prompt_ids: list[TokenId] | None = Field(None, min_length=1,
                                             max_length=settings.TENZRO_GENERATE_MAX_PROMPT_TOKENS,
                                             description="The prompt's token ids; or prompt, or messages.")
    prompt: str | None = Field(None, min_length=1, max_length=1_000_000,
                               description="The prompt as text, encoded with the model's tokenizer.")
    messages: list[ChatMessage] | None = Field(None, min_length=1, max_length=512,
                                               description="A chat, rendered with the model's chat template.")
    sampling: SamplingIn | None = None
    stop: list[Annotated[str, Field(min_length=1, max_length=200)]] | None = Field(
        None, max_length=4, description="Strings that end the completion (not included).")
    max_new_tokens: Int = Field(16, ge=1, le=settings.TENZRO_GENERATE_MAX_NEW_TOKENS,
                                description="At most TENZRO_GENERATE_MAX_NEW_TOKENS.")
    allow_partial: bool = Field(False, description="Accept a layer whose lost experts' gate mass is renormalized "
                                                   "away, instead of failing the generation.")
    wire: Literal["q8_0", "f32"] | None = Field(None, description="Activation codec on the wire; default: "
                                                                  "TENZRO_ACTIVATION_CODECS, Q8_0 first.")
    stop_at_eos: bool = Field(True, description="End at the config's eos_token_id, as transformers' generate does.")
    deadline_s: float | None = Field(None, gt=0, le=settings.TENZRO_GENERATE_DEADLINE_S, description=(
        "Seconds from the request until the generation must have ended, waiting for admission included (default "
        "and at most TENZRO_GENERATE_DEADLINE_S); past it, it fails with deadline_exceeded, its tokens kept."))
    wait: bool = Field(True, description="Answer when the generation ends (or after TENZRO_GENERATE_WAIT_S, "
                                         "still running); false answers at once with its id.")


class LayerStep(Out):
    layer: int
    batch: int = Field(1, description="Generations whose rows this layer's forward carried (continuous batching: "
                                      "they shared the iteration).")
    ms: float
    dispatch_ms: float | None = Field(None, description="Of ms, the dispatch to the holders and the combine; the "
                                                        "rest is gating, readahead and planning.")
    hedges_fired: int | None = Field(None, description="Batches whose backup was raced against a stalled primary.")
    hedges_won: int | None = Field(None, description="Of those, the backup answered first.")
    lost_gate_mass: float | None
    missing: int
    failures: int
    holders: list[dict[str, Any]] = Field(description=(
        "[{provider, transport, rows, batches, latency_ms_max, compute_ms}]: the layer's fan-out; compute_ms: "
        "the compute its answers reported, summed."))


class Step(Out):
    index: int
    phase: Literal["prefill", "decode"]
    tokens_in: int
    token: int
    ms: float
    dense_ms: float | None = Field(None, description="The step's dense part (embedding, attention, norms, dense "
                                                     "FFNs, LM head) as the compute thread timed it; ms minus it and "
                                                     "the MoE layers is hand-off between the loop and that thread.")
    layers: list[LayerStep]


class GenerationOut(Out):
    generation_id: str
    model_id: str
    state: Literal["running", "done", "failed", "cancelled"]
    prompt_ids: list[int]
    max_new_tokens: int
    options: dict[str, Any]
    tokens: list[int]
    text: str = Field(description="The completion's text (a model with a tokenizer), up to any stop string.")
    finish_reason: Literal["stop", "length", "cancelled", "error"] | None
    ttft_ms: float | None = Field(description="Time to the first new token: the prefill.")
    decode_tokens_per_s: float | None
    error: dict[str, str] | None
    created_at: datetime
    finished_at: datetime | None
    steps: list[Step] = Field(default_factory=list)


class ModelForwardParams(Params):
    model_id: str = Field(**_MODEL_ID)
    token_ids: list[TokenId] = Field(min_length=1, max_length=settings.TENZRO_GENERATE_MAX_PROMPT_TOKENS,
                                     description="Token ids at positions 0 … t-1.")
    allow_partial: bool = False
    wire: Literal["q8_0", "f32"] | None = None


class ModelForwardOut(Out):
    model_id: str
    tokens: int
    vocab_size: int
    logits: str = Field(json_schema_extra=base64_field("Little-endian f32 [tokens, vocab_size], base64."))
    layers: list[LayerStep]
    elapsed_ms: float


class GenerationParams(QueryParams):
    generation_id: str = Field(min_length=1, max_length=32)
    steps: bool = Field(True, description="false leaves the steps out: what a client following the tokens polls.")


class GenerationsParams(QueryParams):
    limit: int = Field(20, ge=0, le=500, description="How many of the most recent generations.")


@rpc_method("tenzro_moeLoadDense", rest="/moe/dense/load", tag="moe", params=LoadDenseParams,
            response=LoadDenseOut, errors=(404, 503), operator_only=True)
async def load_dense(params: LoadDenseParams) -> dict[str, Any]:
    """Read a model's non-expert tensors (embeddings, attention, norms, dense FFN layers, LM head)
    into this router's memory with ranged reads, and load every MoE layer's gate from the checkpoint."""
    checkpoint = params.checkpoint or await sync_to_async(default_checkpoint)(params.model_id)
    if not checkpoint:
        raise InvalidInput(f"no checkpoint given and the catalog knows no source of {params.model_id!r}",
                           reason="checkpoint_required")
    result, _ = await worker_call("moe/load_dense", {"model_id": params.model_id, "checkpoint": checkpoint},
                                  timeout_s=settings.TENZRO_LOAD_DENSE_TIMEOUT_S)
    return result


async def generation_begin(params: GenerateParams) -> str:
    """Ask the expert worker to start a generation; its id, once its record exists.

    Shared by tenzro_moeGenerate and the dashboard's form: the schema checked the params' form,
    the worker checks the rest (the dense part is loaded, ids within the vocabulary, not busy)
    and raises the same errors for both."""
    started, _ = await worker_call("moe/generate", params.model_dump(exclude={"wait"}, exclude_none=True))
    return started["generation_id"]


@rpc_method("tenzro_moeGenerate", rest="/moe/generate", tag="moe", params=GenerateParams, response=GenerationOut,
            errors=(404, 429, 503), operator_only=True,
            links={"generation": {"operationId": "tenzro_moeGeneration",
                                  "parameters": {"generation_id": "$response.body#/generation_id"}}})
async def generate(params: GenerateParams) -> dict[str, Any]:
    """Greedy generation over the network: prefill the prompt as one batch, then one token per
    step with the KV cache; every MoE layer runs through the distributed forward."""
    generation_id = await generation_begin(params)
    running = sync_to_async(selectors.generation_running)
    until = time.monotonic() + settings.TENZRO_GENERATE_WAIT_S
    while params.wait and time.monotonic() < until and await running(generation_id=generation_id):
        await asyncio.sleep(WAIT_POLL_S)
    return await sync_to_async(selectors.generation_get)(generation_id=generation_id)


@rpc_method("tenzro_moeModelForward", rest="/moe/model-forward", tag="moe", params=ModelForwardParams,
            response=ModelForwardOut, errors=(404, 503), operator_only=True)
async def model_forward(params: ModelForwardParams) -> dict[str, Any]:
    """One whole-model forward (no KV cache kept): every position's logits, each MoE layer's fan-out."""
    result, body = await worker_call("moe/model_forward", params.model_dump(exclude_none=True),
                                     timeout_s=settings.TENZRO_GENERATE_WAIT_S)
    return {**result, "logits": b64_encode(body)}


@rpc_method("tenzro_moeGeneration", rest="/moe/generation", http_method="GET", tag="moe",
            params=GenerationParams, response=GenerationOut, errors=(404,))
def generation(params: GenerationParams) -> dict[str, Any]:
    """One generation: its tokens so far, state, and each step's per-layer fan-out."""
    return selectors.generation_get(generation_id=params.generation_id, steps=params.steps)


class GenerationsOut(Out):
    generations: list[GenerationOut]


@rpc_method("tenzro_moeGenerations", rest="/moe/generations", http_method="GET", tag="moe",
            params=GenerationsParams, response=GenerationsOut)
def generations(params: GenerationsParams) -> dict[str, Any]:
    """The most recent generations on this router (without their steps)."""
    return {"generations": selectors.generations_recent(limit=params.limit)}


class IterationOut(Out):
    model_id: str
    batch: int = Field(description="Generations that stepped together in this iteration.")
    rows: int = Field(description="Their rows (tokens): 1 per decoding generation, a prefill chunk's tokens.")
    ms: float
    ago_s: float = Field(description="Seconds since it ended.")


class BatchingOut(Out):
    running: int = Field(description="Generations admitted and stepping.")
    queued: int = Field(description="Generations waiting for a slot or KV cache bytes (TENZRO_GENERATE_QUEUE).")
    max_concurrent: int
    kv_bytes: int = Field(description="KV cache bytes the running generations hold (reserved in the memory budget).")
    kv_budget_bytes: int
    tokens_per_s: float = Field(description="Generated tokens per second over the last window_s seconds, all "
                                            "generations together.")
    window_s: float
    iterations: list[IterationOut] = Field(description="The newest iterations, oldest first.")


@rpc_method("tenzro_moeBatching", rest="/moe/batching", http_method="GET", tag="moe", response=BatchingOut,
            errors=(503,))
async def batching() -> dict[str, Any]:
    """This router's continuous batching now: running and waiting generations, KV cache bytes, each recent
    iteration's batch size and the aggregate tokens per second (the dashboard's live view)."""
    result, _ = await worker_call("moe/batching", {})
    return result
