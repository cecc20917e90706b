"""Real builds: podman (chroot isolation) builds a base and a project image on the session's registry, with SBOM,
scan, FROM checks, failures that keep their log, a registry that is down, the stale cascade and the schedule."""

from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from images import registry, services
from images.models import BaseImage, ImageBuild, ProjectImage, TeamImageSettings
from kernel.errors import ValidationFailed
from quotas.tests.factories import TeamFactory

pytestmark = pytest.mark.django_db


def define_base(upstream, name="tiny-base", extra=""):
    return services.base_image_define(
        name=name,
        containerfile=f"FROM {upstream['reference']}\nRUN echo {name} > /etc/trainyard-base{extra}\n",
        cuda_version="12.4",
        framework="none",
        min_driver_version="550.54",
    )


def built(image):
    build = services.build_request(image=image)
    return services.build_run(build_id=build.pk)


def image_files(registry_url: str, build, prefix: str) -> dict[str, str]:
    """The text of the files whose path starts with `prefix` in a pushed build's image, read from its layers in the
    registry. A RUN step's answers are written to such files and read here: podman has been seen to leave a short
    step's output out of the build log now and then (docs/images.md)."""
    import io
    import tarfile

    repository = registry.parse(build.reference).repository
    files: dict[str, str] = {}
    with registry.Client(registry_url) as client:
        for layer in client.image_manifest(repository, build.digest)["layers"]:
            with tarfile.open(fileobj=io.BytesIO(b"".join(client.blob(repository, layer["digest"])))) as tar:
                for member in tar:
                    name = member.name.removeprefix("./").lstrip("/")
                    if member.isfile() and name.startswith(prefix):
                        files[name] = tar.extractfile(member).read().decode(errors="replace").strip()
    return files


def base_built(upstream, name="tiny-base", extra=""):
    """A base image defined and built, for tests that build on it: a failed build stops here with its log, not
    later as a project build that finds no base."""
    build = built(define_base(upstream, name, extra))
    assert build.status == "succeeded", build.log[-4000:]
    return build


def test_a_base_build_pushes_a_digest_with_layers_size_and_sbom(images_env, feed):
    services.feed_load(document=feed, source="planted")
    base = define_base(images_env)
    build = built(base)
    assert build.status == "succeeded", build.log
    assert build.digest.startswith("sha256:") and len(build.digest) == 71
    base.refresh_from_db()
    assert base.digest == build.digest and base.reference.endswith("/trainyard/base/tiny-base:latest")
    # The registry holds exactly that digest under the tag.
    assert registry.resolve(base.reference) == build.digest
    assert len(build.layers) == 2 and build.size_bytes > 100_000  # the upstream rootfs and the RUN layer
    assert {"type": "deb", "name": "libssl3", "version": "3.0.11-1~deb12u1"} in build.sbom
    assert {"type": "pypi", "name": "PyYAML", "version": "5.3"} in build.sbom
    found = {(f.vuln_id, f.severity) for f in build.findings.all()}
    assert found == {("GHSA-8q59-q68h-6hv4", "critical"), ("DSA-TEST-0001", "medium")}  # tzdata is past its fix
    assert base.scan_status == "failed" and base.last_rebuilt == build.finished_at


def test_a_project_image_builds_on_the_pinned_base_and_refuses_other_froms(images_env):
    base = define_base(images_env)
    assert built(base).status == "succeeded"
    base.refresh_from_db()
    team = TeamFactory(slug="vision")
    with pytest.raises(ValidationFailed) as err:
        services.project_image_define(
            team=team, name="trainer", base="tiny-base", containerfile="FROM docker.io/library/ubuntu:24.04\n"
        )
    assert err.value.code == "base_not_in_catalog"
    other_team = f"{registry.platform_registry()}/trainyard/alpha/private:latest"  # guessable, refused by path
    for containerfile in (f"FROM {other_team}\n", f"FROM tiny-base AS a\nFROM {other_team}\nCOPY --from=a / /\n"):
        with pytest.raises(ValidationFailed) as err:
            services.project_image_define(team=team, name="trainer", base="tiny-base", containerfile=containerfile)
        assert err.value.code == "base_not_in_catalog"
    image = services.project_image_define(
        team=team, name="trainer", base="tiny-base", containerfile="FROM tiny-base\nRUN echo ok > /trainer\n"
    )
    build = built(image)
    assert build.status == "succeeded", build.log
    assert f"@{base.digest}" in build.containerfile.splitlines()[0] and build.base_digest == base.digest
    image.refresh_from_db()
    assert image.digest == build.digest and image.reference.endswith("/trainyard/vision/trainer:latest")
    assert len(build.layers) == 3


