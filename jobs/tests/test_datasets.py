"""Registered datasets with real parts: a real S3 store (SeaweedFS), the real node cache, real sandboxed jobs."""

import stat
import threading
import uuid

import pytest
from boto3.s3.transfer import TransferConfig
from rest_framework.test import APIClient

from jobs import services
from jobs.backends.dataset_cache import CacheFull, DatasetCache, DatasetError
from jobs.models import Dataset, Job
from jobs.states import JobState
from jobs.tests.conftest import wait_for
from jobs.tests.test_lifecycle_e2e import finished, log_text, submit
from kernel import objectstore
from trainyard.tests.test_cli import cli  # noqa: F401 - fixture


def _upload(store, prefix: str, files: dict[str, bytes]) -> None:
    s3 = objectstore.client(store)
    for rel, body in files.items():
        s3.put_object(Bucket=store.bucket, Key=prefix + rel, Body=body)


def _spec(store, name: str, files: dict[str, bytes], *, version: int = 1) -> dict:
    prefix = f"datasets/demo/{uuid.uuid4().hex}/{name}/v{version}/"
    _upload(store, prefix, files)
    return {
        "id": uuid.uuid4().int % 10**6,
        "team": "demo",
        "name": name,
        "version": version,
        "prefix": prefix,
        "size_bytes": sum(len(b) for b in files.values()),
        "file_count": len(files),
    }


# ------------------------------------------------------------------------------------------ the node cache


def test_fetch_verifies_checksums_including_multipart_etags(object_store, tmp_path):
    spec = _spec(object_store, "small", {"a.txt": b"alpha", "sub/b.txt": b"beta"})
    big = bytes(range(256)) * (6 * 4096 + 11)  # a little over 6 MiB: uploaded in 5 MiB parts, no sha256 metadata
    s3 = objectstore.client(object_store)
    config = TransferConfig(multipart_threshold=5 * 1024 * 1024, multipart_chunksize=5 * 1024 * 1024)
    import io

    s3.upload_fileobj(io.BytesIO(big), object_store.bucket, spec["prefix"] + "big.bin", Config=config)
    etag = s3.head_object(Bucket=object_store.bucket, Key=spec["prefix"] + "big.bin")["ETag"]
    assert "-2" in etag  # really a multipart object
    spec.update(size_bytes=spec["size_bytes"] + len(big), file_count=3)
    held = DatasetCache(tmp_path / "cache").acquire(spec, object_store)
    assert held.fetched
    assert (held.path / "sub" / "b.txt").read_bytes() == b"beta"
    assert (held.path / "big.bin").read_bytes() == big
    # Read-only for every job (the sandbox binds it read-only as well, which holds even for root).
    assert stat.S_IMODE((held.path / "a.txt").stat().st_mode) == 0o444
    assert stat.S_IMODE((held.path / "sub").stat().st_mode) == 0o555
    held.release()


def test_a_wrong_checksum_or_a_changed_dataset_is_refused_and_leaves_nothing(object_store, tmp_path):
    spec = _spec(object_store, "bad", {"a.txt": b"alpha"})
    s3 = objectstore.client(object_store)
    s3.put_object(Bucket=object_store.bucket, Key=spec["prefix"] + "b.txt", Body=b"beta", Metadata={"sha256": "0" * 64})
    spec.update(size_bytes=9, file_count=2)
    cache = DatasetCache(tmp_path / "cache")
    with pytest.raises(DatasetError, match="does not match its size or checksum"):
        cache.acquire(spec, object_store)
    assert cache.entries() == [] and not list((tmp_path / "cache" / "data").iterdir())
    spec.update(size_bytes=5, file_count=1)  # the registration said one file: the store now has two
    with pytest.raises(DatasetError, match="changed in the store since it was registered") as changed:
        cache.acquire(spec, object_store)
    assert changed.value.reason == "DatasetChanged" and changed.value.permanent


