"""Template filters and tags of the portal: durations, sizes, GPU shares, state and reason wording, bars."""

from __future__ import annotations

from datetime import datetime

from django import template
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from frontend import wording
from kernel import sentences
from kernel.units import human_duration
from quotas.models import Team

register = template.Library()


@register.filter
def duration(seconds: float | int | None) -> str:
    """'45 s', '12 min', '3 h 5 min', '2 d 4 h': short, rounded, translated."""
    if seconds is None or seconds == "":
        return "—"
    s = max(0, int(seconds))
    if s < 60:
        return _("%(n)d s") % {"n": s}
    minutes = s // 60
    if minutes < 60:
        return _("%(n)d min") % {"n": minutes}
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return _("%(h)d h %(m)d min") % {"h": hours, "m": minutes} if minutes else _("%(h)d h") % {"h": hours}
    days, hours = divmod(hours, 24)
    return _("%(d)d d %(h)d h") % {"d": days, "h": hours} if hours else _("%(d)d d") % {"d": days}


@register.filter
def said(text: str | None) -> str:
    """A sentence the platform stored in English (a wait reason, a timeline entry, a seeded description, a failure
    rule's suggestion) in the reader's language where the catalogue has it; an admin's own text is shown as written
    (kernel.sentences)."""
    return sentences.said(text)


@register.filter
def time_limit(seconds: float | int | None) -> str:
    """A time limit as users write one: '4h', '30m', '1h 30m' (the submit form and the API accept the same)."""
    if seconds is None or seconds == "":
        return "—"
    return human_duration(seconds)


@register.filter
def job_gpus(job) -> str:
    """What a job holds or asks for, in cards: '2 × 1 GPU', '0.25 GPU', '4 × 2 × 1 GPU' for replicas."""
    share = gpus(job.gpu_milli)
    per = _("%(n)s GPU") % {"n": share}
    count = job.gpu_count * (job.replicas or 1)
    return per if count == 1 else f"{count} × {per}"


@register.filter
def job_duration(job) -> str:
    """How long it ran (or has run so far); for a job that has not started, how long it has waited."""
    if job.started_at:
        end = job.finished_at or timezone.now()
        return duration((end - job.started_at).total_seconds())
    if job.finished_at:
        return "—"
    return _("waiting %(wait)s") % {"wait": duration((timezone.now() - job.submitted_at).total_seconds())}


@register.filter
def eta(estimate) -> str:
    """An estimated start (jobs.eta.Estimate) in words: a range, "about" when it is narrow, or "unknown" (with
    the latest moment the time limits allow, when they bound it). Never "0 s" for a job that waits."""
    if estimate is None:
        return "—"
    words = _range_words(estimate)
    old, held = getattr(estimate, "outlived", 0), getattr(estimate, "holders", 0)
    if not old:
        return words
    if old == held == 1:
        note = _("the job it waits for has run longer than any similar job did: it may end any moment, or run on to "
                 "its time limit")  # fmt: skip
    elif old == held:
        note = _("all %(n)s jobs it waits for have run longer than any similar job did: they may end any moment, or "
                 "run on to their time limits") % {"n": old}  # fmt: skip
    else:
        note = ngettext(
            "%(n)s of the %(all)s jobs it waits for has run longer than any similar job did",
            "%(n)s of the %(all)s jobs it waits for have run longer than any similar job did",
            old,
        ) % {"n": old, "all": held}
    return f"{words} ({note})"


def _range_words(estimate) -> str:
    if not estimate.known or estimate.low is None or estimate.high is None:
        if estimate.high is not None:
            return _("unknown (at the latest in %(high)s, when running jobs reach their time limits)") % {
                "high": duration(max(60, estimate.high))
            }
        return _("unknown")
    low, high = max(60, estimate.low), max(60, estimate.high)
    if duration(low) == duration(high):
        return _("in about %(t)s") % {"t": duration(high)}
    return _("between %(low)s and %(high)s from now") % {"low": duration(low), "high": duration(high)}


@register.filter
def since(moment: datetime | None) -> str:
    """How long ago, as a duration."""
    if moment is None:
        return "—"
    return duration((timezone.now() - moment).total_seconds())


@register.filter
def cpulist(cpus) -> str:
    """[0, 1, 2, 3, 8] → `0-3,8`, as the kernel writes CPU lists."""
    from jobs.backends.cpu_pinning import format_cpulist

    return format_cpulist(cpus or [])


