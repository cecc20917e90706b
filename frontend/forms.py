"""The submit form: it only turns what a browser sends into the API's submission body.

Every rule about what may be submitted lives in `jobs.services.job_validate` (and the API's input
serializer); the page shows their errors, with the same message and code, next to the field they name.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from django import forms
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.utils.translation import gettext_lazy as _

CUSTOM_IMAGE = "__reference__"

# Submission fields the form has no input for; a job or template opened in the form keeps them (shown, not lost).
CARRIED_FIELDS = (
    "replicas",
    "working_dir",
    "mounts",
    "priority",
    "tensorboard_logdir",
    "gpu_milli",
    "gpu_memory_mib",
    "cpu_milli",
    "memory_mib",
    "code",
    "watch",
    "ci",
    "resume_from",
)

# Where a service or serializer error about a submission field is shown on the form.
FIELD_FOR: dict[str, str] = {
    "team": "team",
    "queue": "queue",
    "spec": "spec",
    "gpus": "gpus",
    "gpu_milli": "spec",
    "gpu_memory_mib": "spec",
    "replicas": "spec",
    "image": "image",
    "command": "command",
    "args": "command",
    "env": "env",
    "timeout_s": "timeout_s",
    "max_retries": "max_retries",
    "labels": "labels",
    "gpu_models": "gpu_models",
    "name": "name",
    "tensorboard": "tensorboard",
    "preemptible": "preemptible",
    "datasets": "datasets",
    "code": "code_archive",
    "code_archive": "code_archive",
    "code_git_url": "code_git_url",
    "code_git_commit": "code_git_commit",
}


# The order the page shows its fields in: the error summary lists problems in it.
FORM_ORDER = (
    "non_field",
    "team",
    "queue",
    "spec",
    "gpus",
    "image",
    "command",
    "code_archive",
    "code_git_url",
    "code_git_commit",
    "env",
    "timeout_s",
    "max_retries",
    "tensorboard",
    "preemptible",
    "gpu_models",
    "labels",
    "datasets",
    "name",
)


def _key_value_lines(text: str, *, code: str) -> dict[str, str]:
    """`KEY=value` per line; blank lines and `#` comments are skipped. Names are checked by the service."""
    pairs: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ValidationError(
                _("line %(number)d: expected KEY=value, got “%(line)s”"),
                code=code,
                params={"number": number, "line": line[:80]},
            )
        pairs[key.strip()] = value.strip()
    return pairs


class SubmitForm(forms.Form):
    """Fields are loose on purpose: types and limits are judged by the same serializer and service as the API."""

    idempotency_key = forms.CharField(required=False, max_length=200, widget=forms.HiddenInput)
    name = forms.CharField(label=_("Name"), required=False, max_length=120)
    team = forms.CharField(label=_("Team"), required=False)
    queue = forms.CharField(label=_("Queue"), required=False)
    spec = forms.CharField(label=_("Resource spec"), required=False)
    gpus = forms.CharField(label=_("Whole GPUs"), required=False)
    image = forms.CharField(label=_("Image"), required=False)
    image_reference = forms.CharField(label=_("Other image reference"), required=False, max_length=300)
    command = forms.CharField(label=_("Command"), required=False, widget=forms.Textarea)
    env = forms.CharField(label=_("Environment"), required=False, widget=forms.Textarea)
    timeout_s = forms.CharField(label=_("Time limit"), required=False)
    max_retries = forms.CharField(label=_("Retries on platform failures"), required=False)
    tensorboard = forms.BooleanField(label=_("Start a TensorBoard for this job"), required=False)
    preemptible = forms.BooleanField(label=_("Run preemptible on idle GPUs"), required=False)
    labels = forms.CharField(label=_("Labels"), required=False, widget=forms.Textarea)
    datasets = forms.CharField(label=_("Datasets"), required=False, widget=forms.Textarea)
    gpu_models = forms.MultipleChoiceField(label=_("GPU models"), required=False, choices=())
    carried = forms.CharField(required=False, widget=forms.HiddenInput)
    # The job's code, brought by the platform (jobs/code.py): an archive, or a git repository and commit.
    code_archive = forms.FileField(label=_("Code archive"), required=False)
    code_git_url = forms.CharField(label=_("Git repository"), required=False, max_length=500)
    code_git_commit = forms.CharField(label=_("Commit"), required=False, max_length=200)
    template_name = forms.CharField(label=_("Template name"), required=False, max_length=80)
    template_description = forms.CharField(label=_("Template description"), required=False, max_length=300)

    def __init__(self, *args, gpu_models: list[str] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["gpu_models"].choices = [(m, m) for m in (gpu_models or [])]

    def clean_command(self) -> str:
        # Browsers send a textarea's line breaks as CRLF; a multi-line argument (python -c '…') keeps plain LF.
        return self.cleaned_data["command"].replace("\r\n", "\n")

    def clean_env(self) -> dict[str, str]:
        return _key_value_lines(self.cleaned_data["env"], code="invalid_env")

    def clean_labels(self) -> dict[str, str]:
        return _key_value_lines(self.cleaned_data["labels"], code="invalid_labels")

    def clean_datasets(self) -> list[dict[str, Any]]:
        """`name[:version] /path` per line (team/name for another team's shared dataset); checked by the service."""
        found: list[dict[str, Any]] = []
        for number, raw in enumerate(self.cleaned_data["datasets"].splitlines(), start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) != 2:
                raise ValidationError(
                    _("line %(number)d: expected NAME[:VERSION] /PATH, got “%(line)s”"),
                    code="invalid_dataset",
                    params={"number": number, "line": line[:80]},
                )
            name, _sep, version = parts[0].partition(":")
            item: dict[str, Any] = {"name": name, "path": parts[1]}
            if "/" in name:
                item["team"], item["name"] = name.split("/", 1)
            if version:
                item["version"] = version
            found.append(item)
        return found

    def clean_carried(self) -> dict[str, Any]:
        raw = self.cleaned_data["carried"]
        if not raw:
            return {}
        try:
            value = json.loads(raw)
        except ValueError:
            value = None
        if not isinstance(value, dict) or set(value) - set(CARRIED_FIELDS):
            raise ValidationError(_("the kept fields of the original job could not be read"), code="invalid_carried")
        return value

    def submission(self) -> dict[str, Any]:
        """The body the REST API would receive for the same submission (empty optional fields left out)."""
        # Fields the form itself could not read (a bad KEY=value line) are left out: the API would get none.
        data = self.cleaned_data
        body: dict[str, Any] = {
            "team": data.get("team", ""),
            "queue": data.get("queue", ""),
            "command": data.get("command", ""),
        }
        image = data.get("image_reference", "").strip() if data.get("image") == CUSTOM_IMAGE else data.get("image")
        if image:
            body["image"] = image
        for name in ("name", "spec", "gpus", "timeout_s", "max_retries"):
            value = str(data.get(name) or "").strip()
            if value:
                body[name] = value
        if data.get("env"):
            body["env"] = data["env"]
        if data.get("labels"):
            body["labels"] = data["labels"]
        if data.get("gpu_models"):
            body["gpu_models"] = list(data["gpu_models"])
        if data.get("datasets"):
            body["datasets"] = data["datasets"]
        body["tensorboard"] = bool(data.get("tensorboard"))
        if data.get("preemptible"):
            body["preemptible"] = True
        for name, value in (data.get("carried") or {}).items():
            body.setdefault(name, value)
        return body

    def add_service_error(self, field: str | None, message: str, code: str) -> None:
        self.add_error(FIELD_FOR.get(field or ""), ValidationError(message, code=code))

    def add_service_errors(self, errors: list) -> None:
        """Each of a ValidationErrors' problems, unless the form already found one for that field."""
        unreadable = {
            name for name in ("env", "labels", "datasets") if name in self.errors
        }  # the service saw none of these
        for error in errors:
            if error.field not in unreadable:
                self.add_service_error(error.field, error.detail, error.code)

    def errors_with_codes(self) -> dict[str, list[dict[str, str]]]:
        """Per field (`non_field` for the rest): each error's message and its stable code (the API's `code`)."""
        out: dict[str, list[dict[str, str]]] = {}
        for name, errors in self.errors.as_data().items():
            out["non_field" if name == NON_FIELD_ERRORS else name] = [
                {"message": " ".join(e.messages), "code": e.code or "invalid"} for e in errors
            ]
        rank = {name: i for i, name in enumerate(FORM_ORDER)}
        return dict(sorted(out.items(), key=lambda item: rank.get(item[0], len(rank))))


def initial_from_submission(body: dict[str, Any], *, catalog: set[str]) -> dict[str, Any]:
    """The form's fields for a submission body (a job's, or a template's): the inverse of `submission()`."""
    command = body.get("command") or []
    args = body.get("args") or []
    if isinstance(command, list):
        command_line = shlex.join([*map(str, command), *map(str, args)])
    else:
        command_line = " ".join([str(command), *(shlex.quote(str(a)) for a in args)])
    image = str(body.get("image") or "")
    initial: dict[str, Any] = {
        "team": body.get("team", ""),
        "queue": body.get("queue", ""),
        "spec": body.get("spec", ""),
        "gpus": body.get("gpus", ""),
        "image": image if image in catalog else CUSTOM_IMAGE,
        "image_reference": "" if image in catalog else image,
        "command": command_line,
        "env": "\n".join(f"{k}={v}" for k, v in sorted((body.get("env") or {}).items())),
        "labels": "\n".join(f"{k}={v}" for k, v in sorted((body.get("labels") or {}).items())),
        "timeout_s": body.get("timeout_s", ""),
        "max_retries": body.get("max_retries", ""),
        "tensorboard": bool(body.get("tensorboard")),
        "preemptible": bool(body.get("preemptible")),
        "gpu_models": list(body.get("gpu_models") or []),
        "datasets": "\n".join(_dataset_line(d) for d in body.get("datasets") or [] if isinstance(d, dict)),
        "name": body.get("name", ""),
    }
    carried = {k: body[k] for k in CARRIED_FIELDS if body.get(k) not in (None, "", [], {})}
    if carried.get("replicas") == 1:
        carried.pop("replicas")
    if carried.get("priority") == 0:
        carried.pop("priority")
    initial["carried"] = json.dumps(carried) if carried else ""
    return initial


def _dataset_line(item: dict[str, Any]) -> str:
    name = f"{item['team']}/{item.get('name', '')}" if item.get("team") else str(item.get("name", ""))
    version = f":{item['version']}" if item.get("version") not in (None, "") else ""
    return f"{name}{version} {item.get('path', '')}"
