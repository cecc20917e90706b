"""A job's code snapshot on Kubernetes: published to the object store at submission, fetched into the pod's
working directory by an init container of the platform's own code (digest checked). Validated against every
Volcano release's CRDs and Kubernetes' schema; the init container's code run as a real process on a real S3 store
(SeaweedFS). A submission without an object store refused, and a failed fetch ending the attempt with its reason,
are on the real API server (tests/k8s/test_code_snapshot.py, test_init_containers.py), the fetch's termination
message written by this code. Not run on a real kubelet here: kwok's nodes run no containers."""

import json
import os
import subprocess
import sys

import pytest
from trainyard_cli.code import pack

from jobs import code
from jobs.backends import volcano_render as render
from jobs.tests.test_volcano_render import describe, options, validate_everywhere, volcano_crds  # noqa: F401
from kernel import objectstore
from kernel.paths import BASE_DIR

DIGEST = "sha256:" + "ab" * 32
CODE = {"team": "vision", "digest": DIGEST, "key": code.store_key("vision", DIGEST)}


def with_store(**overrides):
    return options(s3_url="http://s3.storage.svc:8333", platform_image="registry.example.org/trainyard:0.1.0",
                   **overrides)  # fmt: skip


@pytest.mark.parametrize("replicas", [1, 2])
def test_the_code_init_container_validates_on_every_release(replicas, volcano_crds):  # noqa: F811
    desc = describe("guaranteed", replicas=replicas, code=CODE)
    job = render.render_job(desc, with_store())
    validate_everywhere(job, volcano_crds)
    for task in job["spec"]["tasks"]:
        pod = task["template"]["spec"]
        first = pod["initContainers"][0]
        assert first["name"] == render.CODE_FETCHER and first["image"] == "registry.example.org/trainyard:0.1.0"
        assert first["command"][:3] == ["python", "-m", "jobs.backends.code_fetch"]
        spec = json.loads(next(e["value"] for e in first["env"] if e["name"] == "TRAINYARD_CODE"))
        assert spec == {"key": "code/vision/" + "ab" * 32 + ".tar.gz", "digest": DIGEST}
        assert {"name": "code", "emptyDir": {}} in pod["volumes"]
        trainer = pod["containers"][0]
        assert trainer["workingDir"] == "/workspace"
        assert {"name": "code", "mountPath": "/workspace"} in trainer["volumeMounts"]


def test_a_relative_working_dir_is_inside_the_code_and_no_store_is_refused(volcano_crds):  # noqa: F811
    job = render.render_job(describe("guaranteed", code=CODE, working_dir="src"), with_store())
    assert job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["workingDir"] == "/workspace/src"
    with pytest.raises(render.ManifestError, match="TRAINYARD_S3_URL is not set"):
        render.render_job(describe("guaranteed", code=CODE), options())


def _fetch_process(store, tmp_path, spec):
    into, termination = tmp_path / "workspace", tmp_path / "termination-log"
    env = {
        **os.environ,
        "PYTHONPATH": str(BASE_DIR),
        "TRAINYARD_S3_URL": store.url,
        "TRAINYARD_S3_BUCKET": store.bucket,
        "TRAINYARD_S3_ACCESS_KEY_ID": store.access_key_id,
        "TRAINYARD_S3_SECRET_ACCESS_KEY": store.secret_access_key,
        "TRAINYARD_CODE": json.dumps(spec),
    }
    done = subprocess.run(
        [sys.executable, "-m", "jobs.backends.code_fetch", "--into", str(into), "--termination-log", str(termination)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return done, into, termination.read_text() if termination.exists() else ""


def test_the_init_container_process_fetches_checks_and_unpacks_from_a_real_store(object_store, tmp_path):
    folder = tmp_path / "project"
    (folder / "pkg").mkdir(parents=True)
    (folder / "pkg" / "model.py").write_text("NAME = 'tiny'\n")
    (folder / "train.py").write_text("print('hi')\n")
    data, digest, _ = pack(folder)
    s3 = objectstore.client(object_store)
    objectstore.ensure_bucket(object_store, s3)
    key = code.store_key("vision", digest)
    s3.put_object(Bucket=object_store.bucket, Key=key, Body=data)
    done, into, said = _fetch_process(object_store, tmp_path, {"key": key, "digest": digest})
    assert done.returncode == 0, done.stderr
    assert (into / "train.py").read_text() == "print('hi')\n" and (into / "pkg" / "model.py").exists()
    assert (into / ".trainyard-code").read_text().strip() == digest
    # Other bytes under that key: refused, nothing unpacked over the copy, the reason in the termination log.
    s3.put_object(Bucket=object_store.bucket, Key=key, Body=pack(folder.parent / "project")[0][:-8] + b"x" * 8)
    (into / ".trainyard-code").unlink()
    done, _into, said = _fetch_process(object_store, tmp_path, {"key": key, "digest": digest})
    assert done.returncode == 1 and said.startswith("CodeFetchError: the stored code snapshot is sha256:"), said
    # A key the store does not have.
    done, _into, said = _fetch_process(object_store, tmp_path / "x", {"key": key + ".gone", "digest": digest})
    assert done.returncode == 1 and said.startswith("CodeFetchError: cannot read code snapshot"), said


def test_the_default_rules_retry_a_failed_code_fetch():
    from jobs.classifier import DEFAULT_RULES

    rule = next(r for r in DEFAULT_RULES if r["name"] == "code-fetch-failed")
    assert (rule["failure_class"], rule["reaction"]) == ("platform", "retry")
