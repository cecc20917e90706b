"""Every change of an experiment: create, advance (the periodic pass), pause, resume, cancel, run the best again.

Trials are ordinary jobs: each is submitted with `jobs.services.job_submit` as the experiment's owner, so the
same validation, quotas and queues admit it, and labelled `experiment=<id>`, `trial=<n>`. The searcher's only
lever on a running trial is `jobs.lifecycle.job_cancel` with reason `stopped_early`: the job ends `cancelled`
(the job state machine has no new state), its checkpoints are recorded as for any stopped attempt, and the trial
says `stopped_early`. `experiment_advance` is level-triggered: it reads the trials, their jobs and their metric
rows from the database and closes the difference, so a restart or a lost message costs one period.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import structlog
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from experiments import search
from experiments.models import Experiment, Trial
from jobs import checkpoints, lifecycle
from jobs import services as job_services
from jobs.models import Attempt, Job
from jobs.services import InvalidTransition
from jobs.states import TERMINAL, JobState
from kernel.errors import Conflict, NotFound, ValidationErrors, ValidationFailed
from kernel.sentences import stored
from quotas.models import Membership, Team

log = structlog.get_logger("experiments")

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
METRIC_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:/-]{0,63}\Z")
MAX_TRIALS = 1000
MAX_CURVE_POINTS = 2000
STOPPED_EARLY = "stopped_early"
PAUSED = "experiment_paused"
CANCELLED = "experiment_cancelled"
FIELDS = {
    "name", "team", "template", "space", "searcher", "metric", "direction", "max_trials", "max_concurrent",
    "rightsize",
}  # fmt: skip


def _fail(message: str, *, code: str, field: str) -> ValidationFailed:
    return ValidationFailed(message, code=code, field=field)


def render(template: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """The template with every `{{name}}` in its command, args, env values and name replaced by the value."""

    def text(s: str) -> str:
        return PLACEHOLDER.sub(lambda m: _as_text(values[m.group(1)]), s)

    out = json.loads(json.dumps(template))
    for key in ("command", "name"):
        if isinstance(out.get(key), str):
            out[key] = text(out[key])
    if isinstance(out.get("command"), list):
        out["command"] = [text(a) if isinstance(a, str) else a for a in out["command"]]
    if isinstance(out.get("args"), list):
        out["args"] = [text(a) if isinstance(a, str) else a for a in out["args"]]
    if isinstance(out.get("env"), dict):
        out["env"] = {k: text(v) if isinstance(v, str) else v for k, v in out["env"].items()}
    return out


def _as_text(value: Any) -> str:
    return json.dumps(value) if isinstance(value, bool) else str(value)


def _placeholders(template: dict[str, Any]) -> set[str]:
    found: set[str] = set()
    parts: list[Any] = [template.get("name"), template.get("command"), template.get("args")]
    parts += list((template.get("env") or {}).values()) if isinstance(template.get("env"), dict) else []
    for part in parts:
        for s in part if isinstance(part, list) else [part]:
            if isinstance(s, str):
                found.update(PLACEHOLDER.findall(s))
    return found


def _parse_searcher(raw: Any) -> tuple[str, dict[str, Any], int]:
    """`searcher: random` or `{name: adaptive, max_steps: 100, min_steps: 10, reduction: 3, seed: 7}`."""
    data = {"name": raw} if isinstance(raw, str) else raw
    if not isinstance(data, dict) or data.get("name") not in search.SEARCHERS:
        raise _fail(stored("searcher must be grid, random or adaptive"), code="invalid_searcher", field="searcher")
    name = data["name"]
    seed = data.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
        raise _fail(
            "searcher.seed must be a whole number 0..2147483647", code="invalid_searcher", field="searcher.seed"
        )
    config: dict[str, Any] = {}
    if name == "adaptive":
        adaptive = search.parse_adaptive(data)
        config = {"max_steps": adaptive.max_steps, "min_steps": adaptive.min_steps, "reduction": adaptive.reduction}
    else:
        unknown = set(data) - {"name", "seed", "max_steps"}
        if unknown:
            raise _fail(
                f"unknown searcher key(s) {', '.join(sorted(map(str, unknown)))}",
                code="invalid_searcher",
                field="searcher",
            )
        if "max_steps" in data:
            steps = data["max_steps"]
            if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
                raise _fail("searcher.max_steps must be a positive whole number", code="invalid_searcher",
                            field="searcher.max_steps")  # fmt: skip
            config["max_steps"] = steps
    return name, config, seed


def _whole(data: dict, key: str, default: int | None, low: int, high: int) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _fail(
            stored("%(field)s must be a whole number from %(low)s to %(high)s", field=key, low=low, high=high),
            code=f"invalid_{key}",
            field=key,
        )
    return value


def trial_body(experiment: Experiment, *, number: int, params: dict[str, Any], max_steps: int | None = None) -> dict:
    """The job body of a trial: the template with its parameters (and `{{max_steps}}`) filled in, the experiment's
    team, labels linking it, and each parameter as an environment variable HP_<NAME> too."""
    values = dict(params)
    steps = max_steps if max_steps is not None else experiment.searcher_config.get("max_steps")
    if steps is not None:
        values.setdefault("max_steps", steps)
    body = render(experiment.template, values)
    body["team"] = experiment.team.slug
    body.setdefault("name", f"{experiment.name}-t{number}")
    env = dict(body.get("env") or {})
    for key, value in params.items():
        env[f"HP_{key.upper()}"] = _as_text(value)
    body["env"] = env
    labels = dict(body.get("labels") or {})
    labels.update({"experiment": str(experiment.id), "trial": str(number)})
    body["labels"] = labels
    rec = experiment.recommendation or {}
    if experiment.rightsize == "apply" and rec.get("spec") and not rec.get("fits_request"):
        body["spec"] = rec["spec"]
        if rec.get("gpu_count"):
            body["gpus"] = rec["gpu_count"]
    return body


def experiment_create(*, user, data: Any) -> Experiment:
    """Validate an experiment and store it (`running`); its first trials are submitted by the next pass (or at
    once, after commit). 400 with a field and a code for every problem found; the template is checked by
    validating the first trial's job exactly as a submission would be."""
    if not isinstance(data, dict):
        raise _fail("an experiment is a mapping of fields", code="invalid_experiment", field="non_field_errors")
    unknown = sorted(set(data) - FIELDS)
    if unknown:
        raise ValidationErrors([_fail(stored("unknown field"), code="unknown_field", field=name) for name in unknown])
    team = Team.objects.filter(slug=data.get("team") if isinstance(data.get("team"), str) else None).first()
    if team is None or not (user.is_staff or Membership.objects.filter(user=user, team=team).exists()):
        raise NotFound(stored("team not found (or you are not a member)"), code="unknown_team", field="team")
    problems: list[ValidationFailed] = []

    def check(fn):
        try:
            return fn()
        except search.SpaceError as exc:
            problems.append(_fail(str(exc), code=exc.code, field=exc.field))
        except ValidationFailed as exc:
            problems.extend(getattr(exc, "errors", None) or [exc])
        return None

    name = data.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > 120:
        problems.append(_fail("name is 1..120 characters", code="invalid_name", field="name"))
    params = check(lambda: search.parse_space(data.get("space")))
    searcher = check(lambda: _parse_searcher(data.get("searcher", "random")))
    metric = data.get("metric")
    if not isinstance(metric, str) or not METRIC_KEY.match(metric):
        problems.append(
            _fail(
                stored("metric names the reported value to optimize, e.g. loss"), code="invalid_metric", field="metric"
            )  # fmt: skip
        )
    direction = data.get("direction", "minimize")
    if direction not in search.DIRECTIONS:
        problems.append(_fail("direction is minimize or maximize", code="invalid_direction", field="direction"))
    max_trials = check(lambda: _whole(data, "max_trials", 16, 1, MAX_TRIALS))
    max_concurrent = check(lambda: _whole(data, "max_concurrent", 4, 1, MAX_TRIALS))
    rightsize = data.get("rightsize", "advise")
    if rightsize not in ("advise", "apply"):
        problems.append(_fail("rightsize is advise or apply", code="invalid_rightsize", field="rightsize"))
    template = data.get("template")
    if not isinstance(template, dict) or not template:
        problems.append(
            _fail(
                stored("template is the trial's job (queue, spec, image, command, ...)"),
                code="invalid_template",
                field="template",
            )  # fmt: skip
        )
        template = None
    elif "name" in template and not isinstance(template["name"], str):
        problems.append(_fail("the template's name is text", code="invalid", field="template.name"))
        template = None
    elif "team" in template and template["team"] != team.slug:
        problems.append(
            _fail("the template's team is the experiment's", code="invalid_template", field="template.team")
        )
    if problems:
        _raise(problems)
    assert params is not None and searcher is not None and template is not None
    names = {p.name for p in params}
    searcher_name, config, seed = searcher
    allowed = names | ({"max_steps"} if "max_steps" in config else set())
    unknown_placeholders = sorted(_placeholders(template) - allowed)
    if unknown_placeholders:
        raise _fail(
            stored("the template names %(names)s, which the search space does not define",
                   names=", ".join(f"{{{{{n}}}}}" for n in unknown_placeholders)),
            code="unknown_placeholder",
            field="template",
        )  # fmt: skip
    if searcher_name == "grid" and search.grid_size(params) > MAX_TRIALS:
        raise _fail(
            f"the grid has {search.grid_size(params)} points; at most {MAX_TRIALS}", code="grid_too_large",
            field="space",
        )  # fmt: skip
    experiment = Experiment(
        name=name.strip(),
        team=team,
        owner=user,
        template={k: v for k, v in template.items() if k != "team"},
        space=search.space_as_data(params),
        searcher=searcher_name,
        searcher_config=config,
        seed=seed,
        metric=metric,
        direction=direction,
        max_trials=max_trials,
        max_concurrent=min(max_concurrent, max_trials),
        rightsize=rightsize,
    )
    first = search.suggest(params, searcher=searcher_name, seed=seed, index=0)
    assert first is not None
    body = trial_body(experiment, number=1, params=first)
    try:
        from jobs.api import submission_check  # the submission API's own checks (types, sizes), then the service's

        submission_check(user=user, data=body)
        resolved = job_services.job_validate(user=user, data=body)
    except ValidationFailed as exc:
        _raise([_fail(e.detail, code=e.code, field=f"template.{e.field}" if e.field else "template")
                for e in getattr(exc, "errors", None) or [exc]])  # fmt: skip
    experiment.code_digest = resolved.fields.get("code_digest", "")
    experiment.save()
    log.info("experiment_created", experiment_id=str(experiment.id), team=team.slug, searcher=searcher_name)
    transaction.on_commit(lambda: _advance_soon(experiment.id), robust=True)
    return experiment


