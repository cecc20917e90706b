"""Right-sizing's lookup of earlier runs at submission: the same runs as the plain query over the whole history
(same image and command, or same labels; the user's or the team's; newest first), read through the indexes kept
for it, so that the rows PostgreSQL visits do not grow with the team's history."""

import json
import random
import uuid
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Q
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs import services as jobs
from jobs.models import Job, written_fields
from monitoring.selectors import similar_runs
from quotas.models import Membership, Team

pytestmark = [pytest.mark.django_db]

COMMANDS = [["python3", "train.py"], ["python3", "train.py", "--big"], ["python3", "eval.py"]]
ARGS = [[], ["--lr", "0.1"]]
LABELS = [{}, {"project": "vision"}, {"project": "speech"}]
IMAGES = ["python-3.11", "pytorch-2.5-cuda12.4"]


def submitted(user, **extra):
    data = {"team": "demo", "queue": "train", "spec": "guaranteed", "image": "python-3.11", "command": ["true"]}
    job, _ = jobs.job_submit(user=user, data={**data, **extra})
    return job


def history(template, owners, n, rng, images=(), **fixed):
    """`n` succeeded copies of `template` over the last 30 days, each with a command, arguments, labels, image
    reference (of `images`, else the template's) and owner drawn from the lists above (or `fixed`).

    The drawn values are made here; the rows are made in the database by one INSERT … SELECT from the template's
    row (building 14,000 objects for bulk_create took most of the long-history test's minute)."""
    now = timezone.now()
    drawn = []
    for _ in range(n):
        row = {"id": uuid.uuid4(), "idempotency_key": None, "state": "succeeded", "reserved": False, "reason": ""}
        row["command"], row["args"], row["labels"] = rng.choice(COMMANDS), rng.choice(ARGS), rng.choice(LABELS)
        row["image_reference"] = rng.choice(images) if images else template.image_reference
        row["owner"] = rng.choice(owners)
        row["finished_at"] = now - timedelta(seconds=rng.uniform(60, 30 * 86400))
        row.update(fixed)
        drawn.append(row)
    if not drawn:
        return
    quote = connection.ops.quote_name
    varying = [Job._meta.get_field(name) for name in drawn[0]]
    arrays = [[_as_text(field, row[field.name]) for row in drawn] for field in varying]
    kept = [f for f in written_fields(Job) if f not in varying and f.name != "submitted_at"]
    chosen = ", ".join(f"v.c{i}::{field.db_type(connection)}" for i, field in enumerate(varying))
    names = ", ".join(quote(f.column) for f in [*varying, *kept])
    copied = ", ".join(quote(f.column) for f in kept)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO jobs_job (submitted_at, {names}) SELECT now(), {chosen}, {copied} "
            f"FROM jobs_job, unnest({', '.join(['%s::text[]'] * len(arrays))}) "
            f"AS v({', '.join(f'c{i}' for i in range(len(arrays)))}) WHERE jobs_job.id = %s",
            [*arrays, template.pk],
        )


def _as_text(field, value):
    """A drawn value as PostgreSQL's text for the field's column (cast back in the INSERT)."""
    if value is None:
        return None
    if field.is_relation:
        return str(getattr(value, "pk", value))
    if field.get_internal_type() == "JSONField":
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


def the_plain_query(job, *, owner_only, limit):
    """What the lookup answered before it had indexes: one OR over the whole history, newest first."""
    qs = Job.objects.filter(team_id=job.team_id, state="succeeded", image_reference=job.image_reference).exclude(
        pk=job.pk
    )
    same = Q(command=job.command, args=job.args)
    if job.labels:
        same |= Q(labels=job.labels)
    if owner_only:
        qs = qs.filter(owner_id=job.owner_id)
    return [j.pk for j in qs.filter(same).order_by("-finished_at")[:limit]]


@pytest.fixture
def teammate(db_platform):
    mate = get_user_model().objects.create_user(username="mate", password="x-pass-123456")
    Membership.objects.create(user=mate, team=Team.objects.get(slug="demo"), role="member")
    return mate


