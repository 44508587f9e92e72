"""One engine call of ``QGPMLLM`` (:class:`LLMCall`) and the LlamaIndex completion responses of
finished and streamed calls: the text, and on the last response the call's usage and
:class:`qgpm.QGPMResult` (``raw``) and its method and finish reason (``additional_kwargs``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncGenerator, Iterator, Optional

from llama_index.core.base.llms.types import CompletionResponse, CompletionResponseAsyncGen, CompletionResponseGen

from qgpm import QGPMResult

if TYPE_CHECKING:
    from ._prompt import PromptParts
    from ._tracing import QGPMTrace

__all__ = ["LLMCall", "completion", "completions", "acompletions"]


@dataclass
class LLMCall:
    """One engine call: ``engine.answer`` (``parts`` found) or ``engine.chat`` (``parts is None``)."""

    parts: Optional[PromptParts]
    args: tuple
    kwargs: dict[str, Any]
    trace: Optional[QGPMTrace]  # the trace of the synthesis the call is part of
    details: dict[str, Any] = field(default_factory=dict)


def result_fields(result: Optional[QGPMResult]) -> dict[str, Any]:
    """What a finished call's response carries besides its text: usage and the result."""
    if result is None:
        return {}
    usage = {"prompt_tokens": result.usage.prompt_tokens, "completion_tokens": result.usage.answer_tokens,
             "total_tokens": result.usage.total_tokens}
    return {"raw": {"usage": usage, "result": result},
            "additional_kwargs": {"method": result.method, "finish_reason": result.finish_reason}}


def completion(result: QGPMResult) -> CompletionResponse:
    return CompletionResponse(text=result.text, **result_fields(result))


def completions(pieces: Iterator[tuple[str, Optional[QGPMResult]]]) -> CompletionResponseGen:
    text = ""
    for piece, result in pieces:
        text += piece
        yield CompletionResponse(text=text, delta=piece, **result_fields(result))


async def acompletions(pieces: AsyncGenerator[tuple[str, Optional[QGPMResult]], None]) -> CompletionResponseAsyncGen:
    text = ""
    async for piece, result in pieces:
        text += piece
        yield CompletionResponse(text=text, delta=piece, **result_fields(result))