def test_a_failing_build_keeps_its_log_and_pushes_nothing(images_env):
    base = define_base(images_env)
    assert built(base).status == "succeeded"
    team = TeamFactory(slug="nlp")
    image = services.project_image_define(
        team=team, name="broken", base="tiny-base", containerfile="FROM tiny-base\nRUN exit 3\n"
    )
    build = built(image)
    assert build.status == "failed" and "exit 3" in build.log and "nothing was pushed" in build.log
    assert build.digest == ""
    with pytest.raises(registry.ManifestUnknown):
        registry.resolve(f"{registry.platform_registry()}/trainyard/nlp/broken:latest")


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="builds are isolated when the platform runs as root")
def test_a_build_works_whatever_the_platforms_temporary_folder(images_env, monkeypatch, tmp_path):
    """`make run` started with TMPDIR at a folder only root may write in: podman, as the team's build user, could
    not make its run root there ('mkdir …/trainyard-podman-…: permission denied') and the offline base never
    built; and a restart with another TMPDIR met storage that recorded the old run root ('database configuration
    mismatch'). The run root no longer follows TMPDIR."""
    import tempfile

    base = define_base(images_env, name="tmpdir-base")
    assert built(base).status == "succeeded"
    private = tmp_path / "private-tmp"
    private.mkdir(mode=0o700)  # root's alone
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    build = built(base)  # the same storage, another temporary folder
    assert build.status == "succeeded", build.log
    assert not any(private.iterdir())


def test_a_build_waits_for_a_registry_that_is_down_and_says_so(images_env, settings):
    from ops.embedded import free_port

    base = define_base(images_env)
    good = settings.TRAINYARD_REGISTRY_URL
    settings.TRAINYARD_REGISTRY_URL = f"http://127.0.0.1:{free_port()}"
    build = services.build_request(image=base)
    with pytest.raises(services.RegistryWaiting):
        services.build_run(build_id=build.pk)
    build.refresh_from_db()
    assert build.status == "waiting_registry" and build.registry_waits == 1
    assert "registry unreachable" in build.log and "retrying" in build.log
    settings.TRAINYARD_REGISTRY_URL = good  # it is back: the retried build goes through
    assert services.build_run(build_id=build.pk).status == "succeeded"


@pytest.mark.slow  # four builds
def test_a_base_rebuild_marks_project_images_stale_and_rebuilds_where_the_team_asks(images_env):
    base = define_base(images_env)
    assert built(base).status == "succeeded"
    manual, auto = TeamFactory(slug="manual"), TeamFactory(slug="auto")
    TeamImageSettings.objects.create(team=auto, rebuild_on_base_change=True)
    images = {}
    for team in (manual, auto):
        images[team.slug] = services.project_image_define(
            team=team, name="app", base="tiny-base", containerfile="FROM tiny-base\nRUN echo app > /app\n"
        )
        assert built(images[team.slug]).status == "succeeded"
    define_base(images_env, extra="-v2")  # the platform team changes the base
    assert built(base).status == "succeeded"
    for image in images.values():
        image.refresh_from_db()
    assert images["manual"].stale and images["auto"].stale
    assert not ImageBuild.objects.filter(project_image=images["manual"], status="queued").exists()
    queued = ImageBuild.objects.get(project_image=images["auto"], status="queued")
    assert queued.trigger == "base_rebuilt"
    services.build_run(build_id=queued.pk)
    images["auto"].refresh_from_db()
    assert not images["auto"].stale


