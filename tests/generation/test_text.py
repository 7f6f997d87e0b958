"""The text core against transformers: encode, decode, chat templates; streamed text and stop strings."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from tokenizers import decoders as tk_decoders

from apps.generation.text import CompletionText, TextCodec, TextError
from testkit.text_files import CHAT_TEMPLATE, write_text_files

transformers = pytest.importorskip("transformers")
MESSAGES = [{"role": "system", "content": "ba be"}, {"role": "user", "content": "bi bo bu"},
            {"role": "assistant", "content": "da de"}, {"role": "user", "content": "di"}]


def codec_of(folder: Path) -> TextCodec:
    def read(name: str) -> bytes | None:
        return (folder / name).read_bytes() if (folder / name).exists() else None
    return TextCodec.from_files(read("tokenizer.json"), read("tokenizer_config.json"), read("generation_config.json"))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    write_text_files(tmp_path, vocab_size=256, generation={"temperature": 0.6, "top_p": 0.95})
    return tmp_path


def test_chat_ids_and_text_equal_transformers(folder: Path) -> None:
    codec, reference = codec_of(folder), transformers.AutoTokenizer.from_pretrained(str(folder))
    for messages in (MESSAGES[:1], MESSAGES[1:2], MESSAGES):
        want = reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        assert codec.chat_ids(messages) == list(getattr(want, "input_ids", want))
        assert codec.render_chat(messages) == reference.apply_chat_template(messages, add_generation_prompt=True,
                                                                            tokenize=False)
    ids = [0, 97, 47, 2, 42, 1, 255]
    assert codec.decode(ids) == reference.decode(ids, skip_special_tokens=True)
    assert codec.encode(codec.decode(ids)) == reference(codec.decode(ids)).input_ids
    assert codec.eos_ids == {1} and codec.generation_defaults == {"temperature": 0.6, "top_p": 0.95}


def test_a_role_the_template_refuses_and_a_model_without_template(folder: Path, tmp_path_factory) -> None:
    with pytest.raises(TextError, match="role tool is not one of") as refused:
        codec_of(folder).chat_ids([{"role": "tool", "content": "x"}])
    assert refused.value.reason == "template_refused"
    bare = tmp_path_factory.mktemp("bare")
    write_text_files(bare, vocab_size=256, chat_template=None)
    with pytest.raises(TextError) as missing:
        codec_of(bare).chat_ids(MESSAGES)
    assert missing.value.reason == "template_missing"


def test_templates_run_sandboxed(folder: Path) -> None:
    escape = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    config = {"chat_template": escape}
    codec = TextCodec(Tokenizer.from_file(str(folder / "tokenizer.json")), config, {})
    with pytest.raises(TextError) as refused:
        codec.render_chat(MESSAGES)
    assert refused.value.reason == "template_refused"
    assert CHAT_TEMPLATE  # the kit's own template compiles (used above)
    with pytest.raises(TextError) as broken:
        TextCodec(codec.tokenizer, {"chat_template": "{% for %}"}, {})
    assert broken.value.reason == "template_invalid"
    with pytest.raises(TextError) as bad:
        TextCodec.from_files(b"{not json", None, None)
    assert bad.value.reason == "tokenizer_invalid"


def byte_level_codec() -> TextCodec:
    """A byte-level BPE (GPT-2's scheme) trained on a few lines: multi-byte characters span tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tk_decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(["hello world", "stop here", "héllo wörld ✓"] * 20, trainer)
    return TextCodec(tokenizer, {"eos_token": "<eos>"}, {})


def stream(codec: TextCodec, text: str, stop: list[str]) -> tuple[list[str], CompletionText]:
    completion = CompletionText(codec, stop)
    deltas = []
    for token in codec.encode(text):
        deltas.append(completion.add(token))
        if completion.stopped:
            break
    deltas.append(completion.flush())
    return deltas, completion


@pytest.mark.parametrize("text", ["héllo wörld ✓ 🙂 done", "plain ascii", "✓✓✓"])
def test_streamed_text_is_the_decode_and_never_a_broken_character(text: str) -> None:
    codec = byte_level_codec()
    deltas, completion = stream(codec, text, [])
    assert "".join(deltas) == text == completion.text
    assert not any("\ufffd" in d for d in deltas)
    assert sum(bool(d) for d in deltas) > 1  # it did stream


@pytest.mark.parametrize("text, stop, want", [
    ("hello world stop here and more", ["stop"], "hello world "),
    ("hello world stop here", ["op he"], "hello world st"),  # across token boundaries
    ("hello world", ["xyz"], "hello world"),
    ("héllo ✓ wörld", ["✓"], "héllo "),
    ("hello world stop", ["world", "lo w"], "hel"),  # the earliest of several
])
def test_stop_strings_cut_exactly(text: str, stop: list[str], want: str) -> None:
    deltas, completion = stream(byte_level_codec(), text, stop)
    assert "".join(deltas) == want == completion.text
    assert completion.stopped == (want != text)
