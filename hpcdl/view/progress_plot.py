"""The training-progress plot as MATLAB draws it, from a run's records: per panel the smoothed training curve over
the raw one (faint), validation points joined by a dashed line, epoch boundaries; beside the panels an info panel
(elapsed, epoch and iteration of total, learning rate, environment, stop reason, final and best validation).

Panels are exactly the values the records hold: accuracy and loss where there are any, then each number the
user's code reported by name (``metrics``). Pure matplotlib (Agg), no pyplot: safe in a background thread.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from hpcdl.store.atomic import atomic_open

Record = dict[str, Any]

ACCURACY_COLOR, LOSS_COLOR = "#0072BD", "#D95319"
METRIC_COLORS = ("#77AC30", "#7E2F8E", "#EDB120", "#4DBEEE", "#A2142F")
EPOCH_COLOR = "#A0A0A0"
"""The epoch boundaries' colour, drawn without antialiasing (a test counts them in the PNG)."""
PANEL_FACE = "#FAFAFA"
"""Each panel's background (a test counts the panels by it)."""
RAW_ALPHA = 0.25


@dataclass
class RunFacts:
    """What the info panel says beside what the records hold."""

    environment: str = ""
    """Execution environment and devices, in words (cpu (no GPU usable), 4 ranks on cuda, ...)."""
    max_epochs: Optional[int] = None
    """The epochs the run was planned for; None: unknown (the user's code)."""
    stop_reason: str = ""
    """Why training stopped; empty while it runs."""


@dataclass(frozen=True)
class Panel:
    """One panel: its label, the records' key, the scale shown (100 for percent), colour and y scale."""

    label: str
    key: str
    scale: float
    color: str
    log: bool


def smoothing_weight(count: int) -> float:
    """The exponential smoothing weight for a curve of ``count`` points: 0.6 for short runs (TensorBoard's
    default), more for long ones, so that about the last count/10 points make up a smoothed value."""
    return min(0.98, max(0.6, 1.0 - 10.0 / max(count, 1)))


def smoothed(values: Sequence[float], weight: float) -> list[float]:
    """The debiased exponential moving average of ``values`` (TensorBoard's smoothing); non-finite values are
    passed through and left out of the average."""
    out, average, norm = [], 0.0, 0.0
    for value in values:
        if not math.isfinite(value):
            out.append(value)
            continue
        average, norm = weight * average + (1 - weight) * value, weight * norm + (1 - weight)
        out.append(average / norm)
    return out


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def panels_for(iterations: Sequence[Record], validations: Sequence[Record], metrics: Sequence[str] = ()
               ) -> list[Panel]:
    """The panels the records call for: accuracy, loss (where any record has them), then each of ``metrics``."""
    panels = []
    for label, key, scale, color in (("Accuracy (%)", "accuracy", 100.0, ACCURACY_COLOR),
                                     ("Loss", "loss", 1.0, LOSS_COLOR)):
        if any(_number(r.get(key)) for r in (*iterations, *validations)):
            panels.append(Panel(label, key, scale, color, key == "loss" and _spans_decades(iterations, key)))
    for n, name in enumerate(metrics):
        if any(_number(r.get(name)) for r in iterations):
            color = METRIC_COLORS[n % len(METRIC_COLORS)]
            panels.append(Panel(name, name, 1.0, color, _spans_decades(iterations, name)))
    return panels


def _spans_decades(records: Sequence[Record], key: str) -> bool:
    """Log scale when every value is positive and they span more than two decades."""
    values = [r[key] for r in records if _number(r.get(key)) and math.isfinite(r[key])]
    return bool(values) and min(values) > 0 and max(values) / min(values) > 100


def epoch_boundaries(iterations: Sequence[Record]) -> list[float]:
    """Where each epoch after the first begins: halfway between its first iteration and the one before."""
    bounds, before = [], None
    for record in iterations:
        epoch = record.get("epoch")
        if before is not None and _number(epoch) and _number(before.get("epoch")) and epoch > before["epoch"]:
            bounds.append((before["iteration"] + record["iteration"]) / 2)
        before = record
    return bounds


def _clock(seconds: float) -> str:
    s = int(max(0, seconds))
    return f"{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}"


def _validation_words(record: Optional[Record]) -> str:
    if record is None:
        return "-"
    parts = [f"{100 * record['accuracy']:.2f}%" if _number(record.get("accuracy")) else "",
             f"loss {record['loss']:.4g}" if _number(record.get("loss")) else "",
             f"(iteration {record['iteration']})" if _number(record.get("iteration")) else ""]
    return " ".join(p for p in parts if p) or "-"


def best_validation(validations: Sequence[Record]) -> Optional[Record]:
    """The best validation: highest accuracy where there is one, else lowest loss."""
    scored = [r for r in validations if _number(r.get("accuracy"))]
    if scored:
        return max(scored, key=lambda r: r["accuracy"])
    scored = [r for r in validations if _number(r.get("loss"))]
    return min(scored, key=lambda r: r["loss"]) if scored else None


