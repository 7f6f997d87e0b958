"""The request bodies of OpenAI's completions and chat completions, and what they ask of `moe/generate`.

Fields this router does not serve are refused by the schema itself, by name (n > 1, best_of > 1,
echo, suffix, tools, logit_bias, a response_format other than text), rather than silently ignored:
the OpenAPI description says what is served. Fields OpenAI's clients
send that change nothing here (user, metadata, store, service_tier, …) are accepted and ignored.
Sampling extensions that vLLM and llama.cpp's server also take (top_k, min_p, repetition_penalty)
are accepted too (docs/openai.md).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from django.conf import settings
from pydantic import BaseModel, ConfigDict, Field

from apps.generation.sampling import MAX_TOP_LOGPROBS

DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions
MAX_NEW = settings.TENZRO_GENERATE_MAX_NEW_TOKENS
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1, max_length=200)
    max_tokens: int | None = Field(None, ge=1, le=MAX_NEW, description="At most TENZRO_GENERATE_MAX_NEW_TOKENS.")
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, le=2**31 - 1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=1, description="Only 1: one choice per request.")
    stream: bool = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, float] | None = Field(None, max_length=0, description="Not supported: empty or absent.")
    user: str | None = None

    def sampling(self, top_logprobs: int | None) -> dict[str, Any]:
        """The `sampling` of moe/generate: what the client set; the rest from the model's defaults."""
        given = {name: getattr(self, name) for name in ("temperature", "top_p", "top_k", "min_p",
                                                        "repetition_penalty", "presence_penalty",
                                                        "frequency_penalty", "seed")}
        return {**{k: v for k, v in given.items() if v is not None}, "top_logprobs": top_logprobs,
                "use_model_defaults": True}


class CompletionRequest(_Common):
    prompt: str | list[TokenId] = Field(description="Text, or one prompt's token ids.", max_length=1_000_000)
    max_tokens: int | None = Field(DEFAULT_COMPLETION_TOKENS, ge=1, le=MAX_NEW)
    logprobs: int | None = Field(None, ge=0, le=5, description="Log-probabilities of this many most likely tokens.")
    echo: Literal[False] = Field(False, description="Not supported: false or absent.")
    best_of: int | None = Field(None, ge=1, le=1)
    suffix: None = Field(None, description="Not supported: absent.")

    def worker_params(self) -> dict[str, Any]:
        prompt: dict[str, Any] = {"prompt": self.prompt} if isinstance(self.prompt, str) else \
            {"prompt_ids": self.prompt}
        return {**prompt, "max_new_tokens": self.max_tokens or DEFAULT_COMPLETION_TOKENS, "stop": self.stop,
                "sampling": self.sampling(self.logprobs)}


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str = Field(min_length=1, max_length=64)
    content: str | list[TextPart] | None = None
    name: str | None = None

    def plain(self) -> dict[str, Any]:
        content = self.content if isinstance(self.content, str) else \
            "".join(part.text for part in self.content or [])
        return {"role": self.role, "content": content, **({"name": self.name} if self.name else {})}


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"] = Field(description="Only text: JSON modes are not supported.")


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1, max_length=512)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_NEW)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS, description="With logprobs: true.")
    tools: list[dict[str, Any]] | None = Field(None, max_length=0, description="Not supported: empty or absent.")
    tool_choice: Any = None
    response_format: ResponseFormat | None = None

    def worker_params(self) -> dict[str, Any]:
        limit = self.max_completion_tokens or self.max_tokens
        top_logprobs = (self.top_logprobs or 0) if self.logprobs else None
        return {"messages": [m.plain() for m in self.messages],
                **({"max_new_tokens": limit} if limit else {"fill_context": True}), "stop": self.stop,
                "sampling": self.sampling(top_logprobs)}
