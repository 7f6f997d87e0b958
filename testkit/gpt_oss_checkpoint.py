"""A tiny gpt-oss MoE checkpoint in the hub layout: fused experts with biases, a biased router, and
optionally the MXFP4 ``*_blocks`` / ``*_scales`` that openai's own checkpoints store.

The dense part (attention, norms, embeddings) is left out: these checkpoints feed the expert and
gate slicers (apps/catalog/slicing_gpt_oss.py). The whole-model fixture comes from transformers
(scripts/make_generation_fixtures.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from core.quantization.mxfp4 import dequantize_hub, quantize_hub
from testkit.checkpoints import TinyModel, f32_to_bf16_bits, write_checkpoint


def gpt_oss_moe(root: Path, *, seed: int = 5, d_model: int = 64, d_ff: int = 96, n_experts: int = 4,
                n_layers: int = 2, mxfp4: bool = False, shards: int = 2) -> TinyModel:
    """`dense` holds the f32 values a reader must give: the fused parameters in transformers' own
    orientation (gate_up_proj [E, d, 2·d_ff], down_proj [E, d_ff, d]) even when `mxfp4` stores them as
    blocks (then they are the blocks' exact values). Biases are BF16, as in the released checkpoints."""
    rng = np.random.default_rng(seed)
    config = {"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "hidden_size": d_model,
              "intermediate_size": d_ff, "num_local_experts": n_experts, "experts_per_token": 2,
              "num_experts_per_tok": 2, "num_hidden_layers": n_layers, "swiglu_limit": 7.0}
    if mxfp4:
        config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    tensors, dense = {}, {}

    def bf16(name: str, w: np.ndarray) -> None:
        bits = f32_to_bf16_bits(w)
        tensors[name] = ("BF16", bits)
        dense[name] = (bits.astype(np.uint32) << 16).view(np.float32)

    def weight(name: str, out_in: np.ndarray) -> None:
        """out_in f32 [E, out, in]; the parameter is its transpose [E, in, out]."""
        blocks, scales = quantize_hub(out_in)
        exact = dequantize_hub(blocks, scales)  # [E, out, in]: what either storage holds
        dense[name] = np.ascontiguousarray(exact.transpose(0, 2, 1))
        if mxfp4:
            tensors[name + "_blocks"], tensors[name + "_scales"] = ("U8", blocks), ("U8", scales)
        else:
            tensors[name] = ("F32", dense[name])

    for layer in range(n_layers):
        p = f"model.layers.{layer}.mlp."
        bf16(p + "router.weight", (rng.standard_normal((n_experts, d_model)) * 0.3).astype(np.float32))
        bf16(p + "router.bias", (rng.standard_normal(n_experts) * 0.5).astype(np.float32))
        # scaled so that some pre-activations pass the ±7 clamp
        weight(p + "experts.gate_up_proj", (rng.standard_normal((n_experts, 2 * d_ff, d_model)) * 0.8)
               .astype(np.float32))
        bf16(p + "experts.gate_up_proj_bias", rng.standard_normal((n_experts, 2 * d_ff)).astype(np.float32))
        weight(p + "experts.down_proj", (rng.standard_normal((n_experts, d_model, d_ff)) / np.sqrt(d_ff))
               .astype(np.float32))
        bf16(p + "experts.down_proj_bias", (rng.standard_normal((n_experts, d_model)) * 0.1).astype(np.float32))
    write_checkpoint(root, config, tensors, shards=shards)
    return TinyModel(root=root, config=config, dense=dense, tensors=tensors)


__all__ = ["gpt_oss_moe"]
