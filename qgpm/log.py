"""The ``qgpm`` logger, and warnings said once per process."""

from __future__ import annotations

import logging

logger = logging.getLogger("qgpm")

_WARNED: set[str] = set()


def warn_once(message: str) -> None:
    """Log ``message`` as a warning on the ``qgpm`` logger, the first time it is asked in this process."""
    if message not in _WARNED:
        _WARNED.add(message)
        logger.warning(message)
