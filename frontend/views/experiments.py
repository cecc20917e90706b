"""Experiments: part of `frontend.views` (see its package docstring). The list, and the experiment page: best
trial, learning curves, HP-vs-metric scatter, parallel coordinates, the trials table (sortable by any parameter or
metric), compare the best N, run the best again, pause/resume/cancel."""

from __future__ import annotations

import re

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import urlencode
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from experiments import charts, selectors, services
from experiments.models import Experiment
from frontend.views.common import code_from_form
from kernel.errors import DomainError
from kernel.sentences import said
from monitoring.charts import PALETTE, Series, line_chart

OTHERS = tuple(c for c in PALETTE if c != charts.BEST)  # red is the best trial's alone
MAX_CURVES = 64  # the learning-curve chart draws this many trials (the best first)
MAX_DEFINITION_BYTES = 64 * 1024
CODE_FIELDS = ("code_archive", "code_git_url", "code_git_commit")
CARRIED_DIGEST = re.compile(r"sha256:[0-9a-f]{64}\Z")

EXAMPLE = """name: lr-sweep
team: {team}
template:
  queue: train
  spec: shared
  image: python-3.11
  command: python train.py --lr {{{{lr}}}} --steps {{{{max_steps}}}}
space:
  lr: {{type: log_uniform, min: 0.0001, max: 0.1}}
searcher: {{name: adaptive, max_steps: 27, min_steps: 3}}
metric: loss
direction: minimize
max_trials: 16
max_concurrent: 4
"""


def _experiment(request: HttpRequest, experiment_id) -> Experiment:
    experiment = selectors.experiments_visible_to(request.user).filter(pk=experiment_id).first()
    if experiment is None:
        raise Http404("no such experiment")
    return experiment


@login_required
def experiment_list(request: HttpRequest) -> HttpResponse:
    experiments = list(selectors.experiments_visible_to(request.user).prefetch_related("trials")[:200])
    rows = [{"experiment": e, "summary": selectors.summary(e, list(e.trials.all()))} for e in experiments]
    return render(request, "frontend/experiment_list.html", {"nav": "experiments", "rows": rows})


