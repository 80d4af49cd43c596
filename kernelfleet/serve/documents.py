"""The OpenAI-compatible API's documents (pydantic): what a client sends and what it gets back.

A completion request is checked field by field; a field the API does not know is an error (a
client that sends ``logprobs`` or ``best_of`` would otherwise get an answer that silently ignores it).
Beyond OpenAI's fields, as vLLM names them: ``stop_token_ids`` and ``ignore_eos``; every choice
carries its ``token_ids``. A choice's ``text`` is None when the model directory has no tokenizer.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

TokenId = Annotated[int, Field(ge=0)]
StopString = Annotated[str, Field(min_length=1, max_length=256)]
MAX_CHOICES = 128  # OpenAI's bound on n


class CompletionRequest(BaseModel):
    """``POST /v1/completions``."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: str | None = Field(None, description="The served model's id (GET /v1/models); any other is a 404.")
    prompt: Annotated[str, Field(min_length=1)] | Annotated[list[TokenId], Field(min_length=1)] = Field(
        description="Text (when the model directory has a tokenizer) or token ids.")
    max_tokens: int = Field(16, ge=1, description="Tokens to generate at most.")
    temperature: float = Field(1.0, ge=0, le=2, description="0 is greedy.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling: the most likely tokens up to this mass.")
    seed: int | None = Field(None, ge=0, lt=2**63, description="The same seed gives the same tokens.")
    stop: StopString | Annotated[list[StopString], Field(max_length=4)] | None = Field(
        None, description="Stop where the text holds any of these (at most 4); the text ends before it.")
    n: int = Field(1, ge=1, le=MAX_CHOICES, description="Choices to generate for the prompt, each its own request.")
    stop_token_ids: list[TokenId] = Field([], max_length=256, description="Stop after any of these tokens.")
    ignore_eos: bool = Field(False, description="Do not stop at the model's end-of-sequence tokens.")
    stream: bool = Field(False, description="Server-sent events, one per token, then `data: [DONE]`.")

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class Choice(BaseModel):
    index: int = 0
    text: str | None
    token_ids: list[int]
    finish_reason: Literal["stop", "length", "error"] | None
    logprobs: None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Completion(BaseModel):
    """The answer, whole or (``stream``) one chunk per token with ``usage`` on none of them."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "kernelfleet"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    code: int


class Error(BaseModel):
    """Every refusal, in OpenAI's shape: ``{"error": {"message", "type", "code"}}``."""

    error: ErrorBody
