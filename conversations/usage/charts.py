"""Server-side SVG charts: stacked bars per day and lines per day, each with the same figures
as a table for screen readers (the SVG itself is one labelled image). No script, no
library: the page stays inside the site's content security policy."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

WIDTH, HEIGHT = 720, 240
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 12, 28
# Distinct hues, each at least 3:1 against white (non-text contrast).
PALETTE = ("#1f6feb", "#b35900", "#1a7f37", "#8250df", "#cf222e", "#0a7a8a", "#6e7781", "#9a6700", "#bf3989")


@dataclass(frozen=True)
class Chart:
    title: str
    svg: SafeString
    days: list[date]
    series: dict[str, list[float]]
    unit: str

    @property
    def legend(self) -> list[tuple[str, str]]:
        return [(name, PALETTE[i % len(PALETTE)]) for i, name in enumerate(self.series)]

    @property
    def rows(self) -> list[tuple[date, list[float]]]:
        return [(day, [values[i] for values in self.series.values()]) for i, day in enumerate(self.days)]


def _scale(top: float) -> tuple[float, list[float]]:
    """A round maximum for the axis and its four grid values."""
    if top <= 0:
        return 1.0, [0.0, 0.25, 0.5, 0.75, 1.0]
    magnitude = 10 ** (len(str(int(top))) - 1)
    nice = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= top)
    return float(nice), [nice * k / 4 for k in range(5)]


def _frame(title: str, top: float, ticks: list[float], days: list[date], body: list[str]) -> SafeString:
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    parts = [
        format_html(
            '<svg class="usage-chart" viewBox="0 0 {} {}" role="img" aria-label="{}" focusable="false">',
            WIDTH,
            HEIGHT,
            title,
        )
    ]
    for tick in ticks:
        y = TOP + plot_h - plot_h * tick / top
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_short(tick)}</text>')
    step = plot_w / max(1, len(days))
    for i, day in enumerate(days):
        if i % 5 == 0 or i == len(days) - 1:
            x = LEFT + step * (i + 0.5)
            parts.append(f'<text x="{x:.1f}" y="{HEIGHT - 8}" text-anchor="middle">{day:%d %b}</text>')
    parts += body
    parts.append("</svg>")
    return mark_safe("".join(parts))  # every interpolated text went through format_html or is a number


def _short(value: float) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    if value >= 1000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def stacked_bars(title: str, days: list[date], series: dict[str, list[float]], unit: str) -> Chart:
    totals = [sum(values[i] for values in series.values()) for i in range(len(days))]
    top, ticks = _scale(max(totals, default=0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    step = plot_w / max(1, len(days))
    body = []
    for i in range(len(days)):
        base = 0.0
        for k, values in enumerate(series.values()):
            value = values[i]
            if value <= 0:
                continue
            h = plot_h * value / top
            y = TOP + plot_h - plot_h * base / top - h
            color = PALETTE[k % len(PALETTE)]
            body.append(
                f'<rect x="{LEFT + step * i + step * 0.15:.1f}" y="{y:.1f}" width="{step * 0.7:.1f}" '
                f'height="{h:.1f}" fill="{color}"/>'
            )
            base += value
    return Chart(title, _frame(escape(title), top, ticks, days, body), days, series, unit)


def lines(title: str, days: list[date], series: dict[str, list[float | None]], unit: str) -> Chart:
    known = [v for values in series.values() for v in values if v is not None]
    top, ticks = _scale(max(known, default=0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    step = plot_w / max(1, len(days))
    body = []
    for k, values in enumerate(series.values()):
        color = PALETTE[k % len(PALETTE)]
        points = [
            f"{LEFT + step * (i + 0.5):.1f},{TOP + plot_h - plot_h * v / top:.1f}"
            for i, v in enumerate(values)
            if v is not None
        ]
        if points:
            body.append(
                f'<polyline points="{" ".join(points)}" fill="none" stroke="{color}" stroke-width="2"/>'
            )
            for point in points:
                x, y = point.split(",")
                body.append(f'<circle cx="{x}" cy="{y}" r="2.5" fill="{color}"/>')
    filled = {name: [v if v is not None else 0 for v in values] for name, values in series.items()}
    return Chart(title, _frame(escape(title), top, ticks, days, body), days, filled, unit)
