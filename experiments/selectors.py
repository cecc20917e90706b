"""Reads of experiments: what a user may see, the best trial, the trials table (sortable by any parameter or
metric), and its CSV."""

from __future__ import annotations

import csv
import io
import math
from typing import Any

from django.db.models import QuerySet

from experiments.models import Experiment, Trial
from quotas.models import Membership

SORT_COLUMNS = ("number", "state", "best_value", "last_value", "last_step", "gpu_seconds")


def experiments_visible_to(user) -> QuerySet[Experiment]:
    qs = Experiment.objects.select_related("team", "owner")
    if user.is_staff:
        return qs
    return qs.filter(team_id__in=list(Membership.objects.filter(user=user).values_list("team_id", flat=True)))


def best_trial(experiment: Experiment, trials: list[Trial] | None = None) -> Trial | None:
    """The trial with the best value of the searched metric so far (any state: a stopped trial's value counts)."""
    trials = trials if trials is not None else list(experiment.trials.exclude(best_value=None))
    scored = [t for t in trials if t.best_value is not None]
    if not scored:
        return None
    sign = 1 if experiment.direction == "minimize" else -1
    return min(scored, key=lambda t: (sign * t.best_value, t.number))


def trials_of(experiment: Experiment) -> list[Trial]:
    return list(experiment.trials.select_related("job").order_by("number"))


def sort_trials(experiment: Experiment, trials: list[Trial], key: str) -> list[Trial]:
    """Sort by a column or a parameter (`-` first: descending); trials without the value go last either way."""
    descending = key.startswith("-")
    name = key.lstrip("-") or "number"
    if name == "metric":
        name = "best_value"

    def value(trial: Trial) -> Any:
        if name in SORT_COLUMNS:
            return getattr(trial, name)
        return trial.params.get(name)

    present = [t for t in trials if value(t) is not None]
    missing = [t for t in trials if value(t) is None]
    try:
        present.sort(key=lambda t: (value(t), t.number), reverse=descending)
    except TypeError:  # a categorical of mixed types
        present.sort(key=lambda t: (str(value(t)), t.number), reverse=descending)
    return present + missing


def sort_keys(experiment: Experiment) -> list[str]:
    return [*SORT_COLUMNS, *experiment.space.keys()]


def trial_row(experiment: Experiment, trial: Trial) -> dict[str, Any]:
    return {
        "number": trial.number,
        "state": trial.state,
        "job": str(trial.job_id),
        "job_state": trial.job.state,
        "job_reason": trial.job.reason,
        "params": trial.params,
        "best_value": trial.best_value,
        "best_step": trial.best_step,
        "last_value": trial.last_value,
        "last_step": trial.last_step,
        "rungs": trial.rungs,
        "gpu_seconds": round(trial.gpu_seconds, 3),
        "earlier_jobs": trial.earlier_jobs,
    }


def trials_csv(experiment: Experiment, trials: list[Trial]) -> str:
    names = list(experiment.space.keys())
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["trial", "state", "job", *names, f"best_{experiment.metric}", "best_step",
                     f"last_{experiment.metric}", "last_step", "gpu_seconds"])  # fmt: skip
    for t in trials:
        writer.writerow(
            [t.number, t.state, str(t.job_id), *[_cell(t.params.get(n)) for n in names], _cell(t.best_value),
             _cell(t.best_step), _cell(t.last_value), _cell(t.last_step), round(t.gpu_seconds, 3)]
        )  # fmt: skip
    return out.getvalue()


def _cell(value: Any) -> Any:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    return value


def summary(experiment: Experiment, trials: list[Trial]) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.state] = counts.get(t.state, 0) + 1
    best = best_trial(experiment, trials)
    return {
        "trials": len(trials),
        "by_state": counts,
        "best_trial": best.number if best else None,
        "best_value": best.best_value if best else None,
        "best_params": best.params if best else None,
        "best_job": str(best.job_id) if best else None,
        "gpu_seconds": round(sum(t.gpu_seconds for t in trials), 3),
    }
