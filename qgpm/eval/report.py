"""Markdown report, ``stats.json`` and accuracy-vs-depth plots from a run's ``rows.jsonl``.

    python -m qgpm.eval.cli report --out runs/x      # or: from qgpm.eval.report import report

``report(out_dir)`` regenerates everything from the rows (and the manifest, for the
run's settings), so it can be rerun at any time, e.g. after a resumed run.

Files written in ``out_dir``: ``report.md`` (tables: task x length x method accuracy with
Wilson 95 % CI; all tasks pooled; paired differences vs vanilla with bootstrap CI and
exact McNemar p; per-depth accuracy and paired tables; gold log-prob; QGPM/Top-K
diagnostics; the benchmark's targets and the head-signal vs remapping diagnosis
(:mod:`qgpm.eval.targets`); timings), ``stats.json`` (the same numbers) and ``plots/depth_<task>_<length>.png``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from qgpm.eval.hashes import config_value
from qgpm.eval.rows import METHOD_ORDER, dedupe_rows, read_manifest, read_rows
from qgpm.eval.stats import base_for, group_accuracy, group_paired, series_labels, summarize
from qgpm.eval.targets import targets_and_diagnosis, targets_markdown
from qgpm.methods import METHODS, Stage, method_spec
from qgpm.plan import KEPT_REASONS
from qgpm.sources import parse_source
from qgpm.samples.tasks import TASKS

__all__ = ["report", "plot_depth_curves", "REPORT_FILE", "STATS_FILE"]

REPORT_FILE = "report.md"
STATS_FILE = "stats.json"


def _series_order(labels: Sequence[str]) -> list[str]:
    def key(lab: str) -> tuple:
        m = lab.split("@")[0]
        return (METHOD_ORDER.index(m) if m in METHOD_ORDER else len(METHOD_ORDER), lab)

    return sorted(set(labels), key=key)


def _pct(x: float | None, digits: int = 1) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.{digits}f}"


def _acc_cell(a) -> str:
    if a is None or a.n == 0:
        return "–"
    err = f", {a.errors} err" if a.errors else ""
    return f"{_pct(a.acc)} ({_pct(a.lo, 0)}–{_pct(a.hi, 0)}) n={a.n}{err}"


def _p(p: float) -> str:
    return "–" if p is None or math.isnan(p) else (f"{p:.3f}" if p >= 0.001 else f"{p:.1e}")


def _depth(d: Any) -> str:
    return "random" if d is None else f"{float(d):g}"


def _table(header: Sequence[str], body: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return lines


def _tasks_lengths(rows: Sequence[dict]) -> list[tuple[str, int]]:
    tl = {(r["task"], int(r["length"])) for r in rows}
    return sorted(tl, key=lambda x: (TASKS.index(x[0]) if x[0] in TASKS else 99, x[0], x[1]))


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _kept_vanilla_section(rows: Sequence[dict], labels: dict, order: Sequence[str]) -> list[str]:
    """How many calls of each position-changing series kept the model's own positions, and by
    which rule (rows that record ``kept_reason``); nothing when none did."""
    counts: dict[tuple, dict[str, int]] = {}
    for r in rows:
        if r.get("error") or "kept_reason" not in r:
            continue
        c = counts.setdefault((r["task"], int(r["length"]), labels[(r["method"], r["config_hash"])]), {"calls": 0})
        c["calls"] += 1
        if r["kept_reason"] is not None:
            c[r["kept_reason"]] = c.get(r["kept_reason"], 0) + 1
    reasons = [k for k in KEPT_REASONS if any(k in c for c in counts.values())]
    if not reasons:
        return []
    body = [[t, L, lab, c["calls"], *[c.get(k, 0) for k in reasons]]
            for (t, L, lab), c in sorted(counts.items(), key=lambda kv: (kv[0][0], kv[0][1], list(order).index(kv[0][2])))]
    return ["## Calls that kept the model's own positions", "",
            "Calls of the series that change positions which moved no sentence, by the rule that kept them "
            "(`result.details.kept_reason`; keep_length: a context within `keep_length` tokens). Such a call answers as vanilla does.", "",
            *_table(["task", "length", "series", "calls", *reasons], body), ""]


def plot_depth_curves(rows: Sequence[dict], out_dir: str | Path, *, labels: dict | None = None) -> list[Path]:
    """One PNG per (task, length) with accuracy vs depth per series (Wilson 95 % bars),
    plus one per length pooling all tasks. Rows with random placement are skipped."""
    import matplotlib  # optional: qgpm[eval]

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # optional: qgpm[eval]; after the backend is chosen

    rows = [r for r in rows if r.get("depth") is not None]
    if not rows:
        return []
    labels = labels or series_labels(rows)
    acc = group_accuracy(rows, ("task", "length", "depth"), labels=labels)
    pooled = group_accuracy(rows, ("*", "length", "depth"), labels=labels)
    order = _series_order(labels.values())
    out = Path(out_dir) / "plots"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    groups = [(t, L, acc) for t, L in _tasks_lengths(rows)]
    if len({r["task"] for r in rows}) > 1:
        groups += [("all", L, pooled) for L in sorted({int(r["length"]) for r in rows})]
    for task, length, table in groups:
        n = max((v.n for k, v in table.items() if k[0] == task and k[1] == length), default=0)
        if not n:  # every answer errored: nothing to plot (report.md lists the errors)
            continue
        fig, ax = plt.subplots(figsize=(5.2, 3.4), dpi=110)
        for j, lab in enumerate(order):
            pts = sorted((k[2], v) for k, v in table.items() if k[0] == task and k[1] == length and k[3] == lab and v.n)
            if not pts:
                continue
            dodge = (j - (len(order) - 1) / 2) * 0.012  # keep overlapping series and bars apart
            xs = [float(d) + dodge for d, _ in pts]
            ys = [100 * v.acc for _, v in pts]
            err = [[100 * (v.acc - v.lo) for _, v in pts], [100 * (v.hi - v.acc) for _, v in pts]]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, linewidth=1.5, label=lab, alpha=0.9)
        ax.set_title(f"{task} @ {length} tokens (n={n} per depth)", fontsize=10)
        ax.set_xlabel("needle / gold depth (0 = start, 1 = end)")
        ax.set_ylabel("accuracy %")
        ax.set_ylim(-5, 105)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
        fig.tight_layout()
        path = out / f"depth_{task}_{length}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def _strict(value: Any) -> Any:
    """``value`` with every NaN / infinite float as ``None``: ``stats.json`` is strict JSON (an
    accuracy over no answered row is not a number)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


