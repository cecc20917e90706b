"""Job files: a job as the YAML `trainyard submit` reads (the submission API's fields), written and read here.

Exported, a job's file is its reproduce request: the pinned image digest, the code snapshot's digest, spec,
command, env and the rest, so submitting it runs the same bytes (as Reproduce does). Read back (the portal's
import), a file is checked as YAML and as a mapping of known fields before it fills the submit form; the
fields' values are judged later by the same serializer and service as any submission.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from kernel.errors import ValidationFailed
from kernel.sentences import stored

MAX_BYTES = 256 * 1024  # a job file is a page of text; anything larger is not one

# The order fields are written in: what a reader looks for first.
ORDER = (
    "name",
    "team",
    "queue",
    "spec",
    "gpus",
    "gpu_milli",
    "gpu_memory_mib",
    "cpu_milli",
    "memory_mib",
    "replicas",
    "image",
    "code",
    "command",
    "args",
    "working_dir",
    "env",
    "datasets",
    "mounts",
    "watch",
    "timeout_s",
    "max_retries",
    "priority",
    "preemptible",
    "tensorboard",
    "tensorboard_logdir",
    "gpu_models",
    "labels",
    "ci",
    "resume_from",
)


def job_yaml(job, *, platform_url: str = "") -> str:
    """The job's reproduce request as a job file (`trainyard submit job.yaml` runs the same bytes)."""
    from jobs.services.rerun import reproduce_data

    data = reproduce_data(job)
    body = {k: data[k] for k in ORDER if k in data and data[k] not in (None, "", [], {})}
    body.update({k: v for k, v in data.items() if k not in ORDER and v not in (None, "", [], {})})
    if body.get("replicas") == 1:
        body.pop("replicas")
    if body.get("priority") == 0:
        body.pop("priority")
    head = [
        f"# Reproduces job {job.id} ({job.name}){f' of {platform_url}' if platform_url else ''}.",
        "# The image and the code are pinned by digest: submitting this file runs the same bytes.",
        "# Submit it with `trainyard submit job.yaml`, or import it on the portal's submit page.",
    ]
    text = yaml.safe_dump(body, sort_keys=False, allow_unicode=True, default_flow_style=False, width=120)
    return "\n".join(head) + "\n" + text


def read_job_yaml(raw: bytes, *, known: set[str]) -> dict[str, Any]:
    """A job file's fields, or ValidationFailed (field `jobfile`) saying what is wrong with it: not text, not
    YAML (with the line), not a mapping, a field twice, or fields the submission does not know."""
    if len(raw) > MAX_BYTES:
        raise ValidationFailed(
            stored("a job file is at most %(n)s KiB; this one is larger", n=MAX_BYTES // 1024),
            code="jobfile_too_large",
            field="jobfile",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValidationFailed(stored("the job file is not UTF-8 text"), code="jobfile_not_text", field="jobfile")
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text) if root is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise ValidationFailed(
            stored(
                "the job file is not valid YAML (line %(line)s): %(problem)s",
                line=(mark.line + 1) if mark is not None else "?",
                problem=exc.problem or exc.context or "",
            ),
            code="jobfile_invalid_yaml",
            field="jobfile",
        )
    except yaml.YAMLError:
        raise ValidationFailed(stored("the job file is not valid YAML"), code="jobfile_invalid_yaml", field="jobfile")
    if not isinstance(root, yaml.MappingNode) or not isinstance(data, dict):
        raise ValidationFailed(
            stored("a job file is a YAML mapping of job fields (team, queue, spec, image, command, ...)"),
            code="jobfile_not_mapping",
            field="jobfile",
        )
    seen: set[str] = set()
    for key_node, _value in root.value:
        key = str(key_node.value)
        if key in seen:
            raise ValidationFailed(
                stored("%(field)s is given twice (line %(line)s)", field=key, line=key_node.start_mark.line + 1),
                code="jobfile_duplicate_field",
                field="jobfile",
            )
        seen.add(key)
    unknown = sorted(str(k) for k in data if str(k) not in known)
    if unknown:
        raise ValidationFailed(
            stored("the job file has fields a job does not: %(fields)s", fields=", ".join(unknown)),
            code="jobfile_unknown_field",
            field="jobfile",
        )
    # YAML reads `2024-05-01` as a date; the submission wants text, as the CLI sends it.
    return json.loads(json.dumps(data, default=str))
