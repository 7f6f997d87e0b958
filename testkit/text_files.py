"""Tokenizer files for the tiny checkpoints: a WordLevel vocabulary the size of the model's, a ChatML
chat template, a generation_config.json — what a hub checkpoint carries beside its weights.

    write_text_files(folder, vocab_size=256, bos_id=0, eos_id=1)

Ids 0 … 3 are the special tokens (<s>, </s>, <|im_start|>, <|im_end|>; bos and eos where the config
says), 4 … 6 the chat roles, every other id a distinct lowercase word, split on whitespace: the text of any id sequence
encodes back to the same ids, so a prompt can be written as text for the fixtures' prompt ids.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

SPECIALS = ("<s>", "</s>", "<|im_start|>", "<|im_end|>")
ROLES = ("system", "user", "assistant")  # ids 4 … 6: the template writes them
# ChatML, as Qwen's checkpoints spell it (system turn optional; a role it does not know is refused).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('role ' + message['role'] + ' is not one of system, user, assistant') }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_ONSETS = ["b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z"]
_VOWELS = ["a", "e", "i", "o", "u"]


def words(count: int) -> list[str]:
    """`count` distinct pronounceable lowercase words ("ba", "be", …, "baba", …)."""
    syllables = [c + v for c in _ONSETS for v in _VOWELS]  # 90
    out = list(syllables)
    for first in syllables:
        out.extend(first + second for second in syllables)
        if len(out) >= count:
            break
    return out[:count]


def word_tokenizer(vocab_size: int) -> Tokenizer:
    vocab = {token: i for i, token in enumerate(SPECIALS)}
    for word in (*ROLES, *words(vocab_size - len(SPECIALS) - len(ROLES))):
        vocab[word] = len(vocab)
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<s>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with one space
    tokenizer.add_special_tokens(list(SPECIALS))
    return tokenizer


def write_text_files(folder: Path, *, vocab_size: int, bos_id: int = 0, eos_id: int = 1,
                     chat_template: str | None = CHAT_TEMPLATE, generation: dict | None = None) -> Tokenizer:
    """tokenizer.json, tokenizer_config.json and generation_config.json into a checkpoint folder."""
    tokenizer = word_tokenizer(vocab_size)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIALS[bos_id],
              "eos_token": SPECIALS[eos_id], "unk_token": SPECIALS[bos_id], "model_max_length": 256,
              "clean_up_tokenization_spaces": False}
    if chat_template is not None:
        config["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": bos_id, "eos_token_id": eos_id, **(generation or {})}, indent=2))
    return tokenizer