def test_a_job_is_found_once_it_succeeds_whichever_way_its_row_got_there(db_platform):
    """The lookup's table is filled by the database: a job that becomes succeeded by an update (as every job that
    runs does) or is inserted succeeded (a copy) is found; a running or failed one is not; a deleted one goes."""
    from jobs.models import SucceededRun

    template = submitted(db_platform, command=["python3", "fit.py"], labels={"project": "fit"})
    ran = submitted(db_platform, command=["python3", "fit.py"])
    failed = submitted(db_platform, command=["python3", "fit.py"])
    Job.objects.filter(pk=failed.pk).update(state="failed", finished_at=timezone.now())
    assert similar_runs(template, owner_only=False, limit=10) == []
    Job.objects.filter(pk=ran.pk).update(state="running")
    assert similar_runs(template, owner_only=False, limit=10) == []
    Job.objects.filter(pk=ran.pk).update(state="succeeded", finished_at=timezone.now())
    history(template, [db_platform], 1, random.Random(1), command=["python3", "fit.py"], args=[], labels={})
    found = similar_runs(template, owner_only=True, limit=10)
    assert len(found) == 2 and ran.pk in {j.pk for j in found}
    assert SucceededRun.objects.count() == 2
    Job.objects.filter(pk=ran.pk).delete()
    assert SucceededRun.objects.count() == 1 and len(similar_runs(template, owner_only=False, limit=10)) == 1


def test_a_run_whose_key_matches_but_whose_values_differ_is_not_found(db_platform):
    """The keys are md5s: two commands (or label sets) could share one. A run whose stored key is the probe's but
    whose own values differ is not evidence for it."""
    from jobs.models import SucceededRun

    template = submitted(db_platform, command=["python3", "fit.py"], labels={"project": "fit"})
    history(template, [db_platform], 2, random.Random(3), command=["python3", "other.py"], args=[], labels={"x": "y"})
    probe = submitted(db_platform, command=["python3", "fit.py"], labels={"project": "fit"})
    assert similar_runs(probe, owner_only=False, limit=10) == []
    with connection.cursor() as cursor:  # a collision in both keys, made by hand
        cursor.execute(
            "UPDATE jobs_succeededrun SET command_key = md5((%s::jsonb)::text || (%s::jsonb)::text), "
            "labels_key = md5((%s::jsonb)::text)",
            [json.dumps(probe.command), json.dumps(probe.args), json.dumps(probe.labels)],
        )
        cursor.execute(
            "SELECT count(*) FROM jobs_succeededrun WHERE command_key = md5((%s::jsonb)::text || (%s::jsonb)::text)",
            [json.dumps(probe.command), json.dumps(probe.args)],
        )
        assert cursor.fetchone()[0] == SucceededRun.objects.count() == 2
    assert similar_runs(probe, owner_only=False, limit=10) == []
    assert similar_runs(probe, owner_only=True, limit=10) == []


def test_the_runs_found_are_those_of_the_plain_query(db_platform, teammate):
    rng = random.Random(5)
    template = submitted(db_platform)
    references = [submitted(db_platform, image=image).image_reference for image in IMAGES]
    assert len(set(references)) == 2
    history(template, [db_platform, teammate], 600, rng, images=references)
    probes = [
        submitted(db_platform, image=image, command=command, args=args, labels=labels)
        for image in IMAGES
        for command in COMMANDS[:2]
        for args in ARGS
        for labels in LABELS
    ]
    probes.append(submitted(db_platform, command=["python3", "never-ran.py"], labels={"project": "vision"}))
    probes.append(submitted(db_platform, command=["python3", "never-ran.py"]))
    sizes = []
    for probe in probes:
        for owner_only in (True, False):
            for limit in (1, 10, 50):
                found = [j.pk for j in similar_runs(probe, owner_only=owner_only, limit=limit)]
                sizes.append(len(found))
                assert found == the_plain_query(probe, owner_only=owner_only, limit=limit), (
                    probe.command,
                    probe.args,
                    probe.labels,
                    owner_only,
                    limit,
                )
    assert sizes.count(50) > 10 and 0 < sizes.count(0) < len(sizes) / 4  # most probes have history, a few none
    # The probes' own team only: another team's identical runs are not evidence.
    other = Team.objects.create(slug="other", name="Other", namespace="other")
    same = {k: getattr(probes[0], k) for k in ("command", "args", "labels", "image_reference")}
    history(template, [db_platform], 20, rng, team=other, **same)
    for owner_only in (True, False):
        found = similar_runs(probes[0], owner_only=owner_only, limit=50)
        teams = set(Job.objects.filter(pk__in=[j.pk for j in found]).values_list("team_id", flat=True))
        assert found and teams == {probes[0].team_id}


