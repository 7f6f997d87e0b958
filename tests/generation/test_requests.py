"""What moe/generate accepts, checked without a worker: prompts as ids, text or chat; sampling; limits."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.generation.requests import max_new_of, prompt_ids_of, sampling_of, stop_of
from apps.generation.text import TextCodec
from core.errors import InvalidInput
from testkit.text_files import write_text_files


@pytest.fixture
def codec(tmp_path: Path) -> TextCodec:
    write_text_files(tmp_path, vocab_size=256, generation={"temperature": 0.6})
    return TextCodec.from_files(*((tmp_path / n).read_bytes() for n in
                                  ("tokenizer.json", "tokenizer_config.json", "generation_config.json")))


def refused(call, param: str, reason: str = "invalid_input") -> None:
    with pytest.raises(InvalidInput) as err:
        call()
    assert err.value.details["param"] == param and err.value.reason == reason, (err.value.details, err.value.reason)


def test_a_prompt_comes_as_exactly_one_of_ids_text_and_chat(codec: TextCodec) -> None:
    ids = dict(vocab=256, limit=100, no_text_reason="")
    assert prompt_ids_of({"prompt_ids": [9, 10]}, codec, **ids) == [9, 10]
    assert prompt_ids_of({"prompt": "bi bo"}, codec, **ids) == codec.encode("bi bo")
    assert prompt_ids_of({"messages": [{"role": "user", "content": "bi"}]}, codec, **ids)[:2] == [2, 5]
    refused(lambda: prompt_ids_of({"prompt": "a", "prompt_ids": [1]}, codec, **ids), "prompt")
    refused(lambda: prompt_ids_of({"prompt_ids": [1, 256]}, codec, **ids), "prompt_ids", "token_out_of_range")
    refused(lambda: prompt_ids_of({"prompt": "bi"}, None, vocab=256, limit=100, no_text_reason="no tokenizer.json"),
            "prompt", "text_unavailable")
    refused(lambda: prompt_ids_of({"messages": [{"role": "tool", "content": "x"}]}, codec, **ids), "messages",
            "template_refused")
    refused(lambda: prompt_ids_of({"messages": [{"role": "user"}]}, codec, **ids), "messages[0]")
    refused(lambda: prompt_ids_of({"prompt": "bi " * 20}, codec, vocab=256, limit=100, no_text_reason="",
                                  context=20), "prompt", "context_length_exceeded")


def test_sampling_defaults_limits_and_stops(codec: TextCodec) -> None:
    assert sampling_of(None, codec.generation_defaults).temperature == 0.0  # no sampling: greedy
    assert sampling_of({"use_model_defaults": True}, codec.generation_defaults).temperature == 0.6
    assert sampling_of({"temperature": 1.1, "use_model_defaults": True}, codec.generation_defaults).temperature == 1.1
    refused(lambda: sampling_of({"temperature": -1}, {}), "temperature")
    refused(lambda: sampling_of({"beam": 2}, {}), "beam")
    assert max_new_of({"fill_context": True}, prompt_tokens=200, limit=1024, context=256) == 56
    refused(lambda: max_new_of({"max_new_tokens": 100}, prompt_tokens=200, limit=1024, context=256),
            "max_new_tokens", "context_length_exceeded")
    refused(lambda: max_new_of({"max_new_tokens": 0}, prompt_tokens=2, limit=1024, context=256), "max_new_tokens")
    assert stop_of("x") == ["x"] and stop_of(None) == []
    refused(lambda: stop_of(["a", ""]), "stop")
