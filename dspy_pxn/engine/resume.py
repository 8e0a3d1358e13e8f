"""Resuming a run from its ``log_dir`` exactly where the last completed step left it.

gepa already saves its state to ``run_dir`` at the top of every iteration and reloads it on start, but three things
break a P×N resume: the strategies' own state (the minibatch cursor and the RNG that parent selection and minibatch
shuffling share) restarts from zero, so the resumed run samples different parents and minibatches than the run it
continues; gepa evaluates the seed on the whole valset before it looks for saved state, paying |val| LM calls whose
result it then discards; and nothing stops a resume under different settings from mixing two runs into one state.

``checkpoint`` rides on gepa's own adapter-state hook (``get_adapter_state`` / ``set_adapter_state``), so our state
is pickled in the same file, at the same moment, as gepa's: the two never disagree about the last completed step.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, Protocol

from gepa.core.state import GEPAState

logger = logging.getLogger(__name__)

GEPA_STATE_FILE = "gepa_state.bin"
CHECKPOINT_KEY = "dspy_pxn"


def differences(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Each setting that differs; one that a run saved before it was recorded is not compared."""
    return [f"{key}: saved {saved[key]!r}, now {value!r}" for key, value in now.items()
            if key in saved and saved[key] != value]


def load_saved_state(log_dir: str | None) -> GEPAState | None:
    """The state gepa saved in ``log_dir``, or None for a fresh run."""
    if log_dir is None or not os.path.exists(os.path.join(log_dir, GEPA_STATE_FILE)):
        return None
    try:
        return GEPAState.load(log_dir)
    except Exception as error:  # a torn or foreign file must not look like a fresh run
        raise ValueError(f"log_dir={log_dir!r} holds a {GEPA_STATE_FILE} that cannot be loaded "
                         f"({type(error).__name__}: {error}); point log_dir at a new directory, or delete that file "
                         "to start over.") from error


def check_resumable(saved: GEPAState, settings: dict[str, Any], log_dir: str) -> None:
    """Refuse to continue a run under different settings, naming each difference."""
    checkpoint = saved.adapter_state.get(CHECKPOINT_KEY)
    if checkpoint is None:
        raise ValueError(f"log_dir={log_dir!r} holds a gepa state that BatchedGEPA did not write (e.g. from "
                         "dspy.GEPA); resume it with the optimizer that started it, or use a new log_dir.")
    if different := differences(checkpoint["settings"], settings):
        raise ValueError(f"log_dir={log_dir!r} holds a run with different settings, so it cannot be resumed: "
                         f"{'; '.join(different)}. Resume with the same settings (only the budget may change), or "
                         "use a new log_dir.")


def saved_seed_scores(saved: GEPAState, val_size: int) -> list[Any]:
    """The seed's saved valset scores, in valset order: they answer the seed validation gepa re-requests on start."""
    scores = saved.prog_candidate_val_subscores[0]
    return [scores.get(i) for i in range(val_size)]


def saved_dollars(saved: GEPAState | None) -> tuple[float, float]:
    """Dollars a resumed run had spent, in all and on reflection (0 for a fresh run, or one saved before
    dollars were)."""
    checkpoint = saved.adapter_state.get(CHECKPOINT_KEY, {}) if saved is not None else {}
    return float(checkpoint.get("spent_usd", 0.0)), float(checkpoint.get("reflection_spent_usd", 0.0))


Checkpoint = tuple[Callable[[], dict[str, Any]], Callable[[dict[str, Any]], None]]  # (snapshot, restore)


class Positioned(Protocol):
    """What a checkpoint saves of a sampler (``engine.sampling.SequentialMinibatchSampler``) and restores."""

    def position(self) -> dict[str, Any]: ...

    def restore(self, saved: dict[str, Any]) -> None: ...


def checkpoint(settings: dict[str, Any], sampler: Positioned,
               dollars_spent: Callable[[], tuple[float, float]]) -> Checkpoint:
    """What the adapter saves with gepa's state, and how a resumed run restores it: the settings a resume must
    match, the sampler's position and the generator parents, minibatches and crossovers draw from (the
    sampler's: in the step loop, gepa's own), and the dollars spent (``dollars_spent``: in all and on
    reflection, this run's and the runs it resumed)."""

    def snapshot() -> dict[str, Any]:
        return {"settings": dict(settings), **sampler.position(),
                **dict(zip(("spent_usd", "reflection_spent_usd"), dollars_spent(), strict=True))}

    return snapshot, sampler.restore