def _header(rows: Sequence[dict], manifest: Mapping[str, Any], order: Sequence[str]) -> list[str]:
    """What the rows of the folder are (read from the rows: their splits, depths, series and
    samples per cell), then the runs that wrote them, the latest one in full."""
    runs = manifest.get("runs") or []
    latest = manifest.get("latest") or {}
    cells: dict[tuple, set] = {}
    for r in rows:
        cells.setdefault((r.get("task"), r.get("length"), r.get("depth"), r.get("method"), r.get("config_hash")), set()).add(r.get("seed"))
    sizes = sorted(len(v) for v in cells.values())
    splits = sorted({str(r.get("split")) for r in rows})
    depths = sorted({r.get("depth") for r in rows if r.get("depth") is not None})
    models = sorted({f"`{u.get('model')}` ({u.get('dtype')}, {u.get('device')})" for u in runs if u.get("model")})
    out = [
        f"- split: **{', '.join(splits)}**" + (" (rows of several splits: every statistic counts them together)" if len(splits) > 1 else ""),
        f"- series: {', '.join(order)}; samples per (task, length, depth) and series: "
        + (f"{sizes[0]}" if sizes[0] == sizes[-1] else f"{sizes[0]} to {sizes[-1]}") + f"; depths: {depths}",
    ]
    if runs:
        out.append(f"- written by {len(runs)} run{'s' if len(runs) != 1 else ''} (each with its command in manifest.json); model: {', '.join(models)}")
    if latest:
        methods = latest.get("methods") or []
        specs = [method_spec(m) for m in methods if m in METHODS]
        every = len(specs) < len(methods) or not specs  # a method this version does not know: name every setting
        relevance = config_value(latest.get("config") or {}, "relevance")
        ranked = every or any(s.stage is Stage.HEADS for s in specs)
        read = ""  # only the settings its methods read (a vanilla run has no reranker and no config)
        if every or any(s.reranker for s in specs):
            read += f"; reranker ({'/'.join(s.name for s in specs if s.reranker) or 'topk/reorder'}) {latest.get('reranker')}"
        if every or any(s.takes_k for s in specs):
            read += f", k={latest.get('k')}"
        if ranked and (every or parse_source(relevance).heads):
            read += f"; heads `{latest.get('heads')}`"
        if ranked:
            read += f"; relevance source `{relevance}`"
        out.append(f"- the latest run: `{latest.get('command')}` (methods {', '.join(methods)}; n = {latest.get('n')} per (task, length, depth){read})")
        if every or any(s.config for s in specs):
            out.append(f"- its QGPM config: `{json.dumps(latest.get('config'))}` ({latest.get('config_provenance')})")
        out.append(f"- versions: {latest.get('versions')}; processes: {latest.get('processes')}; latest run wall time {latest.get('wall_s')} s")
    return out


