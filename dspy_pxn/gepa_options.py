"""What a dspy.GEPA user passes in ``gepa_kwargs``, read as BatchedGEPA reads it.

dspy.GEPA hands ``gepa_kwargs`` to ``gepa.optimize``. Most go on to gepa as they are; these do not,
because BatchedGEPA plays their part itself, and each is read as its own argument, so code written
for dspy.GEPA keeps working: gepa's ``callbacks`` and ``stop_callbacks`` join BatchedGEPA's own,
its ``sampling_strategy`` and ``selection_strategy`` are P, N and the selection, and its
``max_reflection_cost`` is the reflection dollar cap. The rest BatchedGEPA owns, and dspy.GEPA
refuses them too: its own arguments, and a ``reflection_strategy`` (gepa refuses one beside DSPy's
adapter, which owns proposals).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gepa.strategies.proposal_sampling import IndependentSampling, PxNSampling, SameParentSampling, SingleMutationSampling

from dspy_pxn import checks
from dspy_pxn.width import AUTO

OWNED = ("reflection_strategy", "batch_sampler", "max_metric_calls", "reflection_minibatch_size",
         "candidate_selection_strategy")
# gepa's own sampling strategies, as (p, n).
GEPA_SAMPLINGS: dict[type, Callable[[Any], tuple[int, int]]] = {
    SingleMutationSampling: lambda sampling: (1, 1),
    SameParentSampling: lambda sampling: (1, sampling.n),
    IndependentSampling: lambda sampling: (sampling.n, 1),
    PxNSampling: lambda sampling: (sampling.p, sampling.n),
}


def unowned(gepa_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """A copy of ``gepa_kwargs``, refused when it sets what BatchedGEPA sets itself."""
    owned = sorted(set(gepa_kwargs or {}) & set(OWNED))
    if owned:
        raise ValueError(
            f"gepa_kwargs may not set {owned}: BatchedGEPA sets them itself. Use BatchedGEPA's own arguments "
            "(p, n, selection, max_metric_calls, reflection_minibatch_size, candidate_selection_strategy)."
        )
    return dict(gepa_kwargs or {})


def pxn_and_selection(gepa_kwargs: dict[str, Any], p: Any, n: int, selection: Any) -> tuple[Any, int, Any]:
    """p, n and selection, with gepa's ``sampling_strategy`` and ``selection_strategy`` taken out of
    ``gepa_kwargs`` as them; both given for one thing is a contradiction."""
    sampling = gepa_kwargs.pop("sampling_strategy", None)
    if sampling is not None:
        if type(sampling) not in GEPA_SAMPLINGS:
            raise ValueError(f"gepa_kwargs['sampling_strategy']={type(sampling).__name__}: BatchedGEPA samples P parents "
                             "x N mutations itself, exactly on budget; pass p=... and n=... (gepa's PxNSampling, "
                             "SameParentSampling, IndependentSampling and SingleMutationSampling are read as them).")
        if p != AUTO or n != 1:
            raise checks.ArgumentError("Pass p and n, or gepa_kwargs={'sampling_strategy': ...}, not both: they say "
                                       "the same thing.")
        p, n = GEPA_SAMPLINGS[type(sampling)](sampling)
    strategy = gepa_kwargs.pop("selection_strategy", None)
    if strategy is not None:
        if selection is not None:
            raise checks.ArgumentError("Pass selection=... or gepa_kwargs={'selection_strategy': ...}, not both: they "
                                       "say the same thing.")
        selection = strategy
    return p, n, selection


def callbacks_and_stoppers(gepa_kwargs: dict[str, Any], callbacks: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """The run's gepa callbacks, ``gepa_kwargs``' joining the ones given, and the stoppers it passed."""
    stoppers = gepa_kwargs.pop("stop_callbacks", None)
    stoppers = list(stoppers) if isinstance(stoppers, Sequence) else [stoppers] if stoppers is not None else []
    return [*callbacks, *(gepa_kwargs.pop("callbacks", None) or [])], stoppers


def reflection_cap(gepa_kwargs: dict[str, Any], max_reflection_cost_usd: float | None) -> float | None:
    """gepa's ``max_reflection_cost`` (which dspy.GEPA refuses) is ``max_reflection_cost_usd``."""
    if "max_reflection_cost" not in gepa_kwargs:
        return max_reflection_cost_usd
    if max_reflection_cost_usd is not None:
        raise checks.ArgumentError("Pass max_reflection_cost_usd=... or gepa_kwargs={'max_reflection_cost': ...}, "
                                   "not both: they are the same cap.")
    return gepa_kwargs.pop("max_reflection_cost")
