"""The benchmark's pass/fail targets and the diagnosis behind them, from a run's rows.

Targets, each per task pooled over lengths and depths, paired by sample:

- retrieval (NIAH multi-key, NoLiMa-style): QGPM at least +10 points above vanilla,
  and significantly above vanilla at mid depths (25-75 %, exact McNemar p < 0.05, b > c);
- guard (single-needle NIAH, QA): QGPM never more than 1 point below vanilla;
- QGPM within 2 points of the Oracle (or above it).

Diagnosis (why a target is missed): for every task, how well QGPM's relevance source (the
heads, or a reranker) ranks the evidence (top-1 rate, MRR: ``evidence_rank`` of the qgpm
rows), the Oracle's own gain over vanilla (what the position remapping gives with perfect
relevance), and QGPM's gain split by whether the evidence was ranked first. If the Oracle
gains little, the limit is the remapping on this model; if the Oracle gains and QGPM does
not, and QGPM does better when the evidence is ranked first, the limit is the relevance signal.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from qgpm.eval.stats import pair_key, paired, series_labels

__all__ = ["TargetCheck", "check_targets", "diagnose", "judged_series", "targets_and_diagnosis", "targets_markdown", "RETRIEVAL_TASKS", "GUARD_TASKS", "MID_DEPTHS"]

RETRIEVAL_TASKS = ("niah_multikey_1", "niah_multikey_2", "nolima_direct", "nolima_assoc")
GUARD_TASKS = ("niah_single_2", "qa_1", "qa_2")
MID_DEPTHS = (0.25, 0.5, 0.75)


@dataclass
class TargetCheck:
    """One target on one task: the measured value, its paired 95 % CI, and whether it is met."""

    target: str
    task: str
    pairs: int
    value: float  # points
    lo: float
    hi: float
    threshold: str
    met: bool | None  # None: no pairs to judge
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _by_label(rows: Sequence[dict]) -> dict[str, list[dict]]:
    labels = series_labels(rows)
    out: dict[str, list[dict]] = {}
    for r in rows:
        if not r.get("error"):
            out.setdefault(labels[(r["method"], r["config_hash"])], []).append(r)
    return out


def _task(rows: Sequence[dict], task: str, depths: Sequence[float] | None = None) -> list[dict]:
    out = [r for r in rows if r["task"] == task]
    if depths is not None:
        out = [r for r in out if r.get("depth") is not None and any(abs(float(r["depth"]) - d) < 1e-6 for d in depths)]
    return out


def judged_series(rows: Sequence[dict], *, baseline: str = "vanilla") -> tuple[list[tuple[str, str, str]], str | None]:
    """The ``(qgpm series, baseline series, oracle series)`` label triples the targets judge, and a
    note on what is left out: every qgpm config (``qgpm``, ``qgpm@<hash>``) against the one
    ``baseline`` series (``baseline`` may be a label) and the one oracle series. Where the
    baseline ran with several configs nothing is judged (against which would be a guess: pass a
    label as ``--baseline``); where the Oracle did, its target and its diagnosis column are left out."""
    labs = set(series_labels(rows).values())

    def of(name: str) -> list[str]:
        return [name] if name in labs else sorted(lab for lab in labs if lab.startswith(name + "@"))

    bases, oracles = of(baseline), of("oracle")
    if len(bases) > 1:
        return [], (f"Targets and diagnosis skipped: {baseline} ran with {len(bases)} configs here ({', '.join(bases)}); "
                    "regenerate with `qgpm report --baseline <one of those labels>`.")
    note = None
    if len(oracles) > 1:
        note = f"The Oracle's target and columns are left out: it ran with {len(oracles)} configs here ({', '.join(oracles)})."
    oracle = oracles[0] if len(oracles) == 1 else ""  # "": no series, so no Oracle target
    return [(m, bases[0] if bases else baseline, oracle) for m in of("qgpm")], note


def check_targets(rows: Sequence[dict], *, method: str = "qgpm", baseline: str = "vanilla", oracle: str = "oracle",
                  n_boot: int = 10_000, seed: int = 0) -> list[TargetCheck]:
    """Every target that the rows can judge (tasks present, series present); ``method``,
    ``baseline`` and ``oracle`` are series labels (:func:`judged_series` picks them)."""
    by = _by_label(rows)
    m, v, o = by.get(method, []), by.get(baseline, []), by.get(oracle, [])
    tasks = sorted({r["task"] for r in m})
    out: list[TargetCheck] = []
    for t in tasks:
        mt = _task(m, t)
        if t in RETRIEVAL_TASKS and v:
            p = paired(mt, _task(v, t), n_boot=n_boot, seed=seed)
            out.append(TargetCheck(f"retrieval: {method} − {baseline} ≥ +10 pts (all depths)", t, p.n, 100 * p.diff, 100 * p.lo, 100 * p.hi,
                                   "≥ +10", None if p.n == 0 else 100 * p.diff >= 10, f"b/c = {p.b}/{p.c}"))
            pm = paired(_task(m, t, MID_DEPTHS), _task(v, t, MID_DEPTHS), n_boot=n_boot, seed=seed)
            out.append(TargetCheck(f"retrieval: {method} significantly above {baseline} at mid depths (25–75 %)", t, pm.n, 100 * pm.diff, 100 * pm.lo, 100 * pm.hi,
                                   "McNemar p < 0.05, b > c", None if pm.n == 0 else (pm.p < 0.05 and pm.b > pm.c),
                                   f"b/c = {pm.b}/{pm.c}, p = {pm.p:.3g}"))
        if t in GUARD_TASKS and v:
            p = paired(mt, _task(v, t), n_boot=n_boot, seed=seed)
            out.append(TargetCheck(f"guard: {method} − {baseline} ≥ −1 pt", t, p.n, 100 * p.diff, 100 * p.lo, 100 * p.hi,
                                   "≥ −1", None if p.n == 0 else 100 * p.diff >= -1, f"b/c = {p.b}/{p.c}, p = {p.p:.3g}"))
        if o:
            p = paired(mt, _task(o, t), n_boot=n_boot, seed=seed)
            out.append(TargetCheck(f"{method} − {oracle} ≥ −2 pts", t, p.n, 100 * p.diff, 100 * p.lo, 100 * p.hi,
                                   "≥ −2", None if p.n == 0 else 100 * p.diff >= -2, f"b/c = {p.b}/{p.c}"))
    return out


def _acc(rows: Sequence[dict]) -> float | None:
    return sum(float(r["correct"]) for r in rows) / len(rows) if rows else None


def diagnose(rows: Sequence[dict], *, method: str = "qgpm", baseline: str = "vanilla", oracle: str = "oracle",
             n_boot: int = 10_000, seed: int = 0) -> list[dict[str, Any]]:
    """Per task: head-signal quality, the Oracle's gain, and QGPM's gain split by the heads' evidence rank
    (``method``, ``baseline``, ``oracle``: series labels, as for :func:`check_targets`)."""
    by = _by_label(rows)
    m, v, o = by.get(method, []), by.get(baseline, []), by.get(oracle, [])
    out = []
    for t in sorted({r["task"] for r in m}):
        mt = _task(m, t)
        vt = {(pair_key(r)): r for r in _task(v, t)}
        ranks = [r.get("evidence_rank") for r in mt]
        known = [x for x in ranks if x is not None]
        top1 = [r for r in mt if r.get("evidence_rank") == 0]
        rest = [r for r in mt if r.get("evidence_rank") != 0]
        d: dict[str, Any] = {
            "series": method, "task": t, "n": len(mt),
            "evidence_top1": (sum(1 for x in known if x == 0) / len(known)) if known else None,
            "evidence_top3": (sum(1 for x in known if x < 3) / len(known)) if known else None,
            "evidence_mrr": (sum(1 / (x + 1) for x in known) / len(known)) if known else None,
            "evidence_unlocated": len(ranks) - len(known),
        }
        if v:
            pq = paired(mt, _task(v, t), n_boot=n_boot, seed=seed)
            d.update(qgpm_delta=100 * pq.diff, qgpm_lo=100 * pq.lo, qgpm_hi=100 * pq.hi, qgpm_logprob=pq.logprob_diff)
            same = [r["answer"].strip() == vt[pair_key(r)]["answer"].strip() for r in mt
                    if pair_key(r) in vt and isinstance(r.get("answer"), str) and isinstance(vt[pair_key(r)].get("answer"), str)]
            d["same_answer"] = sum(same) / len(same) if same else None
            for name, sub in (("top1", top1), ("rest", rest)):
                pairs = [(r, vt[pair_key(r)]) for r in sub if pair_key(r) in vt]
                d[f"qgpm_delta_{name}"] = (100 * (_acc([a for a, _ in pairs]) - _acc([b for _, b in pairs]))) if pairs else None
                d[f"n_{name}"] = len(pairs)
            if o:
                po = paired(_task(o, t), _task(v, t), n_boot=n_boot, seed=seed)
                d.update(oracle_delta=100 * po.diff, oracle_lo=100 * po.lo, oracle_hi=100 * po.hi, oracle_logprob=po.logprob_diff)
        out.append(d)
    return out


def targets_and_diagnosis(rows: Sequence[dict], *, baseline: str = "vanilla", n_boot: int = 10_000,
                          seed: int = 0) -> tuple[list[TargetCheck], list[dict[str, Any]], str | None]:
    """The targets and the diagnosis of every qgpm series (:func:`judged_series`), and its note
    on what was left out."""
    triples, note = judged_series(rows, baseline=baseline)
    checks = [c for m, b, o in triples for c in check_targets(rows, method=m, baseline=b, oracle=o, n_boot=n_boot, seed=seed)]
    diag = [d for m, b, o in triples for d in diagnose(rows, method=m, baseline=b, oracle=o, n_boot=n_boot, seed=seed)]
    return checks, diag, note


def targets_markdown(checks: Sequence[TargetCheck], diag: Sequence[dict[str, Any]], note: str | None) -> list[str]:
    """The "Targets" and "Diagnosis" sections of ``report.md``, after the note on what was left
    out (:func:`judged_series`); nothing when no qgpm series ran."""
    if not checks and not diag:
        return ["## Targets", "", note, ""] if note else []
    fmt = lambda x, s="+.1f": "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, s)  # noqa: E731
    md = ["## Targets", "", *([note, ""] if note else []),
          "Per task, pooled over lengths and depths, paired by sample (Δ in points, paired bootstrap 95 % CI). "
          "met = the point estimate passes the threshold (the CI says how sure that is).", "",
          "| target | task | pairs | Δ [95% CI] | threshold | met | detail |", "|---|---|---|---|---|---|---|"]
    for c in checks:
        met = "–" if c.met is None else ("yes" if c.met else "**no**")
        md.append(f"| {c.target} | {c.task} | {c.pairs} | {fmt(c.value)} [{fmt(c.lo)}, {fmt(c.hi)}] | {c.threshold} | {met} | {c.detail} |")
    md += ["", "## Diagnosis: relevance signal vs position remapping", "",
           "evidence top-1 / top-3 / MRR: where QGPM's relevance source (the config's relevance: the heads or a reranker) ranks "
           "the evidence sentence (qgpm rows). oracle Δ: what the remapping gives with perfect relevance. qgpm Δ | top-1: "
           "QGPM's gain on the samples where the evidence was ranked first; | rest: on the others. Δlogp: mean paired gold log-prob difference (nats). "
           "same answer %: qgpm's answer text equals the baseline's.", "",
           "| series | task | n | evidence top-1 % | top-3 % | MRR | oracle Δ [CI] | oracle Δlogp | qgpm Δ [CI] | qgpm Δlogp | same answer % | qgpm Δ \\| top-1 (n) | qgpm Δ \\| rest (n) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for d in diag:
        pct = lambda x: "–" if x is None else f"{100 * x:.0f}"  # noqa: E731
        o = f"{fmt(d.get('oracle_delta'))} [{fmt(d.get('oracle_lo'))}, {fmt(d.get('oracle_hi'))}]" if "oracle_delta" in d else "–"
        q = f"{fmt(d.get('qgpm_delta'))} [{fmt(d.get('qgpm_lo'))}, {fmt(d.get('qgpm_hi'))}]" if "qgpm_delta" in d else "–"
        md.append(f"| {d['series']} | {d['task']} | {d['n']} | {pct(d['evidence_top1'])} | {pct(d['evidence_top3'])} | {fmt(d['evidence_mrr'], '.2f')} | {o} | "
                  f"{fmt(d.get('oracle_logprob'), '+.2f')} | {q} | {fmt(d.get('qgpm_logprob'), '+.2f')} | {pct(d.get('same_answer'))} | "
                  f"{fmt(d.get('qgpm_delta_top1'))} ({d.get('n_top1', 0)}) | {fmt(d.get('qgpm_delta_rest'))} ({d.get('n_rest', 0)}) |")
    md.append("")
    return md
