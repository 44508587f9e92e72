"""The user-facing engine: load a model once, answer questions over long contexts.

    from qgpm import QGPM
    engine = QGPM.from_pretrained()                    # embedded SmolLM2-135M-Instruct
    result = engine.answer(context=long_text, question="Who calibrated the tide gauge?")
    print(result.text); print(result.top_sentences(3))

Methods: ``vanilla`` (standard RoPE), ``qgpm`` (head relevance -> modulated positions),
``oracle`` (caller-given evidence -> modulated positions), ``topk`` / ``reorder``
(reranker-based input editing with standard RoPE, paper Sec. 5.3), and the paper's
query-agnostic baselines: RoPE changes ``string`` / ``ms-poe`` / ``self-extend`` and input
compression ``llmlingua-2`` (settings in ``options=``, see :mod:`qgpm.baselines`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import numbers
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from queue import Empty, Queue
from typing import Any, Iterator, Literal, Sequence

import torch

from .baselines import BASELINE_METHODS, ROPE_BASELINES, build_baseline_plan, resolve_options
from .config import QGPMConfig
from .defaults import DEFAULT_K, DEFAULT_RERANKER, METHODS, PASS1_FIELDS as _PASS1_FIELDS
from .fingerprint import ModelFingerprint, model_fingerprint
from .heads import HeadSet, HeadSetMissingError, check_head_set, find_head_set, known_model_name, missing_head_set_error
from .loading import ModelSource, load_model, load_tokenizer, parse_dtype, resolve_source
from .plan import REORDER_LAYERED_ERROR, MapResult, build_plan, check_local_layers, oracle_units, reorder_needs_masks, split_layer
from .prompt import DEFAULT_TEMPLATE, Prompt, PromptError, PromptSpec, build_prompt, check_prompt_inputs, check_template, has_visible_text, render_chat
from .relevance import Pass1Stats, head_token_logits, sentence_logits
from .results import AnswerStream, PreparedCall, QGPMResult, SentenceRelevance, StreamState, Timings, Usage
from .rope import PositionPlan, rotary_info
from .runtime import apply_plan, cache_kwarg as _cache_kwarg, check_supported, decoder_layers, model_lock, reorder_mask_kind
from .rerank import BM25Reranker, get_reranker
from .shaping import fuse_heads
from .sources import fuse_sources, parse_source, reranker_relevance
from .tokens import count_plain, count_tokens_bounded, encode_plain, encode_prompt, max_token_chars, plain_backend, special_token_ids

logger = logging.getLogger("qgpm")

__all__ = ["QGPM", "QGPMResult", "SentenceRelevance", "Usage", "Timings", "METHODS", "ContextTooLongError", "AnswerStream", "PreparedCall", "CallOptions"]

Method = Literal["vanilla", "qgpm", "oracle", "topk", "reorder", "string", "ms-poe", "self-extend", "llmlingua-2"]


@dataclass(frozen=True)
class CallOptions:
    """How to prepare one call: the arguments of :meth:`QGPM.prepare` besides context and question.

    :meth:`QGPM.answer`, :meth:`QGPM.prepare` and :meth:`QGPM.stream` take these as keyword
    arguments (see :meth:`QGPM.answer` for each); the engine carries them as one object.
    ``max_new_tokens`` is the generation budget the prompt must leave room for. Values are
    stored as given and checked when the call is prepared.
    """

    method: Method = "qgpm"
    evidence: Sequence[str] | None = None
    system: str | None = None
    instruction: str | None = None
    answer_prefix: str | None = None
    template: str = DEFAULT_TEMPLATE
    reranker: Any = None
    k: int = DEFAULT_K
    config: QGPMConfig | None = None
    max_new_tokens: int = 0
    options: Any = None

    @classmethod
    def take(cls, kwargs: dict[str, Any], **defaults: Any) -> "CallOptions":
        """Pop this class's fields out of ``kwargs`` (the rest stays there).

        ``defaults`` replace the class defaults for fields ``kwargs`` does not hold.
        """
        values = dict(defaults)
        for f in dataclasses.fields(cls):
            if f.name in kwargs:
                values[f.name] = kwargs.pop(f.name)
        return cls(**values)


class ContextTooLongError(ValueError):
    """The prompt plus the generation budget does not fit the model's window."""


def _note_flat(mr: MapResult, config: QGPMConfig) -> None:
    """Log the three rules that make a call keep vanilla positions: the confidence rule
    (``config.min_top_z``), the dominance rule (``config.decisive_margin``) and the
    short-context rule (``config.keep_length``)."""
    if mr.flat:
        logger.warning(
            "qgpm: the head relevance is flat (top sentence z below min_top_z=%s), so this call keeps vanilla "
            "positions; result.details['flat_relevance'] is True. Lower min_top_z (or set it to None) to always modulate.",
            config.min_top_z,
        )
    elif mr.decisive:
        logger.warning(
            "qgpm: one sentence already stands out (top z exceeds the next by at least decisive_margin=%s), so this "
            "call keeps vanilla positions; result.details['decisive_relevance'] is True. Set decisive_margin=None in "
            "QGPMConfig to modulate such calls too.",
            config.decisive_margin,
        )
    elif config.keep_length > 0 and mr.s_low >= 1.0:
        logger.warning(
            "qgpm: the context is no longer than keep_length=%s tokens, so this call keeps vanilla positions "
            "(result.details['s_low'] is 1.0). Set keep_length=0 in QGPMConfig to modulate short contexts too.",
            config.keep_length,
        )


class _TimingStreamer:
    """A generate() streamer that records when the first new token appears and forwards tokens."""

    def __init__(self, inner=None) -> None:
        self.inner = inner
        self.first_token_at: float | None = None
        self._prompt_seen = False
        self.count = 0

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
        else:
            if self.first_token_at is None:
                self.first_token_at = time.perf_counter()
            self.count += int(value.numel())
        if self.inner is not None:
            self.inner.put(value)

    def end(self) -> None:
        if self.inner is not None:
            self.inner.end()