def test_lru_eviction_never_evicts_a_copy_in_use_and_a_full_cache_is_a_clear_error(object_store, tmp_path):
    kib = b"x" * 1024
    one, two, three = (_spec(object_store, n, {"f": kib}) for n in ("one", "two", "three"))
    cache = DatasetCache(tmp_path / "cache", limit_bytes=2048)
    a = cache.acquire(one, object_store)
    b = cache.acquire(two, object_store)
    b.release()
    a.release()
    cache.acquire(one, object_store).release()  # used again: "two" is now the least recently used
    c = cache.acquire(three, object_store)
    assert sorted(e["dataset"]["name"] for e in cache.entries()) == ["one", "three"]
    assert c.fetched and cache.used_bytes() == 2048
    # "three" is held by a job and "one" too: a fourth copy cannot be made, and neither is touched.
    held_one = cache.acquire(one, object_store)
    assert not held_one.fetched
    four = _spec(object_store, "four", {"f": kib})
    with pytest.raises(CacheFull, match="in use by a running job"):
        cache.acquire(four, object_store)
    assert sorted(e["dataset"]["name"] for e in cache.entries()) == ["one", "three"]
    assert all(e["in_use"] for e in cache.entries())
    with pytest.raises(CacheFull, match="holds at most 2048"):
        cache.acquire(_spec(object_store, "huge", {"f": kib * 3}), object_store)
    c.release()
    cache.acquire(four, object_store).release()  # "three" is free again: evicted for "four"
    assert sorted(e["dataset"]["name"] for e in cache.entries()) == ["four", "one"]
    held_one.release()


def test_concurrent_fetches_of_the_same_version_coalesce(object_store, tmp_path):
    spec = _spec(object_store, "shared", {f"part-{i}": bytes([i]) * 200_000 for i in range(8)})
    results, errors = [], []

    def take():
        try:
            held = DatasetCache(tmp_path / "cache").acquire(spec, object_store)
            results.append(held)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert sorted(h.fetched for h in results) == [False, False, False, True]  # one download, three waited for it
    assert len({h.path for h in results}) == 1
    for h in results:
        h.release()


def test_a_copy_in_use_survives_its_dataset_being_deleted_from_the_store(object_store, tmp_path):
    spec = _spec(object_store, "gone", {"f.txt": b"kept"})
    cache = DatasetCache(tmp_path / "cache", limit_bytes=4)
    held = cache.acquire(spec, object_store)
    s3 = objectstore.client(object_store)
    s3.delete_object(Bucket=object_store.bucket, Key=spec["prefix"] + "f.txt")
    with pytest.raises(CacheFull):  # the cache is full and the copy is in use: it is not evicted
        cache.acquire(_spec(object_store, "other", {"g": b"1234"}), object_store)
    assert (held.path / "f.txt").read_bytes() == b"kept"
    held.release()


# ------------------------------------------------------------------------------------ registration and submission


@pytest.fixture
def demo(platform, checkpoint_store):
    return platform


