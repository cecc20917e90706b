"""The portal's experiment pages through Django's test client: what a user reads and can do on them."""

import re
import tarfile

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from experiments import services
from experiments.models import Experiment, Trial
from experiments.tests.test_api import TEMPLATE, body
from jobs import services as job_services
from jobs.models import Job
from quotas.tests.factories import MembershipFactory, TeamFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def demo(settings):
    settings.TRAINYARD_BACKEND = "local"
    settings.TRAINYARD_LOCAL_GPUS = "4x24GiB"
    from django.contrib.auth import get_user_model

    from ops.seed import seed

    seed(admin_password="admin-pass-123", demo_password="demo-pass-123")
    return get_user_model().objects.get(username="demo")


@pytest.fixture
def experiment(demo):
    data = body(template={**TEMPLATE, "command": "python train.py --lr {{lr}} --opt {{opt}} --steps {{max_steps}}"},
                searcher={"name": "adaptive", "max_steps": 27, "min_steps": 3})  # fmt: skip
    experiment = services.experiment_create(user=demo, data=data)
    for number, (lr, opt, final, state) in enumerate(
        [(0.01, "sgd", 0.5, "completed"), (0.001, "adam", 0.2, "completed"), (0.1, "sgd", 2.0, "stopped_early")], 1
    ):
        job, _ = job_services.job_submit(user=demo, data={**TEMPLATE, "team": "demo", "command": ["true"]})
        curve = [[s, final + 1.0 / s] for s in range(1, 28 if state == "completed" else 4)]
        Trial.objects.create(experiment=experiment, number=number, params={"lr": lr, "opt": opt}, job=job,
                             state=state, curve=curve, best_value=min(v for _, v in curve), best_step=curve[-1][0],
                             last_step=curve[-1][0])  # fmt: skip
    return experiment


def test_the_experiment_page_shows_the_best_trial_curves_scatter_parallel_and_a_sortable_table(demo, experiment):
    client = Client()
    client.force_login(demo)
    listing = client.get("/experiments/").content.decode()
    assert f'data-experiment="{experiment.id}"' in listing
    page = client.get(f"/experiments/{experiment.id}/").content.decode()
    best = Trial.objects.get(experiment=experiment, number=2)
    section = page[page.index('id="best-trial"') : page.index('id="curves-h"')]
    assert "#2" in section and "lr=0.001" in section and "opt=adam" in section
    # Learning curves: one line per trial; scatter: one chart per parameter, a dot per trial; parallel: a line each.
    assert len(re.findall(r'<polyline data-series="#\d"', page)) == 3
    scatters = page[page.index('id="scatters"') : page.index('id="parallel"')]
    assert scatters.count('data-param="lr"') == 1 and scatters.count('data-param="opt"') == 1
    assert len(re.findall(r'<circle data-trial="\d"', scatters)) == 6
    assert 'data-trial="2" cx=' in scatters and 'fill="#dc2626"' in scatters  # the best in red
    parallel = page[page.index('id="parallel"') : page.index('id="trials-h"')]
    assert len(re.findall(r'<polyline data-trial="\d"', parallel)) == 3
    # Compare the best N: the best two by value, best first.
    compare = re.search(r'id="compare-best" href="([^"]+)"', page).group(1).replace("&amp;", "&")
    ids = re.findall(r"job=([0-9a-f-]{36})", compare)
    assert ids[0] == str(best.job_id) and len(ids) == 3

    # The table sorts by any parameter or the metric, with a link per column.
    def order(key):
        page = client.get(f"/experiments/{experiment.id}/?sort={key}").content.decode()
        return re.findall(r'<tr data-trial="(\d)"', page)

    assert order("lr") == ["2", "1", "3"] and order("-lr") == ["3", "1", "2"]
    assert order("best_value") == ["2", "1", "3"] and order("opt") == ["2", "1", "3"]
    assert order("nonsense") == ["1", "2", "3"]
    assert f"/api/v1/experiments/{experiment.id}/trials/csv/" in page


