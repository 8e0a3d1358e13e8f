"""The paper's runtime figure: predicted wall-clock over step width vs measured runs.

matplotlib is imported inside the function (Agg backend), so importing dspy_pxn never
pulls in a GUI toolkit or pays matplotlib's import time.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from dspy_pxn.runtime_model import RunShape, RuntimeModel, Selection


def plot_model_vs_measured(
    model: RuntimeModel,
    shape: RunShape,
    measured: Mapping[tuple[int, int], float],
    path: str | Path,
    selection: Selection = "all",
    max_width: int | None = None,
) -> Path:
    """Write a PNG: the model's wall-clock curve over k = P·N, measured runs as labelled points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    widest = max_width or max([p * n for p, n in measured] + [shape.workers])
    widths = list(range(1, widest + 1))
    curve = [model.predict(k, 1, shape, selection) for k in widths]
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    ax.plot(widths, [c.wall_s for c in curve], color="tab:blue", label="runtime model")
    ax.axhline(model.floor(shape), color="gray", linestyle="--",
               label=f"floor B·T_e/W = {model.floor(shape):.1f} s")
    for (p, n), wall in sorted(measured.items()):
        ax.scatter([p * n], [wall], color="tab:red", zorder=3)
        ax.annotate(f"{p}×{n}", (p * n, wall), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.scatter([], [], color="tab:red", label="measured")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("proposals per step k = P·N")
    ax.set_ylabel("wall-clock (s)")
    ax.set_title(f"W={shape.workers}, B={shape.budget}, |val|={shape.val_size}, "
                 f"T_e={model.task_s:.2f}s, T_r={model.reflection_s:.2f}s, a={model.acceptance:.2f}", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