def info_lines(iterations: Sequence[Record], validations: Sequence[Record], facts: RunFacts) -> list[tuple[str, str]]:
    """The info panel's (label, value) lines."""
    last = iterations[-1] if iterations else {}
    epoch = last.get("epoch")
    per_epoch = _per_epoch(iterations)
    total = last.get("total") or (per_epoch * facts.max_epochs if per_epoch and facts.max_epochs else None)
    lines = [("Result", facts.stop_reason or "training"),
             ("Elapsed", _clock(last["time_s"]) if _number(last.get("time_s")) else "-"),
             ("Epoch", "-" if epoch is None else f"{epoch}" + (f" of {facts.max_epochs}" if facts.max_epochs else "")),
             ("Iteration", f"{last.get('iteration', '-')}" + (f" of {total}" if total else "")),
             ("Iterations/epoch", str(per_epoch) if per_epoch else "-")]
    if _number(last.get("learn_rate")):
        lines.append(("Learning rate", f"{last['learn_rate']:.4g}"))
    if facts.environment:
        lines.append(("Environment", facts.environment))
    lines += [("Final validation", _validation_words(validations[-1] if validations else None)),
              ("Best validation", _validation_words(best_validation(validations)))]
    return lines


def _per_epoch(iterations: Sequence[Record]) -> Optional[int]:
    """Iterations in the first complete epoch, if one is."""
    counts: dict[Any, int] = {}
    for record in iterations:
        counts[record.get("epoch")] = counts.get(record.get("epoch"), 0) + 1
    epochs = [e for e in counts if _number(e)]
    return counts[min(epochs)] if len(epochs) > 1 else None


def progress_figure(iterations: Sequence[Record], validations: Sequence[Record], facts: RunFacts,
                    metrics: Sequence[str] = ()) -> Any:
    """The plot as a matplotlib Figure (Agg), or None when the records hold nothing to draw."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = panels_for(iterations, validations, metrics)
    if not panels:
        return None
    figure = Figure(figsize=(12, 1.6 + 2.4 * len(panels)), dpi=100)
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(len(panels), 2, width_ratios=(3.2, 1), wspace=0.05, hspace=0.12,
                               left=0.07, right=0.99, top=0.93, bottom=0.45 / (1.6 + 2.4 * len(panels)) + 0.04)
    bounds = epoch_boundaries(iterations)
    shared = None
    for row, panel in enumerate(panels):
        axes = figure.add_subplot(grid[row, 0], sharex=shared, facecolor=PANEL_FACE)
        shared = shared or axes
        _draw_panel(axes, panel, iterations, validations, bounds)
        if row < len(panels) - 1:
            axes.tick_params(labelbottom=False)
    axes.set_xlabel("Iteration")
    info = figure.add_subplot(grid[:, 1])
    info.axis("off")
    text = "\n".join(f"{label}:\n  " + "\n  ".join(textwrap.wrap(value, 30) or ["-"])
                     for label, value in info_lines(iterations, validations, facts))
    info.text(0.04, 1.0, text, va="top", ha="left", family="monospace", fontsize=8.5, transform=info.transAxes,
              bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "#CCCCCC"})
    last = iterations[-1] if iterations else {}
    figure.suptitle("Training progress" + (f": {facts.stop_reason}" if facts.stop_reason
                                           else f" (iteration {last.get('iteration', 0)})"), x=0.07, ha="left")
    return figure


def _draw_panel(axes: Any, panel: Panel, iterations: Sequence[Record], validations: Sequence[Record],
                bounds: Sequence[float]) -> None:
    points = [(r["iteration"], panel.scale * r[panel.key]) for r in iterations if _number(r.get(panel.key))]
    if points:
        x, y = zip(*points)
        axes.plot(x, y, color=panel.color, lw=0.8, alpha=RAW_ALPHA)
        weight = smoothing_weight(len(y))
        trend = [10 ** v for v in smoothed([math.log10(v) if v > 0 else math.nan for v in y], weight)] \
            if panel.log else smoothed(y, weight)  # on a log axis, the average of the logarithms
        axes.plot(x, trend, color=panel.color, lw=1.6, label="Training (smoothed)")
    checks = [(r["iteration"], panel.scale * r[panel.key]) for r in validations if _number(r.get(panel.key))]
    if checks:
        axes.plot(*zip(*checks), "k--o", ms=3.5, lw=1.0, label="Validation")
    for x in bounds:
        axes.axvline(x, color=EPOCH_COLOR, lw=1, antialiased=False, zorder=0.5)
    if panel.log:
        axes.set_yscale("log")
    elif panel.key == "accuracy":
        axes.set_ylim(0, 100)
    axes.set_ylabel(panel.label)
    axes.grid(True, axis="y", alpha=0.25)
    axes.legend(loc="lower right" if panel.key == "accuracy" else "upper right", fontsize="small")


def write_progress_plot(path: Path, iterations: Sequence[Record], validations: Sequence[Record], facts: RunFacts,
                        metrics: Sequence[str] = ()) -> list[str]:
    """Draw the plot into ``path`` (atomically); returns the panels' labels (none drawn: nothing to draw)."""
    figure = progress_figure(iterations, validations, facts, metrics)
    if figure is None:
        return []
    labels = [panel.label for panel in panels_for(iterations, validations, metrics)]
    with atomic_open(path, "wb") as f:
        figure.savefig(f, format="png", metadata={"Description": "panels: " + ", ".join(labels)})
    return labels


def png_bytes(iterations: Sequence[Record], validations: Sequence[Record], facts: RunFacts,
              metrics: Sequence[str] = (), dpi: int = 80) -> Optional[bytes]:
    """The plot as PNG bytes (for a page), or None when there is nothing to draw."""
    import io

    figure = progress_figure(iterations, validations, facts, metrics)
    if figure is None:
        return None
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def user_metrics(iterations: Sequence[Record], reserved: Sequence[str]) -> list[str]:
    """The names of the numbers the user's code reported beside the ``reserved`` fields, in first-seen order."""
    return list(dict.fromkeys(k for r in iterations for k, v in r.items() if k not in reserved and _number(v)))
