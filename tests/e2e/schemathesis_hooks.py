"""schemathesis hooks (SCHEMATHESIS_HOOKS) for tests/e2e/test_api_schema.py.

One extra check: a schema-valid request may be refused with 422 only for a reason about its
content that the schema cannot express (tests/e2e/schemathesis.toml says which operations).
"""

import json

import schemathesis

CONTENT_REASONS = {
    "shape_mismatch", "non_finite_input", "invalid_payload", "model_mismatch", "not_a_file", "unreadable_file",
    "invalid_policy", "checkpoint_required", "config_invalid", "config_missing_key", "config_unsupported",
    "index_invalid", "header_corrupt", "header_too_large", "header_truncated", "offsets_invalid",
    "dtype_unsupported", "tensor_missing", "short_read", "range_ignored", "fetch_failed", "invalid_routings",
    "expert_out_of_range",  # prepare: slice ids beyond dense_slices (a relation JSON Schema cannot state)
    "token_out_of_range", "shape_incomplete",  # generation: a vocabulary, a config only the checkpoint knows
    "not_a_provider", "job_not_done",  # placement: this node among the providers named, a job's state
}


@schemathesis.check
def valid_data_refused_only_for_content(ctx, response, case):
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code != 422:
        return None
    try:
        reason = json.loads(response.content).get("reason")
    except (ValueError, AttributeError):
        reason = None
    if reason not in CONTENT_REASONS:
        raise AssertionError(f"schema-valid request refused with 422 {reason!r}: the schema should have said so")
    return None
