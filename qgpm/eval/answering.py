"""Answering one sample with one method: the keyword arguments, the stop rule, the measured row part."""

from __future__ import annotations

import time
from typing import Any

from qgpm.calibrate import evidence_sentences
from qgpm.defaults import DEFAULT_K, DEFAULT_RERANKER
from qgpm.eval.scoring import is_correct, score
from qgpm.methods import Stage, method_spec
from qgpm.samples.base import EvalSample

__all__ = ["PLAIN_TEXT_STOP", "answer_stop", "options_for", "gold_continuation", "prepare_kwargs", "evidence_rank", "answer_sample"]


PLAIN_TEXT_STOP = ("\n\n",)


def answer_stop(engine) -> tuple[str, ...]:
    """The harness's stop strings for ``engine``'s model: none for a model with a chat template
    (its end-of-turn token ends the answer); ``PLAIN_TEXT_STOP`` for a model prompted as plain
    text (a base model such as Gemma-3-270M), whose answer is its first paragraph: such a model
    has no end of turn and writes on past the answer (another "The special magic number for ...
    is: ..." line, often with another number), which a substring metric would otherwise score.
    A stop string keeps its usual meaning (as on a vLLM server): an answer that begins with a
    blank line ends empty."""
    return () if getattr(engine.tokenizer, "chat_template", None) else PLAIN_TEXT_STOP


def options_for(method: str, options: Any) -> Any:
    """``method``'s entry of a ``{method: options}`` mapping (None: its defaults), or
    ``options`` itself when it is one method's options object."""
    if isinstance(options, dict):
        return options.get(method)
    return options


def gold_continuation(sample: EvalSample) -> str:
    """The gold answer as the model would continue the prompt: ``answers[0]``, with a
    leading space when the answer prefix ends in a word (``"... is"`` -> ``" 1234"``)."""
    ans = sample.answers[0]
    prefix = sample.answer_prefix or ""
    if prefix and not prefix[-1].isspace() and not ans[:1].isspace():
        return " " + ans
    return ans


def prepare_kwargs(sample: EvalSample, method: str, *, config=None, reranker: Any = DEFAULT_RERANKER, k: int = DEFAULT_K, options: Any = None) -> dict:
    """The ``engine.answer`` / ``engine.prepare`` keyword arguments for one sample and method."""
    kw: dict[str, Any] = dict(
        method=method,
        instruction=sample.instruction,
        template=sample.template,
        answer_prefix=sample.answer_prefix,
        max_new_tokens=sample.max_new_tokens,
        evidence=sample.evidence if method_spec(method).evidence else None,
        config=config,
    )
    if method_spec(method).reranker:
        kw["reranker"] = reranker
    if method_spec(method).takes_k:
        kw["k"] = k
    if method_spec(method).options:
        kw["options"] = options_for(method, options)
    return kw


def evidence_rank(call, sample: EvalSample) -> int | None:
    """Best (0-based) QGPM rank of a sentence holding evidence, or None."""
    if not call.relevance or call.prompt is None:
        return None
    try:
        gold = evidence_sentences(call.prompt, sample.evidence)
    except Exception:  # evidence not located: no rank
        return None
    ranks = {r.index: r.rank for r in call.relevance}
    return min((ranks[g] for g in gold if g in ranks), default=None)


def answer_sample(engine, sample: EvalSample, method: str, *, config=None, reranker: Any = DEFAULT_RERANKER, k: int = DEFAULT_K, logprob: bool = True, call=None,
                  options: Any = None) -> dict:
    """Answer one sample with one method; the measured part of a row.

    One :meth:`QGPM.prepare` (edit, pass 1, plan) and one prefill serve both the
    generated answer and the gold log-prob (:meth:`QGPM.generate_prepared` with
    ``score=``). ``call``: an already prepared call for this sample (e.g. from
    :meth:`QGPM.replan`), used instead of preparing one.
    """
    t0 = time.perf_counter()
    if call is None:
        call = engine.prepare(sample.context, sample.question, **prepare_kwargs(sample, method, config=config, reranker=reranker, k=k, options=options))
    t_run = time.perf_counter()
    res = engine.generate_prepared(call, max_new_tokens=sample.max_new_tokens, stop=answer_stop(engine),
                                   score=gold_continuation(sample) if logprob else None)
    tm = res.timings
    out = {
        "answer": res.text,
        "correct": bool(is_correct(sample.metric, res.text, sample.answers)),
        "score": float(score(sample.metric, res.text, sample.answers)),
        "logprob_gold": res.details.score_logprob,
        "prompt_tokens": res.usage.prompt_tokens,
        "answer_tokens": res.usage.answer_tokens,
        "finish_reason": res.finish_reason,
        # prefill_s includes the gold tokens scored in the same forward (logprob_s of it)
        "timings": {
            "edit_s": round(tm.edit_s, 4), "pass1_s": round(tm.pass1_s, 4), "plan_s": round(tm.plan_s, 4),
            "prefill_s": round(tm.prefill_s, 4), "decode_s": round(tm.decode_s, 4), "answer_s": round(tm.total_s, 4),
            "logprob_s": round(res.details.score_s or 0.0, 4) if logprob else None, "run_s": round(time.perf_counter() - t_run, 4),
            "wall_s": round(time.perf_counter() - t0, 4),
        },
    }
    spec = method_spec(method)
    if spec.stage is Stage.HEADS:
        out["top_sentences"] = [s.text for s in res.top_sentences(3)]
        out["evidence_rank"] = evidence_rank(call, sample)
        out["num_sentences"] = len(res.relevance)
        out["top_z"] = [None if s.z is None else round(float(s.z), 3) for s in res.top_sentences(3)]
        out["prefill_reused"] = int(res.details.prefill_reused or 0)  # prompt tokens pass 1's continued prefill saved
    if spec.config:
        d = call.details
        out["anchor_length"] = d.anchor_length
        out["s_low"] = d.s_low
        out["flat_relevance"] = bool(d.flat_relevance)
        out["decisive_relevance"] = bool(d.decisive_relevance)
        out["promoted"] = int(d.promoted or 0)
        out["kept_reason"] = d.kept_reason  # why the call kept vanilla positions (qgpm.plan.KEPT_REASONS); None: it moved sentences
        if d.solo_relevance:
            out["solo_relevance"] = True
        if d.term_dropped is not None:
            out["term_dropped"] = int(d.term_dropped)
    if spec.options:
        out["baseline"] = dict(call.details)  # every fact of the call: STRING's S and W, LLMLingua-2's token counts
    if spec.reranker and res.edit is not None:
        out["chunks"] = len(getattr(res.edit, "chunks", []) or [])
        out["kept_chunks"] = len(getattr(res.edit, "kept", []) or [])
        out["evidence_kept"] = all(ev.strip() in res.edit.text for ev in sample.evidence)
    return out

