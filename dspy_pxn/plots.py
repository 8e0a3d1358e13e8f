"""The paper's runtime figure: predicted wall-clock over step width vs measured runs.

matplotlib is imported inside the function (Agg backend), so importing dspy_pxn never
pulls in a GUI toolkit or pays matplotlib's import time.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from dspy_pxn.runtime_model import RunShape, RuntimeModel, Selection


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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