def _register(user, store, name, files, **kwargs):
    from jobs.datasets import dataset_register
    from quotas.models import Team

    prefix = f"datasets/demo/{uuid.uuid4().hex}/{name}/"
    _upload(store, prefix, files)
    return dataset_register(user=user, team=Team.objects.get(slug="demo"), name=name, s3_prefix=prefix,
                            version=kwargs.pop("version", 1), **kwargs)  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_register_list_and_the_submission_400s(demo, checkpoint_store):
    from quotas.models import Team
    from quotas.tests.factories import MembershipFactory, TeamFactory, UserFactory

    dataset = _register(demo, checkpoint_store, "mnist", {"train.bin": b"1" * 100, "test.bin": b"2" * 20})
    assert (dataset.size_bytes, dataset.file_count) == (120, 2)
    other = TeamFactory(slug="other")
    olga = UserFactory(username="olga")
    MembershipFactory(team=other, user=olga)
    Dataset.objects.create(team=other, name="private", claim="private-data")

    client = APIClient()
    client.force_login(demo)
    listed = client.get("/api/v1/datasets/").json()
    assert [(d["name"], d["size_bytes"], d["file_count"], d["kind"]) for d in listed] == [("mnist", 120, 2, "s3")]
    created = client.post(
        "/api/v1/datasets/",
        {"team": "demo", "name": "empty", "s3_prefix": "datasets/demo/nothing-here/"},
        format="json",
    )
    assert created.status_code == 400 and created.json()["code"] == "empty_dataset"

    # Registered through the API by a maintainer (demo) with its size read from the store; not by a plain member.
    # demo shares it with a team it belongs to (a maintainer shares only with teams it sees).
    MembershipFactory(team=other, user=demo)
    prefix = f"datasets/demo/{uuid.uuid4().hex}/api/"
    _upload(checkpoint_store, prefix, {"x": b"x" * 7, "y/z": b"z" * 3})
    body = {"team": "demo", "name": "viaapi", "version": 2, "s3_prefix": prefix, "shared_with": ["other"]}
    created = client.post("/api/v1/datasets/", body, format="json")
    assert created.status_code == 201, created.content
    assert (created.json()["size_bytes"], created.json()["file_count"], created.json()["shared_with"]) == (
        10,
        2,
        ["other"],
    )
    again = client.post("/api/v1/datasets/", body, format="json")
    assert again.status_code == 409 and again.json()["code"] == "dataset_exists"
    member = UserFactory(username="mia")
    MembershipFactory(team=Team.objects.get(slug="demo"), user=member, role="member")
    as_member = APIClient()
    as_member.force_login(member)
    refused = as_member.post("/api/v1/datasets/", {**body, "version": 3}, format="json")
    assert refused.status_code == 403 and refused.json()["code"] == "not_maintainer"
    olga_client = APIClient()
    olga_client.force_login(olga)
    assert [d["name"] for d in olga_client.get("/api/v1/datasets/").json()] == [
        "viaapi",
        "private",
    ]  # by team: demo, other
    assert olga_client.delete(f"/api/v1/datasets/{created.json()['id']}/").status_code == 403  # not olga's team
    assert client.delete(f"/api/v1/datasets/{created.json()['id']}/").status_code == 204

    base = {"team": "demo", "queue": "train", "spec": "shared", "image": "python-3.11", "command": ["true"]}
    for datasets, code in [
        ([{"name": "nope", "path": "/data"}], "unknown_dataset"),
        ([{"name": "private", "path": "/data"}], "dataset_not_readable"),
        ([{"name": "mnist", "version": 7, "path": "/data"}], "unknown_dataset"),
        ([{"name": "mnist", "path": "data"}], "invalid_dataset_path"),
        ([{"name": "mnist", "path": "/usr/share/data"}], "invalid_dataset_path"),
        ([{"name": "mnist", "path": "/data"}, {"name": "mnist", "path": "/data/sub"}], "dataset_path_clash"),
        ("mnist", "not_a_list"),
    ]:
        response = client.post("/api/v1/jobs/", {**base, "datasets": datasets}, format="json")
        assert response.status_code == 400, (datasets, response.content)
        assert response.json()["code"] == code, (datasets, response.json())
    # Shared with the team: now readable.
    Dataset.objects.get(name="private").shared_with.add(Team.objects.get(slug="demo"))
    response = client.post("/api/v1/jobs/", {**base, "datasets": [{"name": "private", "path": "/p"}]}, format="json")
    assert response.status_code == 400 and response.json()["code"] == "dataset_not_available_here"  # a claim, locally


@pytest.mark.django_db
def test_another_teams_dataset_reads_exactly_like_one_that_does_not_exist(settings):
    from django.contrib.auth import get_user_model

    from ops.seed import seed
    from quotas.tests.factories import MembershipFactory, TeamFactory, UserFactory

    settings.TRAINYARD_BACKEND = "local"
    settings.TRAINYARD_LOCAL_GPUS = "2x24GiB"
    seed(admin_password="admin-pass-123", demo_password="demo-pass-123")
    secret = TeamFactory(slug="secret")
    for version in (1, 2):
        Dataset.objects.create(team=secret, name="hidden", version=version, claim="hidden-data")
    client = APIClient()
    client.force_login(get_user_model().objects.get(username="demo"))
    base = {"team": "demo", "queue": "train", "spec": "shared", "image": "python-3.11", "command": ["true"]}

    def answer(item: dict) -> tuple[int, str, str]:
        response = client.post("/api/v1/jobs/", {**base, "datasets": [{**item, "path": "/data"}]}, format="json")
        body = response.json()
        return response.status_code, body["code"], body["detail"].replace(item["name"], "NAME")

    # Name alone, with the owning team's slug, with a version that exists there: each as for a name nowhere.
    for exists, missing in [
        ({"name": "hidden"}, {"name": "absent"}),
        ({"name": "hidden", "team": "secret"}, {"name": "absent", "team": "secret"}),
        ({"name": "hidden", "team": "secret"}, {"name": "hidden", "team": "no-such-team"}),
        ({"name": "hidden", "version": 2}, {"name": "absent", "version": 2}),
        ({"name": "hidden", "version": 2, "team": "secret"}, {"name": "absent", "version": 2, "team": "secret"}),
    ]:
        assert answer(exists) == answer(missing), (exists, missing)
        assert answer(exists)[:2] == (400, "unknown_dataset")
    # A user who sees it (a member of its team) is told that the job's team may not read it.
    mallory = UserFactory(username="mallory")
    MembershipFactory(team=secret, user=mallory)
    MembershipFactory(team=get_user_model().objects.get(username="demo").memberships.get().team, user=mallory)
    client.force_login(mallory)
    assert answer({"name": "hidden", "team": "secret"})[:2] == (400, "dataset_not_readable")