def test_run_the_best_again_with_more_steps_and_pause_from_the_page(demo, experiment):
    client = Client()
    client.force_login(demo)
    response = client.post(f"/experiments/{experiment.id}/rerun/", {"max_steps": "100"})
    job = Job.objects.get(labels__contains={"rerun-of-trial": "2"})
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.id}/"
    assert job.command == ["python", "train.py", "--lr", "0.001", "--opt", "adam", "--steps", "100"]
    response = client.post(f"/experiments/{experiment.id}/rerun/", {"max_steps": "-3"}, follow=True)
    assert "Steps must be a whole number above zero." in response.content.decode()
    client.post(f"/experiments/{experiment.id}/pause/")
    assert Experiment.objects.get(pk=experiment.pk).state == "paused"
    page = client.post(f"/experiments/{experiment.id}/pause/", follow=True).content.decode()
    assert "The experiment is" in page  # pausing twice is a no-op
    client.post(f"/experiments/{experiment.id}/cancel/")
    page = client.post(f"/experiments/{experiment.id}/resume/", follow=True).content.decode()
    assert "Cannot do that" in page and Experiment.objects.get(pk=experiment.pk).state == "cancelled"


def test_another_team_cannot_see_or_command_it(demo, experiment):
    other = TeamFactory(slug="other")
    olga = UserFactory(username="olga")
    MembershipFactory(team=other, user=olga)
    client = Client()
    client.force_login(olga)
    assert client.get(f"/experiments/{experiment.id}/").status_code == 404
    assert client.post(f"/experiments/{experiment.id}/cancel/").status_code == 404
    assert str(experiment.id) not in client.get("/experiments/").content.decode()
    assert Experiment.objects.get(pk=experiment.pk).state == "running"


def test_an_experiment_is_created_from_its_yaml_on_the_portal_and_every_bad_input_is_listed(demo):
    import yaml

    client = Client()
    client.force_login(demo)
    assert 'href="/experiments/new/"' in client.get("/experiments/").content.decode()
    form = client.get("/experiments/new/")
    assert form.status_code == 200
    example = re.search(
        r'<textarea id="id_definition" name="definition"[^>]*>(.*?)</textarea>', form.content.decode(), re.S
    )
    assert example and "team: demo" in example.group(1)  # a starting point for the user's own team
    # Bad inputs: a 400 on the same page, each problem with its field and code, the text kept, nothing stored.
    cases = {
        "name: [unclosed": "experiment_invalid_yaml",
        "- a list": "invalid_experiment",
        yaml.safe_dump(body(colour="red")): "unknown_field",
        yaml.safe_dump(body(space={"lr": {"type": "log_uniform", "min": 0, "max": 1}})): None,
        yaml.safe_dump(body(template={**TEMPLATE, "code": "./src"})): "experiment_code_folder",
    }
    for text, code in cases.items():
        page = client.post("/experiments/new/", {"definition": text})
        assert page.status_code == 400, text
        html = page.content.decode()
        assert 'id="experiment-errors"' in html and (code is None or f'data-code="{code}"' in html), (text, html[:2000])
    assert not Experiment.objects.exists()
    # A good file, pasted or uploaded, creates it and opens its page.
    made = client.post("/experiments/new/", {"definition": yaml.safe_dump(body(name="pasted"))})
    assert made.status_code == 302
    assert made["Location"] == f"/experiments/{Experiment.objects.get(name='pasted').id}/"
    upload = SimpleUploadedFile("exp.yaml", yaml.safe_dump(body(name="uploaded")).encode(), "text/yaml")
    assert client.post("/experiments/new/", {"definition": "", "file": upload}).status_code == 302
    assert Experiment.objects.get(name="uploaded").owner == demo


