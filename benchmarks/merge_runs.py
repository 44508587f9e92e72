"""Merge finished eval run folders into a committed results folder, then regenerate its report.

    python benchmarks/merge_runs.py --into benchmarks/results/eval_smollm2_test runs/a runs/b \
        --note "scripts/test_grid_nolima12.sh, shards I = 0, 1"

Rows are added and deduplicated by their key (task, length, depth, seed, method, config
hash; a row already there is kept, and said so, unless the new one replaces an error row). Each run
folder's manifest entries and fingerprints go into the target manifest, the command of each
entry suffixed with ``(note)`` so the committed record says how the run was started; an entry
merged before (the same finish time and command: a resumed run folder merged again) is kept
once. The report, stats and plots are then regenerated (``qgpm report``). The manifest is written at
indent 2, the format of the committed results folders.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from qgpm.eval.rows import ROWS_FILE, dedupe_rows, read_manifest, read_rows, update_manifest


def _run_key(entry: dict) -> tuple | None:
    """What names one eval run in a manifest: its finish time and its command without the
    ``(note)`` a merge appended (an eval command has no `` (`` of its own; a note may hold
    more parentheses); None for an entry without a finish time."""
    if entry.get("finished") is None:
        return None
    return entry["finished"], str(entry.get("command", "")).split(" (", 1)[0]


def _once(entries: list[dict]) -> list[dict]:
    """``entries`` with each run kept once, at its first (earliest merged) entry."""
    seen: set[tuple] = set()
    kept = []
    for entry in entries:
        key = _run_key(entry)
        if key in seen:
            continue
        if key is not None:
            seen.add(key)
        kept.append(entry)
    return kept


def merge(into: Path, runs: list[Path], note: str | None) -> int:
    into.mkdir(parents=True, exist_ok=True)  # a new results folder
    before = read_rows(into, include_ranks=False)
    added: list[dict] = []
    for run in runs:
        if not (run / "manifest.json").is_file():
            raise SystemExit(f"{run}: no manifest.json (not a finished eval run folder)")
        added += read_rows(run)
    added = dedupe_rows(added)  # a run folder holds its rows twice: rows.jsonl and the rank files
    keys = {(r["task"], r["length"], r.get("depth"), r["seed"], r["method"], r["config_hash"]) for r in before}
    ok_before = {(r["task"], r["length"], r.get("depth"), r["seed"], r["method"], r["config_hash"]) for r in before if not r.get("error")}
    # the committed rows come last, so they win (dedupe_rows: later beats earlier), except an error row a new answer replaces
    rows = dedupe_rows(added + before)
    clash = sum((r["task"], r["length"], r.get("depth"), r["seed"], r["method"], r["config_hash"]) in ok_before for r in added)
    if clash:
        print(f"{into}: {clash} merged rows have a committed answer under the same key; the committed ones are kept")
    (into / ROWS_FILE).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    for run in runs:
        man = read_manifest(run)
        for entry in man.get("runs", []):
            entry = dict(entry)
            if note:
                entry["command"] = f"{entry['command']} ({note})"
            update_manifest(into, entry, man.get("configs", {}))
    # the committed results folders keep their manifests at indent 2, so a merge only adds lines
    path = into / "manifest.json"
    man = json.loads(path.read_text())
    runs_before = len(man.get("runs", []))
    man["runs"] = _once(man.get("runs", []))  # a resumed run folder merged again adds its new runs only
    if len(man["runs"]) < runs_before:
        print(f"{path}: {runs_before - len(man['runs'])} run entries merged before are kept once")
    path.write_text(json.dumps(man, indent=2, default=str) + "\n")
    new = sum((r["task"], r["length"], r.get("depth"), r["seed"], r["method"], r["config_hash"]) not in keys for r in added)
    print(f"{into}: {len(before)} rows before, {len(rows)} after ({new} new of {len(added)} merged)")
    return subprocess.call([sys.executable, "-m", "qgpm.eval.cli", "report", "--out", str(into)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--into", required=True, type=Path, help="the committed results folder")
    ap.add_argument("--note", default=None, help="how the runs were started (appended to each command)")
    ap.add_argument("runs", nargs="+", type=Path, help="finished run folders (qgpm eval --out)")
    args = ap.parse_args(argv)
    return merge(args.into, args.runs, args.note)


if __name__ == "__main__":
    raise SystemExit(main())
