"""A local job naming the offline base `python-local` (built by the `offline_base` fixture with the real podman into
the session's registry): its digest is pinned at submission and recorded, and it runs — on the host, as the local
backend runs every job."""

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.django_db(transaction=True)
def test_a_local_job_naming_the_offline_base_runs_on_the_host_with_the_digest_recorded(
    platform, celery_worker_thread, offline_base
):
    """What the local backend does with the image: it pins and records the digest, and runs the command in its
    sandbox on the host's read-only system folders and the platform's Python — not in the image's rootfs."""
    import sys

    from jobs.states import JobState
    from jobs.tests.conftest import wait_for
    from jobs.tests.test_lifecycle_e2e import finished, log_text, submit

    _, base = offline_base
    job = submit(
        platform,
        image="python-local",
        command=["python", "-c", "import numpy, sys; print('numpy', numpy.__version__, 'python', sys.executable)"],
    )
    assert job.image_digest == base.digest  # resolved at submission from the catalog
    job = wait_for(lambda: finished(job), timeout=60)
    assert job.state == JobState.SUCCEEDED, job.reason
    import numpy

    assert f"numpy {numpy.__version__} python {sys.executable}" in log_text(job)  # the platform's interpreter
    record = job.reproduce
    assert record["image_requested"] == {"reference": base.reference, "digest": base.digest}
    assert record["image_used"] is False and record["runtime"]["kind"] == "host"
