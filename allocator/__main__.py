"""``python -m allocator``: the ``allocator`` command (:mod:`allocator.cli`)."""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from allocator.cli import main

    sys.exit(main())
