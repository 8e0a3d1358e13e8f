"""What a dspy.GEPA user passes in ``gepa_kwargs``, read as BatchedGEPA reads it.

dspy.GEPA hands ``gepa_kwargs`` to ``gepa.optimize``. Most go on to gepa as they are; these do not, because
BatchedGEPA plays their part itself, and each is read for what it says, so code written for dspy.GEPA keeps
working: ``callbacks`` and ``stop_callbacks`` are the run's (both schedules tell them), ``sampling_strategy`` and
``selection_strategy`` are P, N and the selection, ``max_reflection_cost`` is the reflection dollar cap and
``display_progress_bar`` its progress bar. The rest BatchedGEPA owns, and dspy.GEPA refuses them too: its own
arguments, and a ``reflection_strategy`` (gepa refuses one beside DSPy's adapter, which owns proposals).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gepa.strategies.proposal_sampling import (
    IndependentSampling,
    PxNSampling,
    SameParentSampling,
    SingleMutationSampling,
)

from dspy_pxn import checks
from dspy_pxn.engine.width import AUTO

OWNED = ("reflection_strategy", "batch_sampler", "max_metric_calls", "reflection_minibatch_size",
         "candidate_selection_strategy")
GEPA_SAMPLINGS: dict[type, Callable[[Any], tuple[int, int]]] = {  # gepa's own sampling strategies, as (p, n)
    SingleMutationSampling: lambda sampling: (1, 1),
    SameParentSampling: lambda sampling: (1, sampling.n),
    IndependentSampling: lambda sampling: (sampling.n, 1),
    PxNSampling: lambda sampling: (sampling.p, sampling.n),
}


@dataclass(frozen=True)
class GepaOptions:
    """``gepa_kwargs`` as read: what goes on to gepa as it is, and what BatchedGEPA plays itself."""

    rest: dict[str, Any]  # for gepa.optimize, as given
    p: Any
    n: int
    selection: Any
    callbacks: tuple[Any, ...]
    stop_callbacks: tuple[Any, ...]
    max_reflection_cost_usd: float | None
    display_progress_bar: bool


def read(gepa_kwargs: dict[str, Any] | None, p: Any, n: int, selection: Any) -> GepaOptions:
    """``gepa_kwargs`` read as dspy.GEPA users mean it; what BatchedGEPA sets itself is refused, and gepa's
    sampling or selection strategy beside BatchedGEPA's own ``p``/``n`` or ``selection`` is a contradiction."""
    rest = dict(gepa_kwargs or {})
    if owned := sorted(set(rest) & set(OWNED)):
        raise ValueError(f"gepa_kwargs may not set {owned}: BatchedGEPA sets them itself. Use BatchedGEPA's own "
                         "arguments (p, n, selection, max_metric_calls, reflection_minibatch_size, "
                         "candidate_selection_strategy).")
    if (sampling := rest.pop("sampling_strategy", None)) is not None:
        if type(sampling) not in GEPA_SAMPLINGS:
            raise ValueError(f"gepa_kwargs['sampling_strategy']={type(sampling).__name__}: BatchedGEPA samples P parents "
                             "x N mutations itself, exactly on budget; pass p=... and n=... (gepa's PxNSampling, "
                             "SameParentSampling, IndependentSampling and SingleMutationSampling are read as them).")
        if p != AUTO or n != 1:
            raise checks.ArgumentError("Pass p and n, or gepa_kwargs={'sampling_strategy': ...}, not both: they say "
                                       "the same thing.")
        p, n = GEPA_SAMPLINGS[type(sampling)](sampling)
    if (strategy := rest.pop("selection_strategy", None)) is not None:
        if selection is not None:
            raise checks.ArgumentError("Pass selection=... or gepa_kwargs={'selection_strategy': ...}, not both: they "
                                       "say the same thing.")
        selection = strategy
    stoppers = rest.pop("stop_callbacks", None)
    stoppers = tuple(stoppers) if isinstance(stoppers, Sequence) else (stoppers,) if stoppers is not None else ()
    return GepaOptions(
        rest=rest, p=p, n=n, selection=selection, callbacks=tuple(rest.pop("callbacks", None) or ()),
        stop_callbacks=stoppers, max_reflection_cost_usd=rest.pop("max_reflection_cost", None),
        display_progress_bar=bool(rest.pop("display_progress_bar", False)),
    )
