"""The plan stage: from checked inputs (:mod:`qgpm.call_checks`) to a :class:`~qgpm.results.PreparedCall`, one function per :class:`~qgpm.methods.Stage`.

text -> role spans (:mod:`qgpm.prompt`) -> tokens -> relevance (:mod:`qgpm.pass1`, or the
caller's evidence) -> scores -> positions (:func:`qgpm.plan.build_plan`) -> the prepared call.
Context edits (Top-K, Reorder, LLMLingua-2) run before the prompt is built
(:func:`edit_context_stage`). :func:`replan` reshapes a prepared call's stored relevance under
another config with the same plan code as the first preparation (:func:`plan_call`).
"""

from __future__ import annotations

import logging
import re
import time
import weakref
from collections.abc import Mapping
from typing import Any, Protocol, Sequence

import torch

from .baselines import build_baseline_plan
from .chat_template import render_chat
from .config import CALIBRATED, QGPMConfig
from .defaults import DEFAULT_K, DEFAULT_RERANKER
from .diagnostics import Diagnostics
from .editing import edit_context
from .heads import HeadSet
from .hooks import sliding_window_of
from .lexical import bm25_scores
from .limits import check_fits, check_input_size
from .methods import MethodSpec, Stage, method_spec
from .pass1 import qgpm_relevance
from .plan import PlanOutcome, build_plan, oracle_units
from .prompt import Prompt, PromptError, PromptSpec, build_prompt, has_visible_text
from .results import PreparedCall, SentenceRelevance, Timings
from .sources import parse_source
from .thresholds import calibrated_min_top_z
from .tokens import count_plain, encode_prompt, special_token_ids

logger = logging.getLogger("qgpm")

__all__ = ["ModelView", "plain_chat_call", "edit_context_stage", "prepare_stage", "plan_call", "replan", "sentence_relevance", "evidence_tokens",
           "warn_vanilla_kept"]


class ModelView(Protocol):
    """What the plan stage reads from the engine (:class:`qgpm.QGPM` has all of it)."""

    model: torch.nn.Module
    tokenizer: Any
    rotary: Any
    n_layers: int
    head_set: HeadSet | None
    heads_chosen: bool  # the head set was given (heads=...), not the stored one

    def pass1_precision(self, config: QGPMConfig | None = None, context_tokens: int | None = None) -> torch.dtype | None: ...

    def prefill_reuse_on(self) -> bool: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def heads(self) -> list[tuple[int, int]]: ...


_ROLE = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
"""A message role: the chat template writes it outside the protected message text, so it may hold
nothing that could tokenize as a control token or break the turn (no '<', '|', newline, ...)."""


def plain_chat_call(tokenizer: Any, messages: Sequence[Mapping[str, str]], *, window: int, max_new_tokens: int) -> PreparedCall:
    """A plain chat call (``method="plain"``: standard RoPE, no context marked) over
    ``[{"role": ..., "content": ...}]``: the model's chat template where it has one, special-token
    strings in the messages tokenized as plain text; ``PromptError`` / ``ContextTooLongError``
    before any model work."""
    if isinstance(messages, (str, bytes, Mapping)) or not hasattr(messages, "__iter__"):
        raise PromptError(f"messages must be a list of {{'role': ..., 'content': ...}} dicts, got {type(messages).__name__}")
    msgs = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            raise PromptError(f"message {i} must be a dict with 'role' and 'content', got {type(m).__name__}")
        if not isinstance(m["content"], str):
            raise PromptError(f"message {i} content must be a string, got {type(m['content']).__name__}")
        if not isinstance(m["role"], str) or not _ROLE.fullmatch(m["role"]):
            raise PromptError(f"message {i} role must be a role name such as 'user', 'assistant' or 'system' (the chat "
                              f"template's roles: a letter, then letters, digits, '_', '-' or '.', at most 64), got {m['role']!r}; "
                              "the template writes the role as its own text, so anything else could open a turn of its own")
        msgs.append(dict(role=m["role"], content=m["content"]))
    if not msgs or not any(has_visible_text(m["content"]) for m in msgs):
        raise PromptError("messages are empty: pass at least one message with text")
    contents = [m["content"] for m in msgs]
    check_input_size(tokenizer, window, contents, max_new_tokens)
    if getattr(tokenizer, "chat_template", None):
        text, spans = render_chat(tokenizer, msgs)
        if spans is None:
            specials = [t.content for i, t in tokenizer.added_tokens_decoder.items() if int(i) in special_token_ids(tokenizer)]
            if any(sp in c for c in contents for sp in specials):
                raise PromptError(
                    "the model's chat template changes the message text, so the special-token strings in it "
                    f"(e.g. {specials[0]!r}) cannot be kept as plain text; remove them from the messages"
                )
            spans = []
        ids, _ = encode_prompt(tokenizer, text, spans, add_special_tokens=False)
    else:
        text, spans = "", []
        for c in contents:
            spans.append((len(text), len(text) + len(c)))
            text += c + "\n\n"
        ids, _ = encode_prompt(tokenizer, text, spans, add_special_tokens=True)
    ids = torch.tensor([ids], dtype=torch.long)
    check_fits(window, ids.shape[1], max_new_tokens, shorten="the messages")
    return PreparedCall(None, "plain", None, [], Timings(), None, {}, input_ids=ids)


