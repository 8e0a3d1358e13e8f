"""Which settings' held-out quality the benchmarks measured, so ``dspy-pxn plan`` can say which it never did.

The runtime model predicts time, not quality: a setting it ranks fast may search too shallowly to
keep dspy.GEPA's held-out score (``"all"`` at P·N = 16 lost 0.14-0.35 of it). A setting counts as
measured when a results file in ``benchmarks/results/`` holds its held-out score over several seeds
at equal budget beside dspy.GEPA's; the planner marks every other one. Keys are (schedule, P×N,
selection label); ``"auto"`` is ``p="auto"``, the width following the pool (the defaults).
"""

from __future__ import annotations

# (schedule, "PxN" or "auto", selection) -> the results file(s) with its held-out scores.
MEASURED: dict[tuple[str, str, str], str] = {
    ("steps", "1x1", "all"): "schedules.json (dspy.GEPA's own search, candidate for candidate)",
    ("steps", "4x4", "all"): "schedules.json, schedules_w64.json",
    ("steps", "4x4", "best"): "schedules.json, schedules_w64.json",
    ("steps", "4x4", "merge"): "schedules.json, schedules_w64.json",
    ("steps", "4x4", "merge+best"): "schedules_evict_oldest_quick.json",
    ("steps", "4x4", "top-2"): "heldout.json",
    ("steps", "8x2", "all"): "heldout.json",
    ("steps", "8x2", "best"): "heldout.json",
    ("steps", "16x1", "all"): "heldout.json",
    ("steps", "16x1", "best"): "heldout.json",
    ("steps", "16x1", "top-2"): "heldout.json",
    ("async", "4x4", "all"): "schedules.json",
    ("async", "4x4", "merge"): "schedules.json, schedules_w64.json",
    ("async", "4x4", "merge+best"): "schedules_evict_oldest_quick.json",
    ("async", "8x2", "merge"): "schedules_server.json",
    ("async", "16x1", "merge"): "schedules_server.json",
    ("async", "8x4", "merge"): "schedules_w64.json",
    ("async", "16x4", "merge"): "schedules_wide_w64.json",
    ("async", "58x1", "merge"): "schedules_wide_w64_width58.json",
    ("async", "64x1", "merge"): "schedules_wide_w256_width64.json",
    ("async", "96x1", "merge"): "schedules_wide_w256_width96.json",
    ("async", "113x1", "merge"): "schedules_wide_w256_width113.json",
    ("async", "auto", "merge"): ("class_swap_default.json (W 16), class_swap_w64_bill.json (W 64), "
                                 "end_not_waiting_w256_after.json"),
}


def measured(schedule: str, p: int | str, n: int, selection: str) -> str | None:
    """The results file(s) holding this setting's held-out scores, or None when none does."""
    shape = "auto" if p == "auto" else f"{p}x{n}"
    return MEASURED.get((schedule, shape, selection))
