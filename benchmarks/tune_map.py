"""One table over several `qgpm tune` folders: each config against vanilla on the same samples.

    python benchmarks/tune_map.py runs/coarse/*.s0 runs/coarse/*.s1 --out docs/tuning/x.md

Folders that differ only by a ``.sN`` suffix are shards of one config (``qgpm tune --shard``)
and are pooled. For every (config, method) row the table gives, per task, the accuracy and
its paired difference with vanilla, the discordant counts b/c (b = right only with the
config), the exact McNemar p over all tasks, and the mean paired difference of the gold
log-prob (nats). Accuracy by depth is listed per task below the main table.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

from qgpm.eval.significance import mcnemar_exact

KEY = ("task", "length", "depth", "seed")
SHOWN = ("anchor_ratio", "s_low", "k_sharp", "t_sharp", "k_broad", "t_broad", "eps", "local_window", "unmodulated_layers", "split_layer", "tau", "remap", "z_window", "lead_tokens", "solo_margin", "placement", "local_layers", "term_ratio", "moved_order")
ZERO_MEANS = ("t_sharp", "t_broad", "split_layer")  # T = 0 is a hard cut and split_layer 0 the sharp map everywhere, not "off": always shown


def read_rows(folder: Path) -> list[dict]:
    path = folder / "tune_rows.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not r.get("error"):
            rows.append(r)
    return rows


def folder_configs(folder: Path) -> dict[str, dict]:
    """``config_hash -> config`` of every trial in a tune folder (``trials.jsonl``; the Oracle's
    hashes too), or ``{"": config}`` from ``best_config.json`` when only that is there."""
    out: dict[str, dict] = {}
    trials = folder / "trials.jsonl"
    if trials.is_file():
        for line in trials.read_text().splitlines():
            t = json.loads(line)
            out[t["config_hash"]] = t["config"]
            if isinstance(t.get("oracle"), dict) and t["oracle"].get("config_hash"):
                out[t["oracle"]["config_hash"]] = t["config"]
    best = folder / "best_config.json"
    if not out and best.is_file():
        out[""] = json.loads(best.read_text())["config"]
    return out


def _fmt_p(p: float) -> str:
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def build(folders: list[Path]) -> str:
    groups: dict[str, list[Path]] = defaultdict(list)
    for f in folders:
        groups[re.sub(r"\.s\d+$", "", f.name)].append(f)
    vanilla: dict[tuple, dict] = {}
    configs: dict[str, dict] = {}
    answers: dict[tuple[str, str, str], dict[tuple, dict]] = defaultdict(dict)
    for name, fs in groups.items():
        for f in fs:
            configs.update(folder_configs(f))
            for r in read_rows(f):
                k = tuple(r[x] for x in KEY)
                if r["method"] == "vanilla":
                    vanilla[k] = r
                else:
                    answers[(name, r["method"], r["config_hash"])][k] = r
    covered = {k for rows in answers.values() for k in rows}
    if covered:  # vanilla on the samples the configs answered (folders may hold more vanilla rows)
        vanilla = {k: v for k, v in vanilla.items() if k in covered}
    tasks = sorted({k[0] for k in vanilla})
    depths = sorted({k[2] for k in vanilla})
    out = ["| config | method | " + " | ".join(f"{t} acc (Δ)" for t in tasks) + " | all Δ | b/c | McNemar p | "
           + " | ".join(f"{t} Δlogp" for t in tasks) + " | n |",
           "|" + "---|" * (2 + 2 * len(tasks) + 4)]
    van_line = ["vanilla (same samples)", "–"]
    for t in tasks:
        vs = [v for k, v in vanilla.items() if k[0] == t]
        van_line.append(f"{100 * sum(v['correct'] for v in vs) / max(len(vs), 1):.0f}")
    out.append("| " + " | ".join(van_line + ["–", "–", "–"] + ["–"] * len(tasks) + [str(len(vanilla))]) + " |")
    depth_tables: dict[str, list[str]] = {t: [] for t in tasks}
    for (name, method, h), rows in sorted(answers.items(), key=lambda kv: (kv[0][0], kv[0][1], str(configs.get(kv[0][2], {}).get("k_sharp")), kv[0][2])):
        cfg = configs.get(h) or configs.get("", {})
        label = name + (" (" + ", ".join(f"{k}={cfg[k]}" for k in SHOWN if k in cfg and cfg[k] is not None and (k in ZERO_MEANS or cfg[k] not in (0, 0.0, "stride"))) + ")" if cfg else "")
        cells = [label, method]
        b = c = 0
        n_all = 0
        d_all = 0.0
        lp_cells = []
        for t in tasks:
            pairs = [(r, vanilla[k]) for k, r in rows.items() if k[0] == t and k in vanilla]
            if not pairs:
                cells.append("–")
                lp_cells.append("–")
                continue
            acc = sum(r["correct"] for r, _ in pairs) / len(pairs)
            vacc = sum(v["correct"] for _, v in pairs) / len(pairs)
            cells.append(f"{100 * acc:.0f} ({100 * (acc - vacc):+.0f})")
            b += sum(1 for r, v in pairs if r["correct"] and not v["correct"])
            c += sum(1 for r, v in pairs if v["correct"] and not r["correct"])
            n_all += len(pairs)
            d_all += sum(float(r["correct"]) - float(v["correct"]) for r, v in pairs)
            lps = [r["logprob_gold"] - v["logprob_gold"] for r, v in pairs if r.get("logprob_gold") is not None and v.get("logprob_gold") is not None]
            lp_cells.append(f"{sum(lps) / len(lps):+.2f}" if lps else "–")
            by_depth = []
            for d in depths:
                dp = [(r, v) for r, v in pairs if r["depth"] == d]
                by_depth.append(f"{sum(r['correct'] for r, _ in dp)}/{sum(v['correct'] for _, v in dp)}/{len(dp)}" if dp else "–")
            depth_tables[t].append(f"| {label} | {method} | " + " | ".join(by_depth) + " |")
        cells += [f"{100 * d_all / max(n_all, 1):+.1f}", f"{b}/{c}", _fmt_p(mcnemar_exact(b, c))] + lp_cells + [str(n_all)]
        out.append("| " + " | ".join(cells) + " |")
    out += ["", "Accuracy by depth (right with the config / right with vanilla / samples):", ""]
    for t in tasks:
        out += [f"**{t}**", "", "| config | method | " + " | ".join(f"depth {d}" for d in depths) + " |", "|" + "---|" * (2 + len(depths))]
        out += depth_tables[t] + [""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+", type=Path, help="qgpm tune output folders (shards .sN are pooled)")
    p.add_argument("--out", type=Path, default=None, help="write the markdown here (default: print)")
    args = p.parse_args(argv)
    md = build([f for f in args.folders if f.is_dir()])
    if args.out:
        args.out.write_text(md + "\n")
    else:
        sys.stdout.write(md + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