def edit_context_stage(spec: MethodSpec, context: Any, question: str, *, reranker: Any, k: int, options: Any, tokenizer: Any
                       ) -> tuple[Any, Any, float, dict[str, Any]]:
    """The context a method reads, edited by its reranker (``EDIT``) or compressor (``COMPRESS``):
    ``(context, edit, seconds, details)``; other stages get the context back unchanged."""
    if spec.stage is Stage.EDIT:
        t = time.perf_counter()
        edit = edit_context(context, question, mode=spec.name, reranker=reranker if reranker is not None else DEFAULT_RERANKER,
                            k=DEFAULT_K if k is None else k,
                            count_tokens=lambda s: count_plain(tokenizer, s))
        return edit.text, edit, time.perf_counter() - t, {}
    if spec.stage is Stage.COMPRESS:
        from .baselines.llmlingua import compress_context  # optional: the compressor's own packages

        t = time.perf_counter()
        edit = compress_context(context, options)
        return edit.documents, edit, time.perf_counter() - t, dict(original_tokens=edit.original_tokens, compressed_tokens=edit.compressed_tokens)
    return context, None, 0.0, {}


def prepare_call(eng: ModelView, spec: MethodSpec, context: Any, question: str, opts: Any, *, cfg: QGPMConfig,
                 options: Any, evidence: list[str] | None, window: int) -> PreparedCall:
    """Every stage before generation, in order, for arguments the engine has checked
    (:func:`~qgpm.call_checks.check_call`; ``opts``: the call's :class:`~qgpm.call_checks.CallOptions`): edit the context (topk / reorder / llmlingua-2), build
    the prompt, check that it and ``opts.max_new_tokens`` fit ``window``, then pass 1 and the plan
    (:func:`prepare_stage`)."""
    context, edit, edit_s, details = edit_context_stage(spec, context, question, reranker=opts.reranker, k=opts.k, options=options,
                                                        tokenizer=eng.tokenizer)
    prompt = build_prompt(eng.tokenizer, PromptSpec(context=context, question=question, instruction=opts.instruction, system=opts.system,
                                                    answer_prefix=opts.answer_prefix, template=opts.template),
                          max_sentence_chars=cfg.max_sentence_chars, query_tail=cfg.query_tail, split_run_ons=cfg.split_run_ons)
    check_fits(window, prompt.num_tokens, opts.max_new_tokens, context_tokens=prompt.context_tokens)
    budget = max(opts.max_new_tokens, 1)
    return prepare_stage(eng, spec, prompt, question, cfg, capacity=prompt.num_tokens + budget + 1, max_new_tokens=budget,
                         timings=Timings(edit_s=edit_s), edit=edit, details=details, evidence=evidence, options=options)


