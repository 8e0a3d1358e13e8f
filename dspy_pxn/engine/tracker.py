"""What the optimizer needs from a tracker, and nothing of how one works.

DSPy keeps tooling outside its optimizers, and so does dspy-pxn: ``BatchedGEPA`` is handed a ``Tracker``
(``dspy_pxn.tracking.MlflowTracker`` is one) and never imports the tracking package. Nothing a tracker does may stop
the search: a tracker that cannot start leaves the run untracked, and a tracked run whose call raises is a warning
(``start_tracked_run``, ``quietly``). Only contradictory tracking arguments fail, before the search
(``TrackingArgumentError``).

Two ways to get a tracker without naming one: a ``with dspy_pxn.tracking.sweep(...)`` block makes its tracker the
*ambient* one for the runs compiled inside it; and BatchedGEPA's ``use_mlflow=True`` (dspy.GEPA's argument; for one
release also the former MLflow shorthands, ``tracking_uri=...``) is turned into a tracker by the factory the
tracking package registers on import (``dspy_pxn/__init__.py`` imports it, so the factory is always there).
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any, Literal, Protocol, runtime_checkable

from dspy_pxn.engine.description import RunDescription
from dspy_pxn.engine.records import StepRecord
from dspy_pxn.ledger.ledger import RunLedger

logger = logging.getLogger(__name__)


class TrackingArgumentError(ValueError):
    """Tracking arguments that contradict each other or their surroundings (e.g. a run's tracking_uri
    inside a sweep that logs elsewhere): the one tracking failure that stops a compile, before its search."""


@runtime_checkable
class TrackedRun(Protocol):
    """One compile, as a tracker follows it."""

    run_id: str | None
    log_dir: str | None  # where the tracker keeps the run's files (the step log goes there too)
    gepa_callbacks: Sequence[Any]  # notified by gepa alongside the optimizer's own

    def on_step(self, record: StepRecord) -> None: ...

    def finish(self, program: Any, results: Any) -> None: ...  # results: BatchedGEPAResult

    def fail(self, error: BaseException) -> None: ...


@runtime_checkable
class Tracker(Protocol):
    """Starts a ``TrackedRun`` per compile. ``log_dir`` is the run's own, if it has one; ``usage`` is the run's
    ledger (``usage.tally()``: its LM calls, tokens and dollars so far)."""

    def start(self, description: RunDescription, *, log_dir: str | None, usage: RunLedger) -> TrackedRun: ...


# The tracker of the enclosing ``with ...`` block (a sweep), if any.
_AMBIENT: contextvars.ContextVar[Tracker | None] = contextvars.ContextVar("dspy_pxn_tracker", default=None)
_DEFAULT_TRACKERS: list[Callable[[bool], Tracker | None]] = []
_AROUND_COMPILE: list[Callable[[], AbstractContextManager[Any]]] = []


def register_around_compile(factory: Callable[[], AbstractContextManager[Any]]) -> None:
    """Let tooling set up what every compile runs inside (e.g. MLflow autolog's "no traces while compiling")."""
    _AROUND_COMPILE.append(factory)


@contextmanager
def around_compile() -> Iterator[None]:
    """Every registered context, entered for the whole compile; one that fails to enter is a warning."""
    with ExitStack() as stack:
        for factory in _AROUND_COMPILE:
            try:
                stack.enter_context(factory())
            except Exception as error:  # noqa: BLE001 - tooling never stops a search
                logger.warning("Could not set up %r for the compile (%s: %s).", factory, type(error).__name__, error)
        yield


@contextmanager
def tracking_by_default(tracker: Tracker) -> Iterator[Tracker]:
    """Runs compiled inside the block are tracked by ``tracker`` unless they say ``tracker=False``."""
    token = _AMBIENT.set(tracker)
    try:
        yield tracker
    finally:
        _AMBIENT.reset(token)


def register_default_tracker(factory: Callable[[bool], Tracker | None]) -> None:
    """Let ``factory`` say the tracker a compile gets without a ``tracker=`` (its argument: ``use_mlflow``; the
    last one registered wins)."""
    _DEFAULT_TRACKERS.append(factory)


def default_tracker(use_mlflow: bool) -> Tracker | None:
    """MLflow's tracker with its defaults for ``use_mlflow=True`` (checked now, before any LM call); otherwise what
    the tooling asks of every compile, or None."""
    if not _DEFAULT_TRACKERS:
        if use_mlflow:
            raise ImportError("MLflow tracking needs dspy_pxn.tracking: import dspy_pxn (not only its submodules).")
        return None
    return _DEFAULT_TRACKERS[-1](use_mlflow)


def chosen_tracker(given: Any, use_mlflow: bool) -> Tracker | Literal[False] | None:
    """The run's tracker: the one given, MLflow's with its defaults for ``use_mlflow=True``, False for none (not
    even an enclosing sweep's), or None (the enclosing sweep's, if any). Checked when BatchedGEPA is built."""
    if given is not None and given is not False and not isinstance(given, Tracker):
        raise TypeError(f"tracker={given!r} has no start(description, log_dir=..., usage=...): pass a "
                        "dspy_pxn.engine.tracker.Tracker such as dspy_pxn.tracking.MlflowTracker(), or tracker=False.")
    if use_mlflow and given is not None:
        raise ValueError(f"use_mlflow=True and tracker={given!r} say two things: pass use_mlflow=True for MLflow with "
                         "its defaults, or tracker=dspy_pxn.tracking.MlflowTracker(...) to choose where.")
    return default_tracker(True) if use_mlflow else given


def effective_tracker(chosen: Tracker | Literal[False] | None) -> Tracker | None:
    """The tracker that follows this compile: the one chosen, else the enclosing sweep's, else what the tooling
    asks of every compile (MLflow's when ``mlflow.dspy.autolog(log_compiles=True)`` is on); none for ``False``."""
    if chosen is False:
        return None
    return chosen or _AMBIENT.get() or default_tracker(False)


def start_tracked_run(tracker: Tracker | None, description: RunDescription, *, log_dir: str | None,
                      ledger: RunLedger) -> TrackedRun | None:
    """The tracker's run for this compile; None (and one warning) when the tracker fails to start one."""
    if tracker is None:
        return None
    try:
        run = tracker.start(description, log_dir=log_dir, usage=ledger)
    except TrackingArgumentError:
        raise
    except Exception as error:  # noqa: BLE001 - tracking never stops a search
        logger.warning("Tracking could not start (%s: %s); the search runs untracked.", type(error).__name__, error)
        return None
    if not isinstance(run, TrackedRun) or not isinstance(run.log_dir, (str, type(None))):
        logger.warning("Tracker %r returned %r, not a TrackedRun; the search runs untracked.", tracker, run)
        return None
    return run


def quietly(what: str, call: Callable[[], None]) -> None:
    """Call a tracked run's ``what`` (finish, fail); its failure is a warning, never the compile's."""
    try:
        call()
    except Exception as error:  # noqa: BLE001 - tracking never stops a search, nor its result
        logger.warning("Tracking failed to %s the run (%s: %s); the result is unaffected.", what,
                       type(error).__name__, error)
