"""The experiment page's plots as inline SVG (no script, no CDN), like monitoring.charts: each trial's value of
the searched metric against one parameter (scatter), and every trial across all parameters (parallel coordinates).
Log-uniform parameters get a logarithmic axis; categorical ones an axis of their values in the space's order."""

from __future__ import annotations

import math
from typing import Any

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _

from monitoring.charts import _fmt

BEST = "#dc2626"
DOT = "#2563eb"
STOPPED = "#9ca3af"


class Axis:
    """Maps a parameter's (or the metric's) values onto 0..1."""

    def __init__(self, spec: dict[str, Any] | None, values: list[Any]):
        self.kind = (spec or {}).get("type", "float")
        self.categories = list((spec or {}).get("values", [])) if self.kind == "categorical" else []
        numbers = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        if self.kind != "categorical":
            lo = (spec or {}).get("min", min(numbers) if numbers else 0.0)
            hi = (spec or {}).get("max", max(numbers) if numbers else 1.0)
            if numbers:
                lo, hi = min(lo, *numbers), max(hi, *numbers)
            self.log = self.kind == "log_uniform" and lo > 0
            self.lo, self.hi = (math.log10(lo), math.log10(hi)) if self.log else (float(lo), float(hi))
            if self.hi == self.lo:
                self.hi = self.lo + 1

    def position(self, value: Any) -> float | None:
        if self.kind == "categorical":
            if value not in self.categories:
                return None
            n = len(self.categories)
            return 0.5 if n == 1 else self.categories.index(value) / (n - 1)
        if not isinstance(value, int | float) or isinstance(value, bool):
            return None
        x = math.log10(value) if self.log and value > 0 else float(value)
        return (x - self.lo) / (self.hi - self.lo)

    def ticks(self) -> list[tuple[float, str]]:
        if self.kind == "categorical":
            return [(self.position(c) or 0.0, str(c)) for c in self.categories]
        out = []
        for i in range(3):
            x = self.lo + (self.hi - self.lo) * i / 2
            out.append((i / 2, _fmt(10**x if self.log else x)))
        return out


def _colour(trial: dict, best: int | None) -> str:
    if trial["number"] == best:
        return BEST
    return STOPPED if trial["state"] == "stopped_early" else DOT


def scatter(name: str, spec: dict, trials: list[dict], *, metric: str, best: int | None,
            width: int = 300, height: int = 200) -> SafeString:  # fmt: skip
    """One parameter (x) against each trial's best value of the metric (y)."""
    scored = [t for t in trials if t["best_value"] is not None and t["params"].get(name) is not None]
    title = f"{metric} vs {name}"
    if not scored:
        return mark_safe(f'<figure class="chart empty"><figcaption>{escape(title)}</figcaption></figure>')
    left, right, top, bottom = 48, 10, 8, 24
    pw, ph = width - left - right, height - top - bottom
    x_axis = Axis(spec, [t["params"][name] for t in scored])
    y_axis = Axis(None, [t["best_value"] for t in scored])
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
             f'height="{height}" role="img" aria-label="{escape(title)}" data-param="{escape(name)}">']  # fmt: skip
    for frac, label in y_axis.ticks():
        y = top + ph - frac * ph
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e7eb"/>'
                     f'<text x="{left - 4}" y="{y + 4:.1f}" font-size="10" text-anchor="end" fill="#6b7280">'
                     f"{escape(label)}</text>")  # fmt: skip
    for frac, label in x_axis.ticks():
        x = left + frac * pw
        parts.append(f'<text x="{x:.1f}" y="{height - 8}" font-size="10" text-anchor="middle" fill="#6b7280">'
                     f"{escape(label)}</text>")  # fmt: skip
    for t in scored:
        fx, fy = x_axis.position(t["params"][name]), y_axis.position(t["best_value"])
        if fx is None or fy is None:
            continue
        parts.append(
            f'<circle data-trial="{t["number"]}" cx="{left + fx * pw:.1f}" cy="{top + ph - fy * ph:.1f}" r="4" '
            f'fill="{_colour(t, best)}" fill-opacity="0.8"><title>#{t["number"]}: {escape(name)}='
            f"{escape(t['params'][name])}, {escape(metric)}={escape(_fmt(t['best_value']))}</title></circle>"
        )
    parts.append("</svg>")
    return mark_safe(f'<figure class="chart"><figcaption>{escape(title)}</figcaption>{"".join(parts)}</figure>')


def parallel(space: dict[str, dict], trials: list[dict], *, metric: str, best: int | None,
             width: int = 760, height: int = 260) -> SafeString:  # fmt: skip
    """One vertical axis per parameter and one for the metric; each trial a line across them."""
    names = list(space)
    scored = [t for t in trials if t["best_value"] is not None]
    if not scored:
        caption = escape(_("Parallel coordinates"))
        return mark_safe(f'<figure class="chart empty"><figcaption>{caption}</figcaption></figure>')
    axes = [Axis(space[n], [t["params"].get(n) for t in scored]) for n in names]
    axes.append(Axis(None, [t["best_value"] for t in scored]))
    labels = [*names, metric]
    left, right, top, bottom = 40, 40, 16, 24
    pw, ph = width - left - right, height - top - bottom
    step = pw / max(1, len(axes) - 1)
    caption = escape(_("Parallel coordinates"))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
             f'height="{height}" role="img" aria-label="{caption}" class="parallel">']  # fmt: skip
    for i, (axis, label) in enumerate(zip(axes, labels, strict=True)):
        x = left + i * step
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + ph}" stroke="#9ca3af"/>'
            f'<text x="{x:.1f}" y="{height - 6}" font-size="11" text-anchor="middle">{escape(label)}</text>'
        )
        for frac, tick in axis.ticks():
            parts.append(f'<text x="{x + 3:.1f}" y="{top + ph - frac * ph + 3:.1f}" font-size="9" '
                         f'fill="#6b7280">{escape(tick)}</text>')  # fmt: skip
    ordered = sorted(scored, key=lambda t: t["number"] == best)  # the best drawn last, on top
    for t in ordered:
        values = [t["params"].get(n) for n in names] + [t["best_value"]]
        points = []
        for i, (axis, value) in enumerate(zip(axes, values, strict=True)):
            frac = axis.position(value)
            if frac is not None:
                points.append(f"{left + i * step:.1f},{top + ph - frac * ph:.1f}")
        colour = _colour(t, best)
        width_px = "2.5" if t["number"] == best else "1.2"
        parts.append(
            f'<polyline data-trial="{t["number"]}" fill="none" stroke="{colour}" stroke-width="{width_px}" '
            f'stroke-opacity="0.7" points="{" ".join(points)}"><title>#{t["number"]}</title></polyline>'
        )
    parts.append("</svg>")
    return mark_safe(f'<figure class="chart wide"><figcaption>{escape(metric)}</figcaption>{"".join(parts)}</figure>')