@pytest.mark.django_db
def test_shared_with_never_tells_a_maintainer_which_teams_exist(settings):
    from django.contrib.auth import get_user_model

    from ops.seed import seed
    from quotas.tests.factories import MembershipFactory, TeamFactory, UserFactory

    seed(admin_password="admin-pass-123", demo_password="demo-pass-123")
    TeamFactory(slug="other")  # exists; demo is not a member
    mine = TeamFactory(slug="mine")
    demo = get_user_model().objects.get(username="demo")
    MembershipFactory(team=mine, user=demo)
    client = APIClient()
    client.force_authenticate(demo)

    def register(name, shared_with, as_client=client):
        body = {"team": "demo", "name": name, "claim": "data-claim", "shared_with": shared_with}
        return as_client.post("/api/v1/datasets/", body, format="json")

    hidden, missing = register("a", ["other"]), register("a", ["no-such-team"])
    assert hidden.status_code == missing.status_code == 400
    assert hidden.json()["code"] == missing.json()["code"] == "unknown_team"
    # The same words for a team that exists and one that does not: only the slug the user sent differs.
    assert hidden.json()["detail"].replace("other", "X") == missing.json()["detail"].replace("no-such-team", "X")
    assert [f["code"] for f in hidden.json()["fields"]["shared_with"]] == ["unknown_team"]
    both = register("a", ["other", "no-such-team", "mine"])
    assert both.status_code == 400 and "no-such-team, other" in both.json()["detail"]
    assert "mine" not in both.json()["detail"]
    assert not Dataset.objects.exists()
    # A team of the maintainer's own is fine; staff may share with any team.
    shared = register("a", ["mine"])
    assert shared.status_code == 201 and shared.json()["shared_with"] == ["mine"]
    admin = APIClient()
    admin.force_authenticate(UserFactory(username="root", is_staff=True))
    by_staff = register("b", ["other", "mine"], as_client=admin)
    assert by_staff.status_code == 201 and by_staff.json()["shared_with"] == ["mine", "other"]
    assert register("c", ["no-such-team"], as_client=admin).json()["code"] == "unknown_team"


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_job_reads_its_dataset_at_the_path_it_asked_for_and_cannot_write_it(
    demo, checkpoint_store, celery_worker_thread, settings, tmp_path
):
    settings.TRAINYARD_DATASET_CACHE_DIR = tmp_path / "datasets"
    _register(demo, checkpoint_store, "corpus", {"words.txt": b"hello dataset\n", "more/n.txt": b"42\n"})
    script = (
        "cat /data/words.txt /data/more/n.txt; echo env=$TRAINYARD_DATASET_CORPUS; "
        "if echo x > /data/new.txt 2>/dev/null; then echo WROTE; else echo write-refused; fi; "
        "if rm /data/words.txt 2>/dev/null; then echo REMOVED; else echo remove-refused; fi"
    )
    first = submit(demo, command=["sh", "-c", script], datasets=[{"name": "corpus", "path": "/data"}])
    first = wait_for(lambda: finished(first), timeout=60)
    assert first.state == JobState.SUCCEEDED, log_text(first)
    text = log_text(first)
    assert "hello dataset" in text and "42" in text and "env=/data" in text
    assert "write-refused" in text and "remove-refused" in text and "WROTE" not in text
    assert "dataset corpus v1 fetched into the node's cache" in text
    assert first.datasets[0]["name"] == "corpus" and first.reproduce["datasets"][0]["path"] == "/data"
    # A second job finds the copy in the cache; a retry of the first asks for the same dataset again.
    second = submit(demo, command=["sh", "-c", "cat /data/words.txt"], datasets=[{"name": "corpus", "path": "/data"}])
    second = wait_for(lambda: finished(second), timeout=60)
    assert "dataset corpus v1 found in the node's cache" in log_text(second)
    retried = services.job_resubmit(job_id=first.id, user=demo, resume=False)
    assert retried.datasets == first.datasets


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_full_cache_fails_the_attempt_with_a_clear_reason(demo, checkpoint_store, celery_worker_thread, settings,
                                                            tmp_path):  # fmt: skip
    settings.TRAINYARD_DATASET_CACHE_DIR = tmp_path / "datasets"
    settings.TRAINYARD_DATASET_CACHE_BYTES = 10
    _register(demo, checkpoint_store, "toolarge", {"big.bin": b"z" * 100})
    job = submit(demo, command=["true"], datasets=[{"name": "toolarge", "path": "/data"}])
    job = wait_for(lambda: finished(job), timeout=60)
    assert job.state == JobState.FAILED
    attempt = job.attempts.get()
    assert attempt.reason == "DatasetCacheFull" and attempt.rule == "dataset-cache-full"
    assert "TRAINYARD_DATASET_CACHE_BYTES" in log_text(job)


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_dataset_changed_in_the_store_fails_the_job_once_and_is_not_retried(
    demo, checkpoint_store, celery_worker_thread, settings, tmp_path
):
    settings.TRAINYARD_DATASET_CACHE_DIR = tmp_path / "datasets"
    dataset = _register(demo, checkpoint_store, "moved", {"a.txt": b"alpha"})
    # Someone adds a file under the registered prefix: the store no longer holds version 1 as registered.
    _upload(checkpoint_store, dataset.s3_prefix, {"b.txt": b"beta"})
    job = submit(demo, command=["true"], datasets=[{"name": "moved", "path": "/data"}], max_retries=2)
    job = wait_for(lambda: finished(job), timeout=60)
    assert job.state == JobState.FAILED
    attempt = job.attempts.get()  # one attempt although two retries were allowed: a retry would find the same files
    assert (attempt.reason, attempt.rule) == ("DatasetChanged", "dataset-changed")
    failed = job.events.get(kind="attempt_failed").message
    assert "(DatasetChanged): dataset moved v1 changed in the store since it was registered: 2 files" in failed
    assert "DatasetChanged: dataset moved v1 changed in the store" in log_text(job)


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_cli_lists_datasets_and_a_job_yaml_names_them(cli, demo, checkpoint_store, tmp_path):  # noqa: F811
    from trainyard.tests.test_cli import job_yaml, write

    _register(demo, checkpoint_store, "imagenet", {"a": b"1" * 10, "b": b"2" * 20}, version=3)
    listing = cli("datasets")
    assert listing.code == 0, listing.err
    header, row = listing.out.splitlines()
    assert header.split()[:7] == ["TEAM", "NAME", "VERSION", "KIND", "SOURCE", "SIZE", "FILES"]
    assert row.split()[:4] == ["demo", "imagenet", "3", "s3"] and row.split()[5:8] == ["30", "B", "2"]
    good = cli(
        "submit", write(tmp_path, job_yaml("true", datasets=[{"name": "imagenet", "version": 3, "path": "/data"}]))
    )
    assert good.code == 0, good.err
    assert Job.objects.get(pk=good.out.strip()).datasets[0]["size_bytes"] == 30
    bad = cli(
        "submit", write(tmp_path, job_yaml("true", datasets=[{"name": "imagenet", "version": 4, "path": "/data"}]))
    )
    assert bad.code != 0 and "unknown_dataset" in bad.err + bad.out


