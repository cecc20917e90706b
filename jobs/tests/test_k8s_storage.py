"""Checkpoints and datasets on the Volcano path: the native checkpoint sidecar and the dataset volumes, validated
against every Volcano release's CRDs and Kubernetes' own schema, the sidecar's code run as a real process on a real
S3 store, and the fake API server seeing it all through a real submission."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from jobs.backends import checkpoint_sync
from jobs.backends import volcano_render as render
from jobs.backends.dataset_cache import entry_name
from jobs.tests.test_volcano_backend import kube, platform  # noqa: F401 - fixtures
from jobs.tests.test_volcano_render import (  # noqa: F401 - fixture
    describe,
    options,
    templates,
    trainer,
    validate_everywhere,
    validate_pod_template,
    volcano_crds,
)
from trainyard import objectstore
from trainyard.paths import BASE_DIR

PREFIX = "vision/0f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0/attempt-2/"
RESTORE = {
    "name": "ckpt-100.pt",
    "job": "0f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0",
    "attempt": 1,
    "files": [{"path": "ckpt-100.pt", "key": "k", "sha256": "0" * 64, "size": 3}],
}
S3_DATASET = {"id": 7, "team": "vision", "name": "imagenet", "version": 3, "path": "/data", "kind": "s3",
              "prefix": "datasets/imagenet/3/", "claim": "", "size_bytes": 1000, "file_count": 10}  # fmt: skip
PVC_DATASET = {"id": 8, "team": "vision", "name": "coco", "version": 1, "path": "/coco", "kind": "pvc",
               "prefix": "", "claim": "coco-pvc", "size_bytes": 0, "file_count": 0}  # fmt: skip


def with_store(**overrides):
    return options(s3_url="http://s3.storage.svc:8333", platform_image="registry.example.org/trainyard:0.1.0",
                   **overrides)  # fmt: skip


@pytest.mark.parametrize("replicas", [1, 2])
def test_the_checkpoint_sidecar_and_dataset_volumes_validate_on_every_release(replicas, volcano_crds):  # noqa: F811
    desc = describe(
        "guaranteed",
        replicas=replicas,
        checkpoint={"prefix": PREFIX, "restore": RESTORE},
        datasets=[S3_DATASET, PVC_DATASET],
    )
    job = render.render_job(desc, with_store())
    validate_everywhere(job, volcano_crds)
    for template in templates(job).values():
        validate_pod_template(template)
        spec = template["spec"]
        inits = {c["name"]: c for c in spec["initContainers"]}
        sidecar = inits[render.CHECKPOINT_SIDECAR]
        assert sidecar["restartPolicy"] == "Always"  # native sidecar: ends with the trainer
        assert sidecar["image"] == "registry.example.org/trainyard:0.1.0"
        assert sidecar["command"][:3] == ["python", "-m", "jobs.backends.checkpoint_sync"]
        conf = json.loads(next(e["value"] for e in sidecar["env"] if e["name"] == "TRAINYARD_CHECKPOINT_SPEC"))
        assert conf["prefix"] == PREFIX and conf["restore"]["name"] == "ckpt-100.pt"
        assert conf["final_wait_s"] < spec["terminationGracePeriodSeconds"]  # the final sync fits the grace period
        keys = {e["name"]: e.get("valueFrom") for e in sidecar["env"]}
        assert keys["TRAINYARD_S3_SECRET_ACCESS_KEY"] == {
            "secretKeyRef": {"name": "trainyard-s3", "key": "TRAINYARD_S3_SECRET_ACCESS_KEY"}
        }
        assert sidecar["startupProbe"]["exec"]["command"] == ["test", "-e", "/trainyard/sync/ready"]
        # One emptyDir shared by the trainer and the sidecar.
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["checkpoints"] == {"name": "checkpoints", "emptyDir": {}}
        main = trainer(template)
        assert {"name": "checkpoints", "mountPath": "/trainyard/checkpoints"} in main["volumeMounts"]
        assert {"name": "checkpoints", "mountPath": "/trainyard/checkpoints"} in sidecar["volumeMounts"]
        env = {e["name"]: e.get("value") for e in main["env"]}
        assert env["TRAINYARD_CHECKPOINT_DIR"] == "/trainyard/checkpoints"
        assert env["TRAINYARD_RESUME_FROM"] == "/trainyard/checkpoints/ckpt-100.pt"
        assert "TRAINYARD_S3_SECRET_ACCESS_KEY" not in env  # the trainer never gets the store's keys
        # Datasets: a claim read-only; an S3 dataset fetched by an init container, mounted read-only.
        assert volumes["dataset-1"]["persistentVolumeClaim"] == {"claimName": "coco-pvc", "readOnly": True}
        assert {"name": "dataset-1", "mountPath": "/coco", "readOnly": True} in main["volumeMounts"]
        fetcher = inits["dataset-0"]
        assert fetcher["command"][:3] == ["python", "-m", "jobs.backends.dataset_cache"]
        assert "restartPolicy" not in fetcher  # a plain init container: done before the trainer starts
        assert volumes["datasets"] == {"name": "datasets", "emptyDir": {}}
        data_mount = next(m for m in main["volumeMounts"] if m["mountPath"] == "/data")
        spec_item = {k: S3_DATASET[k] for k in ("id", "team", "name", "version", "prefix")}
        assert data_mount == {"name": "datasets", "mountPath": "/data", "readOnly": True,
                              "subPath": f"data/{entry_name(spec_item)}"}  # fmt: skip


def test_without_an_object_store_there_is_no_sidecar_and_s3_datasets_are_refused():
    plain = render.render_job(describe(checkpoint={"prefix": PREFIX}, datasets=[PVC_DATASET]), options())
    spec = templates(plain)["main"]["spec"]
    assert "initContainers" not in spec
    with pytest.raises(render.ManifestError, match="TRAINYARD_S3_URL is not set"):
        render.render_job(describe(datasets=[S3_DATASET]), options())


def _wait(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


@pytest.mark.slow
def test_the_sidecar_process_restores_syncs_publishes_and_makes_the_final_sync(object_store, tmp_path):
    s3 = objectstore.client(object_store)
    source = tmp_path / "source"
    source.mkdir()
    (source / "ckpt-100.pt").write_bytes(b"weights-100")
    stored = checkpoint_sync.upload_file(s3, bucket=object_store.bucket, key="sidecar-test/a1/ckpt-100.pt",
                                         path=source / "ckpt-100.pt")  # fmt: skip
    prefix = f"sidecar-test/{os.getpid()}-{time.time_ns()}/attempt-2/"
    restore = {"name": "ckpt-100.pt", "files": [{"path": "ckpt-100.pt", "key": stored["key"],
                                                 "sha256": stored["sha256"], "size": stored["size"]}]}  # fmt: skip
    folder, state = tmp_path / "checkpoints", tmp_path / "state"
    env = {
        **os.environ,
        "PYTHONPATH": str(BASE_DIR),
        "TRAINYARD_S3_URL": object_store.url,
        "TRAINYARD_S3_BUCKET": object_store.bucket,
        "TRAINYARD_S3_ACCESS_KEY_ID": object_store.access_key_id,
        "TRAINYARD_S3_SECRET_ACCESS_KEY": object_store.secret_access_key,
        "TRAINYARD_CHECKPOINT_SPEC": json.dumps(
            {"dir": str(folder), "prefix": prefix, "restore": restore, "sync_s": 0.3, "final_wait_s": 10}
        ),
    }
    sidecar = subprocess.Popen(
        [sys.executable, "-m", "jobs.backends.checkpoint_sync", "--state", str(state)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait(lambda: (state / "ready").exists())
        assert (folder / "ckpt-100.pt").read_bytes() == b"weights-100"  # restored before it reported ready
        (folder / "ckpt-200.pt").write_bytes(b"weights-200")
        key = checkpoint_sync.manifest_key(prefix)

        def published():
            try:
                body = s3.get_object(Bucket=object_store.bucket, Key=key)["Body"].read()
            except Exception:  # noqa: BLE001 - not yet
                return None
            manifest = json.loads(body)
            return manifest if "ckpt-200.pt" in manifest["files"] else None

        manifest = _wait(published)
        assert "ckpt-100.pt" not in manifest["files"]  # restored, not uploaded again
        (folder / "last.pt").write_bytes(b"at-the-end")  # written just before the pod ends
        sidecar.send_signal(signal.SIGTERM)
        assert sidecar.wait(30) == 0, sidecar.stdout.read()
    finally:
        if sidecar.poll() is None:
            sidecar.kill()
            sidecar.wait()
    final = json.loads(s3.get_object(Bucket=object_store.bucket, Key=key)["Body"].read())
    assert final["final"] is True and final["unsaved"] == [] and "last.pt" in final["files"]
    assert s3.get_object(Bucket=object_store.bucket, Key=prefix + "last.pt")["Body"].read() == b"at-the-end"


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_the_fake_api_server_gets_the_sidecar_and_the_platform_records_what_it_publishes(
    kube,  # noqa: F811
    platform,  # noqa: F811
    celery_worker_thread,
    checkpoint_store,
    settings,
    tmp_path,  # noqa: F811
):
    from jobs.backends import reset_backends
    from jobs.backends.volcano import parse_ref
    from jobs.models import Checkpoint, Dataset
    from jobs.tests.test_volcano_backend import JOBS, TEAM_NS, attempt_ref, drive, reload, submit
    from quotas.models import Team

    reset_backends()  # the backend's render options read the store settings the fixture set
    Dataset.objects.create(team=Team.objects.get(slug="demo"), name="coco", claim="coco-pvc")
    kube.controller.script("ty-", run_ticks=None)
    job = submit(platform, datasets=[{"name": "coco", "path": "/coco"}])
    drive(kube, lambda: reload(job).state == "running")
    vcjob = kube.get(JOBS, parse_ref(attempt_ref(job))[1], TEAM_NS)
    pod = vcjob["spec"]["tasks"][0]["template"]["spec"]
    sidecar = next(c for c in pod["initContainers"] if c["name"] == render.CHECKPOINT_SIDECAR)
    assert sidecar["restartPolicy"] == "Always"
    assert {"name": "dataset-0", "persistentVolumeClaim": {"claimName": "coco-pvc", "readOnly": True}} in pod["volumes"]
    conf = json.loads(next(e["value"] for e in sidecar["env"] if e["name"] == "TRAINYARD_CHECKPOINT_SPEC"))
    assert conf["prefix"] == f"demo/{job.id}/attempt-1/"
    # The sidecar's own code, publishing for that pod: the platform's observer records the checkpoint.
    folder, state = tmp_path / "pod-checkpoints", tmp_path / "pod-state"
    folder.mkdir()
    state.mkdir()
    (folder / "step-300.pt").write_bytes(b"from-the-pod")
    sync = checkpoint_sync.SidecarSync(state, {**conf, "dir": str(folder), "store": checkpoint_store.to_dict()})
    assert sync.sync_once(final=True)
    saved = drive(kube, lambda: Checkpoint.objects.filter(job=job, name="step-300.pt").first())
    assert saved.step == 300 and saved.size_bytes == len(b"from-the-pod") and saved.attempt.number == 1
