"""How a hyperparameter search's trials are scored, ranked and written up (:func:`qgpm.eval.tune.tune`).

:func:`trial_summary` scores one trial's rows against vanilla's on the same samples (accuracy,
gold log-prob, wins and losses with the exact McNemar p, each (task, length) group);
:func:`objective_key` ranks trials by the search's objective; :func:`summary_md` writes
``tune_summary.md``.
"""

from __future__ import annotations

import json
import math
from typing import Sequence

from qgpm.config import QGPMConfig
from qgpm.eval.significance import mcnemar_exact

__all__ = ["SHAPING_FIELDS", "mean", "trial_summary", "objective_key", "fmt", "summary_md"]

SHAPING_FIELDS = ("k_broad", "t_broad", "k_sharp", "t_sharp", "s_low", "eps", "anchor_ratio", "anchor_basis", "tau", "local_window", "unmodulated_layers", "min_top_z", "decisive_margin", "z_window", "solo_margin", "split_layer", "remap", "lead_tokens", "placement", "local_layers", "term_ratio", "moved_order")
"""The shaping and remap fields a preset line in ``tune_summary.md`` lists."""


def mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def trial_summary(rows: list[dict], base_rows: dict[tuple, dict]) -> dict:
    good = [r for r in rows if not r.get("error")]
    acc = mean([float(r["correct"]) for r in good])
    lps = [r["logprob_gold"] for r in good if r.get("logprob_gold") is not None]
    per_group: dict[str, list[tuple[float, float]]] = {}
    b = c = 0
    lp_diff = []
    for r in good:
        v = base_rows.get((r["task"], r["length"], r["depth"], r["seed"]))
        if v is None:
            continue
        per_group.setdefault(f"{r['task']}@{r['length']}", []).append((float(r["correct"]), float(v["correct"])))
        b += int(r["correct"] and not v["correct"])
        c += int(v["correct"] and not r["correct"])
        if r.get("logprob_gold") is not None and v.get("logprob_gold") is not None:
            lp_diff.append(r["logprob_gold"] - v["logprob_gold"])
    groups = {g: {"acc": mean([a for a, _ in xs]), "vanilla": mean([v for _, v in xs]), "n": len(xs)} for g, xs in sorted(per_group.items())}
    deltas = [g["acc"] - g["vanilla"] for g in groups.values()]
    pairs = [p for xs in per_group.values() for p in xs]  # the samples both answered (an error row pairs with nothing)
    return {
        "n": len(good), "errors": len(rows) - len(good), "acc": acc, "mean_score": mean([r["score"] for r in good]),
        "mean_logprob": mean(lps), "logprob_vs_vanilla": mean(lp_diff),
        "delta_vs_vanilla": (mean([a for a, _ in pairs]) - mean([v for _, v in pairs])) if pairs else None,
        "worst_group_delta": min(deltas) if deltas else None, "b": b, "c": c, "mcnemar_p": mcnemar_exact(b, c),
        "evidence_mrr": mean([1 / (r["evidence_rank"] + 1) for r in good if r.get("evidence_rank") is not None]),
        "groups": groups,
    }


def objective_key(t: dict, objective: str, guard: float) -> tuple:
    acc = t["acc"] if t["acc"] is not None else -1.0
    lp = t["mean_logprob"] if t["mean_logprob"] is not None else -math.inf
    if objective == "logprob":
        return (lp, acc)
    if objective == "guarded":
        worst = t["worst_group_delta"] if t["worst_group_delta"] is not None else -1.0
        return (worst >= -guard, acc, lp)
    return (acc, lp)


def fmt(x: float | None, pct: bool = False, signed: bool = False) -> str:
    if x is None:
        return "–"
    v = 100 * x if pct else x
    return f"{v:+.1f}" if signed else (f"{v:.1f}" if pct else f"{v:.2f}")


def _kept_line(kept: dict | None) -> list[str]:
    """A line on the answers a confidence rule kept at vanilla positions: those are alike in every
    trial, so trials can differ only on the others (none at all when every answer was kept)."""
    if not kept or not kept.get("by_reason"):
        return []
    n, reasons = kept["answers"], kept["by_reason"]
    total = sum(reasons.values())
    said = ", ".join(f"{reason} {count}" for reason, count in reasons.items())
    if total == n:
        return [f"- **every answer kept vanilla positions** ({said} of {n}): the trials cannot differ. Tune at lengths above "
                "`keep_length`, or with the rules that kept them relaxed (`--set keep_length=0`, `min_top_z=...`)"]
    return [f"- answers kept at vanilla positions by a confidence rule: {said} of {n} (alike in every trial that keeps them)"]


