"""CheckpointReader: exact ranged reads, dtype decoding (FP8 block scales), and every refusal."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from apps.catalog.checkpoint import CheckpointError, CheckpointReader
from testkit.checkpoints import FileServer, deepseek_v3, qwen3_moe, write_checkpoint, write_safetensors

PROBE = 64  # small first header read, so the second (rest-of-header) read is exercised too


def header_len(path) -> int:
    return 8 + struct.unpack("<Q", path.read_bytes()[:8])[0]


def tensor_span(root, shard: str, name: str) -> tuple[int, int]:
    raw = (root / shard).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    a, b = json.loads(raw[8:8 + n])[name]["data_offsets"]
    return 8 + n + a, 8 + n + b


def test_http_sharded_reads_only_the_needed_ranges(tmp_path):
    model = qwen3_moe(tmp_path / "ckpt")
    wanted = ["model.layers.1.mlp.gate.weight",
              *(f"model.layers.1.mlp.experts.2.{p}_proj.weight" for p in ("gate", "up", "down"))]
    index = json.loads((model.root / "model.safetensors.index.json").read_text())["weight_map"]
    with FileServer(model.root) as server, CheckpointReader.open(server.url, header_probe=PROBE) as reader:
        for name in wanted:
            np.testing.assert_array_equal(reader.read_tensor(name), model.dense[name])
        # what the reader counted is what the server sent
        assert reader.bytes_read == server.bytes_sent
        expected = {("config.json", 0, (model.root / "config.json").stat().st_size),
                    ("model.safetensors.index.json", 0, (model.root / "model.safetensors.index.json").stat().st_size)}
        for shard in {index[n] for n in wanted}:
            hl = header_len(model.root / shard)
            expected |= {(shard, 0, PROBE), (shard, PROBE, hl)}
        for name in wanted:
            expected.add((index[name], *tensor_span(model.root, index[name], name)))
        assert {(p, a, b) for p, a, b, _ in server.served} == expected
        assert all(b - a == sent for _, a, b, sent in server.served)
        tensor_bytes = sum(model.dense[n].size * 2 for n in wanted)  # F16
        assert reader.bytes_by_kind["tensor"] == tensor_bytes
        assert reader.bytes_by_kind["header"] == sum(header_len(model.root / s) for s in {index[n] for n in wanted})


def test_local_folder_matches_http(tmp_path):
    model = qwen3_moe(tmp_path / "ckpt", shards=1, dtype="F32")
    name = "model.layers.0.mlp.experts.3.down_proj.weight"
    with CheckpointReader.open(model.root) as local, FileServer(model.root) as server, \
            CheckpointReader.open(server.url) as remote:
        np.testing.assert_array_equal(local.read_tensor(name), remote.read_tensor(name))
        np.testing.assert_array_equal(local.read_tensor(name), model.dense[name])
        assert local.weight_map is None and local.config["model_type"] == "qwen3_moe"
        assert local.bytes_by_kind["tensor"] == 2 * model.dense[name].nbytes  # read twice, no caching


def test_fp8_block_scales_with_partial_edge_blocks(tmp_path):
    model = deepseek_v3(tmp_path / "ckpt")  # 136 x 160 weights: 2 x 2 blocks, the edge ones partial
    with CheckpointReader.open(model.root) as reader:
        for name in ("model.layers.1.mlp.experts.5.gate_proj.weight", "model.layers.1.mlp.experts.5.down_proj.weight",
                     "model.layers.1.mlp.gate.weight", "model.layers.1.mlp.gate.e_score_correction_bias"):
            np.testing.assert_array_equal(reader.read_tensor(name), model.dense[name])
        full = reader.read_tensor("model.layers.1.mlp.shared_experts.up_proj.weight")
        for r0, r1 in ((0, 136), (5, 130), (128, 136), (127, 129)):
            part = reader.read_tensor("model.layers.1.mlp.shared_experts.up_proj.weight", rows=(r0, r1))
            np.testing.assert_array_equal(part, full[r0:r1])


def test_fp8_decode_covers_every_code():
    from apps.catalog.checkpoint import FP8_E4M3_LUT
    from testkit.checkpoints import f32_to_e4m3

    finite = np.flatnonzero(np.isfinite(FP8_E4M3_LUT))
    assert len(finite) == 254 and float(np.nanmax(FP8_E4M3_LUT)) == 448.0
    assert FP8_E4M3_LUT[0x01] == 2.0**-9 and FP8_E4M3_LUT[0x38] == 1.0 and FP8_E4M3_LUT[0xB8] == -1.0
    codes = f32_to_e4m3(FP8_E4M3_LUT[finite])  # encode(decode(c)) == c, except -0 -> +0
    assert np.array_equal(codes[FP8_E4M3_LUT[finite] != 0], finite[FP8_E4M3_LUT[finite] != 0].astype(np.uint8))


def _single(tmp_path, raw: bytes):
    root = tmp_path / "bad"
    root.mkdir()
    (root / "config.json").write_text("{}")
    (root / "model.safetensors").write_bytes(raw)
    return root


def _header_bytes(header: dict, body: bytes = b"") -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + body


@pytest.mark.parametrize(("raw", "reason"), [
    (b"\x01\x02\x03", "header_truncated"),
    (struct.pack("<Q", 500) + b"{}", "header_truncated"),
    (struct.pack("<Q", 1 << 40) + b"{}", "header_too_large"),
    (struct.pack("<Q", 6) + b"{nope}", "header_corrupt"),
    (_header_bytes([1, 2]), "header_corrupt"),
    (_header_bytes({"w": {"dtype": "F32", "shape": [2]}}), "header_corrupt"),
    (_header_bytes({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, float("inf")]}}), "header_corrupt"),
    (_header_bytes({"w": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]}}, b"\0" * 8), "header_corrupt"),
    (_header_bytes({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, True]}}, b"\0" * 8), "header_corrupt"),
    (_header_bytes({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8), "offsets_invalid"),
    (_header_bytes({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}, b"\0" * 16), "offsets_invalid"),
])
@pytest.mark.parametrize("over_http", [False, True], ids=["local", "http"])
def test_bad_headers_are_refused(tmp_path, raw, reason, over_http):
    root = _single(tmp_path, raw)
    if over_http:
        with FileServer(root) as server, CheckpointReader.open(server.url, header_probe=PROBE) as reader, \
                pytest.raises(CheckpointError) as err:
            reader.read_tensor("w")
    else:
        with CheckpointReader.open(root, header_probe=PROBE) as reader, pytest.raises(CheckpointError) as err:
            reader.read_tensor("w")
    assert err.value.reason == reason, str(err.value)


def test_missing_tensor_wrong_dtype_and_missing_scales(tmp_path):
    root = tmp_path / "c"
    write_checkpoint(root, {"model_type": "deepseek_v3"}, {
        "ints": ("I32", np.arange(6, dtype=np.int32).reshape(2, 3)),
        "fp8": ("F8_E4M3", np.zeros((4, 4), np.uint8)),
        "bf": ("BF16", np.zeros((2, 2), np.uint16)),
    })
    with CheckpointReader.open(root) as reader:
        for name, reason in (("nope", "tensor_missing"), ("ints", "dtype_unsupported"), ("fp8", "tensor_missing")):
            with pytest.raises(CheckpointError) as err:
                reader.read_tensor(name)
            assert err.value.reason == reason and repr(name) in str(err.value)
        assert reader.read_tensor("bf").dtype == np.float32
    model = qwen3_moe(tmp_path / "q")
    with CheckpointReader.open(model.root) as reader, pytest.raises(CheckpointError) as err:
        reader.read_tensor("model.layers.0.mlp.experts.99.up_proj.weight")
    assert err.value.reason == "tensor_missing" and "index" in str(err.value)


def test_range_ignoring_server_is_refused_without_downloading(tmp_path):
    model = qwen3_moe(tmp_path / "ckpt", shards=1)
    with FileServer(model.root) as server, CheckpointReader.open(server.url) as reader:
        server.ignore_range = True
        with pytest.raises(CheckpointError) as err:
            reader.read_tensor("model.layers.0.mlp.experts.0.up_proj.weight")
        assert err.value.reason == "range_ignored"
        assert reader.bytes_by_kind["header"] == 0 and reader.bytes_by_kind["tensor"] == 0


def test_short_body_is_a_short_read(tmp_path):
    model = qwen3_moe(tmp_path / "ckpt", shards=1)
    name = "model.layers.0.mlp.experts.0.up_proj.weight"
    with FileServer(model.root) as server, CheckpointReader.open(server.url, retries=0) as reader:
        reader.tensor_info(name)
        server.short_body = True
        with pytest.raises(CheckpointError) as err:
            reader.read_tensor(name)
        assert err.value.reason == "short_read"


def test_truncated_shard_is_a_short_read_locally(tmp_path):
    model = qwen3_moe(tmp_path / "ckpt", shards=1, dtype="F32")
    path = model.root / "model.safetensors"
    with CheckpointReader.open(model.root) as reader:
        name = "model.layers.1.mlp.experts.3.up_proj.weight"
        info = reader.tensor_info(name)
        path.write_bytes(path.read_bytes()[:info.start + 10])  # cut after the header was read
        with pytest.raises(CheckpointError) as err:
            reader.read_tensor(name)
        assert err.value.reason == "short_read"


def test_retries_5xx_then_gives_up(tmp_path):
    model = qwen3_moe(tmp_path / "ckpt", shards=1)
    name = "model.layers.0.mlp.gate.weight"
    with FileServer(model.root) as server:
        server.fail_next = 2
        with CheckpointReader.open(server.url, retries=3, backoff_s=0.001) as reader:
            np.testing.assert_array_equal(reader.read_tensor(name), model.dense[name])
        server.fail_next = 10
        with pytest.raises(CheckpointError) as err:
            CheckpointReader.open(server.url, retries=2, backoff_s=0.001)
        assert err.value.reason == "fetch_failed" and "3 attempts" in str(err.value)
        server.fail_next = 0
        with pytest.raises(CheckpointError) as err:
            CheckpointReader.open(server.url + "/nothing-here")
        assert err.value.reason == "not_found"


def test_missing_weights_file_and_bad_index(tmp_path):
    root = tmp_path / "c"
    root.mkdir()
    (root / "config.json").write_text("{}")
    with CheckpointReader.open(root) as reader, pytest.raises(CheckpointError) as err:
        reader.read_tensor("x")
    assert err.value.reason == "not_found"
    (root / "model.safetensors.index.json").write_text('{"weight_map": {"x": "../etc/passwd"}}')
    with pytest.raises(CheckpointError) as err:
        CheckpointReader.open(root)
    assert err.value.reason == "index_invalid"
    (root / "config.json").write_text("not json")
    with pytest.raises(CheckpointError) as err:
        CheckpointReader.open(root)
    assert err.value.reason == "config_invalid"


def test_writer_matches_the_safetensors_library(tmp_path):
    from safetensors.numpy import load_file

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    write_safetensors(tmp_path / "x.safetensors", {"a": ("F32", a), "b": ("F16", a.astype(np.float16))})
    loaded = load_file(str(tmp_path / "x.safetensors"))
    np.testing.assert_array_equal(loaded["a"], a)
    np.testing.assert_array_equal(loaded["b"], a.astype(np.float16))
