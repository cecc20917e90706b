"""The portal brings a job's code: an uploaded archive, or a git repository + commit fetched by the platform (here
a real local repository over file://, allowed by setting). Either becomes the team's code snapshot, packed the way
the CLI packs a folder (the same files give the same digest), and the job names it. Every bad input is an error on
the form with its code, and nothing is kept."""

from __future__ import annotations

import io
import subprocess
import tarfile
import zipfile

import pytest
from trainyard_cli.code import pack

from jobs import code
from jobs.models import CodeSnapshot, Job
from jobs.tests.conftest import platform  # noqa: F401 - the seeded platform fixture

pytestmark = pytest.mark.django_db(transaction=True)
FORM = {"team": "demo", "queue": "debug", "spec": "shared", "image": "python-3.11", "command": "python3 train.py"}


def _project(root):
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "model.py").write_text("NAME = 'tiny'\n")
    (root / "config.json").write_text('{"lr": 0.01}')
    (root / "train.py").write_text("from pkg.model import NAME\nprint(NAME, open('config.json').read())\n")
    return root


def _zip_of(folder, top: str) -> io.BytesIO:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            z.write(path, f"{top}/{path.relative_to(folder)}")
    buf.seek(0)
    buf.name = f"{top}.zip"
    return buf


def _members(digest: str) -> dict[str, bytes]:
    with tarfile.open(code.snapshot_path("demo", digest), "r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}


def test_an_uploaded_archive_becomes_the_jobs_code_with_the_clis_digest(platform, client, tmp_path):  # noqa: F811
    folder = _project(tmp_path / "my-experiment")
    client.force_login(platform)
    r = client.post("/jobs/new/", {**FORM, "code_archive": _zip_of(folder, "my-experiment")})
    assert r.status_code == 302, r.content.decode()[-3000:]
    job = Job.objects.get()
    # One top folder is stripped; the bytes are packed as `trainyard run` packs the folder: the same digest.
    assert job.code_digest == pack(folder)[1]
    assert set(_members(job.code_digest)) == {"config.json", "pkg/__init__.py", "pkg/model.py", "train.py"}
    assert CodeSnapshot.objects.get().uploaded_by == "demo"


def _repo(tmp_path):
    repo = _project(tmp_path / "repo")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "first"], check=True)
    first = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    (repo / "config.json").write_text('{"lr": 0.5}')
    subprocess.run([*git, "commit", "-qam", "second"], check=True)
    return repo, first


def test_a_git_commit_fetched_by_the_platform_becomes_the_jobs_code(platform, client, tmp_path, settings):  # noqa: F811
    settings.TRAINYARD_CODE_GIT_ALLOW_FILE = True
    repo, first = _repo(tmp_path)
    client.force_login(platform)
    r = client.post("/jobs/new/", {**FORM, "code_git_url": f"file://{repo}", "code_git_commit": first[:10]})
    assert r.status_code == 302, r.content.decode()[-3000:]
    job = Job.objects.get()
    files = _members(job.code_digest)
    assert files["config.json"] == b'{"lr": 0.01}'  # the named commit, not the branch's head
    assert ".git" not in {n.split("/")[0] for n in files}
    assert job.ci == {"git_url": f"file://{repo}", "git_commit": first}


@pytest.mark.parametrize(
    ("url", "commit", "allow_file", "field", "code_"),
    [
        ("file://{repo}", "HEAD", False, "code_git_url", "code_git_scheme"),  # file:// is off by default
        ("http://git.example.com/r.git", "main", True, "code_git_url", "code_git_scheme"),
        ("ext::sh -c touch% /tmp/pwned", "main", True, "code_git_url", "code_git_scheme"),
        ("--upload-pack=touch /tmp/x", "main", True, "code_git_url", "code_git_scheme"),
        ("file://{repo}", "0" * 40, True, "code_git_commit", "code_git_unknown_commit"),
        ("file://{repo}", "", True, "code_git_commit", "code_git_commit"),
        ("file://{repo}", "--output=/tmp/x", True, "code_git_commit", "code_git_commit"),
        ("file://{repo}-missing", "main", True, "code_git_url", "code_git_unreachable"),
    ],
)
def test_a_git_source_that_cannot_work_is_a_form_error(
    platform,  # noqa: F811
    client,
    tmp_path,
    settings,
    url,
    commit,
    allow_file,
    field,
    code_,
):
    settings.TRAINYARD_CODE_GIT_ALLOW_FILE = allow_file
    repo, _first = _repo(tmp_path)
    client.force_login(platform)
    r = client.post("/jobs/new/", {**FORM, "code_git_url": url.format(repo=repo), "code_git_commit": commit})
    assert r.status_code == 400
    errors = r.context["errors"]
    assert [e["code"] for e in errors.get(field, [])] == [code_], errors
    assert not Job.objects.exists() and not CodeSnapshot.objects.exists()


def _tar_with(member: tarfile.TarInfo, data: bytes = b"") -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.addfile(member, io.BytesIO(data) if member.isfile() else None)
    buf.seek(0)
    buf.name = "code.tar.gz"
    return buf


def _bad_archives():
    link = tarfile.TarInfo("escape")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    up = tarfile.TarInfo("../up.py")
    up.size = 1
    rar = io.BytesIO(b"Rar!")
    rar.name = "code.rar"
    junk = io.BytesIO(b"not a zip")
    junk.name = "code.zip"
    return [(_tar_with(link), "invalid_code_archive"), (_tar_with(up, b"x"), "invalid_code_archive"),
            (rar, "invalid_code_archive"), (junk, "invalid_code_archive")]  # fmt: skip


@pytest.mark.parametrize("index", range(4))
def test_an_archive_that_cannot_work_is_a_form_error(platform, client, index):  # noqa: F811
    upload, code_ = _bad_archives()[index]
    client.force_login(platform)
    r = client.post("/jobs/new/", {**FORM, "code_archive": upload})
    assert r.status_code == 400
    assert [e["code"] for e in r.context["errors"].get("code_archive", [])] == [code_], r.context["errors"]
    assert not Job.objects.exists() and not CodeSnapshot.objects.exists()


def test_an_archive_and_a_repository_at_once_is_refused(platform, client, tmp_path):  # noqa: F811
    client.force_login(platform)
    upload = _zip_of(_project(tmp_path / "p"), "p")
    r = client.post("/jobs/new/", {**FORM, "code_archive": upload, "code_git_url": "https://x/y.git"})
    assert r.status_code == 400 and r.context["errors"]["code_archive"][0]["code"] == "code_twice"


def test_a_form_sent_back_for_another_error_keeps_the_uploaded_code(platform, client, tmp_path):  # noqa: F811
    client.force_login(platform)
    folder = _project(tmp_path / "p")
    r = client.post("/jobs/new/", {**FORM, "timeout_s": "soon", "code_archive": _zip_of(folder, "p")})
    assert r.status_code == 400 and "timeout_s" in r.context["errors"]
    digest = pack(folder)[1]
    assert digest in r.content.decode()  # carried in the form: no second upload needed
    carried = r.context["form"]["carried"].value()
    r = client.post("/jobs/new/", {**FORM, "timeout_s": "10m", "carried": carried})
    assert r.status_code == 302, r.content.decode()[-2000:]
    assert Job.objects.get().code_digest == digest
