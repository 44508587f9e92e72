"""Input limits: what cannot fit the model window is refused before any model work.

Two checks, both raising :class:`ContextTooLongError` with what to shorten:
:func:`check_input_size` bounds the caller's raw text cheaply (characters first, then a token
count that stops at the limit), and :func:`check_fits` applies the one exact rule to every
assembled prompt. :func:`prompt_overhead` counts the tokens QGPM's own prompt takes around a
context and a question, for callers that pack retrieved text into the window themselves.
:func:`model_window` reads the window a model's positions cover from its config.
"""

from __future__ import annotations

from typing import Any, Sequence

from .prompt import PromptSpec, count_prompt_tokens, normalize_spec
from .tokens import count_tokens_bounded, max_token_chars

__all__ = ["ContextTooLongError", "check_input_size", "check_fits", "model_window", "prompt_overhead"]


class ContextTooLongError(ValueError):
    """The prompt plus the generation budget does not fit the model's window."""


def model_window(config: Any) -> int:
    """The longest sequence a model's positions cover, in tokens (0: none known).

    ``max_position_embeddings``, or, for YaRN RoPE, ``factor * original_max_position_embeddings``
    where that is longer: Qwen2.5's long-context recipe adds YaRN and leaves
    ``max_position_embeddings`` at the original window, and YaRN's stretched frequencies are
    what make the longer window valid (vLLM derives its ``max_model_len`` the same way).
    Transformers' ``rope_parameters`` (>= 5, per layer kind on Gemma 3) and the older
    ``rope_scaling`` are both read.
    """
    window = int(getattr(config, "max_position_embeddings", 0) or 0)
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if not isinstance(rope, dict):
        return window
    groups = [rope] if ("rope_type" in rope or "type" in rope) else [v for v in rope.values() if isinstance(v, dict)]
    for params in groups:
        factor, original = params.get("factor"), params.get("original_max_position_embeddings")
        if params.get("rope_type", params.get("type")) == "yarn" and factor and original:
            window = max(window, int(float(factor) * int(original)))
    return window


def check_input_size(tokenizer: Any, window: int, texts: Sequence[str], max_new_tokens: int, *, context: Sequence[str] = (),
                     exact: bool = True) -> None:
    """Raise :class:`ContextTooLongError` for caller text that cannot fit a ``window`` of tokens, cheaply.

    First a character bound: no token of this tokenizer stands for more than
    :func:`~qgpm.tokens.max_token_chars` characters, so more characters than that
    times the room left cannot fit (no tokenizing at all). Then, for large inputs, a
    plain-text token count that stops as soon as it passes the room left. Both are
    lower bounds; the exact count of the assembled prompt follows in :func:`check_fits`.
    ``context`` is counted with ``texts`` unless ``exact=False`` (Top-K, whose edit
    may shorten it: there only the character bound applies to it). ``window=0``: no limit known.
    """
    if not window:
        return
    room = window - max_new_tokens
    if room < 1:
        raise ContextTooLongError(
            f"max_new_tokens={max_new_tokens} leaves no room for the prompt in the model window of {window} tokens; "
            "lower max_new_tokens."
        )
    per = max_token_chars(tokenizer)
    chars = sum(len(t) for t in texts) + sum(len(d) for d in context)
    longest = max((len(t) for t in texts), default=0)
    shorten = ("the context (or retrieve fewer documents)" if sum(len(d) for d in context) >= longest
               else "the longest text besides the context (the question, instruction, system prompt or a message)")
    if chars > room * per:
        raise ContextTooLongError(
            f"the input is {chars} characters: more than can fit the model window of {window} tokens with "
            f"max_new_tokens={max_new_tokens} (a token of this tokenizer covers at most {per} characters, so at most "
            f"{room * per} characters fit). Shorten {shorten}, or lower max_new_tokens."
        )
    counted = list(texts) + (list(context) if exact else [])
    if sum(len(t) for t in counted) > 4 * room:
        n = 0
        for t in counted:
            n += count_tokens_bounded(tokenizer, t, room - n)
            if n > room:
                raise ContextTooLongError(
                    f"the input is more than {room} tokens (counted until the limit): with max_new_tokens="
                    f"{max_new_tokens} it cannot fit the model window of {window} tokens. Shorten {shorten}, "
                    "or lower max_new_tokens."
                )


def check_fits(window: int, num_tokens: int, max_new_tokens: int, *, context_tokens: int | None = None,
               shorten: str = "the context (or retrieve fewer documents)") -> None:
    """The one "prompt too long" rule, for every assembled prompt: raise
    :class:`ContextTooLongError` when ``num_tokens`` plus the generation budget exceed the
    model ``window``. ``shorten`` names what the caller should shorten."""
    if window and num_tokens + max_new_tokens > window:
        ctx = "" if context_tokens is None else f" (context {context_tokens})"
        raise ContextTooLongError(
            f"the prompt is {num_tokens} tokens{ctx} and max_new_tokens is {max_new_tokens}: "
            f"{num_tokens + max_new_tokens} > the model window of {window} tokens. "
            f"Shorten {shorten}, or lower max_new_tokens."
        )


def prompt_overhead(tokenizer: Any, *, instruction: str | None = None, system: str | None = None,
                    answer_prefix: str | None = None) -> int:
    """Tokens QGPM's own prompt takes around a call's context and question: the instruction, the
    system message, the answer prefix and the chat template's (or the plain-text format's) markers.

    A caller that packs retrieved text into the window itself (LlamaIndex's prompt helper) must
    leave this much room, since the call's prompt is QGPM's and not the one it measured. Counted
    on a one-character context and question, so it errs by a token or two on the safe side.
    """
    spec = normalize_spec(PromptSpec(context="x", question="x", instruction=instruction, system=system, answer_prefix=answer_prefix))
    return count_prompt_tokens(tokenizer, spec)