@pytest.mark.django_db(transaction=True)
def test_the_admin_registers_a_dataset_with_its_size_read_from_the_store(demo, checkpoint_store):
    from django.contrib.auth import get_user_model
    from django.test import Client

    from quotas.models import Team

    prefix = f"datasets/demo/{uuid.uuid4().hex}/admin"
    _upload(checkpoint_store, prefix + "/", {"a": b"a" * 5, "b": b"b" * 6})
    client = Client()
    client.force_login(get_user_model().objects.get(username="admin"))
    team = Team.objects.get(slug="demo")
    form = {"team": team.id, "name": "fromadmin", "version": 1, "description": "", "s3_prefix": prefix, "claim": ""}
    response = client.post("/admin/jobs/dataset/add/", form)
    assert response.status_code == 302, response.content.decode()[:3000]
    dataset = Dataset.objects.get(name="fromadmin")
    assert (dataset.s3_prefix, dataset.size_bytes, dataset.file_count) == (prefix + "/", 11, 2)
    assert dataset.registered_by == "admin"
    empty = client.post("/admin/jobs/dataset/add/", {**form, "name": "nothing", "s3_prefix": "datasets/no/such/prefix"})
    assert empty.status_code == 200 and "upload the dataset first" in empty.content.decode()


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_dataset_deleted_while_a_job_reads_it_stays_for_that_job(
    demo, checkpoint_store, celery_worker_thread, settings, tmp_path
):
    from jobs.datasets import dataset_delete

    settings.TRAINYARD_DATASET_CACHE_DIR = tmp_path / "datasets"
    dataset = _register(demo, checkpoint_store, "ephemeral", {"f.txt": b"still-here"})
    script = "cat /data/f.txt; echo; sleep 3; cat /data/f.txt; echo"
    job = submit(demo, command=["sh", "-c", script], datasets=[{"name": "ephemeral", "path": "/data"}])
    wait_for(lambda: "still-here" in log_text(job), timeout=60)
    s3 = objectstore.client(checkpoint_store)
    s3.delete_object(Bucket=checkpoint_store.bucket, Key=dataset.s3_prefix + "f.txt")
    dataset_delete(user=demo, dataset_id=dataset.id)
    job = wait_for(lambda: finished(job), timeout=60)
    assert job.state == JobState.SUCCEEDED
    assert log_text(job).count("still-here") == 2
    assert not Dataset.objects.filter(name="ephemeral").exists()


