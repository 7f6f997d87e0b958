"""A gpt-oss checkpoint as openai publishes it (MXFP4 experts, a biased router), prepared by a real node over
HTTP ranges, loaded from the blobs it published, and answered as transformers' GptOssMLP answers (a peer
fetching such blobs is the same path as any other: tests/e2e/test_prepare_blobs.py)."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from testkit.checkpoints import FileServer
from testkit.gpt_oss_checkpoint import gpt_oss_moe
from testkit.nodes import TOKEN
from tests.catalog.test_slicing_gpt_oss import transformers_mlp
from tests.e2e.test_prepare_blobs import wait_job

pytestmark = pytest.mark.e2e
MODEL = "tiny-gpt-oss"


def test_an_mxfp4_gpt_oss_layer_is_prepared_fetched_and_answered(start_node, tmp_path) -> None:
    model = gpt_oss_moe(tmp_path / "ckpt", mxfp4=True, d_model=64, d_ff=96, n_experts=4)
    with FileServer(model.root) as server:
        a = start_node()
        job = a.result("tenzro_moePrepareExperts", {"model_id": MODEL, "layer": 1, "experts": [0, 1, 2, 3],
                                                    "quant": "q8_0", "checkpoint": server.url}, token=TOKEN)
        job = wait_job(a, job["job_id"])
    assert job["state"] == "done", job
    # the checkpoint's own 4.25-bit blocks, whatever quant was asked for the dense ones
    assert all(e["formats"] == dict.fromkeys(("gate", "up", "down"), "MXFP4") for e in job["experts"])
    a.result("tenzro_moeGateLoad", {"blob_uri": job["gate"]["blob_uri"]}, token=TOKEN)
    for entry in job["experts"]:  # from the node's own blob store, each checked against its hash
        a.result("tenzro_moeExpertLoad", {"blob_uri": entry["blob_uri"]}, token=TOKEN)

    hidden = np.random.default_rng(4).standard_normal((6, 64)).astype(np.float32)
    answer = a.result("tenzro_moeForward", {"model_id": MODEL, "layer": 1, "d_model": 64,
                                             "hidden": base64.b64encode(hidden.tobytes()).decode()})
    out = np.frombuffer(base64.b64decode(answer["output"]), dtype="<f4").reshape(6, 64)
    reference = transformers_mlp(model.dense, 1, hidden)
    # the holder's C kernels quantize the activation rows to int8 (docs/performance.md): ~1 %
    assert np.linalg.norm(out - reference) / np.linalg.norm(reference) < 0.03
