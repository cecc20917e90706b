"""The quota-use log (migration jobs/0027) against the job rows it summarises: after every kind of write a job row
gets (the ORM's save, bulk create, queryset update, raw SQL, delete), `quota_use` says exactly what summing the
holding jobs says, per (queue, team, owner); folding the log changes no sum; and a submission's first reason reads
only the log, never the holding jobs."""

import pytest
from django.db import connection
from django.db.models import Count, Sum

from jobs import services
from jobs.models import Job
from jobs.store import compact_quota_use, first_reason_of, quota_use
from jobs.tests.conftest import platform  # noqa: F401 - the seeded platform fixture
from quotas.models import Queue, Team
from scheduler import dispatch as scheduler

pytestmark = pytest.mark.django_db(transaction=True)
ONE_CARD = {"team": "demo", "queue": "train", "spec": "guaranteed", "image": "python-3.11", "timeout_s": 3600}


def _summed() -> dict:
    """What the holding jobs add up to, read from the job rows: the log must say the same."""
    rows = (
        Job.objects.filter(reserved=True, preemptible=False)
        .values("queue_id", "team_id", "owner_id")
        .annotate(
            g=Sum("total_gpu_milli"),
            gm=Sum("total_gpu_memory_mib"),
            c=Sum("total_cpu_milli"),
            m=Sum("total_memory_mib"),
            n=Count("id"),
        )
        .order_by()
    )
    return {
        (r["queue_id"], r["team_id"], r["owner_id"]): (
            {"gpu_milli": r["g"], "gpu_memory_mib": r["gm"], "cpu_milli": r["c"], "memory_mib": r["m"]},
            r["n"],
        )
        for r in rows
    }


def _logged() -> dict:
    return {(q, t, o): (used, n) for q, t, o, used, n in quota_use()}


def _jobs(user, n: int) -> list[Job]:
    return [
        services.job_submit(user=user, data={**ONE_CARD, "command": ["python", "train.py", str(k)]})[0]
        for k in range(n)
    ]


def test_the_log_agrees_with_the_job_rows_after_every_kind_of_write(platform):  # noqa: F811
    user = platform
    jobs = _jobs(user, 6)
    assert _logged() == _summed() == {}  # waiting jobs hold nothing

    Job.objects.filter(pk__in=[j.pk for j in jobs[:4]]).update(reserved=True)  # one statement, four rows
    assert _logged() == _summed() and sum(n for _, n in _logged().values()) == 4

    job = Job.objects.get(pk=jobs[0].pk)
    job.reserved = False  # a release through save()
    job.save()
    assert _logged() == _summed()

    Job.objects.filter(pk=jobs[1].pk).update(preemptible=True)  # a borrowing job holds no quota
    assert _logged() == _summed()

    other = Queue.objects.exclude(pk=jobs[2].queue_id).first()
    Job.objects.filter(pk=jobs[2].pk).update(queue=other)  # moved to another queue while holding
    assert _logged() == _summed() and any(key[0] == other.id for key in _logged())

    with connection.cursor() as cursor:  # raw SQL, as the dispatcher's admission writes
        cursor.execute(
            "UPDATE jobs_job SET reserved = true, total_cpu_milli = total_cpu_milli + 1000 WHERE id = ANY(%s)",
            [[jobs[4].id, jobs[5].id]],
        )
    assert _logged() == _summed()

    copy = Job.objects.get(pk=jobs[3].pk)
    copy.pk = None
    copy.name = "bulk-copy"
    Job.objects.bulk_create([copy])  # inserted already holding
    assert _logged() == _summed() and sum(n for _, n in _logged().values()) == 5

    Job.objects.filter(pk=copy.pk).delete()
    assert _logged() == _summed()

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM trainyard_quota_use")
        before = cursor.fetchone()[0]
    assert compact_quota_use(slack=0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM trainyard_quota_use")
        after = cursor.fetchone()[0]
    assert after == len(_summed()) < before  # one row per key, the sums unchanged
    assert _logged() == _summed()
    assert not compact_quota_use(slack=0)  # nothing left to fold

    Job.objects.filter(reserved=True).update(reserved=False)
    assert _logged() == _summed() == {}


def test_the_first_reason_reads_the_log_not_the_holding_jobs(platform, django_assert_max_num_queries):  # noqa: F811
    user = platform
    Team.objects.filter(slug="demo").update(gpu_milli=1000, max_running_jobs=10, max_jobs_per_user=10)
    held, waiting = _jobs(user, 2)
    Job.objects.filter(pk=held.pk).update(reserved=True)
    queue = Queue.objects.get(name="train")
    team = Team.objects.get(slug="demo")
    rules = scheduler.QueueRules(
        id=queue.id, name=queue.name, open=True, fifo=False, limit={k: int(getattr(queue, k)) for k in scheduler.VECTOR}
    )
    team_rules = scheduler.TeamRules(
        id=team.id,
        slug=team.slug,
        limit={k: int(getattr(team, k)) for k in scheduler.VECTOR},
        max_running_jobs=team.max_running_jobs,
        max_jobs_per_user=team.max_jobs_per_user,
    )
    from jobs.store import JobStore

    job = next(
        w for line in JobStore().backlog(queue_ids=[queue.id]).waiting.values() for w in line if w.id == waiting.id
    )
    with django_assert_max_num_queries(1) as captured:
        why = first_reason_of(job, rules, team_rules)
    assert why is not None and why[0] == scheduler.TEAM_QUOTA, why
    assert "trainyard_quota_use" in captured.captured_queries[0]["sql"]
    assert "jobs_job" not in captured.captured_queries[0]["sql"]