def prepare_stage(eng: ModelView, spec: MethodSpec, prompt: Prompt, question: str, cfg: QGPMConfig, *, capacity: int, max_new_tokens: int,
                  timings: Timings, edit: Any, details: Mapping[str, Any], evidence: Sequence[str] | None, options: Any) -> PreparedCall:
    """The prepared call of ``spec``'s stage over the built ``prompt`` (``capacity``: prompt and
    ``max_new_tokens`` in tokens, what the plans cover)."""
    details = Diagnostics.of(details)
    if spec.stage is Stage.HEADS:
        return _prepare_heads(eng, prompt, question, cfg, capacity, timings, edit, details)
    if spec.stage is Stage.EVIDENCE:
        if not evidence:
            raise ValueError(f"method={spec.name!r} needs evidence=[exact substrings of the context]")
        t = time.perf_counter()
        units, rel = oracle_units(prompt.token_sentence, evidence_tokens(prompt, evidence))
        planned, relevance, plan_details = plan_call(eng, prompt, rel, cfg, capacity, units=units)
        timings.plan_s = time.perf_counter() - t
        details.update(plan_details)
        return PreparedCall(prompt, spec.name, planned.plan, relevance, timings, edit, details, z=rel, config=cfg, units=units)
    plan = None
    if spec.stage is Stage.ATTENTION:  # positions change inside attention (qgpm.baselines)
        t = time.perf_counter()
        plan, info = build_baseline_plan(spec.name, options, n_tokens=prompt.num_tokens, rotary=eng.rotary, n_layers=eng.n_layers,
                                         sliding_window=sliding_window_of(eng.model), max_new_tokens=max_new_tokens,
                                         device=eng.device)
        timings.plan_s = time.perf_counter() - t
        details.settings.update(info)
    return PreparedCall(prompt, spec.name, plan, [], timings, edit, details, config=cfg)


def _prepare_heads(eng: ModelView, prompt: Prompt, question: str, cfg: QGPMConfig, capacity: int, timings: Timings, edit: Any,
                   details: Diagnostics) -> PreparedCall:
    """A ``qgpm`` call: relevance from ``cfg.relevance`` (pass 1 and / or a reranker), then the plan."""
    view: dict[str, Any] = {}
    rules = confidence_config(eng, cfg)  # the thresholds this call's plan applies, resolved once

    def plan_from(z: torch.Tensor) -> PlanOutcome:
        view["planned"], view["relevance"], view["details"] = plan_call(eng, prompt, z, rules, capacity, note=False)
        return view["planned"]

    reads_heads = parse_source(cfg.relevance).heads
    if eng.heads_chosen and not reads_heads:
        _note_once(eng, f"qgpm: this engine's head set was given (heads=...), but the call's config ranks the sentences with "
                        f"relevance={cfg.relevance!r}, which reads no head; set relevance='heads' (or 'heads+<reranker>') in the "
                        "config to rank with them (qgpm ask: --config relevance=heads)")
    heads = eng.head_set.top(cfg.max_heads).heads if reads_heads and eng.head_set is not None else []
    # a pass 1 at another precision is not the model's prefill: never reused
    precision = eng.pass1_precision(cfg, prompt.context_tokens) if heads else None
    ranked = qgpm_relevance(eng.model, prompt, question, cfg, heads, plan_from, n_layers=eng.n_layers, precision=precision,
                           reuse_prefill=precision is None and bool(heads) and eng.prefill_reuse_on())
    timings.pass1_s, timings.plan_s = ranked.pass1_s, ranked.plan_s
    warn_vanilla_kept(eng, ranked.planned, rules)
    details.update(ranked.details)
    details.update(layers_run=ranked.layers_run, heads=ranked.heads, **view["details"], pass1_continued=ranked.prefill is not None)
    if ranked.source != "heads":
        details["relevance_source"] = ranked.source
    return PreparedCall(prompt, "qgpm", ranked.planned.plan, view["relevance"], timings, edit, details, z=ranked.z, config=cfg, prefill=ranked.prefill)


def confidence_config(eng: ModelView, cfg: QGPMConfig) -> QGPMConfig:
    """``cfg`` with ``min_top_z="calibrated"`` replaced by the threshold calibrated on its relevance
    source's z scale (:func:`qgpm.thresholds.calibrated_min_top_z`: the engine's head set's for the
    heads, the reranker's stored one for a reranker); ``None`` (the rule off, logged once per
    reason) where there is none."""
    if cfg.min_top_z != CALIBRATED:
        return cfg
    value, why = calibrated_min_top_z(cfg.relevance, eng.head_set)
    if value is None:
        _note_once(eng, f"qgpm: min_top_z='calibrated' has no threshold here ({why}), so the flat-relevance rule is off for these "
                        "calls; set min_top_z to a number to use it")
    return cfg.with_(min_top_z=value, provenance=f"{cfg.provenance}; min_top_z 'calibrated' = {value}")


_NOTED: "weakref.WeakKeyDictionary[Any, set[str]]" = weakref.WeakKeyDictionary()


def _note_once(eng: ModelView, message: str, *, key: str | None = None, again: str | None = None) -> None:
    """Log ``message`` as a warning once per engine and ``key`` (default: the message itself);
    with ``again`` (said in the warning), the later ones at DEBUG."""
    seen = _NOTED.setdefault(eng, set())
    key = message if key is None else key
    if key not in seen:
        seen.add(key)
        logger.warning(message if again is None else f"{message} {again}")
    elif again is not None:
        logger.debug(message)


