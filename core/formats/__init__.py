"""The formats one node writes and another (or a file) reads: one package that producers (catalog
slicing, the test kit) and consumers (the expert runtime, the worker, receipts) both import.
docs/formats.md describes every byte.

* expert_payload       one expert's gate/up/down projections, dense or GGML blocks, in safetensors
* gate_payload         one layer's router (softmax, sigmoid with bias, or a dense layer's slices)
* wire                 hidden-state rows on the wire: raw f32 or Q8_0 blocks
* safetensors_header   the container's header, shared by payloads and checkpoint shards
* errors               InvalidPayload, what a gate payload raises
"""

from core.formats.errors import InvalidPayload
from core.formats.expert_payload import ExpertPayload, PayloadError, encode_expert_payload, read_expert_payload
from core.formats.gate_payload import GateSpec, encode_dense_gate_payload, encode_gate_payload, read_gate_payload
from core.formats.wire import WIRE_CODECS, decode_rows, encode_rows, rows_from_bytes, rows_to_bytes

__all__ = [
    "WIRE_CODECS",
    "ExpertPayload",
    "GateSpec",
    "InvalidPayload",
    "PayloadError",
    "decode_rows",
    "encode_dense_gate_payload",
    "encode_expert_payload",
    "encode_gate_payload",
    "encode_rows",
    "read_expert_payload",
    "read_gate_payload",
    "rows_from_bytes",
    "rows_to_bytes",
]
