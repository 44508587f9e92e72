"""Hyperparameter search for QGPM's shaping settings on the *dev* split (never test).

    from qgpm.eval.tune import tune
    tune(engine, tasks=["niah_multikey_1", "nolima_direct"], lengths=[2048], n=8,
         grid={"k_sharp": [1, 2, 4], "s_low": [0.05, 0.1, 0.3]}, out_dir="runs/tune")

Every trial is one :class:`~qgpm.config.QGPMConfig` (the base config with some fields
changed) scored on the same dev samples: mean accuracy first, mean gold log-prob as the
tie-breaker (it moves smoothly where accuracy is flat), or the reverse with
``objective="logprob"``. ``objective="guarded"`` ranks trials that lose accuracy against
vanilla on some (task, length) after all those that never do (DESIGN: "never below
vanilla" is a requirement), then by accuracy and log-prob.

Pass 1 (head relevance) does not depend on the shaping fields, so it runs once per
sample: the prompt and the fused relevance ``z`` are cached, and each trial only rebuilds
the position plan with :func:`qgpm.plan.build_plan` (cheap) before answering. Changing a
pass-1 field (``max_sentence_chars``, ``split_run_ons``, ``query_tail``, ``exclude_newline_tokens``,
``max_heads``) makes a new cache entry. Vanilla answers the same samples once, as the
reference.

Files in ``out_dir``: ``tune_rows.jsonl`` (one row per sample and trial, the runner's row
format, resumable), ``trials.jsonl`` (one summary per trial), ``best_config.json``
(``qgpm eval --config`` reads it) and ``tune_summary.md`` (chosen values, provenance:
command, split, n, seeds, model, heads; every trial; sensitivity).
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as _dt
import itertools
import json
import logging
import random
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from tqdm.auto import tqdm

from qgpm.config import PRESETS, RECIPE, QGPMConfig
from qgpm.config_files import coerce_value, load_config  # load_config re-exported
from qgpm.defaults import PASS1_FIELDS
from qgpm.plan import inert_fields
from qgpm.eval.answering import answer_sample, prepare_kwargs
from qgpm.eval.hashes import config_hash, engine_dtype, engine_heads, method_fingerprint
from qgpm.eval.work import DEFAULT_DEPTHS, make_sample, work_items
from qgpm.eval.rows import end_torn_line, norm_depth, row_key
from qgpm.samples.base import EvalSample, split_seed
from qgpm.eval.trials import SHAPING_FIELDS, fmt, mean, objective_key, summary_md, trial_summary

__all__ = [
    "tune",
    "DEFAULT_GRID",
    "default_grid",
    "warn_inert",
    "shard_items",
    "PASS1_FIELDS",
    "SHAPING_FIELDS",
    "expand_grid",
    "parse_grid",
    "Pass1Cache",
    "load_config",
]

DEFAULT_GRID: dict[str, list] = {
    "k_broad": [8.0, 16.0],
    "t_broad": [2.0, 4.0],
    "k_sharp": [1.0, 2.0, 4.0],
    "t_sharp": [0.0, 0.5, 1.0],
    "s_low": [0.05, 0.1, 0.3],
    "anchor_ratio": [0.5, 1.0],
}
"""A small default space (216 points) for the paper's two maps under ``remap="stride"``;
``trials=`` samples from it at random. :func:`default_grid` leaves out what a base config does
not read."""


def default_grid(base: QGPMConfig) -> dict[str, list]:
    """:data:`DEFAULT_GRID` without the fields that change no position under ``base``
    (:func:`qgpm.plan.inert_fields`): for the SmolLM2 preset and the recipe (one map,
    ``remap="reorder"``) ``k_sharp`` x ``t_sharp`` x ``s_low``, 27 points."""
    inert = inert_fields(base)
    return {name: values for name, values in DEFAULT_GRID.items() if name not in inert}


def warn_inert(grid: Mapping[str, Any], base: QGPMConfig) -> None:
    """Log a warning for each field of ``grid`` that changes no position in any of its trials
    (:func:`qgpm.plan.inert_fields` of the base config under every ``remap`` / ``split_layer`` /
    ``anchor_basis`` the grid tries): its trials repeat one another."""
    axes = {k: list(grid.get(k) or [getattr(base, k)]) for k in ("remap", "split_layer", "anchor_basis")}
    inert: dict[str, str] | None = None
    for combo in itertools.product(*axes.values()):
        try:
            here = inert_fields(base.with_(**dict(zip(axes, combo))))
        except (TypeError, ValueError):  # a combination the config refuses: expand_grid leaves it out too
            continue
        inert = here if inert is None else {k: v for k, v in inert.items() if k in here}
    for name, why in (inert or {}).items():
        if name in grid and len(grid[name]) > 1:
            logger.warning("qgpm tune: the grid varies %s, which changes no position under the base config (%s); "
                           "its trials repeat one another", name, why)


TUNE_ROWS = "tune_rows.jsonl"
TRIALS_FILE = "trials.jsonl"
BEST_FILE = "best_config.json"
SUMMARY_FILE = "tune_summary.md"

logger = logging.getLogger("qgpm")


# ----------------------------------------------------------------------------- configs


def parse_grid(spec: str | None) -> dict[str, list]:
    """``"k_sharp=1,2,4;s_low=0.05,0.1"`` -> ``{"k_sharp": [1, 2, 4], "s_low": [0.05, 0.1]}``."""
    if not spec:
        return {}
    fields = {f.name for f in dataclasses.fields(QGPMConfig)}
    grid: dict[str, list] = {}
    for part in spec.split(";"):
        part = part.strip()
        if not part:
            continue
        name, _, values = part.partition("=")
        name = name.strip()
        if name not in fields or name == "provenance":
            raise ValueError(f"unknown QGPMConfig field {name!r} in grid; fields: {sorted(fields - {'provenance'})}")
        vals = [coerce_value(v) for v in values.split(",") if v.strip()]
        if not vals:
            raise ValueError(f"no values for {name!r} in grid")
        for v in vals:
            _check_grid_value(name, v)
        grid[name] = vals
    return grid


def _check_grid_value(name: str, value: Any) -> None:
    """Refuse, before the model loads, a grid value that is a typo whatever the other fields hold:
    one of the wrong type (``k_sharp=abc``), or a text no base config takes alone (``remap=strde``,
    ``relevance=minlm``: a choice's spelling). Numbers outside a constraint between fields
    (``k_sharp=9`` against the default ``k_broad=8``) are left to their grid point (:func:`expand_grid`)."""
    try:
        QGPMConfig().with_(**{name: value})
        return
    except TypeError as exc:
        raise ValueError(f"grid value {name}={value!r}: {exc}") from None
    except ValueError as exc:
        first = exc
    if not isinstance(value, str):
        return
    for base in (RECIPE, *PRESETS.values()):
        try:
            base.with_(**{name: value})
            return  # valid on another base: the run's base decides
        except ValueError:
            continue
    raise ValueError(f"grid value {name}={value!r} is taken by no config: {first}") from None


def expand_grid(grid: dict[str, list], base: QGPMConfig) -> tuple[list[QGPMConfig], list[dict]]:
    """Every valid config of the grid (in grid order, duplicates of the base removed) and
    the combinations that violate the config's constraints (e.g. ``K_b > K_s``)."""
    names = list(grid)
    valid: list[QGPMConfig] = []
    invalid: list[dict] = []
    for combo in itertools.product(*(grid[k] for k in names)):
        changes = dict(zip(names, combo))
        try:
            cfg = base.with_(**changes)
        except TypeError as exc:  # a value of the wrong type is a typo in the grid, not a point to skip
            raise ValueError(f"grid point {changes}: {exc}") from None
        except ValueError as exc:
            invalid.append({**changes, "reason": str(exc)})
            continue
        if cfg not in valid:  # configs compare by value: k_sharp=4 is k_sharp=4.0
            valid.append(cfg)
    if invalid:
        logger.warning("qgpm tune: %d grid point(s) violate the config's constraints and are skipped, e.g. %s", len(invalid), invalid[0])
    return valid, invalid


def _cfg_fields(cfg: QGPMConfig) -> dict:
    d = dataclasses.asdict(cfg)
    d.pop("provenance", None)
    return d


def _changes(cfg: QGPMConfig, base: QGPMConfig) -> dict:
    a, b = _cfg_fields(cfg), _cfg_fields(base)
    return {k: v for k, v in a.items() if b.get(k) != v}


# ----------------------------------------------------------------------------- pass-1 cache


class Pass1Cache:
    """One prepared call per (sample, method, pass-1 settings); trials only :meth:`QGPM.replan` it.

    For ``qgpm`` the cached call holds the prompt and the fused head relevance ``z``
    (pass 1 ran once); for ``oracle`` the evidence units. Changing a pass-1 field
    (``max_sentence_chars``, ``split_run_ons``, ``query_tail``, ``exclude_newline_tokens``, ``max_heads``)
    makes a new entry; ``misses`` counts the qgpm pass-1 runs.
    """

    def __init__(self, engine) -> None:
        self.engine = engine
        self._cache: dict[tuple, Any] = {}
        self.misses = 0

    @staticmethod
    def _key(sample: EvalSample, cfg: QGPMConfig, method: str) -> tuple:
        return (method, sample.task, sample.length, norm_depth(sample.depth), sample.seed, sample.index) + tuple(getattr(cfg, f) for f in PASS1_FIELDS)

    def call(self, sample: EvalSample, cfg: QGPMConfig, method: str = "qgpm"):
        """The prepared ``method`` call for ``sample`` with its plan built under ``cfg``."""
        key = self._key(sample, cfg, method)
        hit = self._cache.get(key)
        if hit is None:
            hit = self.engine.prepare(sample.context, sample.question, **prepare_kwargs(sample, method, config=cfg))
            self._cache[key] = hit
            self.misses += int(method == "qgpm")
            return hit
        return hit if hit.config == cfg else self.engine.replan(hit, cfg)


def _answer_cached(engine, cache: Pass1Cache, sample: EvalSample, cfg: QGPMConfig, logprob: bool, method: str = "qgpm") -> dict:
    call = cache.call(sample, cfg, method)
    row = answer_sample(engine, sample, method, config=cfg, logprob=logprob, call=call)
    row["timings"]["wall_s"] = round(row["timings"]["wall_s"] + call.timings.pass1_s + call.timings.plan_s, 4)
    return row


# ----------------------------------------------------------------------------- search


def shard_items(items: Sequence[Any], shard: tuple[int, int]) -> list[Any]:
    """The items of ``shard=(i, N)``: ``i, i+N, ...``; ``ValueError`` when it gets none."""
    if shard[0] >= len(items):
        raise ValueError(f"shard {shard[0]}/{shard[1]} gets no sample: the run has {len(items)} (tasks x lengths x depths x n); "
                         f"use at most {len(items)} shards")
    return list(items[shard[0]:: shard[1]])


def tune(
    engine,
    *,
    tasks: Sequence[str],
    lengths: Sequence[int],
    depths: Sequence[float] | None = DEFAULT_DEPTHS,
    n: int,
    out_dir: str | Path,
    grid: dict[str, list] | None = None,
    trials: int | None = None,
    search_seed: int = 0,
    base_config: QGPMConfig | None = None,
    split: str = "dev",
    objective: str = "accuracy",
    guard: float = 0.0,
    logprob: bool = True,
    progress: bool = True,
    haystack: Any = None,
    max_new_tokens: int | None = None,
    command: str | None = None,
    oracle: bool = False,
    methods: Sequence[str] | None = None,
    shard: tuple[int, int] | None = None,
) -> dict:
    """Search QGPM configs on dev samples; returns the summary (also written to ``out_dir``).

    ``grid`` maps config fields to candidate values (default :func:`default_grid` of the base config); with
    ``trials`` set, that many grid points are drawn at random (``search_seed``), the base
    config always being trial 0. ``split`` must be ``"dev"``: tuning on test samples would
    leak into the reported numbers. ``oracle=True`` also answers every trial with the
    Oracle (the same shaping with the generator's evidence labels in place of the
    heads' ranking): the gap between the two separates head-signal errors from what
    the position remapping itself can give on this model. ``methods`` picks what answers
    each trial: ``["qgpm"]`` (default), ``["qgpm", "oracle"]`` (same as ``oracle=True``) or
    ``["oracle"]`` alone, to map the remapping's ceiling without the heads. The first
    method ranks the trials. ``shard=(i, N)`` answers only samples ``i, i+N, ...`` (run N
    processes into separate folders, concatenate their ``tune_rows.jsonl`` into one folder
    and run once more without ``shard``: every answer is then reused and the summary
    covers all samples).
    """
    if methods is None:
        methods = ["qgpm", "oracle"] if oracle else ["qgpm"]
    methods = list(dict.fromkeys(methods))
    if not methods or any(m not in ("qgpm", "oracle") for m in methods):
        raise ValueError(f"tune methods must be qgpm and/or oracle, got {methods}")
    if oracle and "oracle" not in methods:
        raise ValueError("oracle=True conflicts with methods that leave out 'oracle'")
    oracle = "oracle" in methods
    if shard is not None and not (0 <= shard[0] < shard[1]):
        raise ValueError(f"shard must be (i, N) with 0 <= i < N, got {shard}")
    if split != "dev":
        raise ValueError(f"tuning runs on the dev split only (got split={split!r}); test samples must stay unseen")
    if objective not in ("accuracy", "logprob", "guarded"):
        raise ValueError("objective must be 'accuracy', 'logprob' or 'guarded'")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    base = base_config or engine.config
    grid = default_grid(base) if grid is None else grid
    warn_inert(grid, base)
    configs, invalid = expand_grid(grid, base) if grid else ([], [])
    configs = [c for c in configs if c != base]
    if trials is not None and trials - 1 < len(configs):
        configs = random.Random(search_seed).sample(configs, max(trials - 1, 0))
    configs = [base] + configs

    started = time.time()
    items = work_items(tasks, lengths, depths, n, split)
    if shard is not None:
        items = shard_items(items, shard)
    samples: list[EvalSample] = []
    for it in items:
        s = make_sample(engine.tokenizer, it, haystack, max_new_tokens)
        if isinstance(s, Exception):
            raise s
        samples.append(s)
    seeds = sorted({s.seed for s in samples})

    fp = lambda m, c=None: method_fingerprint(engine, m, config=c, max_new_tokens=max_new_tokens, haystack=haystack)  # noqa: E731
    van_hash = config_hash(fp("vanilla"))
    primary = methods[0]
    hashes = [config_hash(fp(primary, c)) for c in configs]
    o_hashes = [config_hash(fp("oracle", c)) for c in configs] if (oracle and primary != "oracle") else []
    rows_path = out / TUNE_ROWS
    existing: dict[tuple, dict] = {}
    if rows_path.is_file():
        for line in rows_path.read_text().splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not r.get("error"):
                existing[row_key(r)] = r

    todo = sum(1 for s in samples for m, h in [("vanilla", van_hash)] + [(primary, h) for h in hashes] + [("oracle", h) for h in o_hashes]
               if (s.task, s.length, norm_depth(s.depth), s.seed, m, h) not in existing)
    bar = None
    if progress:
        bar = tqdm(total=todo, desc="tune", unit="answer", dynamic_ncols=True, file=sys.stderr)
    cache = Pass1Cache(engine)

    def base_row(s: EvalSample, m: str, h: str) -> dict:
        return {"task": s.task, "length": s.length, "depth": norm_depth(s.depth), "seed": s.seed, "index": s.seed - split_seed(split, 0),
                "split": split, "metric": s.metric, "gold": list(s.answers), "method": m, "config_hash": h}

    end_torn_line(rows_path)  # a run killed mid-write: the next row starts on a line of its own
    with open(rows_path, "a", encoding="utf-8") as fh:

        def run_one(s: EvalSample, m: str, h: str, fn) -> dict:
            key = (s.task, s.length, norm_depth(s.depth), s.seed, m, h)
            if key in existing:
                return existing[key]
            row = base_row(s, m, h)
            try:
                row.update(fn())
            except Exception as exc:  # noqa: BLE001
                row.update(answer=None, correct=False, score=0.0, logprob_gold=None, error=f"{type(exc).__name__}: {exc}")
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
            fh.flush()
            existing[key] = row
            if bar is not None:
                bar.update(1)
            return row

        van = {}
        for s in samples:
            r = run_one(s, "vanilla", van_hash, lambda s=s: answer_sample(engine, s, "vanilla", logprob=logprob))
            if not r.get("error"):
                van[(r["task"], r["length"], r["depth"], r["seed"])] = r
        results = []
        kept: collections.Counter = collections.Counter()  # the primary method's answers by kept_reason (None: moved)
        for t_i, (cfg, h) in enumerate(zip(configs, hashes)):
            rows = [run_one(s, primary, h, lambda s=s, cfg=cfg: _answer_cached(engine, cache, s, cfg, logprob, primary)) for s in samples]
            kept.update(r.get("kept_reason") for r in rows if not r.get("error"))
            summ = trial_summary(rows, van)
            if o_hashes:
                o_rows = [run_one(s, "oracle", o_hashes[t_i], lambda s=s, cfg=cfg: _answer_cached(engine, cache, s, cfg, logprob, "oracle")) for s in samples]
                o = trial_summary(o_rows, van)
                summ["oracle"] = {k: o[k] for k in ("n", "acc", "mean_logprob", "logprob_vs_vanilla", "delta_vs_vanilla", "b", "c", "mcnemar_p", "groups")}
                summ["oracle"]["config_hash"] = o_hashes[t_i]
            summ.update(trial=t_i, config_hash=h, changes=_changes(cfg, base), config=_cfg_fields(cfg))
            results.append(summ)
            if bar is not None:
                bar.set_postfix_str(f"trial {t_i}: acc={fmt(summ['acc'], pct=True)}% best={fmt(max(x['acc'] or 0 for x in results), pct=True)}%", refresh=False)
    if bar is not None:
        bar.close()

    van_rows = list(van.values())
    van_acc = mean([float(r["correct"]) for r in van_rows])
    van_lp = mean([r["logprob_gold"] for r in van_rows if r.get("logprob_gold") is not None])
    ranked = sorted(results, key=lambda t: objective_key(t, objective, guard), reverse=True)
    best = ranked[0]
    best_cfg = configs[best["trial"]]
    wall = round(time.time() - started, 1)
    cmd = command or " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
    provenance = (
        f"tuned on the dev split ({len(samples)} samples: tasks {','.join(tasks)}; lengths {','.join(map(str, lengths))}; "
        f"depths {depths}; seeds {seeds[0]}..{seeds[-1]}) for {engine.name}, objective {objective}, "
        f"{len(configs)} trials; {_dt.date.today().isoformat()}; command: {cmd}"
    )
    best_cfg = best_cfg.with_(provenance=provenance)
    acc_values = [t["acc"] for t in results if t["acc"] is not None]
    summary = {
        "model": engine.name, "dtype": engine_dtype(engine), "heads": engine_heads(engine),
        "split": split, "tasks": list(tasks), "lengths": list(lengths), "depths": depths, "n": n,
        "samples": len(samples), "seeds": [seeds[0], seeds[-1]], "objective": objective, "guard": guard,
        "grid": grid, "trials": len(configs), "oracle": bool(o_hashes), "methods": methods, "shard": list(shard) if shard else None, "invalid_grid_points": len(invalid), "search_seed": search_seed,
        "vanilla": {"acc": van_acc, "mean_logprob": van_lp, "config_hash": van_hash},
        "best": best, "best_config": dataclasses.asdict(best_cfg), "base_config": _cfg_fields(base),
        "sensitivity": {"acc_min": min(acc_values) if acc_values else None, "acc_max": max(acc_values) if acc_values else None},
        "command": cmd, "wall_s": wall, "pass1_runs": cache.misses,
        "kept_vanilla": {"answers": sum(kept.values()), "by_reason": {str(k): v for k, v in sorted(kept.items(), key=str) if k is not None}},
        "finished": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    (out / TRIALS_FILE).write_text("".join(json.dumps(t, default=str) + "\n" for t in results))
    (out / BEST_FILE).write_text(json.dumps({"config": dataclasses.asdict(best_cfg), "summary": {k: summary[k] for k in ("model", "split", "n", "samples", "tasks", "lengths", "depths", "objective", "command")}}, indent=1, default=str) + "\n")
    (out / SUMMARY_FILE).write_text(summary_md(summary, ranked, base))
    return summary