def plan_call(eng: ModelView, prompt: Prompt, z: torch.Tensor, cfg: QGPMConfig, capacity: int, *, units: torch.Tensor | None = None,
              note: bool = True) -> tuple[PlanOutcome, list[SentenceRelevance], dict[str, Any]]:
    """Relevance -> scores -> positions for a qgpm call (``z`` per sentence) or an oracle call
    (``z`` per evidence unit, ``units`` mapping tokens to them): the plan, its sentence view and
    its ``details`` entries. ``note``: log the fallback rules that fired (:func:`warn_vanilla_kept`)."""
    cfg = confidence_config(eng, cfg)
    if units is None:
        z = _without_tokenless(prompt, z)
        planned = build_plan(prompt.token_sentence, z, config=cfg, rotary=eng.rotary, n_layers=eng.n_layers, capacity=capacity,
                        unit_lexical=_unit_lexical(prompt, cfg))
    else:
        planned = build_plan(units, z, config=cfg, rotary=eng.rotary, n_layers=eng.n_layers, dense=True, capacity=capacity)
    if note:
        warn_vanilla_kept(eng, planned, cfg)
    details: dict[str, Any] = dict(boundary_plane=planned.boundary_plane, anchor_length=planned.anchor_length, s_low=planned.s_low,
                                   kept_reason=planned.kept_reason)
    if units is None:
        details.update(flat_relevance=planned.flat, tied_relevance=planned.tied, min_top_z=cfg.min_top_z, decisive_relevance=planned.decisive,
                       solo_relevance=planned.solo)
        if cfg.term_ratio is not None:  # how many top-K sentences the query-term filter dropped
            details["term_dropped"] = len(planned.term_dropped)
    relevance = sentence_relevance(prompt, planned, z if units is None else None, units)
    details["promoted"] = sum(s.promoted for s in relevance)
    return planned, relevance, details


def _without_tokenless(prompt: Prompt, z: torch.Tensor) -> torch.Tensor:
    """``z`` with ``-inf`` for the sentences that own no token (a few characters cut from a word
    whose token the sentence before holds): a text reranker may rank them, but moving them moves
    nothing, so they are never promoted (the heads give them ``-inf`` already)."""
    ts = prompt.token_sentence
    owned = torch.bincount(ts[ts >= 0], minlength=z.numel())[: z.numel()] > 0
    if bool(owned.all()):
        return z
    return torch.where(owned.to(z.device), z, torch.full_like(z, float("-inf")))


def replan(eng: ModelView, call: PreparedCall, config: QGPMConfig) -> PreparedCall:
    """``call`` (qgpm or oracle, checked by the engine) with its plan rebuilt under ``config`` from its stored relevance."""
    t = time.perf_counter()
    prompt = call.prompt
    capacity = call.plan.capacity if call.plan is not None else prompt.num_tokens + 1
    planned, relevance, plan_details = plan_call(eng, prompt, call.z, config, capacity, units=call.units if method_spec(call.method).evidence else None)
    timings = Timings(edit_s=call.timings.edit_s, pass1_s=call.timings.pass1_s, plan_s=time.perf_counter() - t)
    details = call.details.copy()
    details.term_dropped = None
    details.update(plan_details)
    details.update(flat_relevance=planned.flat, tied_relevance=planned.tied, decisive_relevance=planned.decisive, solo_relevance=planned.solo)
    return PreparedCall(prompt, call.method, planned.plan, relevance, timings, call.edit, details, z=call.z, config=config, units=call.units,
                        prefill=call.prefill)