def test_the_schedule_rebuilds_bases_older_than_a_week_only(images_env, settings):
    old, fresh = define_base(images_env, "old-base"), define_base(images_env, "fresh-base")
    BaseImage.objects.filter(pk=old.pk).update(last_rebuilt=timezone.now() - timedelta(days=8))
    BaseImage.objects.filter(pk=fresh.pk).update(last_rebuilt=timezone.now() - timedelta(days=1))
    BaseImage.objects.create(name="external", reference="nvcr.io/nvidia/pytorch:24.10-py3")  # not ours to build
    builds = services.images_rebuild_due()
    assert [b.base_image.name for b in builds] == ["old-base"] and builds[0].trigger == "schedule"
    assert services.images_rebuild_due() == builds  # the hourly pass finds the queued build, asks for no other
    ImageBuild.objects.filter(pk=builds[0].pk).update(status="failed")
    assert services.images_rebuild_due() == []  # a failed one is asked again a day later, not every hour
    ImageBuild.objects.filter(pk=builds[0].pk).update(created_at=timezone.now() - timedelta(days=1, minutes=1))
    assert [b.pk for b in services.images_rebuild_due()] != [builds[0].pk]
    assert settings.CELERY_BEAT_SCHEDULE["rebuild-images"]["task"] == "images.rebuild_due"
    assert settings.TRAINYARD_IMAGE_REBUILD_S == 7 * 24 * 3600


def test_the_catalog_holds_at_most_the_configured_number_of_bases(images_env, settings):
    settings.TRAINYARD_MAX_BASE_IMAGES = 2
    define_base(images_env, "one")
    define_base(images_env, "two")
    define_base(images_env, "two", extra="-changed")  # redefining one is fine
    with pytest.raises(ValidationFailed) as err:
        define_base(images_env, "three")
    assert err.value.code == "too_many_base_images"
    assert ProjectImage.objects.count() == 0


def test_data_files_and_size_over_the_limits_are_warned_about_in_the_build_record(images_env, settings):
    # The default limits, and a USER that is not root: nothing to say.
    assert built(define_base(images_env, extra="\nUSER 1000")).warnings == []
    settings.TRAINYARD_IMAGE_DATA_WARN_MIB = 0
    settings.TRAINYARD_IMAGE_SIZE_WARN_MIB = 0
    image = services.project_image_define(
        team=TeamFactory(slug="data"), name="fat", base="tiny-base",
        containerfile="FROM tiny-base\nUSER 0\nRUN echo weights > /model.safetensors\nUSER 1000\n",
    )  # fmt: skip
    build = built(image)
    warnings = {w["code"]: w["detail"] for w in build.warnings}
    assert build.status == "succeeded" and set(warnings) == {"data_in_image", "image_too_large"}, build.log
    assert "/model.safetensors" in warnings["data_in_image"]


def test_unused_project_images_expire_from_the_catalog_and_the_registry(images_env, settings):
    built(define_base(images_env))
    team = TeamFactory(slug="old")
    images = {}
    for name in ("unused", "recent"):
        images[name] = services.project_image_define(
            team=team, name=name, base="tiny-base", containerfile=f"FROM tiny-base\nRUN echo {name} > /n\n"
        )
        built(images[name])
    ProjectImage.objects.filter(pk=images["unused"].pk).update(last_rebuilt=timezone.now() - timedelta(days=91))
    unused = ProjectImage.objects.get(pk=images["unused"].pk)
    assert services.project_images_expire() == ["old/unused"]
    assert list(ProjectImage.objects.values_list("name", flat=True)) == ["recent"]
    with registry.Client(settings.TRAINYARD_REGISTRY_URL) as client, pytest.raises(registry.ManifestUnknown):
        client.manifest("trainyard/old/unused", unused.digest)


def test_a_requirements_file_alone_builds_as_a_pip_install_on_the_pinned_base(images_env):
    base = built(define_base(images_env))
    image = services.project_image_define(
        team=TeamFactory(slug="deps"), name="deps", base="tiny-base", requirements="numpy==2.1.0\n"
    )
    build = built(image)
    assert build.status == "succeeded", build.log
    lines = build.containerfile.splitlines()
    assert lines[0].endswith(f"/trainyard/base/tiny-base@{base.digest}")
    assert "COPY requirements.txt" in lines[1] and "pip install --no-cache-dir -r" in lines[2]
    assert len(build.layers) == 4  # the base's two, the requirements file, the install


