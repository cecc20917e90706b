"""Checkpoints and datasets on the Volcano path: the native checkpoint sidecar and the dataset volumes, validated
against every Volcano release's CRDs and Kubernetes' own schema, the sidecar's, fill's and waiter's code run as real
processes on a real S3 store, and how the observer reads a failed init container. A submission through the real API
server, with those init containers failing and the fill Job failing, is in tests/k8s (test_init_containers.py,
test_dataset_fills.py)."""

import json
import os
import signal
import subprocess
import sys
import time

import kubernetes_validate
import pytest

from jobs.backends import checkpoint_sync, dataset_cache
from jobs.backends import volcano_render as render
from jobs.backends.dataset_cache import entry_name
from jobs.tests.test_volcano_render import (  # noqa: F401 - fixture
    describe,
    options,
    templates,
    trainer,
    validate_everywhere,
    validate_pod_template,
    volcano_crds,
)
from kernel import objectstore
from kernel.paths import BASE_DIR

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
    assert [c["name"] for c in spec["initContainers"]] == ["ty-exec"]  # the stderr wrapper only, no sidecar
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


def _sidecar_process(env_store, tmp_path, restore, *, url=None):
    """The sidecar's own code as a process, restoring `restore`: its exit code and its termination message."""
    folder, state, termination = tmp_path / "checkpoints", tmp_path / "state", tmp_path / "termination-log"
    env = {
        **os.environ,
        "PYTHONPATH": str(BASE_DIR),
        "TRAINYARD_S3_URL": url or env_store.url,
        "TRAINYARD_S3_BUCKET": env_store.bucket,
        "TRAINYARD_S3_ACCESS_KEY_ID": env_store.access_key_id,
        "TRAINYARD_S3_SECRET_ACCESS_KEY": env_store.secret_access_key,
        "TRAINYARD_CHECKPOINT_SPEC": json.dumps({"dir": str(folder), "prefix": "restore-test/a2/", "restore": restore}),
    }
    done = subprocess.run(
        [sys.executable, "-m", "jobs.backends.checkpoint_sync", "--state", str(state),
         "--termination-log", str(termination)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert not (state / "ready").exists()  # never reported started: the trainer would not start
    return done, termination.read_text() if termination.exists() else ""


@pytest.mark.slow
def test_the_sidecar_process_reports_a_failed_restore_with_its_reason(object_store, tmp_path):
    from ops.embedded import free_port

    s3 = objectstore.client(object_store)
    source = tmp_path / "ckpt-100.pt"
    source.write_bytes(b"weights-100")
    key = f"restore-test/{os.getpid()}-{time.time_ns()}/ckpt-100.pt"
    stored = checkpoint_sync.upload_file(s3, bucket=object_store.bucket, key=key, path=source)
    good = {"path": "ckpt-100.pt", "key": key, "sha256": stored["sha256"], "size": stored["size"]}
    plan = {"name": "ckpt-100.pt", "job": "0f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0", "attempt": 1}

    missing = {**plan, "files": [{**good, "key": key + ".gone"}]}
    done, said = _sidecar_process(object_store, tmp_path / "missing", missing)
    assert done.returncode == checkpoint_sync.RESTORE_EXIT_CODE == 125
    assert said.startswith("CheckpointRestoreError: could not restore checkpoint ckpt-100.pt (job 0f1e2d3c-")
    assert "attempt 1)" in said and "missing in the object store" in said
    assert "[trainyard] could not restore checkpoint ckpt-100.pt" in done.stderr  # the local supervisor's line

    corrupt = {**plan, "files": [{**good, "sha256": "0" * 64}]}
    done, said = _sidecar_process(object_store, tmp_path / "corrupt", corrupt)
    assert done.returncode == 125
    assert said.startswith("CheckpointRestoreError: ") and "does not match its checksum" in said

    done, said = _sidecar_process(
        object_store, tmp_path / "down", {**plan, "files": [good]}, url=f"http://127.0.0.1:{free_port()}"
    )
    assert done.returncode == 125
    assert said.startswith("CheckpointStoreUnavailable: could not restore checkpoint ckpt-100.pt"), said


def _pod_with(name: str, terminated: dict, *, sidecar: bool = False) -> dict:
    """A pod as the kubelet reports it after the init container `name` exited: now (a plain one), or as the last
    state of a native sidecar it backs off."""
    status = {"name": name, "restartCount": 1 if sidecar else 0, "state": {"terminated": terminated}}
    if sidecar:
        status = {**status, "state": {"waiting": {"reason": "CrashLoopBackOff"}}, "lastState": status["state"]}
    labels = {"volcano.sh/task-spec": "main", "volcano.sh/task-index": "0"}
    return {"metadata": {"name": "ty-x-main-0", "labels": labels},
            "spec": {"nodeName": "kwok-gpu-0"}, "status": {"initContainerStatuses": [status]}}  # fmt: skip


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Its termination message, as the sidecar's own code writes it.
        ("CheckpointRestoreError: could not restore checkpoint ckpt-100.pt (job j, attempt 1): missing",
         ("CheckpointRestoreError", "could not restore checkpoint ckpt-100.pt (job j, attempt 1): missing")),
        # No termination message written: the end of its log stands in (FallbackToLogsOnError), reason unsaid.
        ("starting\n[trainyard] could not restore checkpoint ckpt-100.pt: boom",
         ("CheckpointStoreUnavailable", "could not restore checkpoint ckpt-100.pt: boom")),
        ("", ("CheckpointStoreUnavailable", "the checkpoint sidecar of main-0 could not restore the checkpoint to "
              "resume from (exit code 125) and left no message")),
    ],
)  # fmt: skip
def test_a_failed_restore_is_read_from_the_sidecars_message_or_the_end_of_its_log(text, expected):
    """How the observer reads the exit of the checkpoint sidecar (the real cluster's
    tests/k8s/test_init_containers.py drives a whole failed restore through the API server); another exit code is
    not a failed restore (the kubelet starts the sidecar again)."""
    from jobs.backends.volcano import _restore_failure

    terminated = {"exitCode": 125, "reason": "Error", **({"message": text} if text else {})}
    obs = _restore_failure([_pod_with(render.CHECKPOINT_SIDECAR, terminated, sidecar=True)])
    assert (obs.phase, obs.exit_code, obs.reason, obs.message, obs.node) == ("failed", 125, *expected, "kwok-gpu-0")
    assert _restore_failure([_pod_with(render.CHECKPOINT_SIDECAR, {**terminated, "exitCode": 2}, sidecar=True)]) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("DatasetFetchError: dataset imagenet v3 was not in its shared cache volume after 21600 s",
         ("DatasetFetchError", "dataset imagenet v3 was not in its shared cache volume after 21600 s")),
        ("fetching\n[trainyard] DatasetCacheFull: dataset needs 2000 bytes; the node's cache holds at most 1000",
         ("DatasetCacheFull", "dataset needs 2000 bytes; the node's cache holds at most 1000")),
        ("Traceback (most recent call last):\nKeyError: 'x'",
         ("Error", "init container dataset-0 exited with code 1: KeyError: 'x'")),
    ],
)  # fmt: skip
def test_a_failed_init_containers_reason_is_its_message_or_the_end_of_its_log(text, expected):
    """How the observer reads a failed plain init container (a dataset's, the code fetch): the reason its own code
    wrote, from its termination message or the end of its log; anything else is an `Error` with what it said."""
    from jobs.backends.volcano import _failed_init

    terminated, reason, message = _failed_init(_pod_with("dataset-0", {"exitCode": 1, "reason": "Error",
                                                                       "message": text}))  # fmt: skip
    assert (terminated["exitCode"], reason, message) == (1, *expected)


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("CheckpointRestoreError", ("platform", "no_retry", "checkpoint-restore-failed")),
        ("CheckpointStoreUnavailable", ("platform", "retry", "checkpoint-store-unavailable")),
        ("DatasetFetchError", ("platform", "retry", "dataset-fetch-failed")),
        ("DatasetChanged", ("user", "no_retry", "dataset-changed")),
        ("DatasetCacheFull", ("resource", "no_retry", "dataset-cache-full")),
    ],
)
def test_default_rules_retry_a_store_outage_but_not_an_unusable_checkpoint(reason, expected):
    from jobs import classifier
    from jobs.models import FailureRule

    rules = [FailureRule(**data) for data in sorted(classifier.DEFAULT_RULES, key=lambda d: d["order"])]
    verdict = classifier.classify(classifier.Observation(exit_code=125, reason=reason), rules)
    assert (verdict.failure_class, verdict.reaction, verdict.rule) == expected


