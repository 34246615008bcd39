"""Charts for the dashboard, as geometry: pure functions from numbers to the rectangles,
points and ticks an SVG template draws (`templates/dashboard/charts.html`). No JavaScript,
no external asset: the page is whole when it arrives."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

WIDTH, HEIGHT = 500, 210
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 14, 34


@dataclass(frozen=True)
class Rect:
    x: float
    y: float
    w: float
    h: float
    color: str
    title: str


@dataclass(frozen=True)
class Tick:
    at: float
    label: str


@dataclass
class Chart:
    width: int
    height: int
    label: str
    rects: list[Rect] = field(default_factory=list)
    points: list[tuple[float, float, str]] = field(default_factory=list)
    """(x, y, title) of a line's vertices, in order."""
    y_ticks: list[Tick] = field(default_factory=list)
    x_ticks: list[Tick] = field(default_factory=list)
    legend: list[tuple[str, str]] = field(default_factory=list)
    baseline: float = 0.0
    left: float = LEFT
    right: float = 0.0
    empty: str | None = None
    """Said instead of a chart when there is nothing to draw."""

    @property
    def polyline(self) -> str:
        return " ".join(f"{x:.1f},{y:.1f}" for x, y, _ in self.points)


def nice_max(value: float) -> float:
    """The smallest 1, 2, 2.5 or 5 times a power of ten at or above `value` (1 for none)."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * power >= value * (1 - 1e-9):
            return step * power
    return 10 * power


def number(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}".rstrip("0").rstrip(".")
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _frame(label: str, top: float, width: int, height: int, ticks: int = 4) -> Chart:
    chart = Chart(width, height, label, left=LEFT, right=width - RIGHT,
                  baseline=height - BOTTOM)
    span = chart.baseline - TOP
    chart.y_ticks = [Tick(chart.baseline - span * i / ticks, number(top * i / ticks))
                     for i in range(ticks + 1)]
    return chart


def stacked_bars(labels: list[str], series: list[tuple[str, str, list[float]]], label: str,
                 unit: str = "", empty: str = "nothing recorded yet", width: int = WIDTH,
                 height: int = HEIGHT) -> Chart:
    """One bar per label, the series stacked from the bottom: (name, colour, values)."""
    totals = [sum(values[i] for _, _, values in series) for i in range(len(labels))]
    if not labels or not any(totals):
        return Chart(width, height, label, empty=empty)
    top = nice_max(max(totals))
    chart = _frame(label, top, width, height)
    chart.legend = [(name, colour) for name, colour, _ in series]
    slot = (chart.right - chart.left) / len(labels)
    bar = max(min(slot * 0.7, 40), 2)
    span = chart.baseline - TOP
    every = max(1, math.ceil(len(labels) / 10))
    for i, name in enumerate(labels):
        x = chart.left + slot * i + (slot - bar) / 2
        y = chart.baseline
        for series_name, colour, values in series:
            h = span * values[i] / top
            if h > 0:
                y -= h
                chart.rects.append(Rect(x, y, bar, h, colour,
                                        f"{name}: {number(values[i])}{unit} {series_name}"))
        if i % every == 0:
            chart.x_ticks.append(Tick(x + bar / 2, name))
    return chart


def line(labels: list[str], values: list[float | None], label: str, unit: str = "",
         colour: str = "#2f6f9f", empty: str = "nothing recorded yet", width: int = WIDTH,
         height: int = HEIGHT) -> Chart:
    """A line through the values that exist (None: no point), one slot per label."""
    present = [v for v in values if v is not None]
    if not present:
        return Chart(width, height, label, empty=empty)
    top = nice_max(max(present))
    chart = _frame(label, top, width, height)
    chart.legend = [(label, colour)]
    slot = (chart.right - chart.left) / max(len(labels), 1)
    span = chart.baseline - TOP
    every = max(1, math.ceil(len(labels) / 10))
    for i, (name, value) in enumerate(zip(labels, values)):
        x = chart.left + slot * (i + 0.5)
        if value is not None:
            chart.points.append((x, chart.baseline - span * value / top,
                                 f"{name}: {number(value)}{unit}"))
        if i % every == 0:
            chart.x_ticks.append(Tick(x, name))
    return chart
