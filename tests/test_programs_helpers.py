"""Shared helpers for the programs/ tests: where the local data lives, skipping clearly when it does not.

(A module of helpers, not tests: only ``tests/test_programs_*.py`` files belong to the
programs' test battery, so the helpers live under that name too.)
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# $DSPY_PXN_DATA_DIR, else a data folder beside the checkout (../shared/data, where CI finds it).
CANDIDATES = (REPO.parent / "shared" / "data",)


def shared_data_dir() -> Path | None:
    env = os.environ.get("DSPY_PXN_DATA_DIR")
    if env:
        return Path(env)
    return next((path for path in CANDIDATES if path.is_dir()), None)


def require_data(*relative: str) -> Path:
    """The data directory, or skip the calling test naming what is missing and how to provide it."""
    root = shared_data_dir()
    missing = [rel for rel in relative if root is None or not (root / rel).exists()]
    if root is None or missing:
        where = root if root is not None else " or ".join(map(str, CANDIDATES))
        pytest.skip(
            f"local data not found ({', '.join(missing) or 'directory'} under {where}); "
            "set DSPY_PXN_DATA_DIR to a directory shaped like shared/data to run this test"
        )
    return root
