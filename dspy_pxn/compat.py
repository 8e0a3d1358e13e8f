"""Which versions of DSPy, gepa and MLflow dspy-pxn was tested with, and what an install without an extra does.

dspy-pxn extends DSPy's and gepa's internals and MLflow's model and prompt APIs, so its dependency
ranges (pyproject.toml) are the ranges CI runs: the full suite on the newest versions, a smoke job on
the oldest (``.ci/run``). A newer version than the tested maximum, within the declared range, may
still work: it gets one warning naming the tested range, as MLflow warns about its autologging
integrations, not a refusal. An optional dependency a feature needs is refused before any work,
naming the extra that installs it (``dspy_pxn.tracking.config.require_mlflow``, the CLI).
"""

from __future__ import annotations

import importlib.metadata
import logging
import re

logger = logging.getLogger(__name__)

# (oldest, newest) version CI ran; docs/guides/compatibility.md prints this table (tests/test_compat.py checks).
TESTED = {
    "dspy": ("3.4.0", "3.4.1"),
    "gepa": ("0.1.4", "0.1.4"),
    "mlflow": ("3.13.0", "3.17.2"),
}
_warned: set[str] = set()


def release(version: str) -> tuple[int, ...]:
    """A version's release numbers, '3.4.1rc1' -> (3, 4, 1): enough to compare with a tested range."""
    match = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(part) for part in match.group().split(".")) if match else ()


def warn_if_untested(package: str) -> None:
    """One warning when ``package`` is installed at a version outside the range CI ran (an older one can come
    from a pin of the user's that pip let stand: the optional extras' minimums bind only when installed)."""
    if package in _warned:
        return
    _warned.add(package)
    try:
        installed = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return
    oldest, newest = TESTED[package]
    if not release(oldest) <= release(installed) <= release(newest):
        logger.warning("dspy-pxn was tested with %s %s to %s; %s %s is installed and may not work with it "
                       "(pip install '%s>=%s,<=%s' if it does not).", package, oldest, newest, package, installed,
                       package, oldest, newest)