def _definition(request: HttpRequest) -> tuple[str, dict | None, list[dict]]:
    """The experiment file given on the form (pasted, or uploaded: the upload wins): its text, its fields, and what
    is wrong with it as (field, code, message) rows."""
    import yaml

    upload = request.FILES.get("file")
    raw = upload.read(MAX_DEFINITION_BYTES + 1) if upload is not None else request.POST.get("definition", "").encode()
    if len(raw) > MAX_DEFINITION_BYTES:
        message = _("An experiment file is at most %(n)s KiB.") % {"n": MAX_DEFINITION_BYTES // 1024}
        return "", None, [{"field": "file", "code": "experiment_file_too_large", "message": message}]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return (
            "",
            None,
            [{"field": "file", "code": "experiment_file_not_text", "message": _("The file is not UTF-8 text.")}],
        )
    try:
        data = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = (mark.line + 1) if mark is not None else "?"
        message = _("This is not valid YAML (line %(line)s).") % {"line": line}
        return text, None, [{"field": "definition", "code": "experiment_invalid_yaml", "message": message}]
    if not isinstance(data, dict):
        message = _("An experiment is a mapping of fields: name, team, template, space, searcher, metric, ...")
        return text, None, [{"field": "definition", "code": "invalid_experiment", "message": message}]
    return text, data, []


def _bring_code(request: HttpRequest, data: dict, *, carried: str) -> tuple[str, list[dict]]:
    """The code given on the form, as on the job form (`code_from_form`: an archive, or a git repository + commit
    the platform fetches), else the one an earlier try of this form brought (`carried`, its digest kept in the
    page): it takes the place of the file's `template.code`. Returns the digest to carry on and what is wrong. A
    `template.code` folder with no code on the form is refused: the portal cannot read the user's disk."""
    template = data.get("template")
    if not isinstance(template, dict):
        return carried, []  # the service says what a template is
    try:
        brought = code_from_form(request, team_slug=str(data.get("team") or ""))
    except DomainError as exc:
        field = {"code": "code_archive", "body": "code_archive"}.get(exc.field or "code", exc.field)
        return carried, [{"field": field, "code": exc.code, "message": said(exc.detail)}]
    if brought is not None:
        carried, ci = brought
        if ci and "ci" not in template:
            template["ci"] = ci
    if carried:
        template["code"] = carried
    code = template.get("code")
    if code is not None and not (isinstance(code, str) and code.startswith("sha256:")):
        message = _(
            "template.code names a folder on your machine, which the portal cannot read: upload an archive of it or "
            "name a git repository and commit below (they take its place), create the experiment with `trainyard "
            "experiment create`, which uploads it, or give the code snapshot's sha256 digest."
        )
        return carried, [{"field": "template.code", "code": "experiment_code_folder", "message": message}]
    return carried, []


@login_required
def experiment_create(request: HttpRequest) -> HttpResponse:
    """A new experiment from its YAML file (the same fields as `trainyard experiment create exp.yaml` and
    POST /api/v1/experiments/): every problem is listed with its field and code, the text kept to fix it."""
    from quotas import selectors as quota

    team = quota.visible_teams(request.user).order_by("name").first()
    text = EXAMPLE.format(team=team.slug if team else "your-team")
    errors: list[dict] = []
    code_digest = ""
    if request.method == "POST":
        text, data, errors = _definition(request)
        carried = request.POST.get("code_digest", "").strip()
        code_digest = carried if CARRIED_DIGEST.match(carried) else ""
        if not errors:
            code_digest, errors = _bring_code(request, data, carried=code_digest)
        if not errors:
            try:
                with transaction.atomic(durable=True):
                    experiment = services.experiment_create(user=request.user, data=data)
            except DomainError as exc:
                problems = getattr(exc, "errors", None) or [exc]
                errors = [{"field": p.field or "", "code": p.code, "message": said(p.detail)} for p in problems]
            else:
                messages.success(request, _("Experiment %(name)s created.") % {"name": experiment.name})
                return redirect("frontend:experiment-detail", experiment_id=experiment.id)
    response = render(
        request,
        "frontend/experiment_form.html",
        {
            "nav": "experiments",
            "definition": text,
            "errors": errors,
            "code_errors": {e["field"]: [e] for e in errors if e["field"] in CODE_FIELDS},
            "code_digest": code_digest,
        },
    )
    if errors:
        response.status_code = 400
    return response


@login_required
def experiment_detail(request: HttpRequest, experiment_id) -> HttpResponse:
    experiment = _experiment(request, experiment_id)
    trials = selectors.trials_of(experiment)
    key = request.GET.get("sort", "number")
    if key.lstrip("-") not in (*selectors.sort_keys(experiment), "metric"):
        key = "number"
    rows = [selectors.trial_row(experiment, t) for t in selectors.sort_trials(experiment, trials, key)]
    best = selectors.best_trial(experiment, trials)
    best_number = best.number if best else None
    ranked = selectors.sort_trials(
        experiment, [t for t in trials if t.best_value is not None],
        "best_value" if experiment.direction == "minimize" else "-best_value",
    )  # fmt: skip
    shown = ranked[:MAX_CURVES]
    curves = line_chart(
        _("%(metric)s by step, every trial") % {"metric": experiment.metric},
        [Series(f"#{t.number}", [(float(s), float(v)) for s, v in t.curve],
                colour=charts.BEST if t.number == best_number else OTHERS[t.number % len(OTHERS)])
         for t in reversed(shown)],
        time_axis=False, y_min=None, width=760, height=260,
    )  # fmt: skip
    plain = [selectors.trial_row(experiment, t) for t in trials]
    scatters = [charts.scatter(name, spec, plain, metric=experiment.metric, best=best_number)
                for name, spec in experiment.space.items()]  # fmt: skip
    parallel = charts.parallel(experiment.space, plain, metric=experiment.metric, best=best_number)
    n = 5
    compare_url = reverse("frontend:job-compare") + "?" + urlencode([("job", str(t.job_id)) for t in ranked[:n]])

    def sort_link(column: str) -> str:
        return "?" + urlencode({"sort": f"-{column}" if key == column else column})

    columns = [{"key": name, "label": name, "url": sort_link(name), "active": key.lstrip("-") == name,
                "descending": key.startswith("-")} for name in experiment.space]  # fmt: skip
    summary = selectors.summary(experiment, trials)
    context = {
        "nav": "experiments",
        "experiment": experiment,
        "summary": summary,
        "best": best,
        "rows": rows,
        "columns": columns,
        "sort": key,
        "sort_urls": {c: sort_link(c) for c in ("number", "state", "best_value", "last_step", "gpu_seconds")},
        "curves": curves,
        "scatters": scatters,
        "parallel": parallel,
        "compare_url": compare_url if ranked else "",
        "compare_n": min(n, len(ranked)),
        "has_steps": "max_steps" in services._placeholders(experiment.template),
        "max_steps": experiment.searcher_config.get("max_steps"),
        "csv_url": f"/api/v1/experiments/{experiment.id}/trials/csv/?" + urlencode({"sort": key}),
        "recommendation": experiment.recommendation or None,
    }
    return render(request, "frontend/experiment_detail.html", context)


@require_POST
@login_required
def experiment_command(request: HttpRequest, experiment_id, command: str) -> HttpResponse:
    experiment = _experiment(request, experiment_id)
    action = {"pause": services.experiment_pause, "resume": services.experiment_resume,
              "cancel": services.experiment_cancel}.get(command)  # fmt: skip
    if action is None:
        raise Http404("no such command")
    try:
        with transaction.atomic(durable=True):
            experiment = action(experiment_id=experiment.id, actor=request.user.username)
    except DomainError as exc:
        messages.error(request, _("Cannot do that: %(detail)s") % {"detail": said(exc.detail)})
    else:
        messages.success(request, _("The experiment is %(state)s.") % {"state": experiment.get_state_display()})
    return redirect("frontend:experiment-detail", experiment_id=experiment.id)


@require_POST
@login_required
def experiment_rerun(request: HttpRequest, experiment_id) -> HttpResponse:
    """Run the best trial's parameters again as a new job, with `{{max_steps}}` from the form when given."""
    experiment = _experiment(request, experiment_id)
    raw = request.POST.get("max_steps", "").strip()
    steps = None
    if raw:
        try:
            steps = int(raw)
        except ValueError:
            steps = 0
        if steps < 1:
            messages.error(request, _("Steps must be a whole number above zero."))
            return redirect("frontend:experiment-detail", experiment_id=experiment.id)
    try:
        with transaction.atomic(durable=True):
            job = services.experiment_rerun_best(experiment_id=experiment.id, user=request.user, max_steps=steps)
    except DomainError as exc:
        messages.error(request, _("Cannot run it again: %(detail)s") % {"detail": said(exc.detail)})
        return redirect("frontend:experiment-detail", experiment_id=experiment.id)
    messages.success(request, _("Submitted the best trial's parameters as a new job."))
    return redirect("frontend:job-detail", job_id=job.id)