ISOLATION_PROBE = (
    "FROM tiny-base\n"
    # Root in the build is a user namespace's root: host uid 0 is not mapped to it.
    'RUN read inside host count < /proc/self/uid_map; echo "uid_map $inside $host $count" > /probe-uid_map; '
    '[ "$host" != 0 ]\n'
    # No network: the namespace has its loopback alone (two header lines and `lo` in /proc/net/dev).
    'RUN n=0; while read line; do n=$((n+1)); done < /proc/net/dev; echo "net lines $n" > /probe-net; [ "$n" -le 3 ]\n'
)


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="builds are isolated when the platform runs as root")
def test_a_project_build_is_an_unprivileged_user_without_network_or_platform_files(
    images_env, settings, tmp_path, registry_url
):
    import os
    import subprocess

    from images.builder import _traversable, builder_for, context_dir, jailed

    base = built(define_base(images_env))
    assert base.status == "succeeded", base.log
    alpha, beta = TeamFactory(slug="alpha"), TeamFactory(slug="beta")
    image = services.project_image_define(team=alpha, name="probe", base="tiny-base", containerfile=ISOLATION_PROBE)
    build = built(image)
    assert build.status == "succeeded", build.log
    assert f"(as trainyard-b{alpha.pk}, network none)" in build.log
    said = image_files(registry_url, build, "probe-")
    _, inside, host_uid, _count = said["probe-uid_map"].split()
    assert inside == "0" and host_uid != "0", said  # root in the step is not the host's root
    assert said["probe-net"] == "net lines 3", said
    # Each team builds as its own user; escaping the chroot leaves that user in the jail: the platform's files,
    # other jobs' folders and every other team's storage are covered, and root-only files stay unreadable.
    settings.TRAINYARD_STATE_ROOT = tmp_path / "state"
    other_job = settings.TRAINYARD_STATE_ROOT / "job-of-beta" / "attempt-1"
    other_job.mkdir(parents=True)
    (other_job / "spec.json").write_text('{"env": {"TOKEN": "beta-secret"}}')
    os.chmod(other_job / "spec.json", 0o644)
    for p in (other_job, other_job.parent, settings.TRAINYARD_STATE_ROOT):
        os.chmod(p, 0o755)
    _traversable(other_job)
    me, them = builder_for(str(alpha.pk)), builder_for(str(beta.pk))
    # Without the jail the build's user could read that world-readable file: the jail is what hides it.
    bare = ["runuser", "-u", me.name, "--", "cat", str(other_job / "spec.json")]
    assert "beta-secret" in subprocess.run(bare, capture_output=True, text=True, timeout=60).stdout
    assert me.name != them.name and me.uid != them.uid and me.uid != 0
    context = context_dir(me, 1)
    targets = [other_job / "spec.json", them.root / "storage", Path(settings.TRAINYARD_BUILD_ROOT) / "storage"]
    for target in targets:
        probe = ["runuser", "-u", me.name, "--", "ls", "-A", str(target)]
        seen = subprocess.run(jailed(me, probe, context=context), capture_output=True, text=True, timeout=60)
        assert seen.returncode != 0 or seen.stdout.strip() == "", (target, seen.stdout)
    spec = subprocess.run(
        jailed(me, ["runuser", "-u", me.name, "--", "cat", str(other_job / "spec.json")], context=context),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "beta-secret" not in spec.stdout
    # Outside the jail the same user still cannot read what only root may.
    secret = tmp_path / "secret_key"
    secret.write_text("platform-secret")
    secret.chmod(0o600)
    os.chmod(tmp_path, 0o711)
    leaked = subprocess.run(["runuser", "-u", me.name, "--", "cat", str(secret)], capture_output=True, text=True)
    assert leaked.returncode != 0 and "platform-secret" not in leaked.stdout
    # And nothing without a jail: no copy from another image, no URL.
    for text, code in (
        ("FROM tiny-base\nCOPY --from=127.0.0.1:5000/trainyard/beta/app:latest /x /x\n", "copy_from_not_a_stage"),
        ("FROM tiny-base\nRUN --mount=type=bind,from=beta-app,target=/m true\n", "copy_from_not_a_stage"),
        ("FROM tiny-base\nADD http://127.0.0.1:8888/alpha/ckpt.pt /ckpt.pt\n", "add_url_not_allowed"),
    ):
        with pytest.raises(ValidationFailed) as err:
            services.project_image_define(team=alpha, name="escape", base="tiny-base", containerfile=text)
        assert err.value.code == code
    ok = "FROM tiny-base AS first\nRUN echo one > /one\nFROM tiny-base\nCOPY --from=first /one /one\n"
    assert (
        built(services.project_image_define(team=alpha, name="stages", base="tiny-base", containerfile=ok)).status
        == "succeeded"
    )


def test_a_clean_scan_passes_only_against_a_loaded_fresh_feed(images_env, settings):
    from images.models import Advisory

    base = define_base(images_env)
    first = built(base)
    assert first.status == "succeeded", first.log
    base.refresh_from_db()
    assert base.scan_status == "unscanned"  # no feed loaded: a scan that matched nothing proves nothing
    unrelated = [
        {
            "id": "OSV-TEST-0",
            "affected": [{"package": {"ecosystem": "PyPI", "name": "not-in-image"}, "versions": ["1"]}],
        }
    ]
    services.feed_load(document=unrelated, source="a feed naming other packages")
    build = built(base)
    assert build.status == "succeeded"
    base.refresh_from_db()
    assert base.scan_status == "passed"
    assert services.feed_state()["entries"] == Advisory.objects.count() and not services.feed_state()["stale"]
    # The build records the feed its scan ran against; the API and the build page show it beside the result.
    assert build.scan_feed["source"] == "a feed naming other packages" and build.scan_feed["entries"] == 1
    from django.contrib.auth import get_user_model
    from django.test import Client
    from rest_framework.test import APIClient

    staff = get_user_model().objects.create_user("feed-staff", password="x", is_staff=True)
    api, web = APIClient(), Client()
    api.force_authenticate(staff)
    web.force_login(staff)
    row = api.get("/api/v1/images/tiny-base/").json()
    assert row["scan_status"] == "passed", row
    assert row["last_build"]["scan_feed"]["source"] == "a feed naming other packages"
    assert row["last_build"]["scan_feed"]["entries"] == 1 and row["last_build"]["scan_feed"]["stale"] is False
    page = web.get(f"/images/builds/{build.pk}/").content.decode()
    assert "the vulnerability feed of 1 entry from a feed naming other packages, loaded" in page
    assert "no longer counts as passed" not in page
    # The feed goes stale: the stored "passed" now reads "stale", without a rebuild.
    Advisory.objects.update(loaded_at=timezone.now() - timedelta(seconds=settings.TRAINYARD_SCAN_FEED_MAX_AGE_S + 60))
    build.scan_feed["loaded_at"] = Advisory.objects.get().loaded_at.isoformat()  # what it ran against, aged
    build.save(update_fields=["scan_feed"])
    row = api.get("/api/v1/images/tiny-base/").json()
    assert row["scan_status"] == "stale" and row["last_build"]["scan_feed"]["stale"] is True, row
    assert "stale: this result no longer counts as passed" in web.get(f"/images/builds/{build.pk}/").content.decode()
    listing = web.get("/images/").content.decode()
    assert 'data-role="scan-status"><span class="tag tag-warn"' in listing
    assert built(base).status == "succeeded"
    base.refresh_from_db()
    assert base.scan_status == "unscanned"  # a stale feed never yields "passed"


@pytest.mark.django_db(transaction=True)
def test_a_build_whose_worker_died_is_reaped_and_a_rebuild_starts_anew(images_env, settings):
    import subprocess
    import time

    from django.db import connections

    base = define_base(images_env)
    dead = services.build_request(image=base)
    ImageBuild.objects.filter(pk=dead.pk).update(status="running", started_at=timezone.now())
    # What the dead worker left running: a process named after the build's local tag.
    leftover = subprocess.Popen(["bash", "-c", f"exec -a {services.build_tag(dead.pk)} sleep 300"])
    deadline = time.monotonic() + 5
    while b"trainyard-build-" not in Path(f"/proc/{leftover.pid}/cmdline").read_bytes():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    # A build whose worker is alive (it holds the build's session lock on its own connection) is left alone.
    alive = services.build_request(image=services.project_image_define(
        team=TeamFactory(slug="alive"), name="x", base="tiny-base", containerfile="FROM tiny-base\n"))  # fmt: skip
    ImageBuild.objects.filter(pk=alive.pk).update(status="running", started_at=timezone.now())
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s, %s)", [services.BUILD_LOCK_CLASS, alive.pk])
        # A second delivery of a build someone runs returns at once and changes nothing.
        assert services.build_run(build_id=alive.pk).status == "running"
        report = services.builds_reap()
        assert report["reaped"] == 1
        dead.refresh_from_db()
        assert dead.status == "failed" and "the worker running this build stopped" in dead.log
        assert "1 leftover process(es) killed" in dead.log
        deadline = time.monotonic() + 5
        while leftover.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert leftover.returncode == -9
        assert ImageBuild.objects.get(pk=alive.pk).status == "running"
    finally:
        other.close()
        if leftover.poll() is None:
            leftover.kill()
    again = services.build_request(image=base)
    assert again.pk != dead.pk and again.status == "queued"
    # A queued build whose message was lost is sent again once it is old enough.
    ImageBuild.objects.filter(pk=again.pk).update(created_at=timezone.now() - timedelta(hours=1))
    assert services.builds_reap()["requeued"] == 1