# ------------------------------------------------------------------------------------ shared dataset cache volumes

RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
                      "secret"}  # fmt: skip


def assert_restricted(pod: dict) -> None:
    """The restricted Pod Security Standard's checks for what these pods set."""
    security = pod.get("securityContext") or {}
    assert security.get("seccompProfile") == {"type": "RuntimeDefault"}
    assert not (pod.get("hostNetwork") or pod.get("hostPID") or pod.get("hostIPC"))
    for volume in pod["volumes"]:
        assert set(volume) - {"name"} <= RESTRICTED_VOLUMES, volume
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        own = container.get("securityContext") or {}
        assert own.get("runAsNonRoot", security.get("runAsNonRoot")) is True, container["name"]
        assert own.get("allowPrivilegeEscalation") is False and own.get("privileged") is not True, container["name"]
        assert own.get("capabilities", {}).get("drop") == ["ALL"], container["name"]
        assert (own.get("runAsUser", security.get("runAsUser")) or 1) != 0, container["name"]


def cached(**overrides):
    return with_store(**{"dataset_cache_storage_class": "cephfs", **overrides})


@pytest.mark.parametrize("replicas", [1, 2])
def test_with_a_cache_storage_class_pods_mount_one_shared_claim_per_dataset_version(
    replicas,
    volcano_crds,  # noqa: F811
):
    second = {**S3_DATASET, "id": 9, "name": "laion", "version": 1, "path": "/laion", "size_bytes": 50 * 1024**3}
    desc = describe("guaranteed", replicas=replicas, datasets=[S3_DATASET, PVC_DATASET, second])
    job = render.render_job(desc, cached())
    validate_everywhere(job, volcano_crds)
    fills = json.loads(job["metadata"]["annotations"][render.ANNOTATION_DATASET_FILLS])
    assert [(f["id"], f["version"]) for f in fills] == [(7, 3), (9, 1)]  # the claims' datasets, for the observer
    for template in templates(job).values():
        validate_pod_template(template)
        spec = template["spec"]
        assert_restricted(spec)
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert "datasets" not in volumes  # no emptyDir copy per pod
        assert volumes["dataset-0"]["persistentVolumeClaim"] == {"claimName": "ty-dataset-7-v3", "readOnly": True}
        assert volumes["dataset-2"]["persistentVolumeClaim"] == {"claimName": "ty-dataset-9-v1", "readOnly": True}
        main = trainer(template)
        spec_item = {k: S3_DATASET[k] for k in ("id", "team", "name", "version", "prefix")}
        assert {"name": "dataset-0", "mountPath": "/data", "readOnly": True,
                "subPath": f"data/{entry_name(spec_item)}"} in main["volumeMounts"]  # fmt: skip
        inits = {c["name"]: c for c in spec["initContainers"]}
        waiter = inits["dataset-0"]
        assert waiter["command"][:4] == ["python", "-m", "jobs.backends.dataset_cache", "wait"]
        assert "restartPolicy" not in waiter  # a plain init container: the trainer starts only after it ended
        assert waiter["command"][waiter["command"].index("--timeout-s") + 1] == str(6 * 3600)
        assert waiter["terminationMessagePolicy"] == "FallbackToLogsOnError"
        assert all(m.get("readOnly") for m in waiter["volumeMounts"] if m["name"] == "dataset-0")
        env = {e["name"] for e in waiter["env"]}
        assert "TRAINYARD_S3_SECRET_ACCESS_KEY" not in env  # it only reads the volume
        assert "dataset-1" not in inits  # a registered claim needs no waiting