def test_the_form_takes_the_code_as_the_job_form_does_an_archive_or_a_git_commit(demo, tmp_path, settings):
    """A `template.code` folder the portal cannot read is replaced by an archive uploaded on the form, or by a git
    repository + commit the platform fetches (the job form's code handling); every trial runs in that snapshot."""
    import yaml
    from trainyard_cli.code import pack

    from jobs import code
    from jobs.models import CodeSnapshot
    from trainyard.tests.test_code_portal import _project, _repo, _zip_of

    client = Client()
    client.force_login(demo)
    definition = yaml.safe_dump(body(template={**TEMPLATE, "code": "./src"}))
    folder = _project(tmp_path / "src")

    # The file as the CLI takes it (`code: ./src`), and an archive of that folder: the CLI's digest, in the trials.
    made = client.post("/experiments/new/", {"definition": definition, "code_archive": _zip_of(folder, "src")})
    assert made.status_code == 302, made.content.decode()[-3000:]
    experiment = Experiment.objects.get()
    assert experiment.code_digest == pack(folder)[1] == experiment.template["code"]
    assert services.trial_body(experiment, number=1, params={"lr": 0.01, "opt": "sgd"})["code"] == pack(folder)[1]
    assert CodeSnapshot.objects.get().uploaded_by == "demo"

    # A git commit fetched by the platform: that commit's files (not the branch's head), and the CI record.
    settings.TRAINYARD_CODE_GIT_ALLOW_FILE = True
    repo, first = _repo(tmp_path)
    git = {"code_git_url": f"file://{repo}", "code_git_commit": first[:10]}
    made = client.post("/experiments/new/", {"definition": yaml.safe_dump(body(name="from-git")), **git})
    assert made.status_code == 302, made.content.decode()[-3000:]
    experiment = Experiment.objects.get(name="from-git")
    with tarfile.open(code.snapshot_path("demo", experiment.code_digest), "r:gz") as tar:
        assert tar.extractfile("config.json").read() == b'{"lr": 0.01}'
    assert experiment.template["ci"] == {"git_url": f"file://{repo}", "git_commit": first}

    # What cannot be used is listed with its field and code, nothing is made.
    cases = [
        ({"code_archive": _zip_of(folder, "src"), "code_git_url": f"file://{repo}"}, "code_archive", "code_twice"),
        ({"code_git_url": f"file://{repo}", "code_git_commit": "0" * 40}, "code_git_commit",
         "code_git_unknown_commit"),
        ({"code_git_url": "http://git.example.com/r.git", "code_git_commit": "main"}, "code_git_url",
         "code_git_scheme"),
        ({"code_archive": SimpleUploadedFile("src.txt", b"not an archive")}, "code_archive", "invalid_code_archive"),
    ]  # fmt: skip
    for extra, field, code_ in cases:
        page = client.post("/experiments/new/", {"definition": yaml.safe_dump(body(name="bad")), **extra})
        assert page.status_code == 400, (field, code_)
        html = page.content.decode()
        assert f'<li data-code="{code_}"><code>{field}</code>' in html, (code_, html[:3000])
        assert f'id="err-{field}"' in html  # and at its field
    assert not Experiment.objects.filter(name="bad").exists()

    # A file with another problem comes back with the uploaded code kept: sent again, it is not asked for twice.
    page = client.post("/experiments/new/", {"definition": yaml.safe_dump(body(name="kept", colour="red")),
                                             "code_archive": _zip_of(folder, "src")})  # fmt: skip
    assert page.status_code == 400
    kept = re.search(r'<input type="hidden" name="code_digest" value="([^"]+)">', page.content.decode()).group(1)
    assert kept == pack(folder)[1]
    made = client.post("/experiments/new/", {"definition": definition.replace("sweep", "kept"), "code_digest": kept})
    assert made.status_code == 302, made.content.decode()[-3000:]
    assert Experiment.objects.get(name="kept").code_digest == kept
    # Without code on the form a folder is still refused, and a digest of another team's is the service's 400.
    page = client.post("/experiments/new/", {"definition": definition})
    assert page.status_code == 400 and 'data-code="experiment_code_folder"' in page.content.decode()
    page = client.post("/experiments/new/", {"definition": definition, "code_digest": "sha256:" + "0" * 64})
    assert page.status_code == 400 and 'data-code="unknown_code"' in page.content.decode()


def test_the_forms_code_fields_and_the_folder_error_read_in_chinese(demo):
    import yaml

    client = Client()
    client.force_login(demo)
    client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/experiments/"})
    page = client.post("/experiments/new/", {"definition": yaml.safe_dump(body(template={**TEMPLATE, "code": "."}))})
    assert page.status_code == 400
    html = page.content.decode()
    assert 'data-code="experiment_code_folder"' in html and 'id="field-code"' in html
    assert "template.code 指向你本机上的文件夹" in html and "每个试验都以它的副本作为工作目录" in html
    assert "代码压缩包" in html
    for english in ("which the portal cannot read", "Every trial runs in a copy", "Code archive"):
        assert english not in html, english
