"""Write the whole-model generation fixtures: tiny random-weight MoE models and their transformers outputs.

The fixtures (tests/fixtures/generation/<name>/) are checked in; this script is how they were made and how
to remake them. It needs torch and transformers, which the node never imports, so it runs in its own venv:

    python3 -m venv /work/genenv && /work/genenv/bin/pip install torch==2.13.0 transformers==5.24.0 safetensors
    /work/genenv/bin/python scripts/make_generation_fixtures.py [--out tests/fixtures/generation]

Per model it writes:
  config.json        the keys a Hugging Face hub config.json of that family has (Qwen/Qwen3-30B-A3B,
                     deepseek-ai/DeepSeek-V3: ``num_experts``, ``rope_theta`` + ``rope_scaling`` with
                     ``type: yarn``), not the 5.x save_pretrained spelling (``num_local_experts``,
                     ``rope_parameters``), so the node reads the config the hub serves.
  model.safetensors  F32, hub tensor names: per-expert ``mlp.experts.{E}.{gate,up,down}_proj.weight`` unfused
                     from transformers 5.x's 3-D ``experts.gate_up_proj`` / ``experts.down_proj`` (gate is
                     the first moe_intermediate_size rows of gate_up, as ``.chunk(2, dim=-1)`` splits it).
                     glm4_moe and both gpt_oss folders are sharded as the hub serves large models instead:
                     ``model-0000i-of-0000n.safetensors`` plus ``model.safetensors.index.json``, split by
                     huggingface_hub's own rule (split_torch_state_dict_into_shards) at SHARD_BYTES, so a
                     layer's tensors lie in more than one file.
  expected.json      prompt ids, greedy ids of ``generate(do_sample=False, max_new_tokens=16)``, versions.
  logits.npy         f32 [prompt_len, vocab]: one forward over the prompt.

gpt_oss (openai/gpt-oss-120b's keys, run with transformers' eager attention and experts) is written twice:
  gpt_oss/           the fused hub experts as transformers' own F32 parameters: ``mlp.experts.gate_up_proj``
                     [E, d_model, 2·d_ff] (gate and up interleaved on the last axis), ``gate_up_proj_bias``,
                     ``down_proj`` [E, d_ff, d_model], ``down_proj_bias``; ``mlp.router.weight``/``.bias``;
                     ``self_attn.sinks``. The experts' weight matrices lie exactly on the MXFP4 grid.
  gpt_oss_mxfp4/     the same, but the experts' weights as the published checkpoints store them:
                     ``*_blocks`` u8 [E, rows_out, cols_in/32, 16] and ``*_scales`` u8 [E, rows_out, cols_in/32]
                     (core/quantization/mxfp4.py quantize_hub), with the published quantization_config;
                     transformers' convert_moe_packed_tensors must decode them to the first folder's weights.
Its checks add: the swiglu clamp fires (counted), and sinks, biases, the clamp and the sliding window each
move the logits.

Checks before writing (the script fails rather than write a fixture a float32 port could not match):
reloading the folder with ``from_pretrained`` gives bit-identical logits; every argmax (each prompt position,
each greedy step) beats the runner-up by MARGIN of the logit scale; every router decision (top-k, and
DeepSeek's top groups) beats the next candidate by ROUTER_MARGIN, so f32 rounding cannot flip an expert.
Weights are drawn from numpy with fixed seeds (not torch's init), scaled ~1/sqrt(fan_in) so the logits
are far from uniform. The tensors are the same bytes on any machine; logits.npy may differ in the last bits
with the CPU torch's kernels run on (1.7e-6 at most between an AVX2 and an AVX-512 machine).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from huggingface_hub import split_torch_state_dict_into_shards
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from core.quantization.mxfp4 import dequantize_hub, quantize_hub  # noqa: E402  (pure numpy, no Django)

MARGIN = 1e-3  # top-1 minus top-2 logit, relative to max |logit| of that row
ROUTER_MARGIN = 1e-4  # gap between the last chosen and the first unchosen router score (probability units)
NEW_TOKENS = 16
PROMPT_LEN = 8

QWEN3_MOE: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1,
    "decoder_sparse_step": 1, "head_dim": 16, "hidden_act": "silu", "hidden_size": 64,
    "initializer_range": 0.02, "intermediate_size": 96, "max_position_embeddings": 256, "max_window_layers": 3,
    "mlp_only_layers": [], "moe_intermediate_size": 32, "norm_topk_prob": True, "num_attention_heads": 4,
    "num_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 3, "num_key_value_heads": 2,
    "output_router_logits": False, "rms_norm_eps": 1e-6, "rope_scaling": None, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001, "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "float32",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 256,
}

DEEPSEEK_V3: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1,
    "ep_size": 1, "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 64,
    "initializer_range": 0.02, "intermediate_size": 96, "kv_lora_rank": 32, "max_position_embeddings": 256,
    "moe_intermediate_size": 32, "moe_layer_freq": 1, "n_group": 4, "n_routed_experts": 8, "n_shared_experts": 1,
    "norm_topk_prob": True, "num_attention_heads": 4, "num_experts_per_tok": 2, "num_hidden_layers": 3,
    "num_key_value_heads": 4, "num_nextn_predict_layers": 0, "q_lora_rank": 48, "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8, "rms_norm_eps": 1e-6,
    # DeepSeek-V3's keys; mscale_all_dim differs from mscale (V3 has 1.0 and 1.0) so that YaRN's cos/sin
    # attention_factor is not 1 and both mscale paths are exercised.
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.8,
                     "original_max_position_embeddings": 64, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": False,
    "topk_group": 2, "topk_method": "noaux_tc", "torch_dtype": "float32", "use_cache": True, "v_head_dim": 16,
    "vocab_size": 256,
}

# GLM-4.5's keys (zai-org/GLM-4.5 config.json): q/k/v biases, RoPE on half of each head
# (partial_rotary_factor 0.5), no q/k norm, DeepSeek-style routing with shared experts and a dense
# first layer; n_group 2 (the hub has 1) so that the group-limited choice is exercised too.
GLM4_MOE: dict[str, Any] = {
    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
    "attention_bias": True, "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1,
    "first_k_dense_replace": 1, "head_dim": 16, "hidden_act": "silu", "hidden_size": 64,
    "initializer_range": 0.02, "intermediate_size": 96, "max_position_embeddings": 256,
    "moe_intermediate_size": 32, "n_group": 2, "n_routed_experts": 8, "n_shared_experts": 1,
    "norm_topk_prob": True, "num_attention_heads": 4, "num_experts_per_tok": 2, "num_hidden_layers": 3,
    "num_key_value_heads": 2, "num_nextn_predict_layers": 0, "partial_rotary_factor": 0.5,
    "rms_norm_eps": 1e-5, "rope_scaling": None, "rope_theta": 1000000, "routed_scaling_factor": 2.5,
    "tie_word_embeddings": False, "topk_group": 1, "torch_dtype": "float32", "use_cache": True,
    "use_qk_norm": False, "vocab_size": 256,
}

# openai/gpt-oss-120b's keys, shrunk: sliding_window 4 so that the 8-token prompt and 16 new tokens cross it
# on the sliding layers; YaRN as published (truncate false) with factor 4 over 64 positions.
GPT_OSS: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
    "attention_bias": True, "attention_dropout": 0.0, "eos_token_id": 1, "experts_per_token": 2, "head_dim": 16,
    "hidden_act": "silu", "hidden_size": 64, "initial_context_length": 64, "initializer_range": 0.02,
    "intermediate_size": 32, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    "max_position_embeddings": 256, "num_attention_heads": 4, "num_experts_per_tok": 2, "num_hidden_layers": 3,
    "num_key_value_heads": 2, "num_local_experts": 8, "output_router_logits": False, "pad_token_id": 0,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 4.0, "original_max_position_embeddings": 64,
                     "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 4, "swiglu_limit": 7.0,
    "tie_word_embeddings": False, "use_cache": True, "vocab_size": 256,
}
GPT_OSS_QUANT = {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                            "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"}
GPT_OSS_HOT = 5.0  # gain of the "hot" gate/up channels (1 in 8) whose pre-activations pass ±swiglu_limit
ABLATION_MIN = 1e-3  # relative logit change a sink/bias/clamp/window ablation must cause

MODELS = {"qwen3_moe": (QWEN3_MOE, 1234), "deepseek_v3": (DEEPSEEK_V3, 4321), "glm4_moe": (GLM4_MOE, 2468),
          "gpt_oss": (GPT_OSS, 5150)}
SHARD_BYTES = {"glm4_moe": 300_000, "gpt_oss": 300_000}  # max bytes a shard; the others are one file


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Overwrite every parameter/buffer that is a weight with seeded numpy draws (names sorted: stable order)."""
    rng = np.random.default_rng(seed)
    state = dict(model.named_parameters())
    state.update({n: b for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")})
    with torch.no_grad():
        for name in sorted(state):
            t = state[name]
            if name.endswith("e_score_correction_bias"):
                # Larger than the sigmoid scores' spread, so the bias really changes the groups chosen.
                value = rng.normal(0.0, 0.3, t.shape)
            elif "norm" in name:
                value = 1.0 + 0.2 * rng.standard_normal(t.shape)
            elif name.endswith("embed_tokens.weight"):
                value = rng.standard_normal(t.shape)
            elif name.endswith("mlp.gate.weight"):
                value = 2.0 * rng.standard_normal(t.shape) / math.sqrt(t.shape[-1])
            else:
                value = rng.standard_normal(t.shape) / math.sqrt(t.shape[-1])
            t.copy_(torch.from_numpy(np.asarray(value, dtype=np.float32)))


def randomize_gpt_oss(model: torch.nn.Module, seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Seeded draws for every gpt-oss parameter; the experts' weight matrices are drawn as [E, rows_out,
    cols_in], put on the MXFP4 grid (quantize_hub then dequantize_hub) and stored transposed (transformers'
    [E, cols_in, rows_out]). Returns {parameter name: (blocks, scales)} of those matrices."""
    rng = np.random.default_rng(seed)
    packed: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    with torch.no_grad():
        for name, t in sorted(model.named_parameters()):
            shape = tuple(t.shape)
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                e, cols_in, rows_out = shape
                w = rng.standard_normal((e, rows_out, cols_in)) / math.sqrt(cols_in)
                if name.endswith("gate_up_proj"):  # some channels hot, so the swiglu clamp fires on some tokens
                    w[rng.random((e, rows_out)) < 0.125] *= GPT_OSS_HOT
                packed[name] = quantize_hub(w.astype(np.float32))
                value = dequantize_hub(*packed[name]).transpose(0, 2, 1)
            elif name.endswith("sinks"):
                value = rng.normal(0.5, 1.0, shape)  # a sink as large as a typical score: it takes real mass
            elif name.endswith("bias"):
                value = rng.normal(0.0, 0.5, shape)
            elif "norm" in name:
                value = 1.0 + 0.2 * rng.standard_normal(shape)
            elif name.endswith("embed_tokens.weight"):
                value = rng.standard_normal(shape)
            elif name.endswith("router.weight"):
                value = 2.0 * rng.standard_normal(shape) / math.sqrt(shape[-1])
            else:
                value = rng.standard_normal(shape) / math.sqrt(shape[-1])
            t.copy_(torch.from_numpy(np.asarray(value, dtype=np.float32)))
    return packed


def hub_state_dict(model: torch.nn.Module, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The model's tensors under hub names: 5.x's fused 3-D experts split back into per-expert 2-D ones
    (gpt-oss keeps them fused: its hub names are transformers' parameter names)."""
    gpt = config["model_type"] == "gpt_oss"
    d_ff = config.get("moe_intermediate_size")
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        if name.endswith("rotary_emb.inv_freq") or name.endswith("original_inv_freq"):
            continue
        if gpt:
            out[name] = t.detach().clone().contiguous()
        elif name.endswith("mlp.experts.gate_up_proj"):  # (E, 2*d_ff, d_model): gate rows then up rows
            prefix = name[: -len("gate_up_proj")]
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"] = t[e, :d_ff].clone().contiguous()
                out[f"{prefix}{e}.up_proj.weight"] = t[e, d_ff:].clone().contiguous()
        elif name.endswith("mlp.experts.down_proj"):  # (E, d_model, d_ff)
            prefix = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = t[e].clone().contiguous()
        else:
            out[name] = t.detach().clone().contiguous()
    assert gpt or not any(n.endswith(("gate_up_proj", "experts.down_proj")) for n in out), "fused experts left"
    return out


def remove_weights(folder: Path) -> None:
    """Delete a folder's safetensors files and index: a fixture remade with another layout leaves none stale."""
    for old in [*folder.glob("model*.safetensors"), *folder.glob("model.safetensors.index.json")]:
        old.unlink()


def save_hub(tensors: dict[str, torch.Tensor], folder: Path, shard_bytes: int | None) -> list[str]:
    """Write `tensors` into `folder` as the hub lays them out: one model.safetensors, or (with `shard_bytes`)
    shards named and split as huggingface_hub splits them, with their model.safetensors.index.json.
    Returns the file names written (index last)."""
    remove_weights(folder)
    if shard_bytes is None:
        split = {"model.safetensors": sorted(tensors)}
    else:
        plan = split_torch_state_dict_into_shards(tensors, max_shard_size=shard_bytes)
        split = dict(plan.filename_to_tensors)
    for filename, names in split.items():
        save_file({n: tensors[n] for n in names}, str(folder / filename), metadata={"format": "pt"})
        (folder / filename).chmod(0o644)  # safetensors creates it 0600
    if shard_bytes is None:
        return list(split)
    index = {"metadata": dict(plan.metadata), "weight_map": dict(sorted(plan.tensor_to_filename.items()))}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return [*split, "model.safetensors.index.json"]


def check_argmax_margins(logits: np.ndarray, what: str) -> float:
    """Smallest (top1 - top2) / max|row| over rows of logits [n, vocab]; raises when below MARGIN."""
    top2 = np.sort(logits, axis=1)[:, -2:]
    rel = (top2[:, 1] - top2[:, 0]) / np.abs(logits).max(axis=1)
    if rel.min() < MARGIN:
        raise SystemExit(f"{what}: argmax margin {rel.min():.2e} < {MARGIN}; change the seed or prompt")
    return float(rel.min())


def check_router_margins(logits: np.ndarray, config: dict[str, Any], bias: np.ndarray | None) -> float:
    """Smallest gap between a chosen and an unchosen candidate of one router, logits f32 [t, n_routed]."""
    k = config["num_experts_per_tok"]
    if config["model_type"] == "gpt_oss":  # GptOssTopKRouter: top-k of the biased logits themselves
        s = np.sort(logits, axis=1)[:, ::-1]
        return float((s[:, k - 1] - s[:, k]).min())
    if config["model_type"] == "qwen3_moe":
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        s = np.sort(p, axis=1)[:, ::-1]
        return float((s[:, k - 1] - s[:, k]).min())
    choice = 1.0 / (1.0 + np.exp(-logits)) + bias
    t, n = choice.shape
    g, kg = config["n_group"], config["topk_group"]
    grouped = np.sort(choice.reshape(t, g, n // g), axis=2)[:, :, -2:].sum(axis=2)
    gs = np.sort(grouped, axis=1)[:, ::-1]
    gap_groups = (gs[:, kg - 1] - gs[:, kg]).min()
    keep = np.argsort(-grouped, axis=1)[:, :kg]
    mask = np.zeros((t, g), dtype=bool)
    np.put_along_axis(mask, keep, True, axis=1)
    masked = np.where(np.repeat(mask, n // g, axis=1), choice, -np.inf)
    cs = np.sort(masked, axis=1)[:, ::-1]
    return float(min(gap_groups, (cs[:, k - 1] - cs[:, k]).min()))


def router_margin(model: torch.nn.Module, ids: torch.Tensor, config: dict[str, Any]) -> float:
    """Run `ids` once with hooks on every router; the smallest decision gap over all layers and positions."""
    seen: list[tuple[np.ndarray, np.ndarray | None]] = []
    hooks = []
    for name, mod in model.named_modules():
        if name.endswith(("mlp.gate", "mlp.router")):
            bias = getattr(mod, "e_score_correction_bias", None)
            b = None if bias is None else bias.detach().numpy().copy()
            hooks.append(mod.register_forward_hook(
                lambda _m, _i, out, b=b: seen.append((out[0].detach().float().numpy(), b))))
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    gap = min(check_router_margins(logits, config, b) for logits, b in seen)
    if gap < ROUTER_MARGIN:
        raise SystemExit(f"router decision gap {gap:.2e} < {ROUTER_MARGIN}; change the seed or prompt")
    return gap


def count_clamps(model: torch.nn.Module, ids: torch.Tensor, limit: float) -> int:
    """Values the swiglu clamp changes (gate > limit, |up| > limit) over every routed (token, expert) pair
    of one forward of `ids`, in numpy from the experts' own parameters."""
    counts: list[int] = []

    def hook(mod, args, _out) -> None:
        x, idx = args[0].detach().numpy(), args[1].detach().numpy()  # (n, d), (n, k)
        w, b = mod.gate_up_proj.detach().numpy(), mod.gate_up_proj_bias.detach().numpy()
        gate_up = np.einsum("nd,nkdf->nkf", x, w[idx]) + b[idx]  # (n, k, 2·d_ff)
        counts.append(int((gate_up[..., ::2] > limit).sum() + (np.abs(gate_up[..., 1::2]) > limit).sum()))

    hooks = [m.register_forward_hook(hook) for n, m in model.named_modules() if n.endswith("mlp.experts")]
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    return sum(counts)


def gpt_oss_ablations(model: torch.nn.Module, ids: torch.Tensor, logits: np.ndarray) -> dict[str, float]:
    """Relative change of the prompt logits when sinks, attention biases, expert biases, the router bias, the
    swiglu clamp or the sliding window are taken away: each must matter, or the fixture would not test it."""

    def without(change) -> float:
        m = copy.deepcopy(model)
        with torch.no_grad():
            change(m)
            got = m(ids).logits[0].numpy()
        return float(np.linalg.norm(got - logits) / np.linalg.norm(logits))

    def params(suffixes: tuple[str, ...], value: float):
        return lambda m: [p.fill_(value) for n, p in m.named_parameters() if n.endswith(suffixes)]

    out = {"sinks": without(params(("sinks",), -1e30)),
           "attention biases": without(params(("proj.bias",), 0.0)),
           "expert biases": without(params(("gate_up_proj_bias", "down_proj_bias"), 0.0)),
           "router bias": without(params(("router.bias",), 0.0)),
           "clamp": without(lambda m: [setattr(e, "limit", 1e9) for e in m.modules() if hasattr(e, "limit")]),
           "sliding window": without(lambda m: setattr(m.config, "layer_types",
                                                       ["full_attention"] * m.config.num_hidden_layers))}
    weak = {k: v for k, v in out.items() if v < ABLATION_MIN}
    if weak:
        raise SystemExit(f"gpt_oss: these barely move the logits, the fixture would not test them: {weak}")
    return out


def write_gpt_oss_mxfp4(src: Path, folder: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor],
                        packed: dict[str, tuple[np.ndarray, np.ndarray]], shard_bytes: int | None) -> None:
    """The gpt_oss fixture as the published checkpoints store it: experts' weights as u8 blocks and scales,
    checked to decode (transformers' convert_moe_packed_tensors) to exactly the F32 parameters."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    quant = {n: t for n, t in tensors.items() if n not in packed}
    for name, (blocks, scales) in packed.items():
        decoded = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32)
        if not torch.equal(decoded, tensors[name]):
            raise SystemExit(f"gpt_oss_mxfp4: {name} blocks decode off by {(decoded - tensors[name]).abs().max()}")
        quant[name + "_blocks"] = torch.from_numpy(blocks)
        quant[name + "_scales"] = torch.from_numpy(scales)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(dict(config, quantization_config=GPT_OSS_QUANT), indent=2) + "\n")
    save_hub(quant, folder, shard_bytes)
    for f in ("expected.json", "logits.npy"):
        shutil.copyfile(src / f, folder / f)


def build(name: str, config: dict[str, Any], seed: int, out: Path) -> None:
    folder = out / name
    gpt = config["model_type"] == "gpt_oss"
    # gpt-oss: the reference code paths of modeling_gpt_oss.py (eager_attention_forward, GptOssExperts.forward)
    impl = {"attn_implementation": "eager", "experts_implementation": "eager"} if gpt else {}
    with tempfile.TemporaryDirectory() as tmp:
        cfg_dir = Path(tmp)
        (cfg_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        hf_config = AutoConfig.from_pretrained(cfg_dir)
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32, **impl).eval()
        packed = randomize_gpt_oss(model, seed) if gpt else randomize(model, seed)
        tensors = hub_state_dict(model, config)
        files = save_hub(tensors, cfg_dir, SHARD_BYTES.get(name))
        reloaded = AutoModelForCausalLM.from_pretrained(cfg_dir, dtype=torch.float32, **impl).eval()
        prompt = np.random.default_rng(seed + 1).integers(2, config["vocab_size"], PROMPT_LEN)
        ids = torch.tensor(prompt[None, :], dtype=torch.long)
        with torch.no_grad():
            logits = model(ids).logits[0].numpy()
            again = reloaded(ids).logits[0].numpy()
        if not np.array_equal(logits, again):
            raise SystemExit(f"{name}: logits after from_pretrained differ by {np.abs(logits - again).max():.3e}")
        with torch.no_grad():
            gen = reloaded.generate(ids, do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=0,
                                    pad_token_id=config["eos_token_id"])
        greedy = gen[0, PROMPT_LEN:].tolist()
        if len(greedy) != NEW_TOKENS or config["eos_token_id"] in greedy:
            raise SystemExit(f"{name}: generate stopped early or produced eos: {greedy}")
        with torch.no_grad():  # every position of prompt + generated tokens: the argmax each step took
            full = reloaded(gen).logits[0].numpy()
        m1 = check_argmax_margins(logits, f"{name} prompt")
        m2 = check_argmax_margins(full[PROMPT_LEN - 1:-1], f"{name} greedy steps")
        if not (full[PROMPT_LEN - 1:-1].argmax(axis=1) == np.array(greedy)).all():
            raise SystemExit(f"{name}: one-shot forward over the generated ids disagrees with generate()")
        gap = router_margin(reloaded, gen, config)
        if gpt:
            clamps = count_clamps(reloaded, gen, config["swiglu_limit"])
            ablations = gpt_oss_ablations(reloaded, ids, logits)
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cfg_dir / "config.json", folder / "config.json")
        remove_weights(folder)
        for f in files:
            shutil.copyfile(cfg_dir / f, folder / f)
    np.save(folder / "logits.npy", logits.astype(np.float32))
    expected = {"prompt_ids": prompt.tolist(), "logits_file": "logits.npy", "greedy_ids": greedy,
                "transformers": transformers.__version__, "torch": torch.__version__}
    (folder / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")
    size = sum(p.stat().st_size for p in folder.iterdir())
    print(f"{name}: {size / 1024:.0f} KiB, argmax margins {m1:.2e} (prompt) {m2:.2e} (greedy), "
          f"router gap {gap:.2e}, greedy {greedy}")
    if gpt:
        print(f"{name}: {clamps} values clamped over prompt + greedy; relative logit change without "
              + ", ".join(f"{k} {v:.2e}" for k, v in ablations.items()))
        write_gpt_oss_mxfp4(folder, out / f"{name}_mxfp4", config, tensors, packed, SHARD_BYTES.get(name))
        size = sum(p.stat().st_size for p in (out / f"{name}_mxfp4").iterdir())
        print(f"{name}_mxfp4: {size / 1024:.0f} KiB, experts' blocks decode to the F32 parameters exactly")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "generation")
    parser.add_argument("--only", choices=sorted(MODELS), action="append",
                        help="build only these (the others' fixtures are left as they are; gpt_oss writes "
                             "gpt_oss_mxfp4 too)")
    args = parser.parse_args()
    for name, (config, seed) in MODELS.items():
        if not args.only or name in args.only:
            build(name, config, seed, args.out)


if __name__ == "__main__":
    main()
