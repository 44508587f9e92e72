"""Token counting for LlamaIndex with the model's own tokenizer: :func:`set_tokenizer` (the global
tokenizer behind ``Settings.tokenizer``), plain-text token ids as QGPM tokenizes retrieved text,
and the tokens QGPM's own prompt takes around a call's context and question."""

from __future__ import annotations

from typing import Any

import llama_index.core
from llama_index.core import Settings

from qgpm.limits import prompt_overhead
from qgpm.prompt import PromptSpec, normalize_spec, render_prompt
from qgpm.tokens import encode_plain

__all__ = ["set_tokenizer", "plain_ids", "qgpm_prompt_overhead"]


def plain_ids(tok: Any, text: str) -> list[int]:
    """Token ids of ``text`` as plain text, as QGPM tokenizes retrieved text (special-token strings are text)."""
    if hasattr(tok, "backend_tokenizer"):
        return encode_plain(tok, text)
    return tok(text, add_special_tokens=False, verbose=False)["input_ids"]  # a non-HF tokenizer (test stand-ins)


def qgpm_prompt_overhead(tok: Any, **parts: Any) -> int:
    """:func:`qgpm.limits.prompt_overhead` (a tokenizer without a Rust backend, the tests' stand-ins: its tokens of the rendered prompt)."""
    if hasattr(tok, "backend_tokenizer"):
        return prompt_overhead(tok, **parts)
    spec = normalize_spec(PromptSpec(context="x", question="x", **parts))
    return len(tok(render_prompt(tok, spec).text, add_special_tokens=False)["input_ids"])


def _engine_of(obj: Any) -> Any:
    """The engine of a :class:`QGPMLLM` (its ``engine``), of anything holding one in ``llm`` (a synthesizer), or ``obj`` itself."""
    engine = getattr(obj, "engine", None)
    if engine is None:
        engine = getattr(getattr(obj, "llm", None), "engine", None)
    return obj if engine is None else engine


def set_tokenizer(engine_or_llm: Any, *, force: bool = False) -> bool:
    """Make LlamaIndex count tokens with the model's own tokenizer.

    ``engine_or_llm``: a :class:`qgpm.QGPM`, a :class:`QGPMLLM` or a
    :class:`~qgpm_integrations.llama_index.QGPMSynthesizer`. Sets the global tokenizer
    behind ``Settings.tokenizer`` (text splitters and the prompt helpers that pack chunks
    into the window use it), so no tiktoken encoding is loaded or downloaded. Without
    ``force`` a tokenizer already chosen is kept. Returns whether it was set.
    """
    tok = getattr(_engine_of(engine_or_llm), "tokenizer", None)
    if tok is None:
        raise TypeError(f"set_tokenizer takes a qgpm.QGPM engine, a QGPMLLM or a QGPMSynthesizer; got {type(engine_or_llm).__name__}")
    if llama_index.core.global_tokenizer is not None and not force:
        return False

    def encode(text: str) -> list[int]:
        return plain_ids(tok, text)

    Settings.tokenizer = encode
    return True
