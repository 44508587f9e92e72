"""The row files of an evaluation run: ``rows.jsonl``, the per-process rank files and
``manifest.json``.

A row is one answer: one method on one sample (see :mod:`qgpm.eval.runner` for its
fields). Its identity is :func:`row_key`, ``(task, length, depth, seed, method,
config_hash)``. Each process appends its rows to ``rows.rank{r}.jsonl``
(:func:`rank_file`, :func:`append_row`); :func:`merge_rows` folds every rank file into
``rows.jsonl`` (one row per key, in a fixed order) and :func:`read_rows` reads them
all back. ``manifest.json`` maps every ``config_hash`` to the settings it stands for
and lists the runs (:func:`update_manifest`, :func:`read_manifest`).

This module is what the runner (which writes rows) and the report (which reads them)
share, so neither imports the other.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any, Iterable

from filelock import FileLock

from qgpm.defaults import METHODS
from qgpm.samples.tasks import TASKS

__all__ = [
    "folder_lock",
    "ROWS_FILE",
    "MANIFEST_FILE",
    "KEY_FIELDS",
    "METHOD_ORDER",
    "norm_depth",
    "row_key",
    "end_torn_line",
    "rank_file",
    "rank_files",
    "append_row",
    "read_rows",
    "dedupe_rows",
    "merge_rows",
    "read_manifest",
    "update_manifest",
]

ROWS_FILE = "rows.jsonl"
MANIFEST_FILE = "manifest.json"
LOCK_FILE = ".qgpm-run.lock"  # held while rows.jsonl or manifest.json is rewritten
KEY_FIELDS = ("task", "length", "depth", "seed", "method", "config_hash")
METHOD_ORDER = METHODS
"""The order of methods in merged files and in reports."""


def norm_depth(d: Any) -> float | None:
    """A depth as rows store and compare it: ``None`` (random placement) or rounded to 6 decimals."""
    return None if d is None else round(float(d), 6)


def row_key(row: dict) -> tuple:
    """The identity of a row: (task, length, depth, seed, method, config_hash)."""
    return (row["task"], int(row["length"]), norm_depth(row.get("depth")), int(row["seed"]), row["method"], row["config_hash"])


def rank_file(out_dir: str | os.PathLike[str], rank: int) -> Path:
    """Where process ``rank`` appends its rows: ``rows.rank{rank}.jsonl``."""
    return Path(out_dir) / f"rows.rank{rank}.jsonl"


def rank_files(out_dir: str | os.PathLike[str]) -> list[Path]:
    """Every rank file in ``out_dir``, sorted by name."""
    return sorted(Path(out_dir).glob("rows.rank*.jsonl"))


def end_torn_line(path: Path) -> None:
    """End ``path`` with a newline if a killed run left a torn last line, so that rows appended
    next start on lines of their own (the torn line is skipped when read)."""
    if path.is_file() and path.stat().st_size:
        with open(path, "rb") as fh:
            fh.seek(-1, os.SEEK_END)
            torn = fh.read(1) != b"\n"
        if torn:
            with open(path, "a", encoding="utf-8") as fh:
                fh.write("\n")


def append_row(fh: IO[str], row: dict) -> None:
    """Write ``row`` as one JSON line and flush it (a killed run loses at most that line;
    :func:`end_torn_line` before appending again)."""
    fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    fh.flush()


def read_rows(out_dir: str | os.PathLike[str], *, include_ranks: bool = True) -> list[dict]:
    """Rows of ``rows.jsonl`` and (by default) every ``rows.rank*.jsonl``, in file order.

    A torn last line (a run killed mid-write) is skipped.
    """
    out_dir = Path(out_dir)
    files = [out_dir / ROWS_FILE] if (out_dir / ROWS_FILE).is_file() else []
    if include_ranks:
        files += rank_files(out_dir)
    rows = []
    for f in files:
        with open(f, encoding="utf-8") as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    return rows


def _sort_key(row: dict) -> tuple:
    task = row["task"]
    t_i = TASKS.index(task) if task in TASKS else len(TASKS)
    m = row["method"]
    m_i = METHOD_ORDER.index(m) if m in METHOD_ORDER else len(METHOD_ORDER)
    d = row.get("depth")
    return (int(row["length"]), t_i, task, int(row.get("index", 0)), -1.0 if d is None else float(d), int(row["seed"]), m_i, m, row["config_hash"])


def dedupe_rows(rows: Iterable[dict]) -> list[dict]:
    """One row per key: a successful row beats an error row, later beats earlier."""
    best: dict[tuple, dict] = {}
    for r in rows:
        key = row_key(r)
        old = best.get(key)
        if old is None or not (r.get("error") and not old.get("error")):
            best[key] = r
    return sorted(best.values(), key=_sort_key)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def folder_lock(out_dir: str | os.PathLike[str]) -> FileLock:
    """The lock that jobs sharing ``out_dir`` (``--shard i/N`` on separate jobs) hold while they
    read and rewrite ``rows.jsonl`` or ``manifest.json``: two jobs finishing together would
    otherwise each write what it read, and the later write drops the other's additions."""
    return FileLock(str(Path(out_dir) / LOCK_FILE))


def merge_rows(out_dir: str | os.PathLike[str]) -> list[dict]:
    """Merge ``rows.jsonl`` and the rank files into ``rows.jsonl`` (atomic, under
    :func:`folder_lock`); returns the rows."""
    out_dir = Path(out_dir)
    with folder_lock(out_dir):
        rows = dedupe_rows(read_rows(out_dir))
        _atomic_write(out_dir / ROWS_FILE, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return rows


def read_manifest(out_dir: str | os.PathLike[str]) -> dict:
    """``manifest.json`` of ``out_dir``; ``{}`` when there is none. One that is not a JSON object
    raises ``ValueError`` naming it: the next run would otherwise write over the runs it lists."""
    path = Path(out_dir) / MANIFEST_FILE
    if not path.is_file():
        return {}
    try:
        man = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); restore it (e.g. from version control) or move it away "
                         "to start a new manifest") from None
    if not isinstance(man, dict):
        raise ValueError(f"{path} holds a JSON {type(man).__name__}, not the manifest's object; restore it or move it away")
    return man


def update_manifest(out_dir: str | os.PathLike[str], entry: dict | None, fingerprints: dict[str, dict]) -> None:
    """Add the ``{config_hash: fingerprint}`` map and a run ``entry`` (also as ``latest``; ``None``:
    the fingerprints only, written before a run answers, so rows of a run that is stopped still
    have their settings on record) to ``manifest.json`` (atomic, under :func:`folder_lock`)."""
    with folder_lock(out_dir):
        man = read_manifest(out_dir)
        man.setdefault("configs", {}).update(fingerprints)
        if entry is not None:
            man.setdefault("runs", []).append(entry)
            man["latest"] = entry
        _atomic_write(Path(out_dir) / MANIFEST_FILE, json.dumps(man, indent=1, default=str) + "\n")
