"""A run's figures: its validation curve and step times (artifacts), and the runtime model vs measured runs.

matplotlib is imported inside the functions (Agg backend), so importing dspy_pxn never
pulls in a GUI toolkit or pays matplotlib's import time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from dspy_pxn.engine.records import StepRecord
from dspy_pxn.ledger.budget import RunShape
from dspy_pxn.planning import RuntimeModel
from dspy_pxn.proposer.selection import Selection
from dspy_pxn.tracking.runlog import Baseline

FIGSIZE, DPI = (7.0, 4.5), 100  # 700 x 450 px


def pyplot():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def plot_model_vs_measured(
    models: Mapping[str, RuntimeModel],
    shape: RunShape,
    measured: Mapping[tuple[int, int], float],
    path: str | Path,
    selection: Selection = "all",
    max_width: int | None = None,
) -> Path:
    """Write a PNG: one predicted wall-clock curve over k = P·N per model, measured runs as points.

    Several models (e.g. fitted on a 1×1 pilot vs on every run) share one figure because
    the acceptance rate a run sees depends on how far it got, and the curves show how much
    that choice moves the prediction.
    """
    if not models:
        raise ValueError("models is empty: pass {label: RuntimeModel}.")
    plt = pyplot()

    widest = max_width or max([p * n for p, n in measured] + [shape.workers])
    widths = list(range(1, widest + 1))
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for label, model in models.items():
        curve = [model.predict(k, 1, shape, selection).wall_s for k in widths]
        ax.plot(widths, curve, label=f"model, {label}: T_e={model.task_s:.2f}s, T_r={model.reflection_s:.2f}s, "
                f"a={model.acceptance:.2f}")
    floor = next(iter(models.values())).floor(shape)
    ax.axhline(floor, color="gray", linestyle="--", label=f"floor B·T_e/W = {floor:.1f} s")
    labelled_at: dict[int, int] = {}
    for (p, n), wall in sorted(measured.items(), key=lambda item: (item[0][0] * item[0][1], item[1])):
        ax.scatter([p * n], [wall], color="tab:red", zorder=3)
        stacked = labelled_at.get(p * n, 0)  # shapes of equal width share an x; stack their labels
        labelled_at[p * n] = stacked + 1
        ax.annotate(f"{p}×{n}", (p * n, wall), textcoords="offset points", xytext=(5, 4 + 10 * stacked), fontsize=8)
    ax.scatter([], [], color="tab:red", label="measured")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("proposals per step k = P·N")
    ax.set_ylabel("wall-clock (s)")
    ax.set_title(f"W={shape.workers}, B={shape.budget}, |val|={shape.val_size}, m={shape.minibatch_size}, "
                 f"selection={selection}", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def plot_run(steps: Sequence[StepRecord], baseline: Baseline | None, started_at: float, out_dir: str) -> list[str]:
    """A run's own artifacts: val scores against metric calls, and where each step's time went."""
    plt = pyplot()
    os.makedirs(out_dir, exist_ok=True)
    calls = [s.metric_calls_total for s in steps]
    best = [s.best_val for s in steps]
    mean = [s.mean_val for s in steps]
    if baseline is not None:
        calls, best, mean = [baseline.metric_calls, *calls], [baseline.val_score, *best], [baseline.val_score, *mean]
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    ax.plot(calls, best, drawstyle="steps-post", marker="o", markersize=3, label="best val")
    ax.plot(calls, mean, marker=".", alpha=0.7, label="mean val of the pool")
    ax.set_xlabel("metric calls")
    ax.set_ylabel("validation score")
    ax.set_title("Validation score vs metric calls")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="lower right")
    fig.tight_layout()
    scores = os.path.join(out_dir, "val_vs_metric_calls.png")
    fig.savefig(scores)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    index = [s.step for s in steps]
    bottom = [0.0] * len(steps)
    for phase in ("reflection_s", "screening_s", "validation_s"):
        values = [getattr(s, phase) for s in steps]
        ax.bar(index, values, bottom=bottom, label=phase.removesuffix("_s"))
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.plot(index, [s.wall_s for s in steps], color="black", marker="o", markersize=3, label="step wall-clock")
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.set_title("Where each step's time went")
    ax.legend(fontsize="small")
    fig.tight_layout()
    phases = os.path.join(out_dir, "step_times.png")
    fig.savefig(phases)
    plt.close(fig)
    return [scores, phases]