def summary_md(summary: dict, ranked: list[dict], base: QGPMConfig) -> str:
    best = summary["best"]
    v = summary["vanilla"]
    cfg = summary["best_config"]
    groups = sorted({g for t in ranked for g in t["groups"]})
    md = [
        "# QGPM hyperparameter search (dev split)", "",
        f"- model: `{summary['model']}` ({summary['dtype']}); heads: `{summary['heads']}`",
        f"- split: **{summary['split']}** (seeds {summary['seeds'][0]}..{summary['seeds'][1]}); tasks: {', '.join(summary['tasks'])}; "
        f"lengths: {summary['lengths']}; depths: {summary['depths']}; n = {summary['n']} per (task, length, depth) = {summary['samples']} samples",
        f"- objective: {summary['objective']} (tie-breaker: mean gold log-prob); trials: {summary['trials']} "
        f"(grid {json.dumps(summary['grid'])}, search seed {summary['search_seed']}; {summary['invalid_grid_points']} grid points violate the config constraints)",
        f"- trials answered by: {', '.join(summary.get('methods') or ['qgpm'])} (the first ranks the trials)"
        + (f"; shard {summary['shard'][0]}/{summary['shard'][1]} of the samples" if summary.get("shard") else ""),
        f"- command: `{summary['command']}`",
        f"- wall time: {summary['wall_s']} s; relevance computed {summary['pass1_runs']} times (pass 1 or the reranker, once per sample "
        f"and pass-1 setting: cached across trials); finished {summary['finished']}",
        *_kept_line(summary.get("kept_vanilla")),
        "",
        "## Chosen", "",
        f"Vanilla on these samples: accuracy {fmt(v['acc'], pct=True)} %, mean gold log-prob {fmt(v['mean_logprob'])}.",
        f"Best trial #{best['trial']} (`{best['config_hash']}`): accuracy {fmt(best['acc'], pct=True)} % "
        f"(Δ vs vanilla {fmt(best['delta_vs_vanilla'], pct=True, signed=True)} pts, worst task Δ {fmt(best['worst_group_delta'], pct=True, signed=True)} pts, "
        f"b/c = {best['b']}/{best['c']}, McNemar p = {best['mcnemar_p']:.3f}), mean gold log-prob {fmt(best['mean_logprob'])}.",
        f"Changes from the base config: `{json.dumps(best['changes'])}`.",
        f"Sensitivity: accuracy over all trials ranged {fmt(summary['sensitivity']['acc_min'], pct=True)}–{fmt(summary['sensitivity']['acc_max'], pct=True)} %.",
        "",
        "Preset line (qgpm/config.py; every field that differs from `QGPMConfig()`, so it builds `best_config.json`'s config):", "",
        "```python",
        _preset_line(cfg),
        "```",
        "",
        "Evaluate it on the test split: `qgpm eval ... --config best_config.json` (this folder).",
        "",
        "## All trials (best first)", "",
        "| # | hash | changes vs base | acc % | Δ vanilla | worst task Δ | b/c | mean logp | Δlogp | evid. MRR | " + " | ".join(groups)
        + (" | oracle acc % | oracle Δlogp" if summary.get("oracle") else "") + " |",
        "|" + "---|" * (10 + len(groups) + (2 if summary.get("oracle") else 0)),
    ]
    for t in ranked:
        cells = [str(t["trial"]), f"`{t['config_hash'][:8]}`", f"`{json.dumps(t['changes'])}`", fmt(t["acc"], pct=True),
                 fmt(t["delta_vs_vanilla"], pct=True, signed=True), fmt(t["worst_group_delta"], pct=True, signed=True),
                 f"{t['b']}/{t['c']}", fmt(t["mean_logprob"]), fmt(t["logprob_vs_vanilla"]), fmt(t["evidence_mrr"])]
        cells += [fmt(t["groups"].get(g, {}).get("acc"), pct=True) for g in groups]
        if summary.get("oracle"):
            o = t.get("oracle") or {}
            cells += [fmt(o.get("acc"), pct=True), fmt(o.get("logprob_vs_vanilla"))]
        md.append("| " + " | ".join(cells) + " |")
    md += ["", f"Base config: `{json.dumps(summary['base_config'])}`", ""]
    return "\n".join(md)


def _preset_line(cfg: dict) -> str:
    """``QGPMConfig(...)`` with every field of ``cfg`` that differs from the defaults (provenance last)."""
    default = QGPMConfig().to_dict()
    changed = [f"{k}={v!r}" for k, v in cfg.items() if k != "provenance" and k in default and v != default[k]]
    return "QGPMConfig(" + ", ".join(changed + [f"provenance={cfg.get('provenance')!r}"]) + ")"