# A RUN step (dash only) printing its own cgroup v1 memory limit and CPU quota, read from the host's /sys.
OWN_GROUP = (
    "RUN while IFS=: read n c p; do "
    'if [ "$c" = memory ]; then read m < "/sys/fs/cgroup/memory$p/memory.limit_in_bytes"; echo "group memory $m"; fi; '
    'if [ "$c" = cpu ]; then read q < "/sys/fs/cgroup/cpu$p/cpu.cfs_quota_us"; '
    'read t < "/sys/fs/cgroup/cpu$p/cpu.cfs_period_us"; echo "group cpu $q $t"; fi; '
    "done < /proc/self/cgroup\n"
)


def test_a_build_step_past_its_memory_bound_fails_saying_so_and_a_normal_one_still_builds(images_env, settings):
    """The build step's whole tree is in a control group of its own: a RUN step that keeps doubling a string is
    killed at the build's memory limit, the build fails with that reason and pushes nothing; within the same bounds
    a normal build succeeds and its log says what held it."""
    from kernel import limits

    if limits.detect("auto", v2_parent_setting=settings.TRAINYARD_CGROUP_PARENT) == "rlimit":
        pytest.skip("no control group can be made on this machine: builds are bounded in time only")
    base = define_base(images_env)
    assert built(base).status == "succeeded"
    settings.TRAINYARD_BUILD_MEMORY_MIB = 256
    team = TeamFactory(slug="hungry")
    greedy = services.project_image_define(
        team=team,
        name="greedy",
        base="tiny-base",
        containerfile='FROM tiny-base\nRUN a=x; while :; do a="$a$a"; done\n',
    )
    build = built(greedy)
    assert build.status == "failed", build.log
    assert "the build ran out of memory: killed at its limit of 256 MiB (TRAINYARD_BUILD_MEMORY_MIB)" in build.log
    assert "nothing was pushed" in build.log and build.digest == ""
    assert "build step limits: memory 256 MiB, 4096 processes, CPU 4 (cgroup" in build.log
    with pytest.raises(registry.ManifestUnknown):
        registry.resolve(f"{registry.platform_registry()}/trainyard/hungry/greedy:latest")
    plain = services.project_image_define(
        team=team, name="plain", base="tiny-base", containerfile="FROM tiny-base\nRUN echo fine > /fine\n" + OWN_GROUP
    )
    ok = built(plain)
    assert ok.status == "succeeded", ok.log
    assert "build step limits: memory 256 MiB" in ok.log
    # The RUN step itself sits in the build's group, under its bounds (cgroup v1: the memory and cpu hierarchies).
    if "(cgroup1)" in ok.log:
        assert f"group memory {256 << 20}" in ok.log and "group cpu 400000 100000" in ok.log, ok.log
    assert not list(Path("/sys/fs/cgroup").glob(f"**/*-build-{build.pk}")), "the build's group was not removed"