def _raise(problems: list[ValidationFailed]) -> None:
    if len(problems) == 1:
        raise problems[0]
    raise ValidationErrors(problems)


def _advance_soon(experiment_id) -> None:
    from experiments.tasks import advance_experiment

    advance_experiment.delay(str(experiment_id))


# ------------------------------------------------------------------------------------------- the periodic pass


def live_experiment_ids() -> list:
    """Experiments with work left: running or paused, or ended with trials whose jobs are still stopping."""
    return list(
        Experiment.objects.filter(
            Q(state__in=[Experiment.State.RUNNING, Experiment.State.PAUSED]) | Q(trials__state=Trial.State.ACTIVE)
        )
        .distinct()
        .values_list("id", flat=True)
    )


def experiments_advance() -> dict[str, int]:
    """One pass over every live experiment (the beat's `experiments.advance`)."""
    totals = {"experiments": 0, "submitted": 0, "stopped": 0, "ended": 0}
    for experiment_id in live_experiment_ids():
        with transaction.atomic(durable=True):
            done = experiment_advance(experiment_id=experiment_id)
        totals["experiments"] += 1
        for key in ("submitted", "stopped", "ended"):
            totals[key] += done.get(key, 0)
    return totals


def experiment_advance(*, experiment_id) -> dict[str, int]:
    """Fold each trial's new metric rows and job state in, stop what the searcher stops, submit what it may, and
    end the experiment when nothing is left. A pass already running on this experiment is left alone."""
    done = {"submitted": 0, "stopped": 0, "ended": 0}
    with transaction.atomic():
        experiment = (
            Experiment.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("team", "owner")
            .filter(pk=experiment_id)
            .first()
        )
        if experiment is None:
            return done
        trials = list(experiment.trials.select_related("job").order_by("number"))
        before = {t.pk: _snapshot(t) for t in trials}
        _fold_metrics(experiment, trials)
        for trial in trials:
            if trial.state == Trial.State.ACTIVE and trial.job.state in TERMINAL:
                _settle(trial)
                done["ended"] += 1
        if experiment.searcher == Experiment.Searcher.ADAPTIVE:
            done["stopped"] = _early_stops(experiment, trials)
        _rightsize(experiment, trials)
        if experiment.state == Experiment.State.RUNNING:
            done["submitted"] = _submit_more(experiment, trials)
        if experiment.state == Experiment.State.RUNNING and not any(t.state == Trial.State.ACTIVE for t in trials):
            exhausted = _next_params(experiment, len(trials)) is None
            if (len(trials) >= experiment.max_trials or exhausted) and not _logs_unread(trials):
                experiment.state = Experiment.State.COMPLETED
                experiment.finished_at = timezone.now()
                log.info("experiment_completed", experiment_id=str(experiment.id), trials=len(trials))
        for trial in trials:
            if trial.pk not in before or _snapshot(trial) != before[trial.pk]:
                trial.save()  # only what this pass changed: a long experiment's ended trials stay untouched
        experiment.save()
    return done