@register.filter
def mib(value: int | None) -> str:
    if value is None:
        return "—"
    value = int(value)
    if value >= 1024 and value % 1024 == 0:
        return _("%(n)s GiB") % {"n": value // 1024}
    if value >= 1024:
        return _("%(n)s GiB") % {"n": f"{value / 1024:.1f}"}
    return _("%(n)s MiB") % {"n": value}


@register.filter
def gpus(milli: int | None) -> str:
    """GPU compute in cards: 1000 milli → '1', 250 → '0.25'."""
    if milli is None:
        return "—"
    cards = int(milli) / 1000
    return f"{cards:g}" if cards == int(cards) else f"{cards:.2f}".rstrip("0")


@register.filter
def cores(milli: int | None) -> str:
    if milli is None:
        return "—"
    value = int(milli) / 1000
    return f"{value:g}"


@register.filter
def state_label(state: str) -> str:
    return wording.state_label(state)


@register.filter
def attempt_state_label(state: str) -> str:
    return str(wording.ATTEMPT_STATE_LABELS.get(state, state))


@register.filter
def reason_sentence(reason: str) -> str:
    return wording.reason_sentence(reason)


@register.filter
def failure_class(value: str) -> str:
    return str(wording.FAILURE_CLASSES.get(value, value))


@register.filter
def reaction(value: str) -> str:
    return str(wording.REACTIONS.get(value, value))


@register.filter
def short_digest(digest: str) -> str:
    if not digest:
        return ""
    algo, _sep, hexpart = digest.partition(":")
    return f"{algo}:{hexpart[:12]}" if hexpart else digest[:19]


@register.filter
def get_item(mapping: dict, key):
    return mapping.get(key) if mapping else None


@register.simple_tag
def nav_teams(user) -> list[Team]:
    """The teams the user belongs to (staff see every team on the team pages, not in the nav)."""
    if not user.is_authenticated:
        return []
    return list(Team.objects.filter(memberships__user=user).order_by("name"))


@register.inclusion_tag("frontend/_bar.html")
def usage_bar(used: int, limit: int, label: str, shown_used: str, shown_limit: str) -> dict:
    """A labelled bar: how much of a limit is used; over 90 % turns amber, at or over 100 % red."""
    pct = 0 if not limit else min(100, round(100 * used / limit))
    level = "full" if limit and used >= limit else ("high" if pct >= 90 else "ok")
    text = _("%(used)s of %(limit)s used (%(pct)d%%)") % {"used": shown_used, "limit": shown_limit, "pct": pct}
    return {"pct": pct, "level": level, "label": label, "text": text, "unlimited": not limit}


@register.filter
def word(value: str) -> str:
    """An alert level or state, a rule's metric or action, a GPU fault, in the reader's language."""
    return wording.monitoring_word(value)


@register.filter
def event_kind(kind: str) -> str:
    return wording.event_kind(kind)


@register.filter
def actor(name: str) -> str:
    return wording.actor_label(name)


@register.filter
def event_reason(event) -> str:
    """Why a timeline entry happened, when it recorded a reason code the portal has a sentence for."""
    code = (event.data or {}).get("reason") if isinstance(event.data, dict) else None
    if not code or not (code in wording.PENDING_REASONS or code in wording.OTHER_REASONS):
        return ""
    return wording.reason_sentence(code)


@register.filter
def evidence(recommendation: dict | None) -> str:
    """A recommendation's evidence in the reader's language, from its figures (`evidence_parts`); the stored
    English sentence when it has none."""
    if not recommendation:
        return ""
    parts = recommendation.get("evidence_parts")
    if not parts:
        return recommendation.get("evidence", "")
    runs = parts["runs"]
    text = ngettext("%(runs)s run, peak %(peak)s of %(asked)s", "%(runs)s runs, peak %(peak)s of %(asked)s", runs) % {
        "runs": runs,
        "peak": f"{parts['peak_mib'] / 1024:.1f} GiB",
        "asked": f"{parts['asked_mib'] / 1024:.1f} GiB",
    }
    if parts.get("util_p95_pct") is not None:
        text += _(", GPU utilization p95 %(pct)s%%") % {"pct": f"{parts['util_p95_pct']:.0f}"}
    if not parts.get("covered", True):
        text += _("; no spec of this queue covers it")
    return text + _("; memory margin %(pct)s%%") % {"pct": f"{parts['memory_margin'] * 100:.0f}"}
