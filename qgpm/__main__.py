"""``python -m qgpm``: the ``qgpm`` command line (see :mod:`qgpm.cli`)."""

from .cli import main

raise SystemExit(main())
