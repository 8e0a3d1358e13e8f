"""What the benchmarks measured of each setting's held-out score, so ``dspy-pxn plan`` picks only settings that keep it.

The runtime model predicts time, not quality: a setting it ranks fast may search too shallowly to keep
dspy.GEPA's held-out score (16 proposals a step in the step loop lost 0.27-0.35 of it at W 16, B 600). A setting
counts as measured when a results file in ``benchmarks/results/`` holds its held-out score over independent seeds
at equal budget, paired by seed with dspy.GEPA's (or 1×1's, dspy.GEPA's own search candidate for candidate), *as
the code stands*: a measurement made before a default it depends on changed (the screening minibatch, staged
screening) is not kept here, since it describes another search, nor relied on for another pool than it was
measured on (``Measurement.pools``). Keys are (schedule, P×N, selection label); ``"auto"`` is ``p="auto"``, the
width following the pool (the defaults).
"""

from __future__ import annotations

from dataclasses import dataclass

# A setting whose measured held-out is within this of dspy.GEPA's (pooled over the landscapes measured) keeps it:
# the spread of a rerun of the same seeds is about 0.01 a cell.
KEEPS_HELD_OUT = -0.02


@dataclass(frozen=True)
class Measurement:
    """A setting's held-out score minus dspy.GEPA's, paired by seed and pooled over the landscapes measured."""

    held_out: float
    where: str  # the results file(s), the regime and the landscapes
    pools: tuple[int, ...] | None = (16,)  # the pools W it was measured on; None: any (dspy.GEPA's own search)

    @property
    def keeps_held_out(self) -> bool:
        return self.held_out >= KEEPS_HELD_OUT

    def measured_on(self, workers: int) -> bool:
        """Whether it was measured on this pool: a wider pool runs the same setting in another regime (other
        budgets and valsets, other windows), so a figure from another pool is shown as such, never relied on."""
        return self.pools is None or workers in self.pools


_CLASS_SWAP = "W 16, B 600, |val| 30, 10 seeds; depth, breadth and chain"
_FIXED = _CLASS_SWAP + ", fixed call times"
_STEP_LOOP = "heldout.json: W 16, B 600, |val| 30, 5 seeds; depth and chain; against 1×1"

MEASURED: dict[tuple[str, str, str], Measurement] = {
    ("steps", "1x1", "all"): Measurement(
        -0.005, f"class_swap_p1_p2.json ({_FIXED}; dspy.GEPA's own search: the same score on every seed of depth "
                "and breadth, chain -0.015)", pools=None),
    ("async", "auto", "merge"): Measurement(
        -0.029, f"class_swap_default.json ({_CLASS_SWAP}, fixed and lognormal call times); "
                "W 64: class_swap_w64_bill.json", pools=(16, 64)),
    ("async", "2x1", "merge"): Measurement(-0.022, f"class_swap_p1_p2.json ({_FIXED}; chain -0.077)"),
    ("async", "3x1", "merge"): Measurement(-0.028, f"class_swap_staged_width.json ({_CLASS_SWAP})"),
    ("async", "4x1", "merge"): Measurement(-0.016, f"class_swap_staged_width.json ({_CLASS_SWAP})"),
    ("async", "5x1", "merge"): Measurement(-0.044, f"class_swap_staged_width.json ({_CLASS_SWAP})"),
    ("async", "4x4", "merge"): Measurement(-0.097, f"class_swap_async_4x4.json ({_CLASS_SWAP}; chain -0.292)"),
    ("async", "8x4", "merge"): Measurement(
        -0.132, "class_swap_w64_async_8x4.json (W 64, B 3000, |val| 150, 5 seeds; depth, breadth and chain -0.330)",
        pools=(64,)),
    ("steps", "4x4", "all"): Measurement(-0.338, _STEP_LOOP),
    ("steps", "8x2", "all"): Measurement(-0.332, _STEP_LOOP),
    ("steps", "16x1", "all"): Measurement(-0.308, _STEP_LOOP),
    ("steps", "4x4", "best"): Measurement(-0.307, _STEP_LOOP),
    ("steps", "8x2", "best"): Measurement(-0.307, _STEP_LOOP),
    ("steps", "16x1", "best"): Measurement(-0.307, _STEP_LOOP),
    ("steps", "4x4", "top-2"): Measurement(-0.306, _STEP_LOOP),
    ("steps", "16x1", "top-2"): Measurement(-0.314, _STEP_LOOP),
}


def measured(schedule: str, p: int | str, n: int, selection: str) -> Measurement | None:
    """What the benchmarks measured of this setting's held-out score, or None when they never did."""
    shape = "auto" if p == "auto" else f"{p}x{n}"
    return MEASURED.get((schedule, shape, selection))