def _logs_unread(trials: list[Trial]) -> bool:
    """Whether an ended trial's log may still hold metric lines the scan has not stored: a job's last line comes
    just before it ends, and the scan reads an attempt's log until it is closed and read to its end (or 15
    minutes have passed), so completing the experiment before that would freeze its summary one step short."""
    recent = timezone.now() - timedelta(minutes=15)
    ended = [t.job_id for t in trials if t.ended_at is not None and t.ended_at >= recent]
    if not ended:
        return False
    return Attempt.objects.filter(job_id__in=ended, ended_at__gte=recent).exclude(metric_cursor__done=True).exists()


def _snapshot(trial: Trial) -> tuple:
    return (trial.state, trial.job_id, trial.stop_reason, trial.metric_cursor, len(trial.curve), repr(trial.rungs),
            trial.gpu_seconds, tuple(trial.earlier_jobs))  # fmt: skip


def _fold_metrics(experiment: Experiment, trials: list[Trial]) -> None:
    """The metric rows reported since each trial's cursor, read in one query for the whole experiment."""
    from monitoring.models import BusinessMetric

    # The metric scan reads an attempt's log until 15 minutes after it ended (monitoring.services.business): a
    # trial ended before that has every row it will ever have.
    settled = timezone.now() - timedelta(minutes=20)
    trials = [t for t in trials if t.ended_at is None or t.ended_at >= settled]
    if not trials:
        return
    owner: dict[str, Trial] = {}
    for trial in trials:
        for job_id in (str(trial.job_id), *trial.earlier_jobs):
            owner[job_id] = trial
    rows = (
        BusinessMetric.objects.filter(
            job_id__in=list(owner), id__gt=min(t.metric_cursor for t in trials), values__has_key=experiment.metric
        )
        .order_by("id")
        .values_list("id", "job_id", "step", "values")
    )
    by_trial: dict[int, list[tuple]] = {}
    for row_id, job_id, step, values in rows:
        trial = owner[str(job_id)]
        if row_id > trial.metric_cursor:
            by_trial.setdefault(trial.pk, []).append((row_id, step, values))
    for trial in trials:
        if trial.pk in by_trial:
            _fold_rows(experiment, trial, by_trial[trial.pk])


