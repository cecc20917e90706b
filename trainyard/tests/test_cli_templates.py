"""`trainyard submit --template NAME`, `trainyard templates` and the 8-character job ids the portal shows,
against a live server."""

import json

import pytest

from jobs import services
from jobs.models import Job, JobTemplate
from jobs.tests.conftest import platform  # noqa: F401 - the seeded platform fixture
from quotas.models import Team
from quotas.tests.factories import MembershipFactory, TeamFactory
from trainyard.tests.test_cli import cli, write  # noqa: F401 - the CLI fixture

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def baseline(platform):  # noqa: F811
    return services.template_create(
        user=platform,
        team_slug="demo",
        name="baseline",
        description="the usual run",
        body={
            "queue": "train",
            "spec": "shared",
            "image": "python-3.11",
            "command": "python train.py",
            "env": {"A": "1"},
        },
    )


def test_submit_from_a_template_with_overrides_from_a_file(cli, baseline, tmp_path):  # noqa: F811
    listed = cli("templates")
    assert listed.code == 0 and "baseline" in listed.out and "python train.py" in listed.out
    plain = cli("submit", "--template", "baseline")
    assert plain.code == 0, plain.err
    job = Job.objects.get(pk=plain.out.strip())
    assert job.labels == {"template": "baseline"} and job.env == {"A": "1"}
    changed = cli("submit", "--template", "baseline", write(tmp_path, "env: {B: '2'}\ntimeout_s: 900\n"), "--json")
    assert changed.code == 0, changed.err
    job = Job.objects.get(pk=json.loads(changed.out)["id"])
    assert job.env == {"A": "1", "B": "2"} and job.timeout_s == 900


def test_template_errors_are_one_clear_line(cli, baseline, tmp_path, platform):  # noqa: F811
    missing = cli("submit", "--template", "nope")
    assert missing.code == 4 and "no template named 'nope' in your teams (templates: demo/baseline)" in missing.err
    bad = cli("submit", "--template", "baseline", write(tmp_path, "queue: nope\n"))
    assert bad.code == 4 and "job.yaml:1: queue:" in bad.err and "unknown_queue" in bad.err
    # the same name in two of the user's teams: the CLI asks for --team
    second = TeamFactory(slug="second")
    MembershipFactory(team=second, user=platform)
    for queue in Team.objects.get(slug="demo").queues.all():
        queue.teams.add(second)
    services.template_create(
        user=platform, team_slug="second", name="baseline", body={**JobTemplate.objects.get().body}
    )
    ambiguous = cli("submit", "--template", "baseline")
    assert ambiguous.code == 4 and "add --team" in ambiguous.err
    chosen = cli("submit", "--template", "baseline", "--team", "second")
    assert chosen.code == 0, chosen.err
    assert Job.objects.get(pk=chosen.out.strip()).team.slug == "second"


def test_short_job_ids_work_like_full_ones(cli, platform):  # noqa: F811
    job, _ = services.job_submit(
        user=platform,
        data={"team": "demo", "queue": "train", "spec": "shared", "image": "python-3.11", "command": "sleep 60"},
    )
    short = str(job.id)[:8]
    status = cli("status", short)
    assert status.code == 0 and str(job.id) in status.out
    cancelled = cli("cancel", short.upper())
    assert cancelled.code == 0 and f"job {job.id} cancelled" in cancelled.err
    unknown = cli("status", "00000000")
    assert unknown.code == 4 and "no job id starts with 00000000" in unknown.err
    too_short = cli("status", "abc")
    assert too_short.code == 4 and "is not a job id" in too_short.err


def test_tokens_list_create_and_revoke_by_the_portal_id(cli, platform, monkeypatch):  # noqa: F811
    from quotas.models import ApiToken
    from quotas.tokens import token_create

    refused = cli("tokens")  # the fixture's token has read and submit only
    assert refused.code == 5 and "admin" in refused.err
    admin, raw = token_create(user=platform, name="admin-ci", scopes=["read", "submit", "admin"])
    monkeypatch.setenv("TRAINYARD_TOKEN", raw)
    created = cli("tokens", "create", "nightly", "--scope", "read", "--expires-days", "7")
    assert created.code == 0, created.err
    new = ApiToken.objects.get(name="nightly")
    assert created.out.strip().startswith(f"ty_{new.prefix}_") and new.scopes == ["read"]
    listed = cli("tokens")
    assert listed.code == 0 and new.prefix in listed.out and "nightly" in listed.out and "active" in listed.out
    revoked = cli("tokens", "revoke", new.prefix)
    assert revoked.code == 0, revoked.err
    new.refresh_from_db()
    assert new.revoked_at is not None
    assert "revoked" in cli("tokens").out
    missing = cli("tokens", "revoke", "00000000")
    assert missing.code == 4 and "no token of yours has the id" in missing.err