def test_a_stuck_build_step_ends_failed_at_its_time_limit_with_every_process_killed(images_env, settings):
    import time

    base = define_base(images_env)
    assert built(base).status == "succeeded"
    settings.TRAINYARD_BUILD_TIMEOUT_S = 10
    stuck = services.project_image_define(
        team=TeamFactory(slug="stuck"),
        name="spin",
        base="tiny-base",
        containerfile="FROM tiny-base\nRUN while :; do :; done\n",
    )
    started = time.monotonic()
    build = built(stuck)
    took = time.monotonic() - started
    assert build.status == "failed", build.log
    assert "the build ran past its time limit of 10 s (TRAINYARD_BUILD_TIMEOUT_S) and was stopped" in build.log
    assert "nothing was pushed" in build.log and took < 60, took
    # Nothing of it lingers: no process of the build's tree is left (the spinning RUN step included).
    tag = services.build_tag(build.pk).encode()
    left = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
                if tag in cmdline or b"while :; do :; done" in cmdline:
                    left.append(entry.name)
            except OSError:
                pass
    assert not left, left


ESCAPE_TOOLS = ("/usr/bin/perl", "/usr/bin/curl", "/bin/cat", "/bin/ls")
# Perl's builtins alone (no module): chroot into a subfolder while the working folder stays outside it, climb, and
# chroot again at the real root; then read and write. Each prints PROBE <what>: <result>. (One RUN line: no ').
ESCAPE_PERL = r"""
sub probe { my ($what, $path) = @_; if (open(my $f, "<", $path)) { local $/; my $got = <$f>;
    print "PROBE $what: READ [$got]\n" } else { print "PROBE $what: refused ($!)\n" } }
sub put { my ($what, $path) = @_; if (open(my $f, ">", $path)) { print $f "escaped\n"; close $f;
    print "PROBE $what: WROTE $path\n" } else { print "PROBE $what: refused ($!)\n" } }
my ($var, $host, $registry_dir) = @ARGV;
probe("absolute $_", "$var/$_") for ("secret_key", "postgres.password");
probe("proc-root $_", "/proc/1/root$var/$_") for ("secret_key", "postgres.password");
probe("climb $_", ("../" x 30) . "$var/$_") for ("secret_key", "postgres.password");
put("proc-root write", "/proc/1/root$host/from-proc-root");
mkdir "/jail"; chdir "/";
if (chroot("/jail")) { chdir("..") for 1 .. 40;
    print "PROBE chroot: ", (chroot(".") ? "escaped" : "refused ($!)"), "\n" }
else { print "PROBE chroot: refused ($!)\n" }
probe("after-chroot $_", "$var/$_") for ("secret_key", "postgres.password");
put("after-chroot write", "$host/from-chroot");
my $plant = "$registry_dir/docker/registry/v2/repositories/trainyard/beta";
mkdir $plant; print "PROBE registry-dir: ", (-d $plant ? "PLANTED" : "refused ($!)"), "\n";
print "PROBE registry-read: ", (opendir(my $d, "$registry_dir/docker") ? "LISTED" : "refused ($!)"), "\n";
"""