def warn_vanilla_kept(eng: ModelView, planned: PlanOutcome, config: QGPMConfig) -> None:
    """Log the rule that made a call keep vanilla positions: the tie and the confidence rule
    (``config.min_top_z``), the dominance rule (``config.decisive_margin``) or the short-context
    rule (``config.keep_length``). Each rule is logged as a warning the first time it fires on
    an engine and at DEBUG after that; ``result.details["kept_reason"]`` names it on every call."""
    if planned.flat and planned.tied and planned.ranks.numel() == 1:
        rule, message = "one sentence", (
            "qgpm: the context holds a single sentence, so there is nothing to rank it against and this call keeps vanilla "
            "positions; result.details['flat_relevance'] is True. Pass the context as its documents or sentences for QGPM to act.")
    elif planned.flat and planned.tied:
        rule, message = "tied", (
            "qgpm: the relevance ranks no sentence above another (every sentence scores the same: e.g. a lexical source "
            "that found none of the question's words in the context), so this call keeps vanilla positions; "
            "result.details['flat_relevance'] is True. " + (
                "Rank with relevance='minilm' or 'heads' for a signal." if config.relevance == "bm25" else
                f"The {config.relevance} relevance gave every sentence the same score here."))
    elif planned.flat:
        rule, message = "flat", (
            f"qgpm: the relevance is flat (top sentence z below min_top_z={config.min_top_z}), so this call keeps vanilla "
            "positions; result.details['flat_relevance'] is True. Lower min_top_z (or set it to None; qgpm ask: --set "
            "min_top_z=none) to always modulate.")
    elif planned.decisive:
        rule, message = "decisive", (
            f"qgpm: one sentence already stands out (top z exceeds the next by at least decisive_margin={config.decisive_margin}), "
            "so this call keeps vanilla positions; result.details['decisive_relevance'] is True. Set decisive_margin=None in "
            "QGPMConfig (qgpm ask: --set decisive_margin=none) to modulate such calls too.")
    elif planned.kept_reason == "keep_length":
        rule, message = "keep_length", (
            f"qgpm: the context is no longer than keep_length={config.keep_length:g} tokens, so this call keeps vanilla positions "
            "(result.details['kept_reason'] is 'keep_length'). Set keep_length=0 in QGPMConfig (qgpm ask: --set keep_length=0) "
            "to modulate short contexts too.")
    else:
        return
    _note_once(eng, message, key=f"vanilla kept: {rule}",
               again="(logged once per engine; later calls log it at DEBUG, and result.details['kept_reason'] names the rule on each)")


def _unit_lexical(prompt: Prompt, config: QGPMConfig) -> torch.Tensor | None:
    """BM25 score of each context sentence for the question (the context's sentences are the
    corpus), for the query-term filter (``config.term_ratio``); ``None`` when it is off."""
    if config.term_ratio is None:
        return None
    question = prompt.question_text or ""
    texts = [s.text for s in prompt.sentences]
    if not texts or not question.strip():
        return torch.zeros(len(texts), dtype=torch.float64)
    return torch.tensor(bm25_scores(question, texts), dtype=torch.float64)


def evidence_tokens(prompt: Prompt, evidence: Sequence[str]) -> torch.Tensor:
    """A mask of the context tokens inside any occurrence of an evidence string (``ValueError``
    for evidence that is empty or not an exact substring of the context)."""
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


def sentence_relevance(prompt: Prompt, planned: PlanOutcome, z: torch.Tensor | None, token_unit: torch.Tensor | None = None) -> list[SentenceRelevance]:
    """Sentence-level view of a plan.

    Map scores are the max over the sentence's tokens. Ranks: QGPM's own sentence
    ranks; for Oracle, sentences holding evidence first (text order within ties).
    """
    ts = prompt.token_sentence
    broad_t, sharp_t = planned.token_scores
    if z is not None:
        ranks = [int(r) for r in planned.ranks]
    else:
        best_unit_rank = []
        for s in prompt.sentences:
            units = token_unit[ts == s.index]
            units = units[units >= 0]
            best_unit_rank.append(int(planned.ranks[units].min()) if units.numel() else 1 << 30)
        order = sorted(range(len(prompt.sentences)), key=lambda i: (best_unit_rank[i], i))
        ranks = [0] * len(order)
        for r, i in enumerate(order):
            ranks[i] = r
    promoted, dropped, front = set(planned.promoted), set(planned.term_dropped), set(planned.front)
    ctx = prompt.context_text
    out = []
    for s in prompt.sentences:
        mask = ts == s.index
        b = float(broad_t[mask].max()) if mask.any() else 1.0
        sh = float(sharp_t[mask].max()) if mask.any() else 1.0
        zi = None if z is None else float(z[s.index])
        units = {s.index} if token_unit is None else set(token_unit[mask].tolist()) - {-1}
        start = s.start + len(ctx[s.start : s.end]) - len(ctx[s.start : s.end].lstrip())  # the span holds the whitespace before the text
        moved_to = ("start" if units & front else "question") if planned.moves and units & promoted else None
        out.append(SentenceRelevance(s.index, s.text, start, start + len(s.text), s.doc, ranks[s.index], b, sh, zi,
                                     promoted=bool(units & promoted), term_dropped=bool(units & dropped), moved_to=moved_to))
    return out