def test_the_dataset_claim_and_fill_job_are_valid_restricted_and_sized_with_headroom():
    spec = {k: S3_DATASET[k] for k in render.DATASET_SPEC_KEYS}
    claim = render.render_dataset_claim({**spec, "size_bytes": 100 * 1024**3}, "trainyard-vision", cached())
    fill = render.render_dataset_fill(spec, "trainyard-vision", cached(service_account="jobs"))
    for version in ("1.29", kubernetes_validate.latest_version()):
        for obj in (claim, fill):
            kubernetes_validate.validate(obj, version, strict=True)
    assert claim["metadata"]["name"] == fill["metadata"]["name"] == "ty-dataset-7-v3"
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"] and claim["spec"]["storageClassName"] == "cephfs"
    assert claim["spec"]["resources"]["requests"]["storage"] == f"{110 * 1024 + 256}Mi"  # +10 % and 256 MiB
    assert render.dataset_claim_size(1000) == "1024Mi"  # at least 1 GiB
    pod = fill["spec"]["template"]["spec"]
    assert_restricted(pod)
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    [container] = pod["containers"]
    assert container["command"][:4] == ["python", "-m", "jobs.backends.dataset_cache", "fill"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": "cache", "mountPath": "/trainyard/datasets"} in container["volumeMounts"]
    assert pod["volumes"][0] == {"name": "cache", "persistentVolumeClaim": {"claimName": "ty-dataset-7-v3"}}
    assert fill["spec"]["activeDeadlineSeconds"] == 6 * 3600 and fill["spec"]["backoffLimit"] == 2
    # A fill that no retry can make succeed (its process exits 3) fails the Job at once.
    assert fill["spec"]["podFailurePolicy"]["rules"] == [
        {"action": "FailJob", "onExitCodes": {"containerName": "fill", "operator": "In", "values": [3]}}
    ]
    labels = fill["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "dataset-fill" and labels["trainyard.io/dataset-id"] == "7"
    # Without the setting: today's emptyDir fetcher per pod, and no fill to wait for.
    job = render.render_job(describe(datasets=[S3_DATASET]), with_store())
    assert render.ANNOTATION_DATASET_FILLS not in job["metadata"]["annotations"]
    with pytest.raises(render.ManifestError, match="TRAINYARD_DATASET_CACHE_STORAGE_CLASS"):
        cached(dataset_cache_storage_class="Not A Class")


@pytest.mark.slow
def test_the_fill_and_wait_processes_share_one_verified_copy(object_store, tmp_path):
    s3 = objectstore.client(object_store)
    prefix = f"datasets/fill-{os.getpid()}-{time.time_ns()}/"
    files = {"train/a.bin": b"a" * 100, "train/b.bin": b"b" * 50, "labels.csv": b"x,1\n"}
    for rel, body in files.items():
        s3.put_object(Bucket=object_store.bucket, Key=prefix + rel, Body=body)
    spec = {"id": 11, "team": "vision", "name": "tiny", "version": 2, "prefix": prefix,
            "size_bytes": sum(map(len, files.values())), "file_count": len(files)}  # fmt: skip
    volume = tmp_path / "claim"
    volume.mkdir()

    def run(action, *extra, dataset=spec, store_url=object_store.url):
        env = {**os.environ, "PYTHONPATH": str(BASE_DIR), "TRAINYARD_DATASET": json.dumps(dataset),
               "TRAINYARD_S3_URL": store_url, "TRAINYARD_S3_BUCKET": object_store.bucket,
               "TRAINYARD_S3_ACCESS_KEY_ID": object_store.access_key_id,
               "TRAINYARD_S3_SECRET_ACCESS_KEY": object_store.secret_access_key}  # fmt: skip
        log = tmp_path / f"termination-{time.time_ns()}"  # each container run gets a file of its own
        done = subprocess.run(
            [sys.executable, "-m", "jobs.backends.dataset_cache", action, "--cache", str(volume),
             "--termination-log", str(log), *extra],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        return done, log.read_text() if log.exists() else ""

    waited, said = run("wait", "--timeout-s", "0.5", "--poll-s", "0.1")  # nothing filled yet: bounded, and says so
    assert waited.returncode == 1
    assert said.startswith("DatasetFetchError: dataset tiny v2 was not in its shared cache volume after 0.5 s")
    changed = {**spec, "file_count": 4}
    failed, said = run("fill", dataset=changed)
    # No retry of the fill Job can mend this: exit 3, on which its pod failure policy fails the Job at once.
    assert failed.returncode == dataset_cache.FILL_CANNOT_SUCCEED_EXIT == 3
    assert said.startswith("DatasetChanged: dataset tiny v2 changed in the store since it was registered")
    assert not (volume / "filled.json").exists()
    # A store that does not answer may answer the Job's next pod: exit 1, the Job's own retries.
    from ops.embedded import free_port

    blinked, said = run("fill", store_url=f"http://127.0.0.1:{free_port()}")
    assert blinked.returncode == 1 and said.startswith("DatasetFetchError: cannot list the dataset in the store")
    assert not (volume / "filled.json").exists()

    filled, said = run("fill")
    assert filled.returncode == 0 and said == "", filled.stderr
    assert "filled into its shared cache volume (3 files, 154 bytes)" in filled.stdout
    marker = json.loads((volume / "filled.json").read_text())
    copy = volume / "data" / marker["entry"]
    assert {str(p.relative_to(copy)): p.read_bytes() for p in copy.rglob("*") if p.is_file()} == files
    assert not os.access(copy / "labels.csv", os.W_OK) or os.geteuid() == 0  # read-only copies
    again, _ = run("fill")  # the Job run again (its TTL passed, a retry): nothing fetched twice
    assert again.returncode == 0 and "already in its shared cache volume" in again.stdout
    waited, said = run("wait", "--timeout-s", "5")
    assert waited.returncode == 0 and said == "" and "ready in its shared cache volume" in waited.stdout