def _escape_upstream(registry_url: str, build_root: Path, folder: Path) -> str:
    """`<registry>/upstream/escape:1`: a rootfs with a shell, perl (its builtins need no module), curl, cat, ls."""
    from urllib.parse import urlparse

    from images.tests.conftest import _copy_with_libraries, auth_args, podman

    rootfs = folder / "rootfs"
    for tool in ("/bin/dash", *ESCAPE_TOOLS):
        _copy_with_libraries(tool, rootfs)
    (rootfs / "bin" / "dash").rename(rootfs / "bin" / "sh")
    (rootfs / "tmp").mkdir(mode=0o1777)
    (folder / "Containerfile").write_text("FROM scratch\nCOPY rootfs/ /\n")
    reference = f"{urlparse(registry_url).netloc}/upstream/escape:1"
    made = podman(build_root, "build", "--isolation", "chroot", "-t", "localhost/upstream-escape", str(folder))
    assert made.returncode == 0, made.stdout + made.stderr
    auth = auth_args(folder, urlparse(registry_url).netloc)
    pushed = podman(build_root, "push", "--tls-verify=false", *auth, "localhost/upstream-escape", reference)
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    return reference


def test_a_project_builds_run_steps_cannot_read_the_platforms_secrets_write_the_host_or_push(
    images_env, settings, tmp_path, registry_url, build_root
):
    """A team's RUN steps try what escaped the old builds: read var/secret_key and var/postgres.password (by absolute
    path, through /proc/1/root, by climbing ../, and after escaping the chroot), write on the host, plant a
    repository in the registry's storage and push to another team's repository. Each fails; a normal build of the
    same team in the same test still succeeds."""
    import os
    import shutil
    import uuid

    from kernel.paths import VAR_DIR

    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("builds are isolated only when the platform runs as root: run the suite as root")
        pytest.skip("builds are isolated when the platform runs as root")
    if shutil.which("perl") is None or shutil.which("curl") is None:
        pytest.fail("the escape probe needs perl and curl on the machine (apt-get install perl-base curl)")
    secrets = {name: (VAR_DIR / name).read_text().strip() for name in ("secret_key", "postgres.password")}
    assert all(len(value) >= 16 for value in secrets.values())  # ops.embedded made them; the probe looks for them
    host = tmp_path / "host"
    host.mkdir()
    reference = _escape_upstream(registry_url, build_root, tmp_path / "escape")
    base = services.base_image_define(
        name="escape-base", containerfile=f"FROM {reference}\nRUN echo base > /base\n", cuda_version="12.4",
        framework="none", min_driver_version="550.54",
    )  # fmt: skip
    built_base = built(base)
    assert built_base.status == "succeeded", built_base.log
    alpha = TeamFactory(slug="alpha")
    TeamFactory(slug="beta")  # the other team, whose repository the steps try to write
    repo = f"trainyard/beta/pushed-{uuid.uuid4().hex[:8]}"
    push_url = f"{registry_url.rstrip('/')}/v2/{repo}/blobs/uploads/"
    containerfile = (
        "FROM escape-base\n"
        f"RUN perl -e '{' '.join(ESCAPE_PERL.split())}' {VAR_DIR} {host} {VAR_DIR / 'registry'} > /probe-perl 2>&1; "
        "true\n"
        f'RUN echo "PROBE push: $(curl -sS -m 5 -X POST -u trainyard:x {push_url} 2>&1 || true)" > /probe-push; true\n'
        "RUN ls -A /proc/1/root/ > /probe-ls 2>&1; true\n"
    )
    image = services.project_image_define(team=alpha, name="escape", base="escape-base", containerfile=containerfile)
    build = built(image)
    log = build.log
    assert build.status == "succeeded", log
    said = image_files(registry_url, build, "probe-")  # what the steps wrote, read from the pushed image
    lines = (said["probe-perl"] + "\n" + said["probe-push"]).splitlines()
    results = {line.split(": ", 1)[0]: line.split(": ", 1)[1] for line in lines if line.startswith("PROBE ")}
    assert len(results) == 14, said  # every probe ran and said what it got
    for name, value in secrets.items():
        assert value not in log and all(value not in text for text in said.values()), f"the build read var/{name}"
    # The chroot itself may be left (the step is root in its own user namespace), but that leaves the team's
    # unprivileged build user in the jail: every read, write and plant is refused all the same.
    assert results.pop("PROBE chroot") in ("escaped", "refused (Operation not permitted)"), log
    refused = {what: got for what, got in results.items() if what != "PROBE push"}
    assert not {what: got for what, got in refused.items() if not got.startswith("refused (")}, refused
    assert "Failed to connect" in results["PROBE push"] or "Could not resolve" in results["PROBE push"], log
    assert "Permission denied" in said["probe-ls"], said  # ls /proc/1/root: the host's root is not listed
    assert (
        not any(host.iterdir()) and not (VAR_DIR / "registry/docker/registry/v2/repositories/trainyard/beta").exists()
    )
    with pytest.raises(registry.ManifestUnknown):
        registry.resolve(f"{registry.platform_registry()}/{repo}:latest")
    # The same team's ordinary build still works.
    normal = services.project_image_define(
        team=alpha, name="normal", base="escape-base", containerfile="FROM escape-base\nRUN echo ok > /ok\n"
    )
    assert built(normal).status == "succeeded"
