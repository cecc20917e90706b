"""The code snapshot's init container on Kubernetes: `python -m jobs.backends.code_fetch --into /workspace`.

A pod cannot read the platform's disk, so a job's code snapshot (jobs/code.py) is published to the object store
when the job is submitted, under `code/<team>/<hex>.tar.gz`. This init container, in the platform's own image,
downloads that archive, checks its sha256 against the digest the job names (the same bytes, or nothing), and
unpacks it into the pod's working directory (an emptyDir the trainer mounts at /workspace) with tarfile's
`data` filter (no links out, no devices, no owners). It is the platform that fetches: the trainer itself keeps no
network. A failure exits 1 with `CodeFetchError: <why>` in `--termination-log`, which the platform's observer
reads as the attempt's reason.

The snapshot is named by `TRAINYARD_CODE` (JSON: key, digest), the store by the `TRAINYARD_S3_*` environment.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tarfile
import tempfile
from pathlib import Path

from kernel import objectstore

REASON = "CodeFetchError"
MARKER = ".trainyard-code"  # the same marker the local backend leaves (jobs/code.py)


class CodeFetchError(Exception):
    reason = REASON


def fetch(config: objectstore.S3Config, *, key: str, digest: str, into: Path) -> int:
    """Download, check and unpack; returns the number of files. CodeFetchError says why it could not."""
    marker = into / MARKER
    if marker.exists() and marker.read_text().strip() == digest:
        return 0  # a restarted pod finds its copy (as a local retry does)
    s3 = objectstore.client(config)
    into.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=into, prefix=".code-", suffix=".tar.gz") as tmp:
        try:
            body = s3.get_object(Bucket=config.bucket, Key=key)["Body"]
            hasher = hashlib.sha256()
            while chunk := body.read(1 << 20):
                hasher.update(chunk)
                tmp.write(chunk)
            tmp.flush()
        except Exception as exc:  # noqa: BLE001 - any store failure is the same fact for the job
            raise CodeFetchError(
                f"cannot read code snapshot {digest[:19]} from {config.url}/{config.bucket}/{key}: "
                f"{objectstore.describe_error(exc)}"
            ) from None
        got = "sha256:" + hasher.hexdigest()
        if got != digest:
            raise CodeFetchError(f"the stored code snapshot is {got[:19]}, not {digest[:19]}: refusing other bytes")
        try:
            with tarfile.open(tmp.name, "r:gz") as tar:
                members = [m for m in tar if m.isfile() or m.isdir()]
                tar.extractall(into, members=members, filter="data")
        except (tarfile.TarError, OSError) as exc:
            raise CodeFetchError(f"cannot unpack code snapshot {digest[:19]}: {exc}") from None
    marker.write_text(digest + "\n")
    return sum(1 for m in members if m.isfile())


def _report(termination_log: str, message: str) -> None:
    print(f"[trainyard] {REASON}: {message}", file=sys.stderr, flush=True)
    if termination_log:
        try:
            Path(termination_log).write_text(f"{REASON}: {message}"[:4000])
        except OSError as err:
            print(f"[trainyard] cannot write {termination_log}: {err}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="code_fetch")
    parser.add_argument("--into", required=True, help="the pod's working directory")
    parser.add_argument("--termination-log", default="", help="where a failure's reason is written")
    args = parser.parse_args(argv)
    spec = json.loads(os.environ["TRAINYARD_CODE"])
    config = objectstore.S3Config.from_env()
    if config is None:
        _report(args.termination_log, "TRAINYARD_S3_URL is not set: the code snapshot's store is unknown")
        return 2
    try:
        count = fetch(config, key=spec["key"], digest=spec["digest"], into=Path(args.into))
    except CodeFetchError as exc:
        _report(args.termination_log, str(exc))
        return 1
    print(f"[trainyard] code snapshot {spec['digest'][:19]} ready in {args.into} ({count} files)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