@contextmanager
def statements():
    """Each (sql, params) sent while the block runs (the lookup's statement is prepared, so Django's captured text
    holds placeholders, not values)."""
    sent = []

    def keep(execute, sql, params, many, context):
        sent.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(keep):
        yield sent


def plans_of(sent):
    """EXPLAIN (ANALYZE) of each SELECT the lookup sent, as PostgreSQL's JSON plans."""
    plans = []
    with connection.cursor() as cursor:
        for sql, params in sent:
            if sql.lstrip("(").startswith("SELECT"):
                cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
                raw = cursor.fetchone()[0]
                plans.append((json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"])
    return plans


def nodes(plan):
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


@pytest.mark.parametrize("owner_only", [True, False])
def test_the_lookup_visits_a_few_rows_of_a_long_history(db_platform, teammate, owner_only):
    """12,000 succeeded runs of the same image in the team, most of them other commands, and 2,000 of the rare
    command by the teammate: each lookup is an index scan on its own index that stops after the rows it returns
    (the user's 3 runs, or the team's newest 10), whatever lies behind them."""
    rng = random.Random(9)
    template = submitted(db_platform)
    history(template, [db_platform, teammate], 12_000, rng)
    rare = ["python3", "rare.py"]
    common = {"command": rare, "args": [], "labels": {}}
    history(template, [teammate], 2_000, rng, **common)
    history(template, [db_platform], 3, rng, **common)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobs_job")
        cursor.execute("ANALYZE jobs_succeededrun")
    probe = submitted(db_platform, command=rare, labels={"project": "rare"})
    with statements() as sent:
        found = similar_runs(probe, owner_only=owner_only, limit=10)
    assert len(found) == (3 if owner_only else 10)
    commands = Job.objects.filter(pk__in=[j.pk for j in found]).values_list("command", flat=True)
    assert list(commands) == [rare] * len(found)
    assert not owner_only or all(j.owner_id == db_platform.pk for j in found)
    plans = plans_of(sent)
    assert len(plans) == 1  # one statement: the two likenesses (the command, the labels) side by side
    used = set()
    for plan in plans:
        # The runs and their profiles by index (jobs_attempt, empty here, is only reached for a run with a profile).
        looked_up = ("jobs_succeededrun", "jobs_job", "monitoring_usageprofile")
        scans = [n for n in nodes(plan) if n["Node Type"] in ("Seq Scan", "Bitmap Heap Scan")]
        assert not [n for n in scans if n.get("Relation Name") in looked_up], json.dumps(plan)
        scans = [n for n in nodes(plan) if n.get("Relation Name") == "jobs_succeededrun"]
        assert len(scans) == 2 and all("Index Name" in n for n in scans), json.dumps(plan)
        for scan in scans:
            assert scan["Actual Rows"] + scan.get("Rows Removed by Filter", 0) <= 10, json.dumps(scan)
            used.add(scan["Index Name"])
        # Then only the rows found, from jobs_job by its primary key.
        rows = [n for n in nodes(plan) if n.get("Relation Name") == "jobs_job"]
        assert rows and all(n.get("Index Name") == "jobs_job_pkey" for n in rows), json.dumps(plan)
        assert all(n["Actual Rows"] <= 1 for n in rows), json.dumps(plan)
    # The command's runs through the index of the scope asked for (the teammate's 2,000 would fill the other's
    # first entries); the labels, which no run has, through either.
    scope = "user" if owner_only else "team"
    assert f"succeeded_command_{scope}" in used and all(name.startswith("succeeded_") for name in used), used


def test_the_recommendation_weighs_the_users_own_runs_first_and_asks_once_when_the_team_has_none(
    db_platform, teammate, monkeypatch
):
    """The user's runs when there are any (even older than the team's newest), else the team's; a command the
    team never ran costs one lookup, not one per scope, and the usage profiles of both scopes are one read."""
    from monitoring import selectors

    seen = []
    monkeypatch.setattr(selectors, "_runs_of", lambda jobs: seen.append([j.owner_id for j in jobs]) or [])
    rng = random.Random(3)
    template = submitted(db_platform)
    cmd = {"command": ["python3", "sweep.py"], "args": [], "labels": {}}
    fresh = submitted(db_platform, command=["python3", "never.py"])
    with CaptureQueriesContext(connection) as captured:
        assert selectors.recommendation_for(fresh) is None
    assert len([q for q in captured if q["sql"].lstrip("(").startswith("SELECT")]) == 1 and seen == []

    history(template, [db_platform], 2, rng, **cmd)
    history(template, [teammate], 60, rng, **cmd)  # the team's newest runs are all the teammate's ...
    Job.objects.filter(owner=db_platform, command=cmd["command"]).update(
        finished_at=timezone.now() - timedelta(days=60)
    )  # ... and the user's own are older than every one of them
    probe = submitted(db_platform, **cmd)
    selectors.recommendation_for(probe)
    # One read of the usage profiles for both scopes: the user's own (older than every one of the team's newest,
    # found by the user's lookup) and the team's newest.
    assert seen == [[db_platform.pk] * 2 + [teammate.pk] * settings_history()]


def settings_history():
    from django.conf import settings

    return settings.TRAINYARD_RIGHTSIZE_HISTORY


def test_each_run_comes_with_the_profile_of_its_last_profiled_attempt(db_platform):
    """The lookup reads each run's usage evidence in the same statement: the final profile of its highest-numbered
    attempt that has GPU numbers, none for a run without one; right-sizing then reads no profile again."""
    from jobs.models import Attempt
    from monitoring import selectors
    from monitoring.models import UsageProfile

    rng = random.Random(5)
    template = submitted(db_platform)
    same = {"command": ["python3", "profiled.py"], "args": [], "labels": {}}
    history(template, [db_platform], 3, rng, **same)
    profiled, bare, no_gpu = Job.objects.filter(command=same["command"]).order_by("-finished_at")

    def profile(job, number, peak, final=True):
        attempt = Attempt.objects.create(
            job=job, number=number, backend="local", state="succeeded", ended_at=timezone.now()
        )
        UsageProfile.objects.create(
            attempt=attempt,
            job=job,
            final=final,
            samples=10,
            gpu_samples=10 if peak else 0,
            gpu_memory_peak_mib=peak,
            gpu_memory_p95_mib=peak and peak - 100,
            gpu_util_p95_pct=peak and 50.0,
        )

    profile(profiled, 1, 4000)
    profile(profiled, 2, 6000)
    profile(profiled, 3, 9000, final=False)  # not final: not evidence
    profile(no_gpu, 1, None)  # no GPU numbers
    probe = submitted(db_platform, **same)
    found = {j.pk: j for j in similar_runs(probe, owner_only=False, limit=10)}
    assert found[profiled.pk].profile == (6000, 5900, 50.0)
    assert found[bare.pk].profile is None and found[no_gpu.pk].profile is None
    with CaptureQueriesContext(connection) as captured:
        runs = selectors._runs_of(list(found.values()))
    assert [r.gpu_memory_peak_mib for r in runs] == [6000]
    assert not [q for q in captured if "monitoring_usageprofile" in q["sql"]]