def report(out_dir: str | Path, *, baseline: str = "vanilla", plots: bool = True, n_boot: int = 10_000, seed: int = 0) -> Path:
    """Regenerate ``report.md``, ``stats.json`` and the plots from the rows in ``out_dir``."""
    out = Path(out_dir)
    rows = dedupe_rows(read_rows(out))
    if not rows:
        if (out / "rows.jsonl").is_file():
            raise ValueError(f"{out / 'rows.jsonl'} holds no rows: no sample was answered (the log says why each was skipped, "
                             "e.g. a length too short for the task's prompt); rerun with longer --lengths")
        raise FileNotFoundError(f"no rows in {out} (expected {out / 'rows.jsonl'})")
    manifest = read_manifest(out)
    configs = manifest.get("configs") or {}
    labels = series_labels(rows)
    order = _series_order(labels.values())
    summary = summarize(rows, baseline=baseline, n_boot=n_boot, seed=seed, configs=configs)
    (out / STATS_FILE).write_text(json.dumps(_strict(summary), indent=1, default=str, allow_nan=False) + "\n")

    kw = dict(labels=labels)
    acc = group_accuracy(rows, ("task", "length"), **kw)
    acc_all = group_accuracy(rows, ("*", "length"), **kw)
    acc_d = group_accuracy(rows, ("task", "length", "depth"), **kw)
    pk = dict(baseline=baseline, labels=labels, n_boot=n_boot, seed=seed, configs=configs)
    par = group_paired(rows, ("task", "length"), **pk)
    par_all = group_paired(rows, ("*", "length"), **pk)
    par_d = group_paired(rows, ("task", "length", "depth"), **pk)
    tls = _tasks_lengths(rows)
    lengths = sorted({L for _, L in tls})
    multi_task = len({t for t, _ in tls}) > 1

    md: list[str] = ["# Evaluation report", ""] + _header(rows, manifest, order)
    base_labels = [lab for lab in order if lab == baseline or lab.startswith(baseline + "@")]
    if len(base_labels) > 1:  # each series is paired with the baseline config run as it was
        md.append("- paired with: " + "; ".join(f"{lab} against {base_for(lab, base_labels, labels, configs)}"
                                                for lab in order if lab not in base_labels))
    if any(lab != lab.split("@")[0] for lab in order):
        md.append("- series with several configs (method@hash): " + "; ".join(
            f"`{h[:6]}` = {json.dumps(configs.get(h, {}).get('config') or configs.get(h, {}))}" for (m, h), lab in labels.items() if "@" in lab))
    md += [f"- rows: {len(rows)} ({sum(1 for r in rows if r.get('error'))} with errors, left out of every statistic)", ""]

    md += ["## Accuracy (%), Wilson 95 % CI", ""]
    body = [[t, L, *[_acc_cell(acc.get((t, L, lab))) for lab in order]] for t, L in tls]
    if multi_task:
        body += [["**all tasks**", L, *[_acc_cell(acc_all.get(("all", L, lab))) for lab in order]] for L in lengths]
    md += _table(["task", "length", *order], body) + [""]

    if par:
        md += [f"## Paired vs {baseline} (same samples)", "",
               "Δ = accuracy difference in points with a paired bootstrap 95 % CI (whole needle contents resampled); b = right only with the method, "
               f"c = right only with {baseline}; p = exact McNemar (two-sided binomial on b, c). contents = distinct "
               "needle contents (seeds) among the pairs; content p = sign-flip test over the contents' summed differences "
               "(outcomes cluster by content: a content answered at several depths is not several independent pairs; "
               "smallest possible p with k contents: 2/2^k). Δlogp = mean paired difference of the gold log-prob (nats).", ""]
        body = []
        keys = [(t, L) for t, L in tls] + ([("all", L) for L in lengths] if multi_task else [])
        for t, L in keys:
            for lab in order:
                p = (par_all if t == "all" else par).get((t, L, lab))
                if p is None or p.n == 0:
                    continue
                lp = "–" if p.logprob_diff is None else f"{p.logprob_diff:+.2f}"
                body.append([("**all tasks**" if t == "all" else t), L, lab, p.n, _pct(p.acc), _pct(p.base_acc),
                             f"{100 * p.diff:+.1f} [{100 * p.lo:+.1f}, {100 * p.hi:+.1f}]", p.b, p.c, _p(p.p), p.contents, _p(p.content_p), lp])
        md += _table(["task", "length", "method", "pairs", "acc", baseline, "Δ [95% CI]", "b", "c", "McNemar p", "contents", "content p", "Δlogp"],
                     body) + [""]

    depth_rows = [r for r in rows if r.get("depth") is not None]
    if depth_rows:
        md += ["## Accuracy by depth (%)", "", "Cells: accuracy % (correct/n).", ""]
        body = []
        depths = sorted({float(r["depth"]) for r in depth_rows})
        for t, L in tls:
            for d in depths:
                cells = []
                for lab in order:
                    a = acc_d.get((t, L, d, lab))
                    cells.append("–" if a is None or a.n == 0 else f"{_pct(a.acc, 0)} ({a.correct}/{a.n})")
                if any(c != "–" for c in cells):
                    body.append([t, L, _depth(d), *cells])
        md += _table(["task", "length", "depth", *order], body) + [""]
        if par_d:
            md += [f"### Paired vs {baseline} by depth", ""]
            body = []
            for t, L in tls:
                for d in depths:
                    for lab in order:
                        p = par_d.get((t, L, d, lab))
                        if p is None or p.n == 0:
                            continue
                        body.append([t, L, _depth(d), lab, p.n, f"{100 * p.diff:+.0f} [{100 * p.lo:+.0f}, {100 * p.hi:+.0f}]", p.b, p.c, _p(p.p)])
            md += _table(["task", "length", "depth", "method", "pairs", "Δ [95% CI]", "b", "c", "McNemar p"], body) + [""]

    if depth_rows and multi_task:
        acc_pd = group_accuracy(depth_rows, ("*", "*", "depth"), **kw)
        par_pd = group_paired(depth_rows, ("*", "*", "depth"), **pk)
        depths = sorted({float(r["depth"]) for r in depth_rows})
        md += ["## All tasks and lengths by depth", "",
               f"Accuracy % (n) per depth, pooled over tasks and lengths; then Δ vs {baseline} in points "
               "[paired bootstrap 95 % CI] and McNemar p.", ""]
        body = []
        for d in depths:
            cells = []
            for lab in order:
                a = acc_pd.get(("all", "all", d, lab))
                cell = "–" if a is None or a.n == 0 else f"{_pct(a.acc, 0)} ({a.n})"
                p = par_pd.get(("all", "all", d, lab))
                if p is not None and p.n:
                    cell += f"; {100 * p.diff:+.0f} [{100 * p.lo:+.0f}, {100 * p.hi:+.0f}] p={_p(p.p)}"
                cells.append(cell)
            body.append([_depth(d), *cells])
        md += _table(["depth", *order], body) + [""]

    lp_groups: dict[tuple, list[float]] = {}
    for r in rows:
        if not r.get("error") and r.get("logprob_gold") is not None:
            lp_groups.setdefault((r["task"], int(r["length"]), labels[(r["method"], r["config_hash"])]), []).append(r["logprob_gold"])
    if lp_groups:
        md += ["## Mean gold log-prob (nats, higher is better)", ""]
        body = [[t, L, *[("–" if (t, L, lab) not in lp_groups else f"{_mean(lp_groups[(t, L, lab)]):.2f}") for lab in order]] for t, L in tls]
        md += _table(["task", "length", *order], body) + [""]

    diag = []  # one row per series (a label), never pooling two configs of a method
    ranked: dict[tuple, list[dict]] = {}  # (task, length, label) -> its qgpm rows with an evidence rank / topk rows with evidence_kept
    for r in rows:
        if not r.get("error") and ((r["method"] == "qgpm" and "evidence_rank" in r) or (r["method"] == "topk" and "evidence_kept" in r)):
            ranked.setdefault((r["task"], int(r["length"]), labels[(r["method"], r["config_hash"])]), []).append(r)
    for t, L in tls:
        for lab in order:
            rs = ranked.get((t, L, lab))
            if rs and rs[0]["method"] == "qgpm":
                ranks = [r["evidence_rank"] for r in rs if r["evidence_rank"] is not None]
                mrr = _mean([1 / (x + 1) for x in ranks])
                top1 = _mean([float(x == 0) for x in ranks])
                diag.append([t, L, lab, len(rs), "–" if mrr is None else f"{mrr:.2f}", _pct(top1, 0), "–"])
            elif rs:
                diag.append([t, L, lab, len(rs), "–", "–", _pct(_mean([float(r["evidence_kept"]) for r in rs]), 0)])
    if diag:
        md += ["## Retrieval diagnostics", "",
               "qgpm: MRR and top-1 rate of the evidence sentence under QGPM's relevance ranking (the config's relevance source); "
               "topk: share of samples whose evidence survived the edit.", ""]
        md += _table(["task", "length", "series", "n", "evidence MRR", "evidence top-1 %", "evidence kept %"], diag) + [""]

    md += _kept_vanilla_section(rows, labels, order)
    checks, diagnosis, note = targets_and_diagnosis(rows, baseline=baseline, n_boot=n_boot, seed=seed)
    md += targets_markdown(checks, diagnosis, note)
    summary["targets"], summary["diagnosis"] = [c.to_dict() for c in checks], diagnosis
    if note:
        summary["targets_note"] = note
    (out / STATS_FILE).write_text(json.dumps(_strict(summary), indent=1, default=str, allow_nan=False) + "\n")

    md += ["## Cost (means per answer)", ""]
    body = []
    for lab in order:
        rs = [r for r in rows if labels[(r["method"], r["config_hash"])] == lab and not r.get("error")]
        if not rs:
            continue
        tm = [r.get("timings") or {} for r in rs]
        f = lambda key, ts=tm: _mean([x[key] for x in ts if x.get(key) is not None])  # noqa: E731
        fmt = lambda v: "–" if v is None else f"{v:.3f}"  # noqa: E731
        scored = [r.get("timings") or {} for r in rs if r.get("logprob_gold") is not None]  # --no-logprob rows hold logprob_s 0.0
        body.append([lab, len(rs), f"{_mean([r.get('prompt_tokens') or 0 for r in rs]):.0f}", f"{_mean([r.get('answer_tokens') or 0 for r in rs]):.1f}",
                     fmt(f("edit_s")), fmt(f("pass1_s")), fmt(f("prefill_s")), fmt(f("decode_s")), fmt(f("logprob_s", scored)), fmt(f("wall_s"))])
    md += ["edit s: the context edit (Reorder's and Top-K's reranker runs here); ranking s: QGPM's relevance pass "
           "(the model's attention pass 1 and/or the relevance source's reranker); prefill s includes the gold answer "
           "scored in the same forward when this process generates (a remote generator's rows score it apart, in log-prob s only); "
           "log-prob s: over the answers that scored the gold log-prob only "
           "(–: none did). Seconds are wall time on the machine and threads of each row's run, so series run at other "
           "times compare only roughly; cost_per_answer_* benchmarks time methods side by side.", ""]
    md += _table(["series", "answers", "prompt tokens", "answer tokens", "edit s", "ranking s", "prefill s", "decode s", "log-prob s", "wall s"], body) + [""]

    errs = [r for r in rows if r.get("error")]
    if errs:
        md += ["## Errors", ""] + [f"- {r['task']} @{r['length']} depth {_depth(r.get('depth'))} seed {r['seed']} {r['method']}: `{r['error'][:200]}`" for r in errs[:50]] + [""]

    if plots:
        paths = plot_depth_curves(rows, out, labels=labels)
        if paths:
            md += ["## Accuracy vs depth", ""] + [f"![{p.stem}](plots/{p.name})" for p in paths] + [""]

    path = out / REPORT_FILE
    path.write_text("\n".join(md))
    return path