def _fold_rows(experiment: Experiment, trial: Trial, rows: list[tuple]) -> None:
    curve = list(trial.curve)
    for row_id, step, values in rows:
        value = values.get(experiment.metric)
        trial.metric_cursor = row_id
        if not isinstance(value, int | float):
            continue
        step = step if step is not None else (curve[-1][0] + 1 if curve else 1)
        curve.append([step, float(value)])
        if trial.best_value is None or search.better(value, trial.best_value, experiment.direction):
            trial.best_value, trial.best_step = float(value), step
        trial.last_value, trial.last_step = float(value), step
    if len(curve) > MAX_CURVE_POINTS:
        curve = curve[: -MAX_CURVE_POINTS // 2 : 2] + curve[-MAX_CURVE_POINTS // 2 :]
    trial.curve = curve


def _gpu_seconds(job: Job) -> float:
    if job.started_at is None or job.finished_at is None:
        return 0.0
    ran = max(0.0, (job.finished_at - job.started_at).total_seconds())
    return ran * job.gpu_count * job.replicas * job.gpu_milli / 1000


def _settle(trial: Trial) -> None:
    job = trial.job
    if job.state == JobState.SUCCEEDED:
        trial.state = Trial.State.COMPLETED
    elif job.state == JobState.CANCELLED and trial.stop_reason == STOPPED_EARLY:
        trial.state = Trial.State.STOPPED_EARLY
    elif job.state == JobState.CANCELLED and trial.stop_reason == PAUSED:
        trial.state = Trial.State.PAUSED
    elif job.state == JobState.CANCELLED:
        trial.state = Trial.State.CANCELLED
    elif job.state == JobState.TIMED_OUT:
        trial.state = Trial.State.TIMED_OUT
    else:
        trial.state = Trial.State.FAILED
    trial.gpu_seconds += _gpu_seconds(job)
    trial.ended_at = job.finished_at
    log.info("trial_ended", experiment_id=str(trial.experiment_id), trial=trial.number, state=trial.state)


def _early_stops(experiment: Experiment, trials: list[Trial]) -> int:
    """Record each trial's value at every rung it reached; stop the active ones outside the rung's best share."""
    adaptive = search.Adaptive(**experiment.searcher_config)
    stopped = 0
    at_rung: dict[str, list[float]] = {}
    for trial in trials:
        for rung, value in trial.rungs.items():
            at_rung.setdefault(rung, []).append(value)
    for trial in trials:
        if trial.stop_reason:
            continue
        points = [(int(s), v) for s, v in trial.curve]
        for rung in adaptive.rungs():
            key = str(rung)
            if key in trial.rungs:
                continue
            value = search.value_at_rung(points, rung)
            if value is None:
                break
            trial.rungs = {**trial.rungs, key: value}
            at_rung.setdefault(key, []).append(value)
            if trial.state != Trial.State.ACTIVE or trial.job.state in TERMINAL:
                continue
            if not search.asha_keep(value, at_rung[key], direction=experiment.direction,
                                    reduction=adaptive.reduction):  # fmt: skip
                _stop(trial, reason=STOPPED_EARLY, message=stored(
                    "stopped early by the experiment's searcher: %(metric)s %(value)s at step %(step)s is outside "
                    "the best 1/%(n)s of the trials that reached that step",
                    metric=experiment.metric, value=f"{value:.6g}", step=rung, n=adaptive.reduction))  # fmt: skip
                stopped += 1
                break
    return stopped


def _stop(trial: Trial, *, reason: str, message: str) -> None:
    trial.stop_reason = reason
    try:
        trial.job = lifecycle.job_cancel(job_id=trial.job_id, actor="experiment", reason=reason, message=message)
    except InvalidTransition:
        trial.stop_reason = ""  # it ended on its own first; the next pass settles it from its job


def _next_params(experiment: Experiment, index: int) -> dict[str, Any] | None:
    params = search.parse_space(experiment.space)
    return search.suggest(params, searcher=experiment.searcher, seed=experiment.seed, index=index)


def _submit_more(experiment: Experiment, trials: list[Trial]) -> int:
    """Resume paused trials first, then start new ones, while fewer than max_concurrent are active."""
    active = sum(1 for t in trials if t.state == Trial.State.ACTIVE)
    submitted = 0
    for trial in [t for t in trials if t.state == Trial.State.PAUSED]:
        if active >= experiment.max_concurrent:
            return submitted
        if not _resubmit(experiment, trial):
            return submitted
        active += 1
        submitted += 1
    while active < experiment.max_concurrent and len(trials) < experiment.max_trials:
        params = _next_params(experiment, len(trials))
        if params is None:
            break
        number = len(trials) + 1
        job = _submit_job(experiment, trial_body(experiment, number=number, params=params))
        if job is None:
            break
        trials.append(Trial.objects.create(experiment=experiment, number=number, params=params, job=job))
        active += 1
        submitted += 1
    return submitted


def _submit_job(experiment: Experiment, body: dict[str, Any]) -> Job | None:
    """Submit one trial's job as the owner; a body that no longer validates fails the experiment (message)."""
    try:
        with transaction.atomic():
            job, _ = job_services.job_submit(user=experiment.owner, data=body)
        return job
    except (ValidationFailed, NotFound) as exc:
        experiment.state = Experiment.State.FAILED
        experiment.finished_at = timezone.now()
        experiment.message = stored("a trial could not be submitted: %(detail)s", detail=exc.detail)
        log.warning("experiment_failed", experiment_id=str(experiment.id), code=exc.code)
        return None


def _resubmit(experiment: Experiment, trial: Trial) -> bool:
    """A paused trial runs again in a new job, from its latest checkpoint when it saved one (else from scratch,
    and its curve starts over)."""
    body = trial_body(experiment, number=trial.number, params=trial.params)
    if checkpoints.latest(trial.job_id) is not None:
        body["resume_from"] = str(trial.job_id)
    else:
        trial.curve, trial.rungs, trial.best_value, trial.best_step = [], {}, None, None
        trial.last_value = trial.last_step = None
    job = _submit_job(experiment, body)
    if job is None:
        return False
    trial.earlier_jobs = [*trial.earlier_jobs, str(trial.job_id)]
    trial.job = job
    trial.state = Trial.State.ACTIVE
    trial.stop_reason = ""
    trial.ended_at = None
    return True


def _rightsize(experiment: Experiment, trials: list[Trial]) -> None:
    """Once `TRAINYARD_EXPERIMENT_RIGHTSIZE_AFTER` trials have a final usage profile, what they used says what the
    next trials need (monitoring's right-sizing, with the experiment's trials as the evidence)."""
    from monitoring.selectors import recommendation_among

    ended = [t.job for t in trials if t.state != Trial.State.ACTIVE]
    if len(ended) < settings.TRAINYARD_EXPERIMENT_RIGHTSIZE_AFTER:
        return
    evidence = ended[-settings.TRAINYARD_RIGHTSIZE_HISTORY :]
    known = experiment.recommendation.get("based_on") if experiment.recommendation else None
    if known is not None and set(known) >= {str(j.pk) for j in evidence}:
        return
    rec = recommendation_among(trials[0].job, evidence)
    if rec is not None and len(rec.get("based_on") or []) >= settings.TRAINYARD_EXPERIMENT_RIGHTSIZE_AFTER:
        experiment.recommendation = rec


# --------------------------------------------------------------------------------------------- user commands


def _locked(experiment_id) -> Experiment:
    experiment = (
        Experiment.objects.select_for_update(of=("self",)).select_related("team").filter(pk=experiment_id).first()
    )
    if experiment is None:
        raise NotFound("experiment not found", code="unknown_experiment")
    return experiment


def _ended(experiment: Experiment, verb: str) -> Conflict:
    return Conflict(
        stored("the experiment is %(state)s; it cannot be %(verb)s", state=experiment.state, verb=verb),
        code="experiment_not_live",
    )


def experiment_pause(*, experiment_id, actor: str) -> Experiment:
    """Stop its active trials (their checkpoints are kept) and submit no new ones until resumed."""
    with transaction.atomic():
        experiment = _locked(experiment_id)
        if experiment.state == Experiment.State.PAUSED:
            return experiment
        if experiment.state != Experiment.State.RUNNING:
            raise _ended(experiment, "paused")
        for trial in experiment.trials.filter(state=Trial.State.ACTIVE).select_related("job"):
            _stop(trial, reason=PAUSED, message=stored("paused with its experiment by %(who)s", who=actor))
            trial.save()
        experiment.state = Experiment.State.PAUSED
        experiment.save()
    log.info("experiment_paused", experiment_id=str(experiment_id), actor=actor)
    return experiment


def experiment_resume(*, experiment_id, actor: str) -> Experiment:
    """Run again: the next pass resubmits the paused trials (from their checkpoints) and goes on searching."""
    with transaction.atomic():
        experiment = _locked(experiment_id)
        if experiment.state == Experiment.State.RUNNING:
            return experiment
        if experiment.state != Experiment.State.PAUSED:
            raise _ended(experiment, "resumed")
        experiment.state = Experiment.State.RUNNING
        experiment.save()
    transaction.on_commit(lambda: _advance_soon(experiment_id), robust=True)
    log.info("experiment_resumed", experiment_id=str(experiment_id), actor=actor)
    return experiment


def experiment_cancel(*, experiment_id, actor: str) -> Experiment:
    """Cancel every active trial and end the experiment (`cancelled`); finished trials and their results stay."""
    with transaction.atomic():
        experiment = _locked(experiment_id)
        if experiment.state == Experiment.State.CANCELLED:
            return experiment
        if not experiment.is_live:
            raise _ended(experiment, "cancelled")
        for trial in experiment.trials.filter(state=Trial.State.ACTIVE).select_related("job"):
            _stop(trial, reason=CANCELLED, message=stored("cancelled with its experiment by %(who)s", who=actor))
            trial.save()
        experiment.trials.filter(state=Trial.State.PAUSED).update(state=Trial.State.CANCELLED)
        experiment.state = Experiment.State.CANCELLED
        experiment.finished_at = timezone.now()
        experiment.save()
    log.info("experiment_cancelled", experiment_id=str(experiment_id), actor=actor)
    return experiment


def experiment_rerun_best(*, experiment_id, user, max_steps: int | None = None) -> Job:
    """Submit the best trial's parameters again as a new job (not a trial), with `{{max_steps}}` set to
    `max_steps` when given; labelled `experiment=<id>`, `rerun-of-trial=<n>`."""
    from experiments.selectors import best_trial

    experiment = Experiment.objects.select_related("team").filter(pk=experiment_id).first()
    if experiment is None:
        raise NotFound("experiment not found", code="unknown_experiment")
    best = best_trial(experiment)
    if best is None:
        raise Conflict(stored("no trial has reported the metric yet"), code="no_best_trial")
    if max_steps is not None and "max_steps" not in _placeholders(experiment.template):
        raise ValidationFailed(
            stored("the template has no {{max_steps}} placeholder, so the number of steps cannot be changed"),
            code="no_steps_placeholder",
            field="max_steps",
        )
    body = trial_body(experiment, number=best.number, params=best.params, max_steps=max_steps)
    body["name"] = f"{experiment.name}-best-t{best.number}"[:120]
    body["labels"] = {"experiment": str(experiment.id), "rerun-of-trial": str(best.number)}
    job, _ = job_services.job_submit(user=user, data=body)
    return job
