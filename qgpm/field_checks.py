"""Type and range checks of QGPM's setting fields, by their annotations.

:func:`check_types` checks every ``float``, ``float | None``, ``int``, ``int | None`` and
``bool`` field of a settings dataclass (a group of :mod:`qgpm.settings` or
:class:`qgpm.QGPMConfig`); fields with other annotations (choices, ``min_top_z``) are checked by
their group's value rules, some of them with :func:`z_margin`. :func:`closest_name` is the one
rule by which every "did you mean" of the package picks a name.
"""

from __future__ import annotations

import difflib
import functools
import math
import numbers
from dataclasses import fields
from typing import Any, Iterable

__all__ = ["check_types", "z_margin", "closest_name"]


def closest_name(name: str, known: Iterable[str]) -> str | None:
    """The name of ``known`` a misspelt ``name`` most likely meant (:func:`difflib.get_close_matches`),
    or ``None``; never ``name`` itself."""
    close = difflib.get_close_matches(name, [k for k in known if k != name], n=1)
    return close[0] if close else None


def _number(owner: str, name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner}.{name} must be a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{owner}.{name} must be a finite number, got {value}")


def _integer(owner: str, name: str, value: Any, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        kind = "an int or None" if optional else "an int"
        raise TypeError(f"{owner}.{name} must be {kind}, got {type(value).__name__} {value!r}")


def _optional_number(owner: str, name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
        raise TypeError(f"{owner}.{name} must be a number or None, got {type(value).__name__} {value!r}")


def _flag(owner: str, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{owner}.{name} must be a bool, got {type(value).__name__} {value!r}")


_TYPE_CHECKS = {
    "float": _number,
    "float | None": _optional_number,
    "int": _integer,
    "int | None": lambda owner, name, value: _integer(owner, name, value, optional=True),
    "bool": _flag,
}
"""The check of a field by its annotation; fields with other annotations (choices,
``min_top_z``) are checked by their group's value rules."""


def check_types(obj: Any) -> None:
    """Check each ``float``, ``float | None``, ``int``, ``int | None`` and ``bool`` field of the
    dataclass ``obj`` (a group or a :class:`qgpm.QGPMConfig`) against its annotation;
    ``TypeError`` (or ``ValueError`` for a non-finite number) names the field as
    ``<class>.<field>``."""
    owner = type(obj).__name__
    for name, check in _typed_fields(type(obj)):
        check(owner, name, getattr(obj, name))


@functools.cache
def _typed_fields(cls: type) -> tuple[tuple[str, Any], ...]:
    """``(field, check)`` for each field of the dataclass ``cls`` that :data:`_TYPE_CHECKS`
    covers (annotations as written: both modules postpone their evaluation)."""
    return tuple((f.name, _TYPE_CHECKS[f.type]) for f in fields(cls) if f.type in _TYPE_CHECKS)


def z_margin(name: str, value: float | None) -> None:
    """A field that is a positive, finite z difference or ``None`` (off)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive, finite z difference or None (off), got {value}")
