"""Configs from text: a JSON file of :class:`~qgpm.config.QGPMConfig` fields and ``field=value``
overrides, as the command line (``--config`` / ``--set`` / ``--grid``) and the harness take them.

:func:`load_config` builds the config, :func:`check_config_args` checks a command line's file and
overrides before the model loads, :func:`coerce_value` reads one ``VALUE``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Sequence

from .config import PRESETS, QGPMConfig

__all__ = ["coerce_value", "check_config_args", "load_config"]


def coerce_value(text: str) -> Any:
    """A command-line ``FIELD=VALUE`` value as Python: ``none``/``null`` -> None,
    ``true``/``false`` -> bool, then int, then float, else the stripped string.
    Used by ``--config`` / ``--set`` / ``--grid`` and the baselines' ``--option``."""
    t = text.strip()
    low = t.lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(t)
        except ValueError:
            pass
    return t


def check_config_args(spec: str | Path | None, overrides: Sequence[str] = ()) -> None:
    """What the CLI checks before the model loads: the file and the override names and values.

    The overrides apply on top of the model's preset, which is known only once the model is
    loaded, so a combination that one base rejects (``moved_order=text`` on the generic
    defaults' ``remap="stride"``) passes here when it is valid on the generic defaults or on
    some preset; the config built on the real base is checked again after loading.
    """
    try:
        load_config(spec, overrides)
    except (TypeError, ValueError) as first:
        if spec is not None:
            raise  # overrides apply on top of the file, which is known now
        for preset in PRESETS.values():
            try:
                load_config(None, overrides, base=preset)
                return
            except (TypeError, ValueError):
                continue
        raise first


def _config_file(spec: str | Path, fields: set[str]) -> QGPMConfig:
    """The config a JSON file holds: an object of ``QGPMConfig`` fields, or one with them under
    ``"config"`` (``best_config.json``). A key that is no field raises, naming it."""
    try:
        d = json.loads(Path(spec).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"config file {str(spec)!r} is not valid JSON ({exc}); it must hold an object of QGPMConfig fields, "
                         'e.g. {"k_sharp": 4, "remap": "reorder"}') from None
    d = d.get("config", d) if isinstance(d, dict) else d
    if not isinstance(d, dict):
        raise ValueError(f"config file {str(spec)!r} must hold a JSON object of QGPMConfig fields (or one under \"config\"), "
                         f"got {type(d).__name__}")
    unknown = sorted(set(d) - fields)
    if unknown:
        raise ValueError(f"config file {str(spec)!r} has keys that are no QGPMConfig field: {', '.join(map(repr, unknown))}; "
                         f"fields: {', '.join(sorted(fields))}")
    d = dict(d)
    said = d.pop("provenance", None)
    if said is not None and not isinstance(said, str):
        raise ValueError(f"config file {str(spec)!r}: provenance must be text (where the settings come from), got {type(said).__name__} {said!r}")
    missing = len(fields - set(d) - {"provenance"})  # a file that lists some fields: the rest are QGPMConfig()'s, not a preset's
    rest = f"; the {missing} fields it does not set: QGPMConfig() defaults" if missing else ""
    return QGPMConfig(**d, provenance=f"config file {Path(spec).name}" + (f" ({said})" if said else "") + rest)


def load_config(spec: str | Path | None, overrides: Sequence[str] = (), *, base: QGPMConfig | None = None) -> QGPMConfig | None:
    """A config from a JSON file (``best_config.json`` or ``QGPMConfig.to_dict()``) and/or
    ``field=value`` overrides; ``None`` when neither is given (engine preset).

    Overrides apply on top of the file, else on top of ``base`` (the CLI passes the
    model's preset; ``None`` = ``QGPMConfig()``, the paper's settings). A file key or an
    override name that is no ``QGPMConfig`` field raises ``ValueError`` naming it.
    """
    if spec is None and not overrides:
        return None
    cfg = base if base is not None else QGPMConfig()
    fields = {f.name for f in dataclasses.fields(QGPMConfig)}
    if spec is not None:
        cfg = _config_file(spec, fields)
    changes = {}
    for ov in overrides:
        name, eq, value = ov.partition("=")
        if not eq:
            raise ValueError(f"bad override {ov!r}: expected field=value")
        name = name.strip()
        if name not in fields or name == "provenance":
            raise ValueError(f"unknown QGPMConfig field {name!r} in {ov!r}; fields: {', '.join(sorted(fields - {'provenance'}))}")
        changes[name] = coerce_value(value)
    return cfg.with_(**changes) if changes else cfg  # with_ appends what was overridden to the provenance
