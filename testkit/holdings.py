"""Put a checkpoint's experts on a running node, as an operator's `tenzro moe expert-load` would."""

from __future__ import annotations

import base64
from pathlib import Path

from apps.catalog.checkpoint import CheckpointReader
from apps.catalog.shapes import ModelShape, shape_from_config
from apps.catalog.slicing import prepare_layer
from testkit.nodes import TOKEN, NodeProcess


def load_every_expert(node: NodeProcess, folder: Path, model_id: str) -> ModelShape:
    """Every expert of every MoE layer of the checkpoint at `folder` (f32) onto `node`; the model's shape."""
    with CheckpointReader.open(folder) as reader:
        shape = shape_from_config(model_id, reader.config)
        for layer in shape.moe_layers:
            prepared = prepare_layer(reader, shape, model_id=model_id, layer=layer,
                                     experts=range(shape.n_experts_total), quant=None)
            for payload in prepared.experts.values():
                node.result("tenzro_moeExpertLoad", {"payload": base64.b64encode(payload).decode()}, token=TOKEN)
    return shape
