"""Line charts rendered on the server as inline SVG: no script, no CDN, readable without JavaScript."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563")


@dataclass
class Series:
    name: str
    points: list[tuple[float, float]] = field(default_factory=list)
    colour: str = ""  # fixed per series (a job keeps its colour across charts); else by position


def _fmt(value: float) -> str:
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value / 1e6:.1f}M"
    if magnitude >= 1e4:
        return f"{value / 1e3:.0f}k"
    if magnitude >= 100 or value == int(value):
        return f"{value:.0f}"
    if magnitude >= 1:
        return f"{value:.1f}"
    return f"{value:.3g}"


def _x_label(value: float, time_axis: bool) -> str:
    if time_axis:
        return datetime.fromtimestamp(value, tz=UTC).strftime("%H:%M")
    return _fmt(value)


def line_chart(
    title: str,
    series: list[Series],
    *,
    unit: str = "",
    time_axis: bool = True,
    y_min: float | None = 0.0,
    y_max: float | None = None,
    threshold: float | None = None,
    width: int = 560,
    height: int = 180,
) -> SafeString:
    """One chart: x is Unix seconds (time_axis) or any number (e.g. the training step)."""
    drawn = [s for s in series if s.points]
    if not drawn:
        return mark_safe(
            f'<figure class="chart empty"><figcaption>{escape(title)}</figcaption>'
            f'<p class="muted">{escape(_("no data"))}</p></figure>'
        )
    left, right, top, bottom = 48, 8, 8, 22
    plot_w, plot_h = width - left - right, height - top - bottom
    xs = [x for s in drawn for x, _ in s.points]
    ys = [y for s in drawn for _, y in s.points] + ([threshold] if threshold is not None else [])
    x0, x1 = min(xs), max(xs)
    lo = min(ys) if y_min is None else min(y_min, min(ys))
    hi = max(ys) if y_max is None else max(y_max, max(ys))
    if x1 == x0:
        x1 = x0 + 1
    if hi == lo:
        hi = lo + 1

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * plot_w

    def py(y: float) -> float:
        return top + plot_h - (y - lo) / (hi - lo) * plot_h

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" aria-label="{escape(title)}">'
    ]
    for i in range(5):
        y = lo + (hi - lo) * i / 4
        parts.append(
            f'<line x1="{left}" x2="{width - right}" y1="{py(y):.1f}" y2="{py(y):.1f}" '
            f'stroke="#e5e7eb"/><text x="{left - 4}" y="{py(y) + 4:.1f}" font-size="10" '
            f'text-anchor="end" fill="#6b7280">{escape(_fmt(y))}{escape(unit)}</text>'
        )
    for frac, anchor in ((0.0, "start"), (0.5, "middle"), (1.0, "end")):
        x = x0 + (x1 - x0) * frac
        parts.append(
            f'<text x="{px(x):.1f}" y="{height - 6}" font-size="10" text-anchor="{anchor}" '
            f'fill="#6b7280">{escape(_x_label(x, time_axis))}</text>'
        )
    if threshold is not None:
        parts.append(
            f'<line class="threshold" x1="{left}" x2="{width - right}" y1="{py(threshold):.1f}" '
            f'y2="{py(threshold):.1f}" stroke="#dc2626" stroke-dasharray="4 3"/>'
        )
    for i, s in enumerate(drawn):
        colour = s.colour or PALETTE[i % len(PALETTE)]
        points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in sorted(s.points))
        parts.append(
            f'<polyline data-series="{escape(s.name)}" fill="none" stroke="{colour}" stroke-width="1.5" '
            f'points="{points}"><title>{escape(s.name)}</title></polyline>'
        )
    parts.append("</svg>")
    legend = "".join(
        f'<span class="legend-item"><span class="swatch" style="background:{s.colour or PALETTE[i % len(PALETTE)]}">'
        f"</span>{escape(s.name)}</span>"
        for i, s in enumerate(drawn)
    )
    return mark_safe(
        f'<figure class="chart"><figcaption>{escape(title)}</figcaption>{"".join(parts)}'
        f'<div class="legend">{legend}</div></figure>'
    )


def epoch(moment: datetime) -> float:
    return moment.timestamp()
