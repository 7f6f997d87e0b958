"""Text at the edge: a checkpoint's tokenizer, chat template and generation defaults, and a completion's text.

Pure module (the `tokenizers` library and jinja2; no Django). Read once per model when its dense part
is loaded; the network itself only ever sees token ids.

    codec = TextCodec.from_files(tokenizer_json, tokenizer_config, generation_config)
    codec.encode("text")                      -> ids, with the tokenizer's own special tokens (bos …)
    codec.chat_ids(messages)                  -> ids of the rendered chat, as transformers'
                                                 apply_chat_template(messages, add_generation_prompt=True)
    codec.decode(ids)                         -> text, special tokens skipped
    CompletionText(codec, stop=["\\n\\n"])   -> fed each new token, gives the text to send now, and
                                                 whether a stop string ended the completion

Chat templates are Hugging Face's: jinja2 in an immutable sandbox, trim_blocks and lstrip_blocks, the
`loopcontrols` extension, `raise_exception`, `strftime_now` and a `tojson` that does not escape HTML,
the tokenizer's special tokens (`bos_token`, `eos_token`, …) as variables (docs/openai.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
REPLACEMENT = "\ufffd"  # what a decode shows for the bytes of a character not yet complete


class TextError(ValueError):
    """The checkpoint's text files cannot serve a request; `reason` says why (template_refused,
    template_invalid, tokenizer_invalid)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json spells it: a string, or an AddedToken object."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _template_environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


class TextCodec:
    """One model's tokenizer, chat template, special tokens and generation defaults."""

    def __init__(self, tokenizer: Tokenizer, config: Mapping[str, Any], generation: Mapping[str, Any]) -> None:
        self.tokenizer = tokenizer
        self.special_tokens = {key: text for key in SPECIAL_TOKEN_KEYS
                               if (text := _token_text(config.get(key))) is not None}
        self.clean_up_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        template = config.get("chat_template")
        if isinstance(template, list):  # several named templates: the "default" one serves chat
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
            template = named.get("default")
        self.chat_template: str | None = template if isinstance(template, str) and template.strip() else None
        self._template: jinja2.Template | None = None
        if self.chat_template is not None:
            try:
                self._template = _template_environment().from_string(self.chat_template)
            except jinja2.exceptions.TemplateError as exc:
                raise TextError("template_invalid", f"the chat template does not compile: {exc}") from exc
        self.generation_defaults = {key: generation[key] for key in
                                    ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
                                    if isinstance(generation.get(key), int | float)
                                    and not isinstance(generation.get(key), bool)}
        eos = generation.get("eos_token_id")
        self.eos_ids = frozenset(v for v in (eos if isinstance(eos, list) else [eos])
                                 if isinstance(v, int) and not isinstance(v, bool))

    @classmethod
    def from_files(cls, tokenizer_json: bytes, tokenizer_config: bytes | None,
                   generation_config: bytes | None) -> TextCodec:
        """From the checkpoint's tokenizer.json, tokenizer_config.json and generation_config.json (the last
        two may be absent). TextError naming the file that is not what it should be."""
        try:
            tokenizer = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
        except Exception as exc:  # the Rust library raises its own Exception subclass
            raise TextError("tokenizer_invalid", f"tokenizer.json does not load: {str(exc)[:300]}") from exc
        parsed = []
        for name, raw in (("tokenizer_config.json", tokenizer_config), ("generation_config.json", generation_config)):
            try:
                value = json.loads(raw) if raw else {}
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise TextError("tokenizer_invalid", f"{name} is not JSON: {exc}") from exc
            if not isinstance(value, dict):
                raise TextError("tokenizer_invalid", f"{name} is not a JSON object")
            parsed.append(value)
        return cls(tokenizer, parsed[0], parsed[1])

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ids, special tokens skipped (transformers' decode(skip_special_tokens=True))."""
        text = self.tokenizer.decode(list(ids), skip_special_tokens=True)
        return _clean_up_spaces(text) if self.clean_up_spaces else text

    def render_chat(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> str:
        """The chat as the model reads it. TextError: no template, or the template refused the messages
        (its raise_exception), or failed on them."""
        if self._template is None:
            raise TextError("template_missing", "this model's checkpoint has no chat template "
                                                "(tokenizer_config.json's chat_template): use completions")
        try:
            return self._template.render(messages=[dict(m) for m in messages], tools=None, documents=None,
                                         add_generation_prompt=add_generation_prompt, **self.special_tokens)
        except jinja2.exceptions.TemplateError as exc:  # raise_exception, or a sandbox refusal
            raise TextError("template_refused", f"the chat template refused these messages: {exc}") from exc
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
            raise TextError("template_refused", f"the chat template failed on these messages: "
                                                f"{type(exc).__name__}: {exc}") from exc

    def chat_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """apply_chat_template(messages, add_generation_prompt=True, tokenize=True): the rendered text
        encoded without adding special tokens (the template writes its own)."""
        return self.encode(self.render_chat(messages), add_special_tokens=False)


def _clean_up_spaces(text: str) -> str:
    """transformers' clean_up_tokenization: no space before punctuation and English contractions."""
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(before, after)
    return text


class CompletionText:
    """The text of a completion as its tokens arrive: what may be sent now, and where a stop string ends it.

    A delta is held back while it ends in an incomplete character (the decode shows U+FFFD) or in a
    prefix of a stop string, so what was sent is never taken back; when a stop string appears (also
    across token boundaries), the text ends just before it and the stop string is not sent."""

    def __init__(self, codec: TextCodec, stop: Sequence[str] = ()) -> None:
        self.codec = codec
        self.stop = [s for s in stop if s]
        self.ids: list[int] = []
        self.text = ""  # the completion's text so far, up to any stop string
        self.sent = 0  # characters of self.text already handed out
        self.stopped = False

    def add(self, token: int) -> str:
        """Take one new token; the text that may be sent now (possibly "")."""
        if self.stopped:
            return ""
        self.ids.append(token)
        text = self.codec.decode(self.ids)
        for stop in self.stop:
            at = text.find(stop, max(0, self.sent - len(stop) + 1))
            if at != -1 and (not self.stopped or at < len(self.text)):
                self.text, self.stopped = text[:at], True
        if self.stopped:
            return self.flush()
        self.text = text
        ready = len(text.rstrip(REPLACEMENT)) if text.endswith(REPLACEMENT) else len(text)
        ready -= self._stop_prefix(text[:ready])
        if ready <= self.sent:
            return ""
        delta, self.sent = text[self.sent:ready], ready
        return delta

    def flush(self) -> str:
        """At the end: whatever was held back."""
        delta, self.sent = self.text[self.sent:], len(self.text)
        return delta

    def _stop_prefix(self, text: str) -> int:
        """Length of the longest end of `text` that begins some stop string."""
        longest = 0
        for stop in self.stop:
            for n in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:n]):
                    longest = n
                    break
        return longest
