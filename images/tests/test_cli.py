"""`trainyard images` and `trainyard image build` against a live server, with a real Celery worker running the
build (podman) and pushing to the session's registry."""

import pytest

from images.models import ImageBuild
from images.tests.test_builds import base_built
from jobs.tests.conftest import platform  # noqa: F401 - the seeded platform fixture
from trainyard.tests.test_cli import cli  # noqa: F401,F811 - runs the CLI in-process against the live server


@pytest.fixture
def base(images_env, platform):  # noqa: F811
    return base_built(images_env)


def test_image_build_waits_for_the_worker_and_images_lists_the_result(  # noqa: F811
    cli,  # noqa: F811
    base,
    celery_worker_thread,
    tmp_path,
):
    containerfile = tmp_path / "Containerfile"
    containerfile.write_text("FROM tiny-base\nRUN echo trained > /model-card\n")
    result = cli(
        "image", "build", "trainer", "--team", "demo", "--base", "tiny-base", "-f", str(containerfile), "--wait",
        "--interval", "0.2",
    )  # fmt: skip
    assert result.code == 0, result.out + result.err
    build = ImageBuild.objects.get(project_image__name="trainer")
    assert build.status == "succeeded" and build.digest in result.out and "succeeded" in result.out
    listed = cli("images")
    assert listed.code == 0
    line = next(row for row in listed.out.splitlines() if row.startswith("trainer"))
    assert "demo" in line and "tiny-base" in line and build.digest[7:19] in line and "none" in line
    assert any(row.startswith("tiny-base") and "(base)" in row for row in listed.out.splitlines())


def test_a_failing_build_exits_1_with_its_log_and_a_foreign_from_is_refused(  # noqa: F811
    cli,  # noqa: F811
    base,
    celery_worker_thread,
    tmp_path,
):
    bad = tmp_path / "Bad"
    bad.write_text("FROM docker.io/library/ubuntu:24.04\n")
    refused = cli("image", "build", "x", "--team", "demo", "--base", "tiny-base", "-f", str(bad))
    assert refused.code != 0 and "base_not_in_catalog" in refused.err
    broken = tmp_path / "Broken"
    broken.write_text("FROM tiny-base\nRUN echo about to fail && exit 7\n")
    failed = cli(
        "image", "build", "broken", "--team", "demo", "--base", "tiny-base", "-f", str(broken), "--wait",
        "--interval", "0.2",
    )  # fmt: skip
    assert failed.code == 1 and "failed" in failed.out and "about to fail" in failed.out