@pytest.mark.django_db(transaction=True)
def test_a_team_registers_datasets_only_in_its_own_space_and_learns_nothing_of_others(demo, checkpoint_store):
    from quotas.tests.factories import MembershipFactory, TeamFactory, UserFactory

    # Team demo's files and a checkpoint-like prefix of demo's exist in the store.
    mine = f"datasets/demo/{uuid.uuid4().hex}/"
    _upload(checkpoint_store, mine, {"a": b"a" * 4})
    _upload(checkpoint_store, f"demo/{uuid.uuid4()}/attempt-1/", {"ckpt.pt": b"c" * 9})
    beta = TeamFactory(slug="beta")
    bob = UserFactory(username="bob")
    MembershipFactory(team=beta, user=bob, role="maintainer")
    client = APIClient()
    client.force_login(bob)
    answers = []
    for prefix in (mine, "demo/", "datasets/demo/", "datasets/", "datasets/nothing/at/all/", "anything/"):
        r = client.post("/api/v1/datasets/", {"team": "beta", "name": "steal", "s3_prefix": prefix}, format="json")
        assert r.status_code == 400, (prefix, r.content)
        answers.append((r.json()["code"], r.json()["detail"]))
    # The same answer whether the prefix holds another team's files, checkpoints, or nothing at all.
    assert len(set(answers)) == 1 and answers[0][0] == "prefix_outside_team_space", answers
    assert "datasets/beta/" in answers[0][1]
    assert not Dataset.objects.filter(team=beta).exists()
    # In its own space the team registers as usual.
    own = f"datasets/beta/{uuid.uuid4().hex}/"
    _upload(checkpoint_store, own, {"x": b"x" * 3})
    r = client.post("/api/v1/datasets/", {"team": "beta", "name": "ok", "s3_prefix": own}, format="json")
    assert r.status_code == 201 and r.json()["size_bytes"] == 3
