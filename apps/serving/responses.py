"""OpenAI's response objects, built from the events a generation streams (apps/generation/runs.py).

Pure module. One `CompletionBuilder` per request: `chunk(event)` gives the streamed chunk of a token
event (None when it has nothing to show yet), `last_chunks(end)` the chunks that close a stream, and
`response(events)` the whole non-streamed object. Shapes are OpenAI's (docs/openai.md).
"""

from __future__ import annotations

from typing import Any, Literal

Kind = Literal["chat", "text"]


def _usage(end: dict[str, Any]) -> dict[str, int]:
    usage = end["usage"]
    return {"prompt_tokens": usage["prompt_tokens"], "completion_tokens": usage["completion_tokens"],
            "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]}


def _entry(piece: str, logprob: float) -> dict[str, Any]:
    return {"token": piece, "logprob": logprob, "bytes": list(piece.encode("utf-8"))}


class CompletionBuilder:
    def __init__(self, *, kind: Kind, generation_id: str, model: str, created: int, logprobs: bool,
                 include_usage: bool = False) -> None:
        self.kind, self.model, self.created, self.logprobs = kind, model, created, logprobs
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + generation_id
        self.include_usage = include_usage
        self._offset = 0  # characters of text before the next token (completions' text_offset)

    def _object(self, chunk: bool) -> str:
        if self.kind == "chat":
            return "chat.completion.chunk" if chunk else "chat.completion"
        return "text_completion"

    def _envelope(self, choices: list[dict[str, Any]], *, chunk: bool) -> dict[str, Any]:
        return {"id": self.id, "object": self._object(chunk), "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices}

    def _logprobs(self, events: list[dict[str, Any]]) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        if self.kind == "chat":
            return {"content": [{**_entry(e["piece"], e["logprob"]),
                                 "top_logprobs": [_entry(piece, lp) for _, lp, piece in e["top"]]} for e in events]}
        offsets = []
        for e in events:
            offsets.append(self._offset)
            self._offset += len(e["piece"])
        return {"tokens": [e["piece"] for e in events], "token_logprobs": [e["logprob"] for e in events],
                "top_logprobs": [{piece: lp for _, lp, piece in e["top"]} for e in events], "text_offset": offsets}

    def first_chunk(self) -> dict[str, Any] | None:
        """A chat stream opens with the assistant's role, as OpenAI's does."""
        if self.kind != "chat":
            return None
        return self._envelope([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                "finish_reason": None}], chunk=True)

    def chunk(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """The chunk of one token event; None when it adds no text and no log-probability."""
        if not event["text"] and not (self.logprobs and "logprob" in event):
            return None
        logprobs = self._logprobs([event]) if "logprob" in event else None
        if self.kind == "chat":
            choice = {"index": 0, "delta": {"content": event["text"]}, "logprobs": logprobs, "finish_reason": None}
        else:
            choice = {"index": 0, "text": event["text"], "logprobs": logprobs, "finish_reason": None}
        return self._envelope([choice], chunk=True)

    def last_chunks(self, end: dict[str, Any]) -> list[dict[str, Any]]:
        """What closes a stream: the held-back text with the finish reason, then the usage if asked."""
        finish = end["finish_reason"]
        if self.kind == "chat":
            delta = {"content": end["text"]} if end["text"] else {}
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": end["text"], "logprobs": None, "finish_reason": finish}
        chunks = [self._envelope([choice], chunk=True)]
        if self.include_usage:
            chunks.append({**self._envelope([], chunk=True), "usage": _usage(end)})
        return chunks

    def response(self, tokens: list[dict[str, Any]], end: dict[str, Any]) -> dict[str, Any]:
        """The whole non-streamed object from every token event and the end event."""
        text = "".join(e["text"] for e in tokens) + end["text"]
        logprobs = self._logprobs([e for e in tokens if "logprob" in e])
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                      "finish_reason": end["finish_reason"]}
        else:
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": end["finish_reason"]}
        return {**self._envelope([choice], chunk=False), "usage": _usage(end)}