class QGPM:
    """QGPM over one loaded HF causal LM and its tokenizer.

    Build it with :meth:`from_pretrained` (model id, folder, .gguf file, or ``None`` for
    the embedded SmolLM2-135M-Instruct), or directly from a loaded model + fast tokenizer.
    One engine may be shared by many threads and framework adapters: calls on one model
    are serialized, and every call leaves the model unpatched. ``engine.fingerprint``
    (:class:`~qgpm.fingerprint.ModelFingerprint`) identifies the model: its stored head
    set and config preset are found by ``fingerprint.key``, with or without ``name=``.

    ``reuse_prefill`` (default ``True``): a ``qgpm`` call whose pass 2 starts with a run of
    tokens computed exactly as in a vanilla prefill (all of them when the call falls back to
    vanilla positions; under ``remap="reorder"`` fed in slot order, the tokens before the
    first moved one) lets pass 1 go on through every layer when that is cheaper than stopping
    at the deepest head's layer, and generation starts from those tokens' cached states
    instead of prefilling them again (:func:`continue_pays`). A call that falls back then
    costs one prefill, not one and a pass 1. The answer is the same computation; only the
    float rounding of the tokens after the reused ones can differ (they run as a separate
    chunk, as in any prefix-cached prefill). ``result.details["prefill_reused"]`` says how
    many prompt tokens were reused. ``False`` (or ``engine.reuse_prefill = False``): pass 1
    always stops at the deepest head's layer and pass 2 prefills the whole prompt.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        heads: HeadSet | Sequence[tuple[int, int]] | str | os.PathLike[str] | None = None,
        config: QGPMConfig | None = None,
        name: str | None = None,
        reuse_prefill: bool = True,
    ) -> None:
        if not isinstance(reuse_prefill, bool):
            raise TypeError(f"reuse_prefill must be True or False, got {reuse_prefill!r}")
        if not getattr(tokenizer, "is_fast", False):
            raise TypeError("QGPM needs a fast (Rust) tokenizer: character offsets map roles and sentences to tokens")
        self.model = model
        self.tokenizer = tokenizer
        self.reuse_prefill = reuse_prefill
        self._warned_attention: set[str] = set()
        # one-time tokenizer setup for the input checks (so no call pays for it)
        plain_backend(tokenizer)
        max_token_chars(tokenizer)
        fp = model_fingerprint(model, tokenizer)
        self.name = name or known_model_name(fp.key) or str(getattr(model.config, "_name_or_path", "") or type(model).__name__)
        self.fingerprint: ModelFingerprint = dataclasses.replace(fp, name=self.name)  # head sets, presets: by .key
        self.family = getattr(model.config, "model_type", "?")
        self.config = config or QGPMConfig.for_model(self.fingerprint.key)
        self._support_error: Exception | None = None
        try:
            check_supported(model)
            self.rotary = rotary_info(model)
        except Exception as exc:  # vanilla still works; qgpm/oracle raise this
            self._support_error = exc
            self.rotary = None
        self.n_layers = len(decoder_layers(model)) if self._support_error is None else getattr(model.config, "num_hidden_layers", 0)
        self._warned_pass1: set[torch.dtype] = set()
        self._head_error: Exception | None = None
        self.head_set: HeadSet | None = None
        self.set_heads(heads)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(
        cls,
        model: str | os.PathLike[str] | None = None,
        *,
        device_map: Any = None,
        dtype: torch.dtype | str | None = None,
        heads: HeadSet | Sequence[tuple[int, int]] | str | os.PathLike[str] | None = None,
        config: QGPMConfig | None = None,
        gguf_file: str | None = None,
        attn_implementation: str | None = None,
        reuse_prefill: bool = True,
        **model_kwargs: Any,
    ) -> "QGPM":
        """Load a model (cached per process) and its head set.

        ``model``: ``None``/``"smollm2"`` (embedded default), an HF id or local folder,
        or a path to a ``.gguf`` file. ``heads``: ``None`` = the stored set for this model;
        ``"calibrate"`` = calibrate now on synthetic samples; a path to a head-set JSON;
        or a list of ``(layer, head)``. ``reuse_prefill``: see :class:`QGPM`. Other keyword
        arguments go to ``AutoModelForCausalLM.from_pretrained``.
        """
        if not isinstance(reuse_prefill, bool):
            raise TypeError(f"reuse_prefill must be True or False, got {reuse_prefill!r}")
        source = resolve_source(model, gguf_file)
        if heads == "calibrate":
            from .samples import check_data_packages

            check_data_packages()  # a missing data package fails here, before the weights load
        if attn_implementation is not None:
            model_kwargs["attn_implementation"] = attn_implementation
        mdl = load_model(source, dtype=dtype, device_map=device_map, **model_kwargs)
        tok = load_tokenizer(source)
        engine = cls(mdl, tok, heads=None if heads == "calibrate" else heads, config=config, name=source.name, reuse_prefill=reuse_prefill)
        engine.source = source
        if heads == "calibrate":
            engine.set_heads("calibrate")
        return engine

    def set_heads(self, heads: HeadSet | Sequence[tuple[int, int]] | str | os.PathLike[str] | None) -> None:
        """Choose the heads pass 1 reads (see :meth:`from_pretrained` for the forms).

        A stored set (``None``), a :class:`HeadSet` or a head-set file made for another
        model (another fingerprint key) raises :class:`~qgpm.heads.HeadSetMismatchError`;
        a list of ``(layer, head)`` is taken as given.
        """
        self._head_error = None
        if isinstance(heads, HeadSet):
            hs = heads
            check_head_set(hs, self.fingerprint)
        elif heads is None:
            found = find_head_set(self.fingerprint)
            if found is None:
                self.head_set, self._head_error = None, missing_head_set_error(self.fingerprint)
                return
            hs = found[0]
            check_head_set(hs, self.fingerprint, f"the stored head set {found[1]}")
        elif isinstance(heads, str) and heads == "calibrate":
            from .calibrate import calibrate_heads
            from .samples import calibration_samples, check_data_packages  # the synthetic calibration split

            check_data_packages()  # wonderwords (qgpm[eval]) and the benchmark data, checked before any model work
            hs = calibrate_heads(self, calibration_samples(self.tokenizer))
        elif isinstance(heads, (str, os.PathLike)):
            hs = HeadSet.load(heads)
            check_head_set(hs, self.fingerprint, f"head set {heads}")
        else:
            hs = HeadSet(self.name, list(heads), method="given by caller", fingerprint=self.fingerprint.to_dict())
        if self._support_error is None:
            n_heads = self.model.config.num_attention_heads
            bad = [h for h in hs.heads if not (0 <= h[0] < self.n_layers and 0 <= h[1] < n_heads)]
            if bad:
                raise ValueError(f"heads {bad} are outside this model ({self.n_layers} layers x {n_heads} heads)")
        self.head_set = hs

    @property
    def heads(self) -> list[tuple[int, int]]:
        """The heads pass 1 uses (after ``config.max_heads``)."""
        if self.head_set is None:
            raise self._head_error or HeadSetMissingError("no head set")
        return self.head_set.top(self.config.max_heads).heads

    def pass1_precision(self, config: QGPMConfig | None = None, context_tokens: int | None = None) -> torch.dtype | None:
        """The dtype pass 1 runs at under ``config`` (default: the engine's) when it is not the
        model's own, else ``None`` (see :attr:`QGPMConfig.pass1_dtype
        <qgpm.config.QGPMConfig.pass1_dtype>`): ``"auto"`` is bfloat16 for a float32 model on
        hardware that multiplies bfloat16 natively, except for a call whose context of
        ``context_tokens`` is no longer than ``keep_length`` (it keeps vanilla positions, so
        the exact pass 1 going on as its prefill costs one prefill in all); else the model's
        dtype. An explicit dtype without such hardware is used, with a warning (once per dtype)."""
        cfg = config or self.config
        want = cfg.pass1_dtype
        if want is None:
            return None
        model_dtype = next(self.model.parameters()).dtype
        if want == "auto":
            if context_tokens is not None and 0 < context_tokens <= cfg.keep_length:
                return None
            return torch.bfloat16 if model_dtype == torch.float32 and _fast_on(self.device, torch.bfloat16) else None
        dtype = parse_dtype(want)  # a name QGPMConfig has checked
        if dtype == model_dtype:
            return None
        if dtype not in self._warned_pass1 and not _fast_on(self.device, dtype):
            self._warned_pass1.add(dtype)
            logger.warning("qgpm: pass1_dtype=%r on %s: this hardware has no fast %s matrix multiply, so pass 1 is likely slower "
                           "than at the model's %s, not faster. Set pass1_dtype=None (or 'auto') in QGPMConfig to run it at the "
                           "model's dtype.", want, self.device, want, _dtype_name(model_dtype))
        return dtype

    @property
    def max_length(self) -> int:
        """The model window in tokens (``max_position_embeddings``)."""
        return int(getattr(self.model.config, "max_position_embeddings", 0) or 0)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ------------------------------------------------------------------ public calls
    def answer(
        self,
        context: str | Sequence[str],
        question: str,
        *,
        method: Method = "qgpm",
        evidence: Sequence[str] | None = None,
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: Sequence[str] | None = None,
        system: str | None = None,
        instruction: str | None = None,
        answer_prefix: str | None = None,
        template: str = DEFAULT_TEMPLATE,
        reranker: Any = None,
        k: int = DEFAULT_K,
        config: QGPMConfig | None = None,
        seed: int | None = None,
        options: Any = None,
        **generate_kwargs: Any,
    ) -> QGPMResult:
        """Answer ``question`` from ``context`` with ``method``.

        ``evidence`` (exact substrings of the context) is required for ``oracle``.
        ``reranker`` / ``k`` apply to ``topk`` and ``reorder`` (default reranker:
        the bundled all-MiniLM-L6-v2, chosen by measurement, see ``DEFAULT_RERANKER``). ``stop`` strings end the
        answer (and are cut from it). ``config`` overrides the engine's settings for
        this call. ``options`` sets a query-agnostic baseline (``string``:
        :class:`~qgpm.StringOptions`, ``ms-poe``: :class:`~qgpm.MsPoEOptions`,
        ``self-extend``: :class:`~qgpm.SelfExtendOptions`, ``None`` = the method's
        defaults; ``llmlingua-2``: :class:`~qgpm.LLMLingua2Options` with the compressor's path).
        Greedy decoding unless ``temperature > 0``; ``seed`` makes sampling
        reproducible (a random generator local to the call, not torch's global one).

        Every argument is checked before any model work; bad input raises ``TypeError``
        / ``ValueError`` (:class:`~qgpm.prompt.PromptError` for the prompt parts,
        :class:`ContextTooLongError` for input that cannot fit the window).
        """
        stop = _check_generation_args(max_new_tokens, temperature, top_p, stop, seed)
        opts = CallOptions(
            method=method, evidence=evidence, system=system, instruction=instruction, answer_prefix=answer_prefix, template=template,
            reranker=reranker, k=k, config=config, max_new_tokens=max_new_tokens, options=options,
        )
        call = self._prepare(context, question, opts)
        return self._run_call(call, max_new_tokens, temperature, top_p, stop, seed, generate_kwargs)

    def generate_prepared(
        self,
        call: PreparedCall,
        *,
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: Sequence[str] | None = None,
        seed: int | None = None,
        score: str | None = None,
        **generate_kwargs: Any,
    ) -> QGPMResult:
        """Generate the answer for a call from :meth:`prepare` (or :meth:`replan`).

        ``score``: a continuation (e.g. the gold answer) whose teacher-forced
        log-probability under the call's positions is computed in the *same* prefill
        as the answer (the prompt and ``score`` go through the model once; the cache is
        cut back to the prompt and generation goes on from it). It lands in
        ``result.details["score_logprob"]`` (summed over ``score``'s tokens) and
        ``result.details["score_tokens"]``.
        """
        if not isinstance(call, PreparedCall):
            raise TypeError(f"call must be a PreparedCall from QGPM.prepare(), got {type(call).__name__}")
        stop = _check_generation_args(max_new_tokens, temperature, top_p, stop, seed)
        if score is not None and not isinstance(score, str):
            raise TypeError(f"score must be a string (the continuation to score), got {type(score).__name__}")
        return self._run_call(call, max_new_tokens, temperature, top_p, stop, seed, generate_kwargs, score=score)

    def replan(self, call: PreparedCall, config: QGPMConfig) -> PreparedCall:
        """The same qgpm / oracle call with its position plan rebuilt under ``config``.

        Pass 1 is not rerun: the stored relevance ``z`` (or the oracle's evidence units)
        is shaped again, so trying many shaping settings (K, T, s_low, eps, c, tau,
        split layer) costs one pass 1 per prompt. Settings that change pass 1 itself
        (``max_sentence_chars``, ``split_run_ons``, ``query_tail``, ``exclude_newline_tokens``,
        ``max_heads``) need a new :meth:`prepare`.
        """
        if not isinstance(call, PreparedCall):
            raise TypeError(f"call must be a PreparedCall from QGPM.prepare(), got {type(call).__name__}")
        if call.method not in ("qgpm", "oracle") or call.z is None or call.prompt is None:
            raise ValueError(f"replan needs a qgpm or oracle call from QGPM.prepare(), got method={call.method!r}")
        self._check_config(config, call.method)
        old = call.config or self.config
        changed = [f for f in _PASS1_FIELDS if getattr(old, f) != getattr(config, f)]
        if changed:
            raise ValueError(f"{', '.join(changed)} change pass 1 or the prompt: call prepare() again with config= instead of replan()")
        t = time.perf_counter()
        prompt = call.prompt
        capacity = call.plan.capacity if call.plan is not None else prompt.num_tokens + 1
        if call.method == "qgpm":
            mr = build_plan(prompt.token_sentence, call.z, config=config, rotary=self.rotary, n_layers=self.n_layers, capacity=capacity,
                            unit_lexical=_unit_lexical(prompt, config))
            _note_flat(mr, config)
            relevance = self._relevance(prompt, mr, call.z)
        else:
            mr = build_plan(call.units, call.z, config=config, rotary=self.rotary, n_layers=self.n_layers, dense=True, capacity=capacity)
            _note_flat(mr, config)
            relevance = self._relevance(prompt, mr, None, call.units)
        plan = mr.plan
        timings = Timings(edit_s=call.timings.edit_s, pass1_s=call.timings.pass1_s, plan_s=time.perf_counter() - t)
        details = dict(call.details, boundary_plane=mr.boundary_plane, anchor_length=mr.anchor_length, flat_relevance=mr.flat, decisive_relevance=mr.decisive, s_low=mr.s_low, solo_relevance=mr.solo)
        if call.method == "qgpm":
            _note_terms(details, mr, config)
        return PreparedCall(prompt, call.method, plan, relevance, timings, call.edit, details, z=call.z, config=config, units=call.units,
                            prefill=call.prefill)

    def _run_call(self, call: PreparedCall, max_new_tokens, temperature, top_p, stop, seed, generate_kwargs, score: str | None = None) -> QGPMResult:
        streamer = _TimingStreamer()
        gen = self._generate_kwargs(call.input_ids, max_new_tokens, temperature, top_p, stop, seed, generate_kwargs)
        ids, plan = _pass2_inputs(call, self.device)
        extra: dict[str, Any] = {}
        if score is not None:
            score_ids = encode_plain(self.tokenizer, score)
            if not score_ids:
                raise ValueError("score is empty: pass the continuation to score, e.g. the gold answer")
        t0 = time.perf_counter()
        with apply_plan(self.model, plan), torch.inference_mode():
            reused_cache, reused = _take_prefill(call, plan)
            if score is not None:
                extra["score_logprob"], cache = self._score_prefill(ids, score_ids, reused_cache, reused)
                extra["score_tokens"] = len(score_ids)
                extra["score_s"] = time.perf_counter() - t0
                if _rewind(cache, len(score_ids) + 1):  # back to the prompt minus its last token, which generation recomputes
                    gen[_cache_kwarg(self.model.forward)] = cache  # generate takes the name forward takes
            elif reused_cache is not None:
                gen[_cache_kwarg(self.model.forward)] = reused_cache  # generation prefills only the tokens after the reused ones
            out = self.model.generate(ids, streamer=streamer, **gen)
        t1 = time.perf_counter()
        new = out[0, call.num_tokens :].tolist()
        text, reason = self._finish_text(new, stop, max_new_tokens)
        res = self._result(call, text, reason, len(new), t0, streamer.first_token_at, t1, reused)
        if isinstance(call.plan, PositionPlan):
            extra["pass2"] = _pass2_kind(call.plan, plan)
        res.details.update(extra)
        return res

    def _score_prefill(self, ids: torch.Tensor, score_ids: list[int], cache: Any = None, reused: int = 0) -> tuple[float, Any]:
        """The one teacher-forced log-prob path: ``log p(score_ids | ids)`` summed over the score
        tokens, from one forward over prompt + score that fills a fresh KV cache (or, with
        ``cache`` holding the first ``reused`` prompt tokens, over the rest of them).

        Returns ``(logprob, cache)``; run it inside ``apply_plan`` and inference mode. Only the
        last prompt row and the score rows get logits (no N x vocab tensor).
        """
        if cache is None:
            cache, reused = _fresh_cache(self.model), 0
        full = torch.cat([ids, torch.tensor([score_ids], device=ids.device)], dim=1)
        keep = len(score_ids) + 1
        logits = self.model(input_ids=full[:, reused:], use_cache=True, logits_to_keep=keep, **{_cache_kwarg(self.model.forward): cache}).logits[0, -keep:]
        logp = torch.log_softmax(logits[:-1].float(), dim=-1)
        return float(logp.gather(1, torch.tensor(score_ids, device=logp.device).unsqueeze(1)).sum()), cache

    def chat(
        self,
        messages: Sequence[dict[str, str]],
        *,
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: Sequence[str] | None = None,
        seed: int | None = None,
        **generate_kwargs: Any,
    ) -> QGPMResult:
        """Plain chat generation (standard RoPE) over ``[{"role": ..., "content": ...}]``.

        For framework adapters when no context is marked: the engine then works as an
        ordinary local chat model (``result.method == "plain"``). Special-token strings in
        the messages are tokenized as plain text.
        """
        stop = _check_generation_args(max_new_tokens, temperature, top_p, stop, seed)
        call = self._plain_call(messages, max_new_tokens)
        return self._run_call(call, max_new_tokens, temperature, top_p, stop, seed, generate_kwargs)

    def stream_chat(self, messages: Sequence[dict[str, str]], **kwargs: Any) -> "AnswerStream":
        """Streaming version of :meth:`chat` (an :class:`AnswerStream`)."""
        _check_stream_kwargs(kwargs)
        call = self._plain_call(messages, kwargs.get("max_new_tokens", 64))
        return AnswerStream(functools.partial(_stream_pieces, self, None, None, dict(kwargs), call), engine=self)

    def _plain_call(self, messages: Sequence[dict[str, str]], max_new_tokens: int) -> PreparedCall:
        if isinstance(messages, (str, bytes, Mapping)) or not hasattr(messages, "__iter__"):
            raise PromptError(f"messages must be a list of {{'role': ..., 'content': ...}} dicts, got {type(messages).__name__}")
        msgs = []
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
                raise PromptError(f"message {i} must be a dict with 'role' and 'content', got {type(m).__name__}")
            if not isinstance(m["content"], str):
                raise PromptError(f"message {i} content must be a string, got {type(m['content']).__name__}")
            msgs.append(dict(role=str(m["role"]), content=m["content"]))
        if not msgs or not any(has_visible_text(m["content"]) for m in msgs):
            raise PromptError("messages are empty: pass at least one message with text")
        contents = [m["content"] for m in msgs]
        self._check_input_size(contents, max_new_tokens)
        if getattr(self.tokenizer, "chat_template", None):
            text, spans = render_chat(self.tokenizer, msgs)
            if spans is None:
                specials = [t.content for i, t in self.tokenizer.added_tokens_decoder.items() if int(i) in special_token_ids(self.tokenizer)]
                if any(sp in c for c in contents for sp in specials):
                    raise PromptError(
                        "the model's chat template changes the message text, so the special-token strings in it "
                        f"(e.g. {specials[0]!r}) cannot be kept as plain text; remove them from the messages"
                    )
                spans = []
            ids, _ = encode_prompt(self.tokenizer, text, spans, add_special_tokens=False)
        else:
            text, spans = "", []
            for c in contents:
                spans.append((len(text), len(text) + len(c)))
                text += c + "\n\n"
            ids, _ = encode_prompt(self.tokenizer, text, spans, add_special_tokens=True)
        ids = torch.tensor([ids], dtype=torch.long)
        self._check_fits(ids.shape[1], max_new_tokens, shorten="the messages")
        return PreparedCall(None, "plain", None, [], Timings(), None, {}, input_ids=ids)

    def stream(self, context: str | Sequence[str], question: str, **kwargs: Any) -> "AnswerStream":
        """Like :meth:`answer`, but yields the answer text piece by piece.

        The returned :class:`AnswerStream` is an iterator of strings; once exhausted its
        ``result`` holds the full :class:`QGPMResult` (relevance, usage, timings). Use it
        as a context manager (``with engine.stream(...) as s:``) or ``close()`` it to
        stop early; a stream that is dropped (e.g. ``break`` out of ``for piece in
        engine.stream(...)``) stops generation and removes the position hooks at once.
        The arguments are checked here, before anything runs.
        """
        _check_stream_kwargs(kwargs)
        opts = CallOptions.take(dict(kwargs), max_new_tokens=64)
        self._check_ready(opts.method)
        self._check_config(opts.config, opts.method)
        _check_evidence(opts.evidence)
        check_prompt_inputs(context, question, instruction=opts.instruction, system=opts.system, answer_prefix=opts.answer_prefix)
        check_template(opts.template)
        return AnswerStream(functools.partial(_stream_pieces, self, context, question, dict(kwargs), None), engine=self)

    def prepare(self, context: str | Sequence[str], question: str, **kwargs: Any) -> PreparedCall:
        """Run everything before generation (edit, pass 1, plan) and return it (for evaluation tools)."""
        opts = CallOptions.take(kwargs)
        if kwargs:
            raise TypeError(f"unexpected arguments: {sorted(kwargs)}")
        mnt = opts.max_new_tokens
        if isinstance(mnt, bool) or not isinstance(mnt, numbers.Integral) or mnt < 0:
            raise TypeError(f"max_new_tokens must be an int >= 0 (the generation budget to leave room for), got {mnt!r}")
        return self._prepare(context, question, opts)

    def answer_logprob(self, context: str | Sequence[str], question: str, answer: str, **kwargs: Any) -> float:
        """Teacher-forced log-probability of ``answer`` as the continuation of the prompt.

        ``kwargs`` are :meth:`prepare`'s. The same computation as ``score=`` of
        :meth:`generate_prepared` (``result.details["score_logprob"]``), without generating.
        """
        if not isinstance(answer, str):
            raise TypeError(f"answer must be a string, got {type(answer).__name__}")
        call = self.prepare(context, question, **kwargs)
        ans = encode_plain(self.tokenizer, answer)
        if not ans:
            raise ValueError("answer is empty")
        ids, plan = _pass2_inputs(call, self.device)
        with apply_plan(self.model, plan), torch.inference_mode():
            logprob, _ = self._score_prefill(ids, ans, *_take_prefill(call, plan))
        return logprob

    # ------------------------------------------------------------------ internals
    def _check_ready(self, method: str) -> None:
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
        if method in ("qgpm", "oracle", *ROPE_BASELINES) and self._support_error is not None:
            raise self._support_error

    def _check_config(self, config: Any, method: str) -> QGPMConfig:
        """The call's config (``None`` = the engine's), checked against this model before pass 1."""
        cfg = self.config if config is None else config
        if not isinstance(cfg, QGPMConfig):
            raise TypeError(f"config must be a qgpm.QGPMConfig, got {type(cfg).__name__}")
        if method in ("qgpm", "oracle") and self._support_error is None:
            n = self.n_layers
            if cfg.split_layer is not None and cfg.split_layer > n:
                raise ValueError(f"config.split_layer={cfg.split_layer} is beyond this model's {n} layers (use 0..{n}, or None for {n // 2})")
            if cfg.unmodulated_layers > n:
                raise ValueError(f"config.unmodulated_layers={cfg.unmodulated_layers} exceeds this model's {n} layers")
            check_local_layers(cfg, self.rotary)
            if method == "qgpm":
                source = parse_source(cfg.relevance)
                if source.heads and self.head_set is None:
                    raise self._head_error or HeadSetMissingError("no head set")
                if source.reranker is not None:  # an unknown spec or a missing package fails here, before any model work
                    get_reranker(source.reranker)
            if method == "qgpm" and cfg.term_ratio is not None:  # the query-term filter's BM25, before pass 1
                BM25Reranker()
            if cfg.remap == "reorder":  # what apply_plan and build_plan would refuse, before pass 1
                if reorder_needs_masks(cfg, n):  # two maps or vanilla layers: per-layer masks (sdpa / eager)
                    if self.rotary.layered:
                        raise ValueError(REORDER_LAYERED_ERROR)
                    reorder_mask_kind(self.model)
        return cfg

    def _check_input_size(self, texts: Sequence[str], max_new_tokens: int, *, context: Sequence[str] = (), exact: bool = True) -> None:
        """Raise :class:`ContextTooLongError` for caller text that cannot fit the window, cheaply.

        First a character bound: no token of this tokenizer stands for more than
        :func:`~qgpm.tokens.max_token_chars` characters, so more characters than that
        times the room left cannot fit (no tokenizing at all). Then, for large inputs, a
        plain-text token count that stops as soon as it passes the room left. Both are
        lower bounds; the exact count of the assembled prompt follows in ``_check_fits``.
        ``context`` is counted with ``texts`` unless ``exact=False`` (Top-K, whose edit
        may shorten it: there only the character bound applies to it).
        """
        window = self.max_length
        if not window:
            return
        room = window - max_new_tokens
        if room < 1:
            raise ContextTooLongError(
                f"max_new_tokens={max_new_tokens} leaves no room for the prompt in the model window of {window} tokens; "
                "lower max_new_tokens."
            )
        per = max_token_chars(self.tokenizer)
        chars = sum(len(t) for t in texts) + sum(len(d) for d in context)
        if chars > room * per:
            raise ContextTooLongError(
                f"the input is {chars} characters: more than can fit the model window of {window} tokens with "
                f"max_new_tokens={max_new_tokens} (a token of this tokenizer covers at most {per} characters, so at most "
                f"{room * per} characters fit). Shorten the context (or retrieve fewer documents), or lower max_new_tokens."
            )
        counted = list(texts) + (list(context) if exact else [])
        if sum(len(t) for t in counted) > 4 * room:
            n = 0
            for t in counted:
                n += count_tokens_bounded(self.tokenizer, t, room - n)
                if n > room:
                    raise ContextTooLongError(
                        f"the input is more than {room} tokens (counted until the limit): with max_new_tokens="
                        f"{max_new_tokens} it cannot fit the model window of {window} tokens. Shorten the context "
                        "(or retrieve fewer documents), or lower max_new_tokens."
                    )

    def _prepare(self, context: str | Sequence[str], question: str, opts: CallOptions) -> PreparedCall:
        """Everything before generation: check the inputs (before any model work), edit the
        context (topk / reorder / llmlingua-2), build the prompt, run pass 1 and build the plan."""
        method, system, instruction, answer_prefix, template = opts.method, opts.system, opts.instruction, opts.answer_prefix, opts.template
        max_new_tokens = opts.max_new_tokens
        self._check_ready(method)
        options = resolve_options(method, opts.options)  # bad settings fail before any work
        cfg = self._check_config(opts.config, method)
        evidence = _check_evidence(opts.evidence)
        if evidence is not None and method != "oracle":
            raise ValueError("evidence= is only used by method='oracle'")
        docs = check_prompt_inputs(context, question, instruction=instruction, system=system, answer_prefix=answer_prefix)
        check_template(template)
        others = [question, instruction or "", system or "", answer_prefix or ""]
        self._check_input_size(others, max_new_tokens, context=docs, exact=method != "topk")
        timings = Timings()
        edit = None
        details: dict[str, Any] = {}
        if method in ("topk", "reorder"):
            from .editing import edit_context

            t = time.perf_counter()
            edit = edit_context(
                context, question, mode=method, reranker=opts.reranker if opts.reranker is not None else DEFAULT_RERANKER, k=opts.k,
                count_tokens=lambda s: count_plain(self.tokenizer, s),
            )
            timings.edit_s = time.perf_counter() - t
            context = edit.text
        elif method == "llmlingua-2":
            from .baselines.llmlingua import compress_context

            t = time.perf_counter()
            edit = compress_context(context, options)
            timings.edit_s = time.perf_counter() - t
            details.update(original_tokens=edit.original_tokens, compressed_tokens=edit.compressed_tokens)
            context = edit.documents
        spec = PromptSpec(context=context, question=question, instruction=instruction, system=system, answer_prefix=answer_prefix, template=template)
        prompt = build_prompt(self.tokenizer, spec, max_sentence_chars=cfg.max_sentence_chars, query_tail=cfg.query_tail,
                              split_run_ons=cfg.split_run_ons)
        self._check_fits(prompt.num_tokens, max_new_tokens, context_tokens=prompt.context_tokens)
        capacity = prompt.num_tokens + max(max_new_tokens, 1) + 1
        plan = None
        relevance: list[SentenceRelevance] = []
        if method == "qgpm":
            t = time.perf_counter()
            stats = Pass1Stats()
            source = parse_source(cfg.relevance)
            heads = self.head_set.top(cfg.max_heads).heads if source.heads else []
            found: dict[str, Any] = {}
            # a reranker source scores the sentences against the question before pass 1 (none runs without the heads)
            z_rerank = (reranker_relevance(get_reranker(source.reranker), prompt.question_text or question, [s.text for s in prompt.sentences])
                        if source.reranker is not None else None)

            def plan_from(tok_logits: torch.Tensor | None) -> MapResult:  # relevance -> scores -> positions
                found["pass1_end"] = time.perf_counter()
                if tok_logits is None:
                    found["z"] = z_rerank
                else:
                    sl = sentence_logits(tok_logits, prompt.token_sentence, len(prompt.sentences), prompt.newline_tokens if cfg.exclude_newline_tokens else None)
                    found["z"] = fuse_heads(sl) if z_rerank is None else fuse_sources(fuse_heads(sl), z_rerank)
                found["mr"] = build_plan(prompt.token_sentence, found["z"], config=cfg, rotary=self.rotary, n_layers=self.n_layers, capacity=capacity,
                                         unit_lexical=_unit_lexical(prompt, cfg))
                found["plan_end"] = time.perf_counter()
                return found["mr"]

            if not source.heads:
                plan_from(None)
                return self._qgpm_call(prompt, cfg, found, t, None, timings, edit, details, source.spec, heads=0, layers_run=0)
            low = self.pass1_precision(cfg, prompt.context_tokens)  # a pass 1 at another precision is not the model's prefill: never reused
            cache = _fresh_cache(self.model) if low is None and self.reuse_prefill and self._prefill_reusable() else None
            if cache is not None:
                deepest = max(layer for layer, _ in heads)
                head_token_logits(self.model, prompt.input_ids, heads, prompt.query_rows, stats=stats, cache=cache,
                                  go_on=lambda tl: continue_pays(plan_from(tl).plan.vanilla_prefix(), prompt.num_tokens, deepest, self.n_layers))
            else:
                plan_from(head_token_logits(self.model, prompt.input_ids, heads, prompt.query_rows, stats=stats, precision=low))
            if low is not None:
                details["pass1_dtype"] = _dtype_name(low)
            prefill_at = found["plan_end"] if stats.continued else None
            return self._qgpm_call(prompt, cfg, found, t, cache if stats.continued else None, timings, edit, details, source.spec,
                                   heads=len(heads), layers_run=len(stats.layers_run), prefill_at=prefill_at)
        elif method == "oracle":
            if not evidence:
                raise ValueError("method='oracle' needs evidence=[exact substrings of the context]")
            t = time.perf_counter()
            ev_tokens = self._evidence_tokens(prompt, evidence)
            units, rel = oracle_units(prompt.token_sentence, ev_tokens)
            mr = build_plan(units, rel, config=cfg, rotary=self.rotary, n_layers=self.n_layers, dense=True, capacity=capacity)
            _note_flat(mr, cfg)
            timings.plan_s = time.perf_counter() - t
            plan = mr.plan
            relevance = self._relevance(prompt, mr, None, units)
            details.update(boundary_plane=mr.boundary_plane, anchor_length=mr.anchor_length, s_low=mr.s_low)
            return PreparedCall(prompt, method, plan, relevance, timings, edit, details, z=rel, config=cfg, units=units)
        elif method in ROPE_BASELINES:  # positions change inside attention (qgpm.baselines)
            t = time.perf_counter()
            plan, info = build_baseline_plan(method, options, n_tokens=prompt.num_tokens, rotary=self.rotary, n_layers=self.n_layers)
            timings.plan_s = time.perf_counter() - t
            details.update(info)
        return PreparedCall(prompt, method, plan, relevance, timings, edit, details, config=cfg)

    def _qgpm_call(self, prompt: Prompt, cfg: QGPMConfig, found: dict[str, Any], t: float, cache: Any, timings: Timings, edit: Any,
                   details: dict[str, Any], source: str, *, heads: int, layers_run: int, prefill_at: float | None = None) -> PreparedCall:
        """The prepared qgpm call from the relevance ``found`` by :meth:`_prepare` (``z``, the plan, stage clocks)."""
        end = time.perf_counter()
        z, mr = found["z"], found["mr"]
        timings.pass1_s = found["pass1_end"] - t
        timings.plan_s = found["plan_end"] - found["pass1_end"]
        prefill = _Prefill(cache, prompt.num_tokens, end - prefill_at) if cache is not None and prefill_at is not None else None
        _note_flat(mr, cfg)
        relevance = self._relevance(prompt, mr, z)
        details.update(layers_run=layers_run, boundary_plane=mr.boundary_plane, anchor_length=mr.anchor_length, heads=heads,
                       flat_relevance=mr.flat, decisive_relevance=mr.decisive, s_low=mr.s_low, solo_relevance=mr.solo,
                       pass1_continued=prefill is not None)
        if source != "heads":
            details["relevance_source"] = source
        _note_terms(details, mr, cfg)
        return PreparedCall(prompt, "qgpm", mr.plan, relevance, timings, edit, details, z=z, config=cfg, prefill=prefill)

    def _prefill_reusable(self) -> bool:
        """Whether generation can start from a cached prefix on this model's attention: the
        implementations transformers ships handle a chunk of queries after a cached prefix
        (the causal mask offset by the prefix); another one (registered through
        ``AttentionInterface``) may not, so it prefills the whole prompt (logged once)."""
        impl = getattr(self.model.config, "_attn_implementation", None) or "eager"
        if impl in _PREFIX_SAFE_ATTENTION:
            return True
        if impl not in self._warned_attention:
            self._warned_attention.add(impl)
            logger.warning("qgpm: reuse_prefill is not applied with attention implementation %r (a chunk after a cached prefix "
                           "needs its causal mask offset, which only transformers' own implementations are known to apply); "
                           "pass 2 prefills the whole prompt. Pass reuse_prefill=False to the engine to silence this.", impl)
        return False

    def _check_fits(self, num_tokens: int, max_new_tokens: int, *, context_tokens: int | None = None,
                    shorten: str = "the context (or retrieve fewer documents)") -> None:
        """The one "prompt too long" rule, for every assembled prompt: raise
        :class:`ContextTooLongError` when ``num_tokens`` plus the generation budget exceed the
        model window. ``shorten`` names what the caller should shorten."""
        window = self.max_length
        if window and num_tokens + max_new_tokens > window:
            ctx = "" if context_tokens is None else f" (context {context_tokens})"
            raise ContextTooLongError(
                f"the prompt is {num_tokens} tokens{ctx} and max_new_tokens is {max_new_tokens}: "
                f"{num_tokens + max_new_tokens} > the model window of {window} tokens. "
                f"Shorten {shorten}, or lower max_new_tokens."
            )

    @staticmethod
    def _evidence_tokens(prompt: Prompt, evidence: Sequence[str]) -> torch.Tensor:
        marks = torch.zeros(prompt.num_tokens, dtype=torch.bool)
        for ev in evidence:
            if not isinstance(ev, str) or not ev.strip():
                raise ValueError("evidence strings must be non-empty")
            ev = ev.strip()
            start = prompt.context_text.find(ev)
            if start < 0:
                raise ValueError(f"evidence {ev[:60]!r} is not an exact substring of the context")
            while start >= 0:
                for j in prompt.char_span_tokens(start, start + len(ev)):
                    if prompt.token_sentence[j] >= 0:
                        marks[j] = True
                start = prompt.context_text.find(ev, start + 1)
        return marks

    @staticmethod
    def _relevance(prompt: Prompt, mr: MapResult, z: torch.Tensor | None, token_unit: torch.Tensor | None = None) -> list[SentenceRelevance]:
        """Sentence-level view of a plan.

        Map scores are the max over the sentence's tokens. Ranks: QGPM's own sentence
        ranks; for Oracle, sentences holding evidence first (text order within ties).
        """
        ts = prompt.token_sentence
        broad_t, sharp_t = mr.token_scores
        if z is not None:
            ranks = [int(r) for r in mr.ranks]
        else:
            best_unit_rank = []
            for s in prompt.sentences:
                units = token_unit[ts == s.index]
                units = units[units >= 0]
                best_unit_rank.append(int(mr.ranks[units].min()) if units.numel() else 1 << 30)
            order = sorted(range(len(prompt.sentences)), key=lambda i: (best_unit_rank[i], i))
            ranks = [0] * len(order)
            for r, i in enumerate(order):
                ranks[i] = r
        out = []
        for s in prompt.sentences:
            mask = ts == s.index
            b = float(broad_t[mask].max()) if mask.any() else 1.0
            sh = float(sharp_t[mask].max()) if mask.any() else 1.0
            zi = None if z is None else float(z[s.index])
            out.append(SentenceRelevance(s.index, s.text, s.start, s.end, s.doc, ranks[s.index], b, sh, zi))
        return out

    def _generate_kwargs(self, input_ids: torch.Tensor, max_new_tokens, temperature, top_p, stop, seed, extra) -> dict[str, Any]:
        stop = _check_generation_args(max_new_tokens, temperature, top_p, stop, seed)
        extra = dict(extra)
        gen: dict[str, Any] = dict(max_new_tokens=max_new_tokens, attention_mask=torch.ones_like(input_ids).to(self.device))
        # generate() itself decodes greedily; sampling is done by _SeededSampler with a
        # generator local to the call, so concurrent calls never share torch's global RNG
        gen.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if temperature > 0:
            sampler = _SeededSampler(temperature, top_p, seed, top_k=extra.pop("top_k", None), min_p=extra.pop("min_p", None))
            from transformers import LogitsProcessorList

            gen["logits_processor"] = LogitsProcessorList([*(extra.pop("logits_processor", None) or []), sampler])
        stops = [s for s in (stop or []) if s]
        if stops:
            gen.update(stop_strings=list(stops), tokenizer=self.tokenizer)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        gen["pad_token_id"] = pad
        gen.update(extra)
        return gen

    def _finish_text(self, new_ids: list[int], stop: Sequence[str] | None, max_new_tokens: int) -> tuple[str, str]:
        text = self.tokenizer.decode(new_ids, skip_special_tokens=True)
        reason = "length" if len(new_ids) >= max_new_tokens else "stop"
        text, hit = _cut_at_stop(text, [s for s in stop or [] if s])
        return text.strip(), "stop" if hit else reason

    def _result(self, call: PreparedCall, text: str, reason: str, n_new: int, t0: float, first: float | None, t1: float, reused: int = 0) -> QGPMResult:
        """The result of running ``call``: its own copies of the timings, details and relevance list.

        With ``reused`` prompt tokens taken from pass 1's continued prefill, that part of the
        prefill (run at the end of pass 1) counts in ``prefill_s``."""
        first = first if first is not None else t1
        pre = call.timings
        ahead = call.prefill.seconds if reused and call.prefill is not None else 0.0
        tm = dataclasses.replace(pre, prefill_s=ahead + first - t0, decode_s=t1 - first, total_s=pre.edit_s + pre.pass1_s + pre.plan_s + ahead + (t1 - t0))
        details = dict(call.details)
        if call.method == "qgpm":
            details.update(prefill_reused=reused, prefill_continued_s=ahead)
        return QGPMResult(
            text=text, method=call.method, relevance=list(call.relevance),
            usage=Usage(call.num_tokens, n_new), timings=tm, finish_reason=reason, edit=call.edit, details=details,
            context=call.prompt.context_text if call.prompt is not None else None,
            question=call.prompt.question_text if call.prompt is not None else None,
        )


def _check_generation_args(max_new_tokens: Any, temperature: Any, top_p: Any, stop: Any, seed: Any) -> list[str]:
    """Check the decoding arguments (before any model work); return the stop strings as a list."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral):
        raise TypeError(f"max_new_tokens must be an int, got {type(max_new_tokens).__name__} {max_new_tokens!r}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    for name, value in (("temperature", temperature), ("top_p", top_p)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy decoding), got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__} {seed!r}")
        if not 0 <= seed < 2**64:
            raise ValueError(f"seed must be in [0, 2**64), got {seed}")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop] if stop else []
    if isinstance(stop, (bytes, Mapping)) or not hasattr(stop, "__iter__"):
        raise TypeError(f"stop must be a string or a list of strings, got {type(stop).__name__}")
    stops = list(stop)
    bad = [type(x).__name__ for x in stops if not isinstance(x, str)]
    if bad:
        raise TypeError(f"stop must be a string or a list of strings; it holds {', '.join(sorted(set(bad)))}")
    return [x for x in stops if x]


def _check_stream_kwargs(kwargs: dict[str, Any]) -> None:
    _check_generation_args(
        kwargs.get("max_new_tokens", 64), kwargs.get("temperature", 0.0), kwargs.get("top_p", 1.0), kwargs.get("stop"), kwargs.get("seed")
    )


def _check_evidence(evidence: Any) -> list[str] | None:
    """Oracle evidence as a list of strings; a single string is one evidence item."""
    if evidence is None:
        return None
    if isinstance(evidence, str):
        return [evidence]
    if isinstance(evidence, (bytes, Mapping)) or not hasattr(evidence, "__iter__"):
        raise TypeError(f"evidence must be a string or a list of strings (exact substrings of the context), got {type(evidence).__name__}")
    items = list(evidence)
    for i, ev in enumerate(items):
        if not isinstance(ev, str):
            raise TypeError(f"evidence item {i} is {type(ev).__name__}, expected str (an exact substring of the context)")
    return items


class _SeededSampler:
    """A logits processor that draws the next token with a generator local to the call.

    ``generate()`` runs greedily with this processor last: it applies the sampling
    warpers (temperature, top-k, top-p, min-p; the ``transformers`` classes), draws one
    token per row with its own ``torch.Generator`` and leaves only that token
    selectable. The generator is created and seeded on the first step, inside the
    model lock; ``seed=None`` seeds it at random. No global RNG is read or changed, so
    concurrent sampling calls with a seed are reproducible.
    """

    def __init__(self, temperature: float, top_p: float, seed: int | None, *, top_k: int | None = None, min_p: float | None = None) -> None:
        from transformers import LogitsProcessorList, MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

        warpers: list[Any] = []
        if temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(float(temperature)))
        if top_k:
            warpers.append(TopKLogitsWarper(int(top_k)))
        if top_p < 1.0:
            warpers.append(TopPLogitsWarper(float(top_p)))
        if min_p is not None:
            warpers.append(MinPLogitsWarper(float(min_p)))
        self.warpers = LogitsProcessorList(warpers)
        self.seed = seed
        self.generator: torch.Generator | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.generator is None:
            self.generator = torch.Generator(device=scores.device)
            if self.seed is None:
                self.generator.seed()
            else:
                self.generator.manual_seed(int(self.seed))
        warped = self.warpers(input_ids, scores)
        probs = torch.softmax(warped.float(), dim=-1)
        drawn = torch.multinomial(probs, num_samples=1, generator=self.generator)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, drawn, 0.0)


def _note_terms(details: dict[str, Any], mr: MapResult, config: QGPMConfig) -> None:
    """``details["term_dropped"]``: how many top-K sentences the query-term filter dropped,
    present exactly when ``config.term_ratio`` is set."""
    details.pop("term_dropped", None)
    if config.term_ratio is not None:
        details["term_dropped"] = len(mr.term_dropped)


def _unit_lexical(prompt: Prompt, config: QGPMConfig) -> torch.Tensor | None:
    """BM25 score of each context sentence for the question (the context's sentences are the
    corpus), for the query-term filter (``config.term_ratio``); ``None`` when it is off."""
    if config.term_ratio is None:
        return None
    question = prompt.question_text or ""
    texts = [s.text for s in prompt.sentences]
    if not texts or not question.strip():
        return torch.zeros(len(texts), dtype=torch.float64)
    return torch.tensor(BM25Reranker().score(question, texts), dtype=torch.float64)


def _cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """``text`` up to the first stop string, and whether one was found."""
    hits = [text.index(s) for s in stop if s and s in text]
    return (text[: min(hits)], True) if hits else (text, False)


def _rewind(cache: Any, tokens: int) -> bool:
    """Drop the last ``tokens`` entries of a KV cache so generation can continue from it;
    ``False`` (logged) when this cache cannot be rewound (a sliding-window layer past its
    window that kept no past states), and generation then recomputes the prompt."""
    try:
        cache.crop(-tokens)
    except RuntimeError as exc:
        logger.warning("qgpm: the log-prob prefill's KV cache cannot be rewound (%s); generation recomputes the prompt "
                       "(one more prefill, same answer)", exc)
        return False
    return True


# attention implementations shipped with transformers, which offset the causal mask by a cached prefix
_PREFIX_SAFE_ATTENTION = frozenset({"eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention"})


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _fast_on(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``device`` multiplies ``dtype`` matrices natively (oneDNN's check on a CPU,
    ``torch.cuda.is_bf16_supported`` for bfloat16 on a GPU; other devices are assumed to)."""
    if dtype == torch.float32:
        return True
    if device.type == "cuda":
        return dtype != torch.bfloat16 or torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return True
    check = {torch.bfloat16: "_is_mkldnn_bf16_supported", torch.float16: "_is_mkldnn_fp16_supported"}.get(dtype)
    fn = getattr(torch.ops.mkldnn, check, None) if check else None
    try:
        return bool(fn()) if fn is not None else False
    except RuntimeError:
        return False


def continue_pays(prefix: int, num_tokens: int, deepest: int, n_layers: int) -> bool:
    """Whether pass 1 should go on as a vanilla prefill (``QGPM.reuse_prefill``).

    Pass 1 has run ``deepest`` of ``n_layers`` layers over the ``num_tokens`` prompt tokens
    when the plan is known. Stopping there costs a full pass 2: one prefill. Going on costs the
    remaining layers for every token, ``(n_layers - deepest) / n_layers`` of a prefill, and
    then pass 2 only for the share ``f = 1 - prefix / num_tokens`` of tokens after the
    ``prefix`` it can reuse (:meth:`PositionPlan.vanilla_prefix
    <qgpm.rope.PositionPlan.vanilla_prefix>`). That chunk is charged ``f * (1 + f / 2)`` of a
    prefill, not ``f``: its queries attend over the whole prompt under an explicit mask, which
    costs more per token than a causal prefill (on CPU, SmolLM2 at 4K:
    ``benchmarks/results/speed_cpu_smollm2_reuse_d*.md``; measured 0.29 / 0.59 / 1.10 of a
    prefill for f = 0.25 / 0.49 / 0.74). It goes on when that is cheaper, and always for a plan
    that changes nothing (``prefix >= num_tokens``: one prefill in all).
    """
    if prefix <= 0:
        return False
    if prefix >= num_tokens:
        return True
    f = 1.0 - prefix / num_tokens
    return (n_layers - deepest) / n_layers + f * (1.0 + f / 2.0) < 1.0


@dataclass(eq=False)
class _Prefill:
    """The vanilla KV states pass 1 computed when it went on as a prefill, shared by a
    prepared call and its replans: the first ``valid`` tokens of ``cache`` still hold them
    (a generation that reused ``P`` tokens appends after them); ``seconds``: what going on
    cost, counted in the prefill time of a generation that reuses them."""

    cache: Any
    valid: int
    seconds: float


def _fresh_cache(model: torch.nn.Module) -> Any:
    """An empty KV cache for ``model``; sliding-window layers (Gemma 3) record their past, so
    that it can be cut back to a prefix (a rewind, a reused prefill)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    if hasattr(cache, "activate_past_recording"):
        cache.activate_past_recording()
    return cache


def _take_prefill(call: PreparedCall, installed: Any) -> tuple[Any, int]:
    """The call's reusable prefill, cut back to what pass 2 can reuse, and that length.

    ``(None, 0)`` unless pass 1 went on as a prefill and pass 2 is a plain forward (no plan
    installed) whose leading tokens match: at most the plan's vanilla prefix, what is still
    valid, and one token short of the prompt (generation computes the last prompt token's
    logits). Run it under the model lock (inside ``apply_plan``).
    """
    pf = call.prefill
    if pf is None or installed is not None or not isinstance(call.plan, PositionPlan):
        return None, 0
    use = min(call.plan.vanilla_prefix(), pf.valid, call.num_tokens - 1)
    if use <= 0:
        return None, 0
    extra = pf.cache.get_seq_length() - use
    try:
        if extra > 0:
            pf.cache.crop(-extra)
    except RuntimeError as exc:  # a cache layer that cannot be cut back: prefill the whole prompt
        logger.warning("qgpm: pass 1's prefill cannot be reused (%s); pass 2 prefills the whole prompt (same answer)", exc)
        pf.valid = 0
        return None, 0
    # a sliding-window layer keeps only its window once cut back: no later reuse of a shorter prefix
    pf.valid = 0 if any(getattr(pf.cache, "is_sliding", ())) else use
    return pf.cache, use


def _pass2_inputs(call: PreparedCall, device: torch.device) -> tuple[torch.Tensor, Any]:
    """What pass 2 feeds the model and under which plan: the prompt in slot order with no
    plan where a ``remap="reorder"`` plan allows it (:meth:`PositionPlan.feed_order
    <qgpm.rope.PositionPlan.feed_order>`: the same computation through the model's own causal
    attention, without the ``[N, N]`` mask), the prompt with no plan where the plan changes
    nothing (:meth:`PositionPlan.is_standard <qgpm.rope.PositionPlan.is_standard>`), else the
    prompt in text order under the call's plan."""
    plan = call.plan
    if isinstance(plan, PositionPlan) and plan.is_standard():  # a call that fell back: the model's plain forward
        return call.input_ids.to(device), None
    order = plan.feed_order() if isinstance(plan, PositionPlan) else None
    if order is None:
        return call.input_ids.to(device), plan
    return call.input_ids[:, order].to(device), None


def _pass2_kind(planned: PositionPlan, installed: Any) -> str:
    """How a qgpm / oracle call's pass 2 ran (``result.details["pass2"]``): ``"standard"`` (a
    plan that changes nothing, e.g. a call that fell back: the plain forward), ``"slot
    order"`` (a reorder fed as a plain forward), ``"masks"`` (a reorder through per-layer
    causal masks) or ``"positions"`` (a stride / move plan: remapped rotary tables)."""
    if planned.is_standard():
        return "standard"
    if installed is None:
        return "slot order"
    return "masks" if planned.orders else "positions"


def _stream_pieces(eng: QGPM, context, question, kw: dict[str, Any], prepared: PreparedCall | None, state: StreamState) -> Iterator[str]:
    """The generator behind :class:`AnswerStream` (a function, so it cannot reference the stream)."""
    from transformers import StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer

    opts = CallOptions.take(kw, max_new_tokens=64)  # what is left in kw goes to generate()
    max_new_tokens = opts.max_new_tokens
    gen_args = {k: kw.pop(k) for k in ("temperature", "top_p", "stop", "seed") if k in kw}
    stop = _check_generation_args(max_new_tokens, gen_args.get("temperature", 0.0), gen_args.get("top_p", 1.0), gen_args.get("stop"), gen_args.get("seed"))
    call = prepared or eng._prepare(context, question, opts)
    gen = eng._generate_kwargs(call.input_ids, max_new_tokens, gen_args.get("temperature", 0.0), gen_args.get("top_p", 1.0), stop, gen_args.get("seed"), kw)
    text_streamer = TextIteratorStreamer(eng.tokenizer, skip_prompt=True, skip_special_tokens=True, timeout=None)
    timing = _TimingStreamer(text_streamer)
    cancel = threading.Event()

    class _Cancel(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), cancel.is_set(), dtype=torch.bool, device=input_ids.device)

    crit = gen.pop("stopping_criteria", None) or StoppingCriteriaList()
    crit.append(_Cancel())
    errors: Queue = Queue()
    out_holder: dict[str, torch.Tensor] = {}

    def work() -> None:
        try:
            ids, plan = _pass2_inputs(call, eng.device)
            with apply_plan(eng.model, plan), torch.inference_mode():
                cache, out_holder["reused"] = _take_prefill(call, plan)
                if cache is not None:
                    gen[_cache_kwarg(eng.model.forward)] = cache
                out_holder["ids"] = eng.model.generate(ids, streamer=timing, stopping_criteria=crit, **gen)
        except BaseException as exc:  # re-raised in the consumer
            errors.put(exc)
            text_streamer.end()

    t0 = time.perf_counter()
    worker = threading.Thread(target=work, name="qgpm-generate", daemon=True)
    try:
        worker.start()
        emitted = ""
        full = ""
        hold = max((len(s) for s in stop), default=1) - 1
        for piece in text_streamer:
            full += piece
            visible, stopped = _cut_at_stop(full, stop)
            if stopped:
                cancel.set()
            else:
                visible = visible[: len(visible) - hold] if hold > 0 else visible
            visible = visible.lstrip().rstrip()  # trailing whitespace waits for what follows
            if len(visible) > len(emitted) and visible.startswith(emitted):
                yield visible[len(emitted) :]
                emitted = visible
        worker.join()
        if not errors.empty():
            raise errors.get()
        t1 = time.perf_counter()
        ids = out_holder["ids"][0, call.num_tokens :].tolist()
        text, reason = eng._finish_text(ids, stop, max_new_tokens)
        if text.startswith(emitted) and len(text) > len(emitted):
            yield text[len(emitted) :]
        state.result = eng._result(call, text, reason, len(ids), t0, timing.first_token_at, t1, out_holder.get("reused", 0))
    finally:
        cancel.set()
        if worker.ident is not None:
            worker.join()
