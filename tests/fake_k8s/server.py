"""A fake Kubernetes API server for tests: real HTTP on 127.0.0.1, Kubernetes semantics, no cluster.

The official `kubernetes` client talks to it unpatched (`FakeKubernetes.api_client()` or any
`Configuration(host=fake.url)`). It keeps objects in memory under one global, monotonically increasing
resourceVersion and answers the way kube-apiserver does where a client can tell the difference:
`Status` bodies with the real reasons (AlreadyExists, NotFound, Conflict, Invalid, BadRequest, Gone),
optimistic concurrency on PUT, merge / JSON / strategic-merge patches, label and field selectors,
pagination (410 Gone for a continue token older than the bounded change history; no watches: the
platform never watches),
ownerReference garbage collection, finalizers, graceful pod deletion, and CRD schema validation of the
real Volcano CRDs (see `crds.py`). A simulated Volcano controller, scheduler and kubelet live in
`controller.py` and are attached by default.

Tests can inject faults (500/429/hang/dropped connection) and read a log of every request.
"""

from __future__ import annotations

import base64
import copy
import json
import math
import random
import re
import threading
import traceback
import uuid
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

import kubernetes.client

from . import crds

if TYPE_CHECKING:
    from .controller import VolcanoController

JSON = dict[str, Any]

KUBERNETES_VERSION = {
    "major": "1",
    "minor": "34",
    "gitVersion": "v1.34.0-trainyard-fake",
    "platform": "linux/amd64",
}


# --- errors ---------------------------------------------------------------------------------------

_REASON_BY_CODE = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class ApiError(Exception):
    """An error answered as a `Status` object, exactly like kube-apiserver does."""

    def __init__(
        self,
        code: int,
        message: str,
        *,
        reason: str | None = None,
        details: JSON | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason if reason is not None else _REASON_BY_CODE.get(code, "")
        self.details = details
        self.headers = dict(headers or {})

    def status(self) -> JSON:
        body: JSON = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        if not self.reason:
            del body["reason"]
        return body


def _details(rt: ResourceType, name: str, **extra: Any) -> JSON:
    details: JSON = {"name": name, "kind": rt.plural}
    if rt.group:
        details["group"] = rt.group
    details.update(extra)
    return details


def not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, f'{rt.qualified} "{name}" not found', details=_details(rt, name))


def already_exists(rt: ResourceType, name: str) -> ApiError:
    return ApiError(409, f'{rt.qualified} "{name}" already exists', reason="AlreadyExists", details=_details(rt, name))


def conflict(rt: ResourceType, name: str, why: str) -> ApiError:
    return ApiError(409, f'Operation cannot be fulfilled on {rt.qualified} "{name}": {why}', details=_details(rt, name))


def invalid(rt: ResourceType, name: str, causes: list[crds.FieldCause]) -> ApiError:
    lines = [cause.message for cause in causes]
    body = lines[0] if len(lines) == 1 else "[" + ", ".join(lines) + "]"
    details = {"name": name, "kind": rt.kind, "causes": [cause.as_status_cause() for cause in causes]}
    if rt.group:
        details["group"] = rt.group
    return ApiError(422, f'{rt.group_kind} "{name}" is invalid: {body}', details=details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, message)


def cause(path: str, reason: str, detail: str) -> crds.FieldCause:
    return crds.FieldCause(path, reason, f"{path}: {detail}")


# --- resource types -------------------------------------------------------------------------------

_META_FIELDS = frozenset({"metadata.name", "metadata.namespace"})


@dataclass(frozen=True)
class ResourceType:
    """One REST resource the fake serves."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    status_subresource: bool = False
    model: str | None = None  # official client model used for strict decoding of built-in kinds
    field_labels: frozenset[str] = _META_FIELDS
    delete_returns_object: bool = False
    name_format: str = "subdomain"  # subdomain | label | dns1035 | segment
    short_names: tuple[str, ...] = ()
    crd: crds.CustomResource | None = None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def group_kind(self) -> str:
        return f"{self.kind}.{self.group}" if self.group else self.kind

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)


BUILTIN_TYPES = (
    ResourceType(
        "", "v1", "namespaces", "Namespace", False, True, "V1Namespace",
        _META_FIELDS | {"status.phase"}, True, "label", ("ns",),
    ),
    ResourceType(
        "", "v1", "pods", "Pod", True, True, "V1Pod",
        _META_FIELDS | {
            "spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
            "spec.hostNetwork", "status.phase", "status.podIP", "status.nominatedNodeName",
        },
        True, "subdomain", ("po",),
    ),
    ResourceType(
        "", "v1", "events", "Event", True, False, "CoreV1Event",
        _META_FIELDS | {
            "involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
            "involvedObject.apiVersion", "involvedObject.resourceVersion", "involvedObject.fieldPath",
            "reason", "reportingComponent", "source", "type",
        },
        False, "segment", ("ev",),
    ),
    ResourceType(
        "", "v1", "nodes", "Node", False, True, "V1Node", _META_FIELDS | {"spec.unschedulable"}, False,
        "subdomain", ("no",),
    ),
    ResourceType(
        "", "v1", "services", "Service", True, True, "V1Service", _META_FIELDS, True, "dns1035", ("svc",)
    ),
    ResourceType(
        "", "v1", "configmaps", "ConfigMap", True, False, "V1ConfigMap", _META_FIELDS, False, "subdomain",
                 ("cm",)),
    ResourceType("", "v1", "secrets", "Secret", True, False, "V1Secret", _META_FIELDS | {"type"}),
    ResourceType(
        "batch", "v1", "jobs", "Job", True, True, "V1Job", _META_FIELDS | {"status.successful"}, False,
        "subdomain",
    ),
    ResourceType(
        "networking.k8s.io", "v1", "ingresses", "Ingress", True, True, "V1Ingress", short_names=("ing",)
    ),
    ResourceType(
        "networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True, False, "V1NetworkPolicy",
        short_names=("netpol",),
    ),
    # Team namespaces kept by the platform (jobs/backends/team_namespace.py): stored and served, never enforced.
    ResourceType("", "v1", "resourcequotas", "ResourceQuota", True, True, "V1ResourceQuota", short_names=("quota",)),
    ResourceType("", "v1", "limitranges", "LimitRange", True, False, "V1LimitRange", short_names=("limits",)),
    ResourceType("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True, False, "V1RoleBinding"),
    ResourceType("node.k8s.io", "v1", "runtimeclasses", "RuntimeClass", False, False, "V1RuntimeClass"),
    # Served so that clients can read what is installed; the schema of a CRD object itself is not checked.
    ResourceType(
        "apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False, True,
        short_names=("crd", "crds"),
    ),
)  # fmt: skip


def _crd_type(resource: crds.CustomResource) -> ResourceType:
    return ResourceType(
        resource.group,
        resource.version,
        resource.plural,
        resource.kind,
        resource.namespaced,
        resource.status_subresource,
        short_names=resource.short_names,
        crd=resource,
    )


# --- names, labels and quantities -----------------------------------------------------------------

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def name_problems(name: str, fmt: str = "subdomain") -> list[str]:
    """Why `name` is not a valid object name of the given format (empty when valid)."""
    if fmt == "segment":
        if name in (".", ".."):
            return [f"may not be '{name}'"]
        return [f"may not contain '{ch}'" for ch in "/%" if ch in name]
    if fmt == "label":
        problems = [] if len(name) <= 63 else ["must be no more than 63 characters"]
        if not _DNS1123_LABEL.match(name):
            problems.append(
                "must be a lowercase RFC 1123 label: lowercase letters, digits and '-', beginning and ending "
                "with a letter or digit (regex '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
            )
        return problems
    if fmt == "dns1035":
        problems = [] if len(name) <= 63 else ["must be no more than 63 characters"]
        if not _DNS1035_LABEL.match(name):
            problems.append(
                "must be a DNS-1035 label: lowercase letters, digits and '-', beginning with a letter and "
                "ending with a letter or digit (regex '[a-z]([-a-z0-9]*[a-z0-9])?')"
            )
        return problems
    problems = [] if len(name) <= 253 else ["must be no more than 253 characters"]
    if not _DNS1123_SUBDOMAIN.match(name):
        problems.append(
            "must be a lowercase RFC 1123 subdomain: RFC 1123 labels joined by '.' "
            "(regex '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
        )
    return problems


def qualified_name_problems(key: str) -> list[str]:
    """Why `key` is not a valid label/annotation key (`[prefix/]name`)."""
    prefix, _, name = key.rpartition("/")
    problems: list[str] = []
    if "/" in prefix:
        return ["a qualified name may contain at most one '/'"]
    if key.endswith("/") or (prefix == "" and key.startswith("/")):
        problems.append("prefix part must be non-empty")
    if prefix and (len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix)):
        problems.append("prefix part must be a lowercase RFC 1123 subdomain")
    if not name:
        problems.append("name part must be non-empty")
    elif len(name) > 63:
        problems.append("name part must be no more than 63 characters")
    elif not _QUALIFIED_NAME.match(name):
        problems.append(
            "name part must be letters, digits, '-', '_' or '.', beginning and ending with a letter or digit "
            "(regex '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
        )
    return problems


def label_value_problems(value: str) -> list[str]:
    problems = [] if len(value) <= 63 else ["must be no more than 63 characters"]
    if not _LABEL_VALUE.match(value):
        problems.append(
            "a label value must be empty or letters, digits, '-', '_' or '.', beginning and ending with a "
            "letter or digit (regex '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
        )
    return problems


_QUANTITY = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))(?:(Ki|Mi|Gi|Ti|Pi|Ei)|([numkMGTPE])|[eE]([+-]?\d+))?$")
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_SUFFIX = {exp: suffix for suffix, exp in _DECIMAL.items()}


def parse_quantity(raw: Any) -> tuple[Fraction, str]:
    """A Kubernetes quantity as an exact number and its format (BinarySI, DecimalSI, DecimalExponent)."""
    if isinstance(raw, bool):
        raise ValueError(f"quantities must match the regular expression; got {raw!r}")
    if isinstance(raw, int | float):
        return Fraction(str(raw)), "DecimalSI"
    match = _QUANTITY.match(str(raw).strip()) if isinstance(raw, str) else None
    if not match:
        raise ValueError(f"quantities must match the regular expression '{_QUANTITY.pattern}'")
    number, binary, decimal, exponent = match.groups()
    value = Fraction(number)
    if binary:
        return value * 1024 ** _BINARY[binary], "BinarySI"
    if exponent is not None:
        return value * Fraction(10) ** int(exponent), "DecimalExponent"
    return value * Fraction(10) ** _DECIMAL[decimal or ""], "DecimalSI"


def quantity_value(raw: Any) -> Fraction:
    return parse_quantity(raw)[0]


def format_quantity(value: Fraction, fmt: str = "DecimalSI") -> str:
    """The canonical string of a quantity, as the API server serializes it ("1000m" -> "1", 0.5 -> "500m")."""
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    value = abs(value)
    if fmt == "BinarySI" and (value < 1024 or value.denominator != 1):
        fmt = "DecimalSI"
    if fmt == "BinarySI":
        number, exp = int(value), 0
        while number % 1024 == 0 and exp < 6:
            number //= 1024
            exp += 1
        return f"{sign}{number}{['', 'Ki', 'Mi', 'Gi', 'Ti', 'Pi', 'Ei'][exp]}"
    number, exp = math.ceil(value * 10**9), -9  # sub-nano precision rounds up, like resource.Quantity
    while number % 1000 == 0 and exp < 18:
        number //= 1000
        exp += 3
    if fmt == "DecimalExponent":
        return f"{sign}{number}" + (f"e{exp}" if exp else "")
    return f"{sign}{number}{_DECIMAL_SUFFIX[exp]}"


def canonical_quantity(raw: Any) -> str:
    value, fmt = parse_quantity(raw)
    return format_quantity(value, fmt)


def resource_list(raw: Mapping[str, Any] | None) -> dict[str, Fraction]:
    """A ResourceList as exact numbers."""
    return {name: quantity_value(value) for name, value in (raw or {}).items()}


def is_extended_resource(name: str) -> bool:
    if name in ("cpu", "memory", "ephemeral-storage", "pods", "storage") or name.startswith("hugepages-"):
        return False
    return "/" in name and not name.split("/", 1)[0].endswith("kubernetes.io")


# --- selectors ------------------------------------------------------------------------------------

_SELECTOR_TOKEN = re.compile(r"\s*(!=|==|=|!|\(|\)|,|>|<|[^\s!=(),<>]+)")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # =, !=, in, notin, exists, !, >, <
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        if not present:
            return False
        try:
            actual, bound = int(str(value)), int(self.values[0])
        except ValueError:
            return False
        return actual > bound if self.op == ">" else actual < bound


class LabelSelector:
    """A parsed label selector (`a=b,c!=d,e in (x,y),f notin (z),g,!h,i>3`)."""

    def __init__(self, text: str | None) -> None:
        self.text = text or ""
        self.requirements = _parse_label_selector(self.text)

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(req.matches(labels) for req in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements


def _parse_label_selector(text: str) -> list[Requirement]:
    tokens: list[str] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _SELECTOR_TOKEN.match(text, pos)
        if not match:
            raise bad_request(f"unable to parse requirement: invalid label selector {text!r}")
        tokens.append(match.group(1))
        pos = match.end()

    def fail(why: str) -> ApiError:
        return bad_request(f"unable to parse requirement: {why} in label selector {text!r}")

    requirements: list[Requirement] = []
    i = 0
    while i < len(tokens):
        if tokens[i] == "!":
            if i + 1 >= len(tokens):
                raise fail("missing key after '!'")
            requirements.append(Requirement(_selector_key(tokens[i + 1], fail), "!"))
            i += 2
        else:
            key = _selector_key(tokens[i], fail)
            i += 1
            if i >= len(tokens) or tokens[i] == ",":
                requirements.append(Requirement(key, "exists"))
            elif tokens[i] in ("=", "==", "!="):
                op = "!=" if tokens[i] == "!=" else "="
                value = ""
                if i + 1 < len(tokens) and tokens[i + 1] != ",":
                    value = tokens[i + 1]
                    i += 1
                if label_value_problems(value):
                    raise fail(f"invalid label value: {value!r}")
                requirements.append(Requirement(key, op, (value,)))
                i += 1
            elif tokens[i] in ("in", "notin"):
                op = tokens[i]
                if i + 1 >= len(tokens) or tokens[i + 1] != "(":
                    raise fail(f"found '{tokens[i + 1] if i + 1 < len(tokens) else ''}', expected: '('")
                i += 2
                values: list[str] = []
                while i < len(tokens) and tokens[i] != ")":
                    if tokens[i] != ",":
                        values.append(tokens[i])
                    i += 1
                if i >= len(tokens):
                    raise fail("found '', expected: ')'")
                if not values:
                    raise fail("for 'in', 'notin' operators, values set can't be empty")
                requirements.append(Requirement(key, op, tuple(values)))
                i += 1
            elif tokens[i] in (">", "<"):
                if i + 1 >= len(tokens) or not re.fullmatch(r"-?\d+", tokens[i + 1]):
                    raise fail("for 'Gt', 'Lt' operators, the value must be an integer")
                requirements.append(Requirement(key, tokens[i], (tokens[i + 1],)))
                i += 2
            else:
                raise fail(f"found '{tokens[i]}', expected: in, notin, =, ==, !=, gt, lt")
        if i < len(tokens):
            if tokens[i] != ",":
                raise fail(f"found '{tokens[i]}', expected: ','")
            i += 1
    return requirements


def _selector_key(token: str, fail: Callable[[str], ApiError]) -> str:
    if token in ("(", ")", ",", "=", "==", "!=", "!", ">", "<") or qualified_name_problems(token):
        raise fail(f"invalid label key {token!r}")
    return token


class FieldSelector:
    """A parsed field selector (`metadata.name=x,status.phase!=Running`)."""

    def __init__(self, text: str | None, rt: ResourceType) -> None:
        self.text = text or ""
        self.terms: list[tuple[str, str, str]] = []
        for term in _split_unescaped(self.text, ","):
            if not term.strip():
                continue
            match = re.match(r"^\s*([^!=\s]+)\s*(==|!=|=)\s*(.*?)\s*$", term)
            if not match:
                raise bad_request(f"invalid selector: '{self.text}'; can't understand '{term}'")
            key, op, value = match.groups()
            if key not in rt.field_labels:
                raise bad_request(f"field label not supported: {key}")
            self.terms.append((key, "!=" if op == "!=" else "=", _unescape(value)))

    def matches(self, obj: JSON) -> bool:
        for key, op, value in self.terms:
            actual = _field_value(obj, key)
            if (actual == value) != (op == "="):
                return False
        return True

    @property
    def empty(self) -> bool:
        return not self.terms


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts, buf, escaped = [], "", False
    for ch in text:
        if escaped:
            buf += "\\" + ch
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == sep:
            parts.append(buf)
            buf = ""
        else:
            buf += ch
    parts.append(buf)
    return parts


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", r"\1", value)


def _field_value(obj: JSON, key: str) -> str:
    if key == "source":
        return str((obj.get("source") or {}).get("component", ""))
    current: Any = obj
    for part in key.split("."):
        current = current.get(part) if isinstance(current, dict) else None
    if isinstance(current, bool):
        return "true" if current else "false"
    return "" if current is None else str(current)


# --- patches --------------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


_CUSTOM_PATCH_TYPES = (
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/apply-patch+yaml",
)

# Merge keys of the lists a strategic merge patch merges instead of replacing (the common ones).
_SMP_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "imagePullSecrets": "name",
    "ports": "containerPort",
    "conditions": "type",
    "ownerReferences": "uid",
    "taints": "key",
}
_SMP_SET_LISTS = {"finalizers"}


def strategic_merge_patch(target: Any, patch: Any, field_name: str = "") -> Any:
    """An approximation of strategic merge patch: merge patch plus keyed merging of well-known lists."""
    if isinstance(patch, dict):
        if patch.get("$patch") == "replace":
            return {k: copy.deepcopy(v) for k, v in patch.items() if not k.startswith("$")}
        result = copy.deepcopy(target) if isinstance(target, dict) else {}
        for key, value in patch.items():
            if key.startswith("$"):
                continue
            if value is None:
                result.pop(key, None)
            else:
                result[key] = strategic_merge_patch(result.get(key), value, key)
        return result
    if isinstance(patch, list) and isinstance(target, list):
        merge_key = _SMP_MERGE_KEYS.get(field_name)
        if field_name in _SMP_SET_LISTS:
            return list(dict.fromkeys([*target, *patch]))
        if merge_key and all(isinstance(item, dict) for item in [*target, *patch]):
            result = [copy.deepcopy(item) for item in target]
            for item in patch:
                index = next((i for i, old in enumerate(result) if old.get(merge_key) == item.get(merge_key)), None)
                if item.get("$patch") == "delete":
                    if index is not None:
                        result.pop(index)
                elif index is None:
                    result.append(strategic_merge_patch({}, item))
                else:
                    result[index] = strategic_merge_patch(result[index], item)
            return result
    return copy.deepcopy(patch)


def json_patch(document: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch; raises ApiError 422 when an operation cannot be applied."""
    if not isinstance(operations, list):
        raise bad_request("the JSON patch must be a list of operations")
    doc = copy.deepcopy(document)
    for number, op in enumerate(operations):
        try:
            doc = _json_patch_op(doc, op)
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise ApiError(
                422,
                f"the server rejected our request due to an error in our request: "
                f"operation {number} {json.dumps(op)}: {exc}",
            ) from None
    return doc


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ValueError(f"invalid JSON pointer {path!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _json_patch_op(doc: Any, op: Mapping[str, Any]) -> Any:
    kind = op.get("op")
    parts = _pointer(str(op.get("path", "")))

    def resolve(parts: list[str]) -> tuple[Any, str]:
        parent = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        return parent, parts[-1]

    def get(parts: list[str]) -> Any:
        value = doc
        for part in parts:
            value = value[int(part)] if isinstance(value, list) else value[part]
        return value

    def remove(parts: list[str]) -> Any:
        parent, last = resolve(parts)
        return parent.pop(int(last)) if isinstance(parent, list) else parent.pop(last)

    def add(parts: list[str], value: Any) -> Any:
        nonlocal doc
        if not parts:
            return copy.deepcopy(value)
        parent, last = resolve(parts)
        if isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if index > len(parent):
                raise IndexError("index out of range")
            parent.insert(index, copy.deepcopy(value))
        elif isinstance(parent, dict):
            parent[last] = copy.deepcopy(value)
        else:
            raise TypeError("cannot add to a scalar")
        return doc

    if kind == "add":
        return add(parts, op["value"])
    if kind == "remove":
        remove(parts)
        return doc
    if kind == "replace":
        get(parts)  # must exist
        if not parts:
            return copy.deepcopy(op["value"])
        parent, last = resolve(parts)
        if isinstance(parent, list):
            parent[int(last)] = copy.deepcopy(op["value"])
        else:
            parent[last] = copy.deepcopy(op["value"])
        return doc
    if kind in ("move", "copy"):
        source = _pointer(str(op.get("from", "")))
        value = remove(source) if kind == "move" else copy.deepcopy(get(source))
        return add(parts, value)
    if kind == "test":
        if get(parts) != op.get("value"):
            raise ValueError("testing value failed")
        return doc
    raise ValueError(f"unknown operation {kind!r}")


# --- time -----------------------------------------------------------------------------------------


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_nano(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# --- watch history, faults, request log -----------------------------------------------------------


@dataclass(frozen=True)
class WatchEvent:
    rv: int
    type: str  # ADDED | MODIFIED | DELETED
    key: tuple[str, str]
    namespace: str
    obj: JSON
    old: JSON | None


@dataclass
class LogLine:
    time: datetime
    text: str


@dataclass
class Fault:
    """An injected failure for the next `remaining` requests matching `method` and `path`."""

    kind: str  # status | hang | drop
    remaining: int
    method: str | None = None
    path: re.Pattern[str] | None = None
    status: int = 500
    message: str = "injected fault"
    retry_after: int | None = None
    seconds: float = 0.0
    process: bool = False
    hits: int = 0

    def matches(self, method: str, path: str) -> bool:
        if self.remaining <= 0:
            return False
        if self.method and self.method.upper() != method.upper():
            return False
        return self.path is None or bool(self.path.search(path))


@dataclass
class RequestRecord:
    """One request as the server saw it."""

    method: str
    path: str
    query: dict[str, list[str]]
    body: Any = None
    status: int | None = None  # what was answered; None when the connection was dropped unanswered
    fault: str | None = None  # the injected fault that shaped the answer, if any
    handled: bool = False  # the API logic ran (the request may have changed state)

    def param(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[-1] if values else None

    @property
    def watch(self) -> bool:
        return self.param("watch") in ("true", "1")


@dataclass
class _Response:
    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    stream: Iterator[bytes] | None = None
    content_type: str = "application/json"


@dataclass
class _Route:
    kind: str  # discovery | collection | item
    group: str = ""
    version: str = ""
    rt: ResourceType | None = None
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    fake: FakeKubernetes


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "trainyard-fake-kube-apiserver"
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - BaseHTTPRequestHandler's signature
        return

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        self.server.fake._serve(self)

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_GET  # noqa: N815


# --- the server -----------------------------------------------------------------------------------

_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_FOREGROUND = "foregroundDeletion"


class FakeKubernetes:
    """An in-memory Kubernetes API server on a free port of 127.0.0.1.

    Use it as a context manager, or call `start()` / `stop()`. With `volcano=True` (the default) the real
    Volcano CRDs are served and a simulated Volcano controller, scheduler and kubelet is attached as
    `.controller` (tick it by hand).
    """

    def __init__(
        self,
        *,
        volcano: bool = True,
        crd_dir: str | None = None,
        nodes: int = 1,
        history_size: int = 1000,
        field_validation: str = "Warn",
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._stopping = threading.Event()
        self._rv = 0
        self._objects: dict[tuple[str, str], dict[tuple[str, str], JSON]] = defaultdict(dict)
        self._history: deque[WatchEvent] = deque()
        self._history_size = history_size
        self._compacted_rv = 0
        self._logs: dict[tuple[str, str, str], list[LogLine]] = defaultdict(list)
        self._previous_logs: dict[tuple[str, str, str], list[LogLine]] = {}
        self._listeners: list[Callable[[WatchEvent], None]] = []
        self._created_at_rv: dict[str, int] = {}
        self._faults: list[Fault] = []
        self._requests: list[RequestRecord] = []
        self._ip_counter = 10
        self._random = random.Random(0x5EED)
        self.internal_errors: list[str] = []
        self.default_field_validation = field_validation
        # Every unknown field a write dropped (`<Kind> <name>: unknown field "<path>"`): a real server drops them
        # silently for a client that does not ask for strict validation, so tests look here.
        self.pruned: list[str] = []
        self._clock = clock or (lambda: datetime.now(UTC))
        self._admission: list[Any] = []
        self.graceful_pod_deletion = False  # True while a kubelet simulation removes terminating pods
        # The resource metrics API (metrics-server): "served", "absent" (not installed: 404) or "unavailable"
        # (registered but not answering: 503). See `set_pod_metrics`.
        self.metrics_api = "served"
        self._pod_metrics: dict[tuple[str, str], JSON] = {}
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

        self._types: dict[tuple[str, str, str], ResourceType] = {}
        for rt in BUILTIN_TYPES:
            self._register(rt)
        self.catalog: crds.CrdCatalog | None = None
        if volcano:
            self.catalog = crds.load_catalog(crd_dir)
            for resource in self.catalog.resources:
                self._register(_crd_type(resource))

        for namespace in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.create("namespaces", {"metadata": {"name": namespace}})
        for definition in self.catalog.definitions if self.catalog is not None else []:
            self.create("customresourcedefinitions.apiextensions.k8s.io", copy.deepcopy(definition))
        for index in range(nodes):
            self.add_node(f"gpu-node-{index}")

        self.controller: VolcanoController | None = None
        if volcano:
            from .controller import VolcanoController

            self.controller = VolcanoController(self)

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> FakeKubernetes:
        if self._httpd is not None:
            return self
        self._stopping.clear()
        httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
        httpd.fake = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-kube-apiserver",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        with self._changed:
            self._changed.notify_all()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeKubernetes:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("the fake API server is not started")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def configuration(self) -> kubernetes.client.Configuration:
        config = kubernetes.client.Configuration(host=self.url)
        config.proxy = None  # never route 127.0.0.1 through a proxy from the environment
        return config

    def api_client(self) -> kubernetes.client.ApiClient:
        return kubernetes.client.ApiClient(self.configuration())

    def now(self) -> datetime:
        return self._clock()

    @property
    def lock(self) -> threading.RLock:
        """The store lock; hold it to make several internal calls atomic (the controller does, per tick)."""
        return self._lock

    # -- resource types ----------------------------------------------------------------------------

    def _register(self, rt: ResourceType) -> None:
        self._types[(rt.group, rt.version, rt.plural)] = rt

    def resource(self, name: str | ResourceType) -> ResourceType:
        """Look a resource up by "pods", "jobs.batch.volcano.sh" or "batch.volcano.sh/v1alpha1/jobs"."""
        if isinstance(name, ResourceType):
            return name
        if name.count("/") >= 1:
            *group_version, plural = name.split("/")
            api_version = "/".join(group_version)
            group, _, version = api_version.rpartition("/")
            found = self._types.get((group, version, plural))
            if found:
                return found
        plural, _, group = name.partition(".")
        for rt in self._types.values():
            if rt.plural == plural and rt.group == group:
                return rt
        raise KeyError(f"the fake API server does not serve {name!r}")

    def _type_for(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._types.get((group, version, plural))

    def add_listener(self, listener: Callable[[WatchEvent], None]) -> None:
        """Call `listener` after every stored change (under the store lock), like an informer with no lag."""
        self._listeners.append(listener)

    def add_admission(self, hook: Any) -> None:
        """Register an admission plugin: an object with `admit(op, rt, obj, old)` and `validate(...)`."""
        self._admission.append(hook)

    # -- faults and request log --------------------------------------------------------------------

    def _fault(self, kind: str, times: int, method: str | None, path: str | None, **options: Any) -> Fault:
        fault = Fault(kind, times, method, re.compile(path) if path else None, **options)
        with self._lock:
            self._faults.append(fault)
        return fault

    def fail_next(
        self,
        times: int = 1,
        *,
        status: int = 500,
        method: str | None = None,
        path: str | None = None,
        message: str = "injected fault",
    ) -> Fault:
        """Answer the next `times` matching requests with `status` (a Status body) without handling them."""
        return self._fault("status", times, method, path, status=status, message=message)

    def throttle_next(
        self, times: int = 1, *, retry_after: int = 1, method: str | None = None, path: str | None = None
    ) -> Fault:
        """Answer the next `times` matching requests with 429 TooManyRequests and a `Retry-After` header."""
        return self._fault(
            "status",
            times,
            method,
            path,
            status=429,
            retry_after=retry_after,
            message="Too many requests, please try again later.",
        )

    def hang_next(
        self,
        times: int = 1,
        *,
        seconds: float = 5.0,
        method: str | None = None,
        path: str | None = None,
        process: bool = True,
    ) -> Fault:
        """Hold the next matching requests for `seconds` before answering.

        With `process=True` the request then takes effect and is answered normally (a client that timed out
        never sees that its create succeeded); with `process=False` it is answered 504 without effect.
        """
        return self._fault(
            "hang",
            times,
            method,
            path,
            seconds=seconds,
            process=process,
            status=504,
            message="the server was unable to return a response in the time allotted",
        )

    def drop_next(
        self, times: int = 1, *, method: str | None = None, path: str | None = None, process: bool = False
    ) -> Fault:
        """Close the next matching requests' connections unanswered (after handling them if `process`)."""
        return self._fault("drop", times, method, path, process=process)

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    @property
    def requests(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._requests)

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    def requests_matching(
        self, method: str | None = None, path: str | None = None, *, handled: bool | None = None
    ) -> list[RequestRecord]:
        """Requests by method and path regex (`re.search`); `handled=True`: those that reached the API."""
        pattern = re.compile(path) if path else None
        return [
            record
            for record in self.requests
            if (method is None or record.method == method.upper())
            and (pattern is None or pattern.search(record.path))
            and (handled is None or record.handled == handled)
        ]

    # -- internal object API (also used by the controller) -----------------------------------------

    def get(self, resource: str | ResourceType, name: str, namespace: str | None = None) -> JSON:
        rt = self.resource(resource)
        with self._lock:
            obj = self._objects[rt.key].get(self._key(rt, namespace, name))
            if obj is None:
                raise not_found(rt, name)
            return copy.deepcopy(obj)

    def try_get(self, resource: str | ResourceType, name: str, namespace: str | None = None) -> JSON | None:
        try:
            return self.get(resource, name, namespace)
        except ApiError:
            return None

    def list(
        self,
        resource: str | ResourceType,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[JSON]:
        rt = self.resource(resource)
        labels = LabelSelector(label_selector)
        fields = FieldSelector(field_selector, rt)
        with self._lock:
            items = [
                copy.deepcopy(obj)
                for (ns, _), obj in sorted(self._objects[rt.key].items())
                if (namespace is None or ns == namespace) and self._selected(obj, labels, fields)
            ]
        return items

    def create(
        self,
        resource: str | ResourceType,
        obj: JSON,
        namespace: str | None = None,
        *,
        field_validation: str | None = None,
        dry_run: bool = False,
        warnings: list[str] | None = None,
    ) -> JSON:
        rt = self.resource(resource)
        with self._lock:
            return self._create(
                rt,
                obj,
                namespace,
                field_validation or self.default_field_validation,
                dry_run,
                warnings if warnings is not None else [],
            )

    def replace(
        self,
        resource: str | ResourceType,
        obj: JSON,
        *,
        name: str | None = None,
        namespace: str | None = None,
        subresource: str | None = None,
        field_validation: str | None = None,
        dry_run: bool = False,
        warnings: list[str] | None = None,
    ) -> JSON:
        rt = self.resource(resource)
        meta = obj.get("metadata") or {}
        name = name or meta.get("name")
        namespace = namespace if namespace is not None else meta.get("namespace")
        with self._lock:
            old = self._stored(rt, namespace, name or "")
            return self._update(
                rt,
                old,
                copy.deepcopy(obj),
                subresource=subresource,
                require_rv=True,
                url_name=name,
                field_validation=field_validation or self.default_field_validation,
                dry_run=dry_run,
                warnings=warnings if warnings is not None else [],
            )

    def patch(
        self,
        resource: str | ResourceType,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        patch_type: str = "merge",
        subresource: str | None = None,
        field_validation: str | None = None,
        dry_run: bool = False,
        warnings: list[str] | None = None,
    ) -> JSON:
        rt = self.resource(resource)
        with self._lock:
            old = self._stored(rt, namespace, name)
            if patch_type == "json":
                patched = json_patch(old, patch)
            elif patch_type == "strategic":
                if rt.crd is not None:
                    raise ApiError(
                        415,
                        "the body of the request was in an unknown format - accepted media types include: "
                        + ", ".join(_CUSTOM_PATCH_TYPES),
                    )
                if not isinstance(patch, dict):
                    raise bad_request("a strategic merge patch must be a JSON object")
                patched = strategic_merge_patch(old, patch)
            else:
                if not isinstance(patch, dict):
                    raise bad_request("a merge patch must be a JSON object")
                patched = merge_patch(old, patch)
            if not isinstance(patched, dict):
                raise ApiError(422, "the patch produced something that is not an object")
            return self._update(
                rt,
                old,
                patched,
                subresource=subresource,
                require_rv=False,
                url_name=name,
                field_validation=field_validation or self.default_field_validation,
                dry_run=dry_run,
                warnings=warnings if warnings is not None else [],
            )

    def mutate(
        self,
        resource: str | ResourceType,
        name: str,
        namespace: str | None,
        change: Callable[[JSON], None],
        *,
        subresource: str | None = None,
    ) -> JSON:
        """Read-modify-write with no resourceVersion precondition (a controller's retry loop, in one step)."""
        rt = self.resource(resource)
        with self._lock:
            old = self._stored(rt, namespace, name)
            new = copy.deepcopy(old)
            change(new)
            return self._update(
                rt,
                old,
                new,
                subresource=subresource,
                require_rv=False,
                url_name=name,
                field_validation="Strict",
                dry_run=False,
                warnings=[],
                admission=False,
            )

    def delete(
        self,
        resource: str | ResourceType,
        name: str,
        namespace: str | None = None,
        *,
        propagation: str | None = None,
        grace_period: int | None = None,
        preconditions: Mapping[str, Any] | None = None,
        dry_run: bool = False,
    ) -> JSON:
        rt = self.resource(resource)
        with self._lock:
            return self._delete(rt, namespace, name, propagation, grace_period, preconditions or {}, dry_run)

    def add_node(
        self,
        name: str,
        *,
        gpus: int = 8,
        gpu_product: str = "NVIDIA-H100-80GB-HBM3",
        gpu_memory_mib: int = 81559,
        cpu: str = "96",
        memory: str = "1024Gi",
        driver_version: str = "550.90.07",
        cuda_version: str = "12.4",
        labels: Mapping[str, str] | None = None,
        allocatable: Mapping[str, str] | None = None,
        taints: list[JSON] | None = None,
        unschedulable: bool = False,
    ) -> JSON:
        """Register a Ready node with GPU Feature Discovery labels and `nvidia.com/gpu` allocatable."""
        driver_major = driver_version.split(".")[0]
        cuda_major, _, cuda_minor = cuda_version.partition(".")
        node_labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "nvidia.com/gpu.present": "true" if gpus else "false",
            "nvidia.com/gpu.count": str(gpus),
            "nvidia.com/gpu.product": gpu_product,
            "nvidia.com/gpu.memory": str(gpu_memory_mib),
            "nvidia.com/gpu.replicas": "1",
            "nvidia.com/gpu.sharing-strategy": "none",
            "nvidia.com/cuda.driver-version.full": driver_version,
            "nvidia.com/cuda.driver-version.major": driver_major,
            "nvidia.com/cuda.runtime-version.full": cuda_version,
            "nvidia.com/cuda.runtime-version.major": cuda_major,
            "nvidia.com/cuda.runtime-version.minor": cuda_minor or "0",
            "nvidia.com/mig.capable": "false",
        }
        node_labels.update(labels or {})
        capacity = {"cpu": cpu, "memory": memory, "pods": "110", "ephemeral-storage": "1Ti"}
        if gpus:
            capacity["nvidia.com/gpu"] = str(gpus)
        capacity.update(allocatable or {})
        now = rfc3339(self.now())
        node: JSON = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": node_labels},
            "spec": {"unschedulable": unschedulable, "taints": list(taints or [])},
            "status": {
                "capacity": dict(capacity),
                "allocatable": dict(capacity),
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "kubelet is posting ready status",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    },
                ],
                "nodeInfo": {
                    "architecture": "amd64",
                    "bootID": str(uuid.uuid5(uuid.NAMESPACE_DNS, name + "/boot")),
                    "containerRuntimeVersion": "containerd://1.7.20",
                    "kernelVersion": "6.8.0-45-generic",
                    "kubeProxyVersion": "",
                    "kubeletVersion": KUBERNETES_VERSION["gitVersion"],
                    "machineID": uuid.uuid5(uuid.NAMESPACE_DNS, name).hex,
                    "operatingSystem": "linux",
                    "osImage": "Ubuntu 22.04.4 LTS",
                    "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
                },
                "addresses": [
                    {"type": "InternalIP", "address": self.next_ip("192.168.0")},
                    {"type": "Hostname", "address": name},
                ],
            },
        }
        if not node["spec"]["taints"]:
            del node["spec"]["taints"]
        return self.create("nodes", node)

    def record_event(
        self,
        involved: JSON,
        *,
        reason: str,
        message: str,
        type: str = "Normal",  # noqa: A002 - the Event field is called type
        component: str,
        host: str | None = None,
    ) -> JSON:
        """Record a core/v1 Event, aggregated like client-go's recorder (same event again: count + 1)."""
        meta = involved.get("metadata") or {}
        namespace = meta.get("namespace") or "default"
        now = rfc3339(self.now())
        with self._lock:
            for existing in self._objects[("", "events")].values():
                ref = existing.get("involvedObject") or {}
                if (
                    ref.get("uid") == meta.get("uid")
                    and existing.get("reason") == reason
                    and existing.get("message") == message
                    and existing.get("type") == type
                    and (existing.get("source") or {}).get("component") == component
                ):

                    def bump(event: JSON) -> None:
                        event["count"] = int(event.get("count", 1)) + 1
                        event["lastTimestamp"] = now

                    return self.mutate("events", existing["metadata"]["name"], namespace, bump)
            event = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {
                    "name": f"{meta.get('name', 'object')}.{self._random.getrandbits(64):016x}",
                    "namespace": namespace,
                },
                "involvedObject": {
                    "apiVersion": involved.get("apiVersion", ""),
                    "kind": involved.get("kind", ""),
                    "name": meta.get("name", ""),
                    "namespace": meta.get("namespace", ""),
                    "uid": meta.get("uid", ""),
                    "resourceVersion": meta.get("resourceVersion", ""),
                },
                "reason": reason,
                "message": message,
                "type": type,
                "count": 1,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "source": {"component": component, **({"host": host} if host else {})},
                "reportingComponent": component,
                "reportingInstance": host or "",
            }
            if not event["involvedObject"]["namespace"]:
                del event["involvedObject"]["namespace"]
            return self.create("events", event)

    def append_log(
        self, namespace: str, pod: str, text: str, *, container: str | None = None, at: datetime | None = None
    ) -> None:
        """Append lines to a container's log (the first container when `container` is None)."""
        with self._changed:
            if container is None:
                stored = self._objects[("", "pods")].get((namespace, pod))
                containers = ((stored or {}).get("spec") or {}).get("containers") or [{}]
                container = containers[0].get("name", "")
            moment = at or self.now()
            for line in text.splitlines():
                self._logs[(namespace, pod, container or "")].append(LogLine(moment, line))
            self._changed.notify_all()

    def rotate_log(self, namespace: str, pod: str, container: str) -> None:
        """A container restarted: its log becomes the `previous=true` log and a new one starts."""
        with self._changed:
            key = (namespace, pod, container)
            self._previous_logs[key] = self._logs.pop(key, [])
            self._changed.notify_all()

    def creation_order(self, obj: JSON) -> int:
        """The resourceVersion an object was created at: a strict creation order (timestamps have seconds)."""
        with self._lock:
            return self._created_at_rv.get(obj["metadata"].get("uid", ""), 0)

    @property
    def resource_version(self) -> int:
        with self._lock:
            return self._rv

    # -- store internals ---------------------------------------------------------------------------

    def _key(self, rt: ResourceType, namespace: str | None, name: str) -> tuple[str, str]:
        return ((namespace or "") if rt.namespaced else "", name)

    def _stored(self, rt: ResourceType, namespace: str | None, name: str) -> JSON:
        obj = self._objects[rt.key].get(self._key(rt, namespace, name))
        if obj is None:
            raise not_found(rt, name)
        return obj

    def _selected(self, obj: JSON, labels: LabelSelector, fields: FieldSelector) -> bool:
        return labels.matches((obj.get("metadata") or {}).get("labels")) and fields.matches(obj)

    def _commit(self, rt: ResourceType, obj: JSON, event_type: str, old: JSON | None) -> JSON:
        self._rv += 1
        meta = obj.setdefault("metadata", {})
        meta["resourceVersion"] = str(self._rv)
        namespace = meta.get("namespace", "") if rt.namespaced else ""
        self._objects[rt.key][(namespace, meta["name"])] = obj
        event = WatchEvent(
            self._rv, event_type, rt.key, namespace, copy.deepcopy(obj), copy.deepcopy(old) if old else None
        )
        result = copy.deepcopy(obj)
        self._record(event)
        for listener in list(self._listeners):
            listener(event)
        return result

    def _record(self, event: WatchEvent) -> None:
        self._history.append(event)
        while len(self._history) > self._history_size:
            self._compacted_rv = self._history.popleft().rv
        self._changed.notify_all()

    def _remove(self, rt: ResourceType, obj: JSON) -> JSON:
        meta = obj["metadata"]
        namespace = meta.get("namespace", "") if rt.namespaced else ""
        self._objects[rt.key].pop((namespace, meta["name"]), None)
        self._rv += 1
        final = copy.deepcopy(obj)
        final["metadata"]["resourceVersion"] = str(self._rv)
        self._record(WatchEvent(self._rv, "DELETED", rt.key, namespace, copy.deepcopy(final), copy.deepcopy(obj)))
        if rt.key == ("", "pods"):
            for store in (self._logs, self._previous_logs):
                for log_key in [k for k in store if k[:2] == (namespace, meta["name"])]:
                    del store[log_key]
        self._collect_dependents(meta.get("uid", ""))
        self._release_foreground_owners(meta.get("ownerReferences") or [])
        if rt.namespaced:
            self._finish_namespace_if_empty(namespace)
        return final

    def _all_objects(self) -> Iterator[tuple[ResourceType, JSON]]:
        for rt in list(self._types.values()):
            for obj in list(self._objects[rt.key].values()):
                yield rt, obj

    def _find_by_uid(self, uid: str) -> tuple[ResourceType, JSON] | None:
        for rt, obj in self._all_objects():
            if obj["metadata"].get("uid") == uid:
                return rt, obj
        return None

    def _dependents(self, uid: str) -> list[tuple[ResourceType, JSON]]:
        return [
            (rt, obj)
            for rt, obj in self._all_objects()
            if any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])
        ]

    def _collect_dependents(self, uid: str) -> None:
        """Garbage-collect objects whose owners are all gone (background propagation)."""
        if not uid:
            return
        for rt, obj in self._dependents(uid):
            refs = obj["metadata"].get("ownerReferences") or []
            alive = [ref for ref in refs if ref.get("uid") != uid and self._find_by_uid(ref.get("uid", ""))]
            meta = obj["metadata"]
            if alive:
                self.mutate(
                    rt,
                    meta["name"],
                    meta.get("namespace"),
                    lambda o, keep=alive: o["metadata"].__setitem__("ownerReferences", keep),
                )
            elif not meta.get("deletionTimestamp"):
                self._delete(rt, meta.get("namespace"), meta["name"], "Background", None, {}, False)

    def _release_foreground_owners(self, refs: list[JSON]) -> None:
        for ref in refs:
            found = self._find_by_uid(ref.get("uid", ""))
            if found is None:
                continue
            rt, owner = found
            meta = owner["metadata"]
            if _FOREGROUND in (meta.get("finalizers") or []) and not self._dependents(meta["uid"]):
                self.mutate(
                    rt,
                    meta["name"],
                    meta.get("namespace"),
                    lambda o: o["metadata"].__setitem__(
                        "finalizers", [f for f in o["metadata"].get("finalizers", []) if f != _FOREGROUND]
                    ),
                )

    def _finish_namespace_if_empty(self, namespace: str) -> None:
        ns = self._objects[("", "namespaces")].get(("", namespace))
        if ns is None or not ns["metadata"].get("deletionTimestamp"):
            return
        if any(key[0] == namespace for rt in self._types.values() if rt.namespaced for key in self._objects[rt.key]):
            return
        self._remove(self.resource("namespaces"), ns)

    def next_ip(self, prefix: str) -> str:
        """A fresh address in `prefix` (a /24 written as three octets)."""
        self._ip_counter += 1
        return f"{prefix}.{self._ip_counter % 250 + 2}"

    # -- create / update / delete ------------------------------------------------------------------

    def _decode_checks(self, rt: ResourceType, obj: Any, namespace: str | None) -> JSON:
        if not isinstance(obj, dict):
            raise bad_request(f"the body of the request must be a {rt.kind} object")
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        if rt.crd is not None and (not api_version or not kind):
            missing = "kind" if not kind else "apiVersion"
            raise bad_request(
                f"Object '{missing.capitalize() if missing == 'kind' else missing}' is missing in "
                f"'{json.dumps(obj, separators=(',', ':'))[:200]}'"
            )
        if api_version and api_version != rt.api_version:
            raise bad_request(
                f"the API version in the data ({api_version}) does not match the expected API "
                f"version ({rt.api_version})"
            )
        if kind and kind != rt.kind:
            raise bad_request(f"the kind in the data ({kind}) does not match the expected kind ({rt.kind})")
        obj = copy.deepcopy(obj)
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        meta = obj.get("metadata")
        if meta is None:
            meta = obj["metadata"] = {}
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        if rt.namespaced:
            body_ns = meta.get("namespace")
            if namespace and body_ns and body_ns != namespace:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            if namespace:
                meta["namespace"] = namespace
            elif not body_ns:
                raise bad_request("an empty namespace may not be set during creation")
        else:
            meta.pop("namespace", None)
        return obj

    def _strict_decode(self, rt: ResourceType, obj: JSON, field_validation: str, warnings: list[str]) -> JSON:
        """Unknown fields: reject (Strict), prune and warn (Warn) or prune (Ignore)."""
        if field_validation not in crds.FIELD_VALIDATION_MODES:
            raise bad_request(f"fieldValidation must be one of {', '.join(crds.FIELD_VALIDATION_MODES)}")
        if rt.crd is not None:
            return obj  # custom objects are pruned by the CRD catalog in _validate
        unknown = crds.model_unknown_fields(rt.model or "", obj)
        if not unknown:
            return obj
        if field_validation == "Strict":
            listed = ", ".join(f'unknown field "{path}"' for path in unknown)
            raise bad_request(
                f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: strict decoding error: {listed}'
            )
        name = (obj.get("metadata") or {}).get("name") or ""
        self.pruned.extend(f'{rt.kind} {name}: unknown field "{path}"' for path in unknown)
        if field_validation == "Warn":
            warnings.extend(f'unknown field "{path}"' for path in unknown)
        return _prune_builtin(rt, obj)

    def _validate(
        self, rt: ResourceType, obj: JSON, old: JSON | None, field_validation: str, warnings: list[str]
    ) -> JSON:
        name = obj["metadata"].get("name") or obj["metadata"].get("generateName") or ""
        causes: list[crds.FieldCause] = []
        if rt.crd is not None and self.catalog is not None:
            try:
                prepared = self.catalog.prepare(rt.crd, obj, field_validation=field_validation)
            except crds.UnknownFieldsError as exc:
                raise bad_request(exc.summary()) from None
            except crds.CrdValidationError as exc:
                causes += exc.causes
            else:
                obj = prepared.obj
                warnings.extend(prepared.warnings)
                self.pruned.extend(f"{rt.kind} {name}: {path}" for path in prepared.unknown)
        causes += _meta_causes(rt, obj["metadata"], old)
        causes += _builtin_causes(rt, obj, old)
        if causes:
            raise invalid(rt, name, causes)
        return obj

    def _run_admission(self, step: str, op: str, rt: ResourceType, obj: JSON, old: JSON | None) -> None:
        for hook in self._admission:
            getattr(hook, step)(op, rt, obj, old)

    def _check_namespace(self, rt: ResourceType, namespace: str | None, name: str) -> None:
        if not rt.namespaced:
            return
        ns = self._objects[("", "namespaces")].get(("", namespace or ""))
        if ns is None:
            raise ApiError(
                404,
                f'namespaces "{namespace}" not found',
                details={"name": namespace or "", "kind": "namespaces"},
            )
        if ns["metadata"].get("deletionTimestamp"):
            raise ApiError(
                403,
                f'{rt.qualified} "{name}" is forbidden: unable to create new content in namespace '
                f"{namespace} because it is being terminated",
                reason="Forbidden",
            )

    def _create(
        self,
        rt: ResourceType,
        body: JSON,
        namespace: str | None,
        field_validation: str,
        dry_run: bool,
        warnings: list[str],
    ) -> JSON:
        obj = self._decode_checks(rt, body, namespace)
        obj = self._strict_decode(rt, obj, field_validation, warnings)
        meta = obj["metadata"]
        if meta.get("resourceVersion"):
            raise ApiError(500, "resourceVersion should not be set on objects to be created")
        if not meta.get("name"):
            if meta.get("generateName"):
                for _ in range(10):
                    candidate = meta["generateName"] + "".join(
                        self._random.choice(_GENERATE_ALPHABET) for _ in range(5)
                    )
                    if self._key(rt, meta.get("namespace"), candidate) not in self._objects[rt.key]:
                        break
                meta["name"] = candidate
            else:
                raise invalid(
                    rt,
                    "",
                    [
                        cause(
                            "metadata.name",
                            "FieldValueRequired",
                            "Required value: name or generateName is required",
                        )
                    ],
                )
        for transient in ("deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink"):
            meta.pop(transient, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = rfc3339(self.now())
        meta["generation"] = 1
        self._check_namespace(rt, meta.get("namespace"), meta["name"])
        _prepare_for_create(self, rt, obj)
        self._run_admission("admit", "CREATE", rt, obj, None)
        obj = self._validate(rt, obj, None, field_validation, warnings)
        meta = obj["metadata"]
        self._run_admission("validate", "CREATE", rt, obj, None)
        if self._key(rt, meta.get("namespace"), meta["name"]) in self._objects[rt.key]:
            raise already_exists(rt, meta["name"])
        if dry_run:
            return obj
        self._created_at_rv[meta["uid"]] = self._rv + 1
        return self._commit(rt, obj, "ADDED", None)

    def _update(
        self,
        rt: ResourceType,
        old: JSON,
        new: JSON,
        *,
        subresource: str | None,
        require_rv: bool,
        url_name: str | None,
        field_validation: str,
        dry_run: bool,
        warnings: list[str],
        admission: bool = True,
    ) -> JSON:
        old_meta = old["metadata"]
        new = self._decode_checks(rt, new, old_meta.get("namespace"))
        new_meta = new["metadata"]
        if url_name is not None and new_meta.get("name") not in (None, url_name):
            raise bad_request(
                f"the name of the object ({new_meta.get('name')}) does not match the name on the URL ({url_name})"
            )
        new_meta["name"] = old_meta["name"]
        new = self._strict_decode(rt, new, field_validation, warnings)
        new_meta = new["metadata"]
        if new_meta.get("uid") and new_meta["uid"] != old_meta["uid"]:
            raise conflict(
                rt,
                old_meta["name"],
                f"Precondition failed: UID in precondition: {new_meta['uid']}, UID in object meta: {old_meta['uid']}",
            )
        rv = new_meta.get("resourceVersion")
        if not rv and require_rv and rt.crd is not None:
            raise invalid(
                rt,
                old_meta["name"],
                [
                    cause(
                        "metadata.resourceVersion",
                        "FieldValueInvalid",
                        "Invalid value: 0x0: must be specified for an update",
                    )
                ],
            )
        if rv and rv != old_meta.get("resourceVersion"):
            raise conflict(
                rt,
                old_meta["name"],
                "the object has been modified; please apply your changes to the latest version and try again",
            )
        if subresource == "status":
            merged = copy.deepcopy(old)
            if "status" in new:
                merged["status"] = new["status"]
            else:
                merged.pop("status", None)
            new = merged
        else:
            if rt.status_subresource:
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
                else:
                    new.pop("status", None)
            for immutable in (
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "namespace",
            ):
                if immutable in old_meta:
                    new_meta[immutable] = old_meta[immutable]
                else:
                    new_meta.pop(immutable, None)
            new_meta.pop("managedFields", None)
            if old_meta.get("deletionTimestamp"):
                added = set(new_meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
                if added:
                    raise invalid(
                        rt,
                        old_meta["name"],
                        [
                            cause(
                                "metadata.finalizers",
                                "FieldValueForbidden",
                                "Forbidden: no new finalizers can be added while the object is being "
                                f"deleted; new: {sorted(added)}",
                            )
                        ],
                    )
        new["metadata"]["resourceVersion"] = old_meta.get("resourceVersion")
        _prepare_for_update(self, rt, new, old)
        if admission and subresource is None:
            self._run_admission("admit", "UPDATE", rt, new, old)
        new = self._validate(rt, new, old, field_validation, warnings)
        if admission and subresource is None:
            self._run_admission("validate", "UPDATE", rt, new, old)
        if _same_content(new, old):
            return copy.deepcopy(old)
        if _spec_changed(rt, new, old):
            new["metadata"]["generation"] = int(old_meta.get("generation", 1)) + 1
        if dry_run:
            return new
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            return self._remove(rt, new)
        return self._commit(rt, new, "MODIFIED", old)

    def _delete(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        propagation: str | None,
        grace_period: int | None,
        preconditions: Mapping[str, Any],
        dry_run: bool,
    ) -> JSON:
        obj = self._stored(rt, namespace, name)
        meta = obj["metadata"]
        if preconditions.get("uid") and preconditions["uid"] != meta.get("uid"):
            raise conflict(
                rt,
                name,
                f"Precondition failed: UID in precondition: {preconditions['uid']}, UID in "
                f"object meta: {meta.get('uid')}",
            )
        if preconditions.get("resourceVersion") and preconditions["resourceVersion"] != meta.get("resourceVersion"):
            raise conflict(
                rt,
                name,
                f"Precondition failed: ResourceVersion in precondition: "
                f"{preconditions['resourceVersion']}, ResourceVersion in object meta: "
                f"{meta.get('resourceVersion')}",
            )
        if propagation not in (None, "Background", "Foreground", "Orphan"):
            raise bad_request(f'propagationPolicy: Unsupported value: "{propagation}"')
        if not meta.get("deletionTimestamp"):
            self._run_admission("validate", "DELETE", rt, obj, None)
        if dry_run:
            return copy.deepcopy(obj)
        if propagation == "Orphan":
            for dep_rt, dep in self._dependents(meta["uid"]):
                dep_meta = dep["metadata"]
                self.mutate(
                    dep_rt,
                    dep_meta["name"],
                    dep_meta.get("namespace"),
                    lambda o, uid=meta["uid"]: o["metadata"].__setitem__(
                        "ownerReferences",
                        [r for r in o["metadata"].get("ownerReferences", []) if r.get("uid") != uid],
                    ),
                )
        if rt.key == ("", "namespaces"):
            if name in ("default", "kube-system", "kube-public"):
                raise ApiError(403, f'namespaces "{name}" is forbidden: this namespace may not be deleted')
            return self._delete_namespace(rt, obj)
        if rt.key == ("", "pods") and self._graceful(obj, grace_period):
            if meta.get("deletionTimestamp"):
                return copy.deepcopy(obj)
            seconds = (
                grace_period
                if grace_period is not None
                else int((obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
            )
            return self._mark_deleting(rt, obj, seconds)
        finalizers = list(meta.get("finalizers") or [])
        if propagation == "Foreground" and self._dependents(meta["uid"]) and _FOREGROUND not in finalizers:
            finalizers.append(_FOREGROUND)
        if finalizers:
            if meta.get("deletionTimestamp") and finalizers == meta.get("finalizers"):
                return copy.deepcopy(obj)
            marked = self._mark_deleting(rt, obj, 0, finalizers)
            if _FOREGROUND in finalizers:
                for dep_rt, dep in self._dependents(meta["uid"]):
                    dep_meta = dep["metadata"]
                    if not dep_meta.get("deletionTimestamp"):
                        self._delete(dep_rt, dep_meta.get("namespace"), dep_meta["name"], "Foreground", None, {}, False)
                self._release_foreground_owners([{"uid": meta["uid"]}])
                current = self._find_by_uid(meta["uid"])
                return copy.deepcopy(current[1]) if current else marked
            return marked
        final = self._remove(rt, obj)
        if rt.delete_returns_object:
            return final
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": _details(rt, name, uid=meta.get("uid", "")),
        }

    def _graceful(self, pod: JSON, grace_period: int | None) -> bool:
        if not self.graceful_pod_deletion or grace_period == 0:
            return False
        phase = (pod.get("status") or {}).get("phase")
        return bool((pod.get("spec") or {}).get("nodeName")) and phase not in ("Succeeded", "Failed")

    def _mark_deleting(self, rt: ResourceType, obj: JSON, seconds: int, finalizers: list[str] | None = None) -> JSON:
        old = copy.deepcopy(obj)
        new = copy.deepcopy(obj)
        meta = new["metadata"]
        meta.setdefault("deletionTimestamp", rfc3339(self.now() + timedelta(seconds=seconds)))
        meta["deletionGracePeriodSeconds"] = seconds
        if finalizers is not None:
            meta["finalizers"] = finalizers
        return self._commit(rt, new, "MODIFIED", old)

    def _delete_namespace(self, rt: ResourceType, ns: JSON) -> JSON:
        name = ns["metadata"]["name"]
        if not ns["metadata"].get("deletionTimestamp"):
            new = copy.deepcopy(ns)
            new["metadata"]["deletionTimestamp"] = rfc3339(self.now())
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            new.setdefault("status", {})["phase"] = "Terminating"
            self._commit(rt, new, "MODIFIED", ns)
        for child_rt in [t for t in self._types.values() if t.namespaced]:
            for (child_ns, child_name), child in list(self._objects[child_rt.key].items()):
                if child_ns == name and not child["metadata"].get("deletionTimestamp"):
                    self._delete(child_rt, child_ns, child_name, "Background", None, {}, False)
        self._finish_namespace_if_empty(name)
        current = self._objects[rt.key].get(("", name))
        if current is not None:
            return copy.deepcopy(current)
        return {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name},
            "status": {"phase": "Terminating"},
        }

    def remove_terminating_pod(self, namespace: str, name: str) -> None:
        """Finish a graceful pod deletion (the kubelet confirmed the containers are gone)."""
        with self._lock:
            pod = self._objects[("", "pods")].get((namespace, name))
            if pod is not None and pod["metadata"].get("deletionTimestamp"):
                if pod["metadata"].get("finalizers"):
                    return
                self._remove(self.resource("pods"), pod)

    # -- the resource metrics API (metrics.k8s.io/v1beta1 pods, as metrics-server serves it) ---------------
    #
    # PodMetrics exist for pods that are Running and whose usage a test set, one item per pod, with the pod's labels
    # (metrics-server copies them), `timestamp`, `window` and the containers' `usage` as canonical quantities. Lists
    # take label selectors; a namespace that does not exist lists empty (metrics-server lists pods from its cache and
    # never looks namespaces up); a pod without metrics is 404 on get. Not emulated: node metrics, field selectors
    # (400 here), the delay of the first scrapes.

    def set_pod_metrics(
        self,
        namespace: str,
        pod: str,
        usage: Mapping[str, Mapping[str, Any]],
        *,
        at: datetime | None = None,
        window_s: int = 15,
    ) -> None:
        """What metrics-server measured for a pod: `{container: {"cpu": "250m", "memory": "512Mi"}}`, at `at` (the
        server's clock by default). Containers the pod does not run are not served."""
        containers = []
        for name, values in usage.items():
            if set(values) != {"cpu", "memory"}:
                raise ValueError(
                    f"container {name}: metrics-server reports exactly cpu and memory, got {sorted(values)}"
                )
            # metrics-server writes CPU in decimal units (nanocores) and memory in binary ones (bytes)
            usage = {"cpu": format_quantity(quantity_value(values["cpu"]), "DecimalSI")}
            usage["memory"] = format_quantity(quantity_value(values["memory"]), "BinarySI")
            containers.append({"name": name, "usage": usage})
        with self._lock:
            self._pod_metrics[(namespace, pod)] = {
                "timestamp": rfc3339(at or self.now()),
                "window": f"{int(window_s)}s",
                "containers": containers,
            }

    def clear_pod_metrics(self, namespace: str | None = None, pod: str | None = None) -> None:
        with self._lock:
            for key in [k for k in self._pod_metrics if namespace in (None, k[0]) and pod in (None, k[1])]:
                del self._pod_metrics[key]

    def _with_metrics_group(self, groups: JSON) -> JSON:
        if self.metrics_api != "absent":
            version = {"groupVersion": f"{METRICS_GROUP}/{METRICS_VERSION}", "version": METRICS_VERSION}
            groups["groups"].append({"name": METRICS_GROUP, "versions": [version], "preferredVersion": version})
            groups["groups"].sort(key=lambda g: g["name"])
        return groups

    def _pod_metrics_item(self, pod: JSON) -> JSON | None:
        meta = pod["metadata"]
        stored = self._pod_metrics.get((meta.get("namespace", ""), meta["name"]))
        if stored is None or (pod.get("status") or {}).get("phase") != "Running" or meta.get("deletionTimestamp"):
            return None
        spec = pod.get("spec") or {}
        running = {c.get("name") for c in (spec.get("containers") or []) + (spec.get("initContainers") or [])}
        item: JSON = {
            "metadata": {
                "name": meta["name"],
                "namespace": meta.get("namespace", ""),
                "creationTimestamp": rfc3339(self.now()),
                "labels": dict(meta.get("labels") or {}),
            },
            "timestamp": stored["timestamp"],
            "window": stored["window"],
            "containers": [copy.deepcopy(c) for c in stored["containers"] if c["name"] in running],
        }
        if not item["metadata"]["labels"]:
            del item["metadata"]["labels"]
        return item

    def _metrics_request(self, method: str, path: str, query: dict[str, list[str]], record: RequestRecord) -> _Response:
        if self.metrics_api == "absent":
            raise _no_such_resource()
        if self.metrics_api == "unavailable":
            raise ApiError(503, "the server is currently unable to handle the request")
        parts = [unquote(part) for part in path[len(METRICS_PREFIX) :].strip("/").split("/") if part]
        if parts == [METRICS_VERSION]:
            if method != "GET":
                raise ApiError(405, "the server does not allow this method on the requested resource")
            return _Response(
                200,
                {
                    "kind": "APIResourceList",
                    "apiVersion": "v1",
                    "groupVersion": f"{METRICS_GROUP}/{METRICS_VERSION}",
                    "resources": [
                        {
                            "name": "pods",
                            "singularName": "",
                            "namespaced": True,
                            "kind": "PodMetrics",
                            "verbs": ["get", "list"],
                        }
                    ],
                },
            )
        if not parts and method == "GET":
            version = {"groupVersion": f"{METRICS_GROUP}/{METRICS_VERSION}", "version": METRICS_VERSION}
            return _Response(
                200,
                {
                    "kind": "APIGroup",
                    "apiVersion": "v1",
                    "name": METRICS_GROUP,
                    "versions": [version],
                    "preferredVersion": version,
                },
            )
        if not parts or parts[0] != METRICS_VERSION:
            raise _no_such_resource()
        rest, namespace = parts[1:], None
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if not rest or rest[0] != "pods" or len(rest) > 2:
            raise _no_such_resource()
        if method != "GET":
            raise ApiError(405, "the server does not allow this method on the requested resource")
        param = _Params(query)
        record.handled = True
        with self._lock:
            if len(rest) == 2:
                if namespace is None:
                    raise _no_such_resource()
                pod = self._objects[("", "pods")].get((namespace, rest[1]))
                item = self._pod_metrics_item(pod) if pod is not None else None
                if item is None:
                    raise ApiError(
                        404,
                        f'podmetrics.metrics.k8s.io "{namespace}/{rest[1]}" not found',
                        details={"name": f"{namespace}/{rest[1]}", "group": METRICS_GROUP, "kind": "pods"},
                    )
                return _Response(
                    200, {"kind": "PodMetrics", "apiVersion": f"{METRICS_GROUP}/{METRICS_VERSION}", **item}
                )
            if param.flag("watch"):
                raise ApiError(405, "the server does not allow this method on the requested resource")
            if param.get("fieldSelector"):
                raise bad_request("field selectors on metrics.k8s.io are not emulated by the fake API server")
            labels = LabelSelector(param.get("labelSelector"))
            items = []
            for (ns, _), pod in sorted(self._objects[("", "pods")].items()):
                if namespace in (None, ns) and labels.matches(pod["metadata"].get("labels")):
                    item = self._pod_metrics_item(pod)
                    if item is not None:
                        items.append(item)
        return _Response(
            200,
            {
                "kind": "PodMetricsList",
                "apiVersion": f"{METRICS_GROUP}/{METRICS_VERSION}",
                "metadata": {},
                "items": items,
            },
        )

    # -- HTTP --------------------------------------------------------------------------------------

    def _serve(self, handler: _Handler) -> None:
        split = urlsplit(handler.path)
        path = split.path
        query = parse_qs(split.query, keep_blank_values=True)
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        body: Any = None
        decode_error = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError as exc:
                decode_error = exc
        record = RequestRecord(handler.command, path, query, body)
        with self._lock:
            self._requests.append(record)
            fault = next((f for f in self._faults if f.matches(handler.command, path)), None)
            if fault is not None:
                fault.remaining -= 1
                fault.hits += 1
                record.fault = fault.kind
        if fault is not None and fault.kind == "hang":
            self._stopping.wait(fault.seconds)
        if fault is not None and (fault.kind == "status" or (fault.kind == "hang" and not fault.process)):
            headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
            details = {"retryAfterSeconds": fault.retry_after} if fault.retry_after is not None else None
            error = ApiError(fault.status, fault.message, details=details, headers=headers)
            self._send(handler, _Response(fault.status, error.status(), error.headers), record)
            return
        if fault is not None and fault.kind == "drop" and not fault.process:
            handler.close_connection = True
            return
        if decode_error is not None:
            response = self._error_response(bad_request(f"couldn't decode the request body: {decode_error}"))
        else:
            response = self._dispatch(
                handler.command, path, query, body, handler.headers.get("Content-Type", ""), record
            )
        if fault is not None and fault.kind == "drop":
            handler.close_connection = True
            return
        self._send(handler, response, record)

    def _error_response(self, error: ApiError) -> _Response:
        return _Response(error.code, error.status(), error.headers)

    def _send(self, handler: _Handler, response: _Response, record: RequestRecord) -> None:
        record.status = response.status
        try:
            handler.send_response(response.status)
            handler.send_header("Content-Type", response.content_type)
            for key, value in response.headers.items():
                handler.send_header(key, value)
            if response.stream is not None:
                handler.send_header("Transfer-Encoding", "chunked")
                handler.end_headers()
                handler.wfile.flush()
                for chunk in response.stream:
                    if chunk:
                        handler.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                        handler.wfile.flush()
                handler.wfile.write(b"0\r\n\r\n")
                handler.wfile.flush()
                return
            if isinstance(response.body, bytes | str):
                payload = response.body.encode() if isinstance(response.body, str) else response.body
            else:
                payload = json.dumps(response.body).encode()
            handler.send_header("Content-Length", str(len(payload)))
            handler.end_headers()
            if handler.command != "HEAD":
                handler.wfile.write(payload)
        except OSError:  # the client went away (timeouts, closed watches)
            handler.close_connection = True
        except Exception:  # noqa: BLE001 - a harness bug inside a stream: record it and cut the stream
            self.internal_errors.append(traceback.format_exc())
            handler.close_connection = True
        finally:
            if response.stream is not None and hasattr(response.stream, "close"):
                response.stream.close()  # type: ignore[attr-defined]

    def _dispatch(
        self,
        method: str,
        path: str,
        query: dict[str, list[str]],
        body: Any,
        content_type: str,
        record: RequestRecord,
    ) -> _Response:
        try:
            response = self._route_request(method, path, query, body, content_type, record)
        except ApiError as error:
            return self._error_response(error)
        except Exception as exc:  # noqa: BLE001 - a harness bug must answer 500 and be recorded, not hang
            self.internal_errors.append(traceback.format_exc())
            return self._error_response(ApiError(500, f"Internal error occurred: {exc!r}"))
        return response

    def _route_request(
        self,
        method: str,
        path: str,
        query: dict[str, list[str]],
        body: Any,
        content_type: str,
        record: RequestRecord,
    ) -> _Response:
        if path in ("/healthz", "/readyz", "/livez"):
            return _Response(200, "ok", content_type="text/plain")
        if path in ("/version", "/version/"):
            return _Response(200, dict(KUBERNETES_VERSION))
        if path in ("/api", "/api/"):
            return _Response(
                200,
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
                },
            )
        if path in ("/apis", "/apis/"):
            return _Response(200, self._with_metrics_group(self._group_list()))
        if path == METRICS_PREFIX or path.startswith(METRICS_PREFIX + "/"):
            return self._metrics_request(method, path, query, record)
        route = self._parse_route(path)
        if route.kind == "discovery":
            if method != "GET":
                raise ApiError(405, "the server does not allow this method on the requested resource")
            return _Response(200, self._resource_list(route.group, route.version))
        rt = route.rt
        assert rt is not None
        param = _Params(query)
        field_validation = param.get("fieldValidation") or self.default_field_validation
        dry_run = param.get("dryRun") == "All"
        warnings: list[str] = []

        def done(status: int, payload: Any) -> _Response:
            quoted = [w.replace("\\", "\\\\").replace('"', '\\"') for w in warnings]
            headers = {"Warning": ", ".join(f'299 - "{w}"' for w in quoted)} if warnings else {}
            return _Response(status, payload, headers)

        if route.kind == "collection":
            if method == "GET":
                record.handled = True
                if param.flag("watch"):
                    raise bad_request("watches are not served by the fake API server: the platform never watches")
                return _Response(200, self._list_response(rt, route.namespace, param))
            if method == "POST":
                if rt.namespaced and route.namespace is None:
                    raise ApiError(405, "the server does not allow this method on the requested resource")
                record.handled = True
                return done(
                    201,
                    self.create(
                        rt,
                        body,
                        route.namespace,
                        field_validation=field_validation,
                        dry_run=dry_run,
                        warnings=warnings,
                    ),
                )
            if method == "DELETE":
                record.handled = True
                return _Response(200, self._delete_collection(rt, route.namespace, param, body))
            raise ApiError(405, "the server does not allow this method on the requested resource")

        name = route.name or ""
        if route.subresource == "log":
            if method != "GET":
                raise ApiError(405, "the server does not allow this method on the requested resource")
            record.handled = True
            return self._pod_log(route.namespace or "", name, param)
        if method == "GET":
            record.handled = True
            return _Response(200, self.get(rt, name, route.namespace))
        if method == "PUT":
            record.handled = True
            if not isinstance(body, dict):
                raise bad_request("the body of the request must be an object")
            return done(
                200,
                self.replace(
                    rt,
                    body,
                    name=name,
                    namespace=route.namespace,
                    subresource=route.subresource,
                    field_validation=field_validation,
                    dry_run=dry_run,
                    warnings=warnings,
                ),
            )
        if method == "PATCH":
            media = content_type.split(";")[0].strip()
            kinds = {
                "application/merge-patch+json": "merge",
                "application/json-patch+json": "json",
                "application/strategic-merge-patch+json": "strategic",
            }
            if media not in kinds:
                raise ApiError(
                    415,
                    f"the body of the request was in an unknown format - accepted media types "
                    f"include: {', '.join(kinds)}",
                )
            record.handled = True
            return done(
                200,
                self.patch(
                    rt,
                    name,
                    body,
                    route.namespace,
                    patch_type=kinds[media],
                    subresource=route.subresource,
                    field_validation=field_validation,
                    dry_run=dry_run,
                    warnings=warnings,
                ),
            )
        if method == "DELETE":
            if route.subresource:
                raise ApiError(405, "the server does not allow this method on the requested resource")
            options = body if isinstance(body, dict) else {}
            propagation = options.get("propagationPolicy") or param.get("propagationPolicy")
            grace = options.get("gracePeriodSeconds", param.get("gracePeriodSeconds"))
            record.handled = True
            return _Response(
                200,
                self.delete(
                    rt,
                    name,
                    route.namespace,
                    propagation=propagation,
                    grace_period=int(grace) if grace is not None else None,
                    preconditions=options.get("preconditions") or {},
                    dry_run=dry_run or options.get("dryRun") == ["All"],
                ),
            )
        raise ApiError(405, "the server does not allow this method on the requested resource")

    def _parse_route(self, path: str) -> _Route:
        parts = [unquote(part) for part in path.strip("/").split("/")]
        if parts[0] == "api" and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[0] == "apis" and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise _no_such_resource()
        if not any(rt.group == group and rt.version == version for rt in self._types.values()):
            raise _no_such_resource()
        if not rest:
            return _Route("discovery", group, version)
        namespace = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            nested = self._type_for(group, version, rest[2])
            if nested is not None and nested.namespaced:
                namespace, rest = rest[1], rest[2:]
        rt = self._type_for(group, version, rest[0])
        if rt is None or len(rest) > 3:
            raise _no_such_resource()
        if namespace is None and rt.namespaced and len(rest) > 1:
            raise _no_such_resource()
        if len(rest) == 1:
            return _Route("collection", group, version, rt, namespace)
        subresource = rest[2] if len(rest) == 3 else None
        if subresource not in (None, "status", "log"):
            raise _no_such_resource()
        if subresource == "status" and not rt.status_subresource:
            raise _no_such_resource()
        if subresource == "log" and rt.key != ("", "pods"):
            raise _no_such_resource()
        return _Route("item", group, version, rt, namespace, rest[1], subresource)

    def _group_list(self) -> JSON:
        groups: dict[str, list[str]] = defaultdict(list)
        for rt in self._types.values():
            if rt.group and rt.version not in groups[rt.group]:
                groups[rt.group].append(rt.version)
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {
                    "name": group,
                    "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in versions],
                    "preferredVersion": {"groupVersion": f"{group}/{versions[0]}", "version": versions[0]},
                }
                for group, versions in sorted(groups.items())
            ],
        }

    def _resource_list(self, group: str, version: str) -> JSON:
        resources: list[JSON] = []
        for rt in self._types.values():
            if rt.group != group or rt.version != version:
                continue
            resources.append(
                {
                    "name": rt.plural,
                    "singularName": rt.kind.lower(),
                    "namespaced": rt.namespaced,
                    "kind": rt.kind,
                    "verbs": [
                        "create",
                        "delete",
                        "deletecollection",
                        "get",
                        "list",
                        "patch",
                        "update",
                        "watch",
                    ],
                    "shortNames": list(rt.short_names),
                }
            )
            if rt.status_subresource:
                resources.append(
                    {
                        "name": f"{rt.plural}/status",
                        "singularName": "",
                        "namespaced": rt.namespaced,
                        "kind": rt.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
            if rt.key == ("", "pods"):
                resources.append(
                    {
                        "name": "pods/log",
                        "singularName": "",
                        "namespaced": True,
                        "kind": "Pod",
                        "verbs": ["get"],
                    }
                )
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": resources,
        }

    def _list_response(self, rt: ResourceType, namespace: str | None, param: _Params) -> JSON:
        labels = LabelSelector(param.get("labelSelector"))
        fields = FieldSelector(param.get("fieldSelector"), rt)
        limit = param.int("limit")
        token = param.get("continue")
        with self._lock:
            rv = self._rv
            start_after: tuple[str, str] | None = None
            if token:
                start_after = self._decode_continue(token)
            keys = sorted(k for k in self._objects[rt.key] if namespace is None or k[0] == namespace)
            items = [
                self._list_item(rt, self._objects[rt.key][k])
                for k in keys
                if (start_after is None or k > start_after) and self._selected(self._objects[rt.key][k], labels, fields)
            ]
        meta: JSON = {"resourceVersion": str(rv)}
        if limit and len(items) > limit:
            last = items[limit - 1]["metadata"]
            meta["continue"] = self._encode_continue(
                rv, (last.get("namespace", "") if rt.namespaced else "", last["name"])
            )
            meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        return {"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": meta, "items": items}

    def _list_item(self, rt: ResourceType, obj: JSON) -> JSON:
        item = copy.deepcopy(obj)
        if rt.crd is None:
            # Items of built-in lists carry no apiVersion/kind on the wire.
            item.pop("apiVersion", None)
            item.pop("kind", None)
        return item

    def _encode_continue(self, rv: int, after: tuple[str, str]) -> str:
        raw = json.dumps({"rv": rv, "start": list(after)}).encode()
        return base64.urlsafe_b64encode(raw).decode()

    def _decode_continue(self, token: str) -> tuple[str, str]:
        try:
            data = json.loads(base64.urlsafe_b64decode(token.encode()))
            rv, after = int(data["rv"]), tuple(data["start"])
        except (ValueError, KeyError, TypeError):
            raise bad_request("continue key is not valid: incorrect encoded start resourceVersion") from None
        if rv < self._compacted_rv:
            raise ApiError(
                410,
                "The provided continue parameter is too old to display a consistent list result. "
                "You can start a new list without the continue parameter.",
                reason="Expired",
            )
        return (str(after[0]), str(after[1]))

    def _delete_collection(self, rt: ResourceType, namespace: str | None, param: _Params, body: Any) -> JSON:
        options = body if isinstance(body, dict) else {}
        deleted = []
        with self._lock:
            for obj in self.list(
                rt,
                namespace,
                label_selector=param.get("labelSelector"),
                field_selector=param.get("fieldSelector"),
            ):
                meta = obj["metadata"]
                try:
                    self.delete(
                        rt,
                        meta["name"],
                        meta.get("namespace"),
                        propagation=options.get("propagationPolicy") or param.get("propagationPolicy"),
                    )
                except ApiError:
                    continue
                deleted.append(self._list_item(rt, obj))
            rv = self._rv
        return {
            "kind": f"{rt.kind}List",
            "apiVersion": rt.api_version,
            "metadata": {"resourceVersion": str(rv)},
            "items": deleted,
        }

    # -- pod logs ----------------------------------------------------------------------------------

    def _pod_log(self, namespace: str, name: str, param: _Params) -> _Response:
        pod = self.get("pods", name, namespace)
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        names = [c["name"] for c in spec.get("containers") or []]
        all_names = names + [c["name"] for c in spec.get("initContainers") or []]
        container = param.get("container")
        if not container:
            if len(names) != 1:
                raise bad_request(
                    f"a container name must be specified for pod {name}, choose one of: [{' '.join(names)}]"
                )
            container = names[0]
        if container not in all_names:
            raise bad_request(f"container {container} is not valid for pod {name}")
        previous = param.flag("previous")
        if previous and (namespace, name, container) not in self._previous_logs:
            raise bad_request(f'previous terminated container "{container}" in pod "{name}" not found')
        if not spec.get("nodeName"):
            raise bad_request(f"pod {name} does not have a host assigned")
        statuses = (status.get("containerStatuses") or []) + (status.get("initContainerStatuses") or [])
        state = next((s.get("state") or {} for s in statuses if s.get("name") == container), {})
        if not previous and (not state or "waiting" in state):
            why = (state.get("waiting") or {}).get("reason", "ContainerCreating")
            raise bad_request(f'container "{container}" in pod "{name}" is waiting to start: {why}')
        since = self._since(param)
        tail = param.int("tailLines")
        limit_bytes = param.int("limitBytes")
        stamps = param.flag("timestamps")
        key = (namespace, name, container)

        def render(lines: Iterable[LogLine]) -> bytes:
            return "".join(
                (f"{rfc3339_nano(item.time)} " if stamps else "") + item.text + "\n" for item in lines
            ).encode()

        with self._lock:
            source = self._previous_logs.get(key, []) if previous else self._logs.get(key, [])
            lines = [item for item in source if since is None or item.time >= since]
            if tail is not None:
                lines = lines[-tail:] if tail > 0 else []
        if param.flag("follow"):
            raise bad_request("follow=true is not served by the fake API server: the platform never follows a log")
        payload = render(lines)
        if limit_bytes is not None:
            payload = payload[:limit_bytes]
        return _Response(200, payload, content_type="text/plain")

    def _since(self, param: _Params) -> datetime | None:
        if param.get("sinceTime") and param.get("sinceSeconds"):
            raise bad_request("at most one of sinceTime or sinceSeconds may be specified")
        if param.get("sinceTime"):
            try:
                return parse_time(str(param.get("sinceTime")))
            except ValueError:
                raise bad_request(f"invalid sinceTime {param.get('sinceTime')!r}") from None
        seconds = param.int("sinceSeconds")
        return self.now() - timedelta(seconds=seconds) if seconds is not None else None


class _Params:
    """Query parameters with the API server's parsing rules."""

    def __init__(self, query: Mapping[str, list[str]]) -> None:
        self.query = query

    def get(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[-1] if values else None

    def flag(self, name: str) -> bool:
        return (self.get(name) or "").lower() in ("true", "1")

    def int(self, name: str) -> int | None:
        value = self.get(name)
        if value in (None, ""):
            return None
        try:
            return int(str(value))
        except ValueError:
            raise bad_request(f"{name}: invalid integer {value!r}") from None


METRICS_GROUP = "metrics.k8s.io"
METRICS_VERSION = "v1beta1"
METRICS_PREFIX = f"/apis/{METRICS_GROUP}"


def _no_such_resource() -> ApiError:
    return ApiError(404, "the server could not find the requested resource", details={})


# --- kind-specific strategy (defaults, server-set fields, validation) -----------------------------


def _prune_builtin(rt: ResourceType, obj: JSON) -> JSON:
    pruned = copy.deepcopy(obj)
    for path in sorted(crds.model_unknown_fields(rt.model or "", pruned), key=len, reverse=True):
        parts = path.replace("[", ".[").split(".")
        target: Any = pruned
        for part in parts[:-1]:
            target = (
                target[int(part[1:-1])]
                if part.startswith("[") and isinstance(target, list)
                else (target[part[1:-1]] if part.startswith("[") else target[part])
            )
        last = parts[-1]
        del target[last[1:-1] if last.startswith("[") else last]
    return pruned


def _qos_class(spec: JSON) -> str:
    containers = spec.get("containers") or []
    requests = [c.get("resources", {}).get("requests", {}) for c in containers]
    limits = [c.get("resources", {}).get("limits", {}) for c in containers]
    if not any(requests) and not any(limits):
        return "BestEffort"
    guaranteed = all(
        lim.get(res) is not None and req.get(res, lim.get(res)) == lim.get(res)
        for req, lim in zip(requests, limits, strict=True)
        for res in ("cpu", "memory")
    )
    return "Guaranteed" if guaranteed else "Burstable"


def _canonicalize_resources(resources: JSON | None) -> None:
    if not isinstance(resources, dict):
        return
    for section in ("requests", "limits"):
        values = resources.get(section)
        if isinstance(values, dict):
            for key, value in list(values.items()):
                try:
                    values[key] = canonical_quantity(value)
                except ValueError:
                    pass  # left as is; validation reports it
    limits = resources.get("limits") or {}
    if limits:
        requests = resources.setdefault("requests", {})
        for key, value in limits.items():
            requests.setdefault(key, value)  # the API server defaults requests to limits


def default_pod_spec(spec: JSON) -> None:
    """The API server's defaults for a pod spec (the subset clients usually read back)."""
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("serviceAccountName", "default")
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("priority", 0)
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        if not isinstance(container, dict):
            continue
        image = str(container.get("image", ""))
        tagged = ":" in image.rsplit("/", 1)[-1] or "@" in image
        default_pull = "Always" if not tagged or image.endswith(":latest") else "IfNotPresent"
        container.setdefault("imagePullPolicy", default_pull)
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        container.setdefault("resources", {})
        _canonicalize_resources(container.get("resources"))
        for port in container.get("ports") or []:
            if isinstance(port, dict):
                port.setdefault("protocol", "TCP")
    if isinstance(spec.get("overhead"), dict):
        spec["overhead"] = {k: canonical_quantity(v) for k, v in spec["overhead"].items()}


def _prepare_for_create(fake: FakeKubernetes, rt: ResourceType, obj: JSON) -> None:
    if rt.crd is not None and rt.status_subresource:
        obj.pop("status", None)
    if rt.key == ("", "namespaces"):
        obj["spec"] = {"finalizers": ["kubernetes"]}
        obj["status"] = {"phase": "Active"}
        labels = obj["metadata"].setdefault("labels", {})
        labels["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
    elif rt.key == ("", "pods"):
        spec = obj.setdefault("spec", {})
        default_pod_spec(spec)
        obj["status"] = {"phase": "Pending", "qosClass": _qos_class(spec)}
    elif rt.key == ("", "services"):
        spec = obj.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        if spec.get("clusterIP") != "None":
            spec["clusterIP"] = fake.next_ip("10.96.0")
        spec["clusterIPs"] = [spec["clusterIP"]]
        for port in spec.get("ports") or []:
            if isinstance(port, dict):
                port.setdefault("protocol", "TCP")
                port.setdefault("targetPort", port.get("port"))
        obj["status"] = {"loadBalancer": {}}
    elif rt.key == ("", "nodes"):
        status = obj.setdefault("status", {})
        for section in ("capacity", "allocatable"):
            if isinstance(status.get(section), dict):
                status[section] = {k: canonical_quantity(v) for k, v in status[section].items()}
    elif rt.key == ("networking.k8s.io", "ingresses"):
        obj["status"] = {"loadBalancer": {}}
    elif rt.key == ("batch", "jobs"):
        obj["status"] = {}


def _prepare_for_update(fake: FakeKubernetes, rt: ResourceType, new: JSON, old: JSON) -> None:
    if rt.key == ("", "pods"):
        default_pod_spec(new.setdefault("spec", {}))
    elif rt.key == ("", "services"):
        spec = new.setdefault("spec", {})
        for key in ("clusterIP", "clusterIPs"):
            if key in (old.get("spec") or {}) and key not in spec:
                spec[key] = old["spec"][key]
    elif rt.key == ("", "nodes"):
        status = new.get("status") or {}
        for section in ("capacity", "allocatable"):
            if isinstance(status.get(section), dict):
                status[section] = {k: canonical_quantity(v) for k, v in status[section].items()}


def _same_content(new: JSON, old: JSON) -> bool:
    def strip(obj: JSON) -> JSON:
        copied = copy.deepcopy(obj)
        copied["metadata"].pop("resourceVersion", None)
        copied["metadata"].pop("managedFields", None)
        return copied

    return strip(new) == strip(old)


def _spec_changed(rt: ResourceType, new: JSON, old: JSON) -> bool:
    ignored = {"metadata", "status"} if rt.status_subresource else {"metadata"}
    return {k: v for k, v in new.items() if k not in ignored} != {k: v for k, v in old.items() if k not in ignored}


def _meta_causes(rt: ResourceType, meta: JSON, old: JSON | None) -> list[crds.FieldCause]:
    causes: list[crds.FieldCause] = []
    name = str(meta.get("name", ""))
    for problem in name_problems(name, rt.name_format):
        causes.append(cause("metadata.name", "FieldValueInvalid", f"Invalid value: {json.dumps(name)}: {problem}"))
    for section in ("labels", "annotations"):
        values = meta.get(section) or {}
        if not isinstance(values, dict):
            causes.append(cause(f"metadata.{section}", "FieldValueTypeInvalid", "Invalid value: must be a map"))
            continue
        for key, value in values.items():
            for problem in qualified_name_problems(str(key)):
                causes.append(
                    cause(
                        f"metadata.{section}",
                        "FieldValueInvalid",
                        f"Invalid value: {json.dumps(key)}: {problem}",
                    )
                )
            if not isinstance(value, str):
                causes.append(
                    cause(
                        f"metadata.{section}",
                        "FieldValueTypeInvalid",
                        f"Invalid value: {json.dumps(value)}: values must be strings",
                    )
                )
            elif section == "labels":
                for problem in label_value_problems(value):
                    causes.append(
                        cause(
                            "metadata.labels",
                            "FieldValueInvalid",
                            f"Invalid value: {json.dumps(value)}: {problem}",
                        )
                    )
        if section == "annotations" and len(json.dumps(values)) > 256 * 1024:
            causes.append(
                cause("metadata.annotations", "FieldValueTooLong", "Too long: must have at most 262144 bytes")
            )
    for index, ref in enumerate(meta.get("ownerReferences") or []):
        for required in ("apiVersion", "kind", "name", "uid"):
            if not (ref or {}).get(required):
                causes.append(
                    cause(
                        f"metadata.ownerReferences[{index}].{required}",
                        "FieldValueRequired",
                        "Required value",
                    )
                )
    controllers = [ref for ref in meta.get("ownerReferences") or [] if (ref or {}).get("controller")]
    if len(controllers) > 1:
        causes.append(
            cause(
                "metadata.ownerReferences",
                "FieldValueInvalid",
                "Invalid value: only one reference can have Controller set to true",
            )
        )
    return causes


def _builtin_causes(rt: ResourceType, obj: JSON, old: JSON | None) -> list[crds.FieldCause]:
    if rt.key == ("", "pods"):
        causes = pod_spec_causes(obj.get("spec") or {}, "spec")
        if old is not None:
            causes += _pod_update_causes(obj.get("spec") or {}, old.get("spec") or {})
        return causes
    if rt.key == ("", "services"):
        return _service_causes(obj.get("spec") or {})
    if rt.key == ("networking.k8s.io", "ingresses"):
        return _ingress_causes(obj.get("spec") or {})
    return []


def pod_spec_causes(spec: JSON, path: str) -> list[crds.FieldCause]:
    """The subset of the API server's pod validation a backend is likely to trip on."""
    causes: list[crds.FieldCause] = []
    containers = spec.get("containers") or []
    if not containers:
        causes.append(cause(f"{path}.containers", "FieldValueRequired", "Required value"))
    seen: set[str] = set()
    for group in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(group) or []):
            where = f"{path}.{group}[{index}]"
            cname = str(container.get("name", ""))
            if not cname:
                causes.append(cause(f"{where}.name", "FieldValueRequired", "Required value"))
            else:
                for problem in name_problems(cname, "label"):
                    causes.append(
                        cause(
                            f"{where}.name",
                            "FieldValueInvalid",
                            f"Invalid value: {json.dumps(cname)}: {problem}",
                        )
                    )
                if cname in seen:
                    causes.append(
                        cause(f"{where}.name", "FieldValueDuplicate", f"Duplicate value: {json.dumps(cname)}")
                    )
                seen.add(cname)
            if not container.get("image"):
                causes.append(cause(f"{where}.image", "FieldValueRequired", "Required value"))
            causes += _resources_causes(container.get("resources") or {}, f"{where}.resources")
            for pindex, port in enumerate(container.get("ports") or []):
                number = port.get("containerPort")
                if not isinstance(number, int) or not 1 <= number <= 65535:
                    causes.append(
                        cause(
                            f"{where}.ports[{pindex}].containerPort",
                            "FieldValueInvalid",
                            f"Invalid value: {json.dumps(number)}: must be between 1 and 65535, inclusive",
                        )
                    )
    policy = spec.get("restartPolicy")
    if policy is not None and policy not in ("Always", "OnFailure", "Never"):
        causes.append(
            cause(
                f"{path}.restartPolicy",
                "FieldValueNotSupported",
                f'Unsupported value: {json.dumps(policy)}: supported values: "Always", "OnFailure", "Never"',
            )
        )
    return causes


def _resources_causes(resources: JSON, path: str) -> list[crds.FieldCause]:
    causes: list[crds.FieldCause] = []
    parsed: dict[str, dict[str, Fraction]] = {"requests": {}, "limits": {}}
    for section in ("requests", "limits"):
        for key, raw in (resources.get(section) or {}).items():
            where = f"{path}.{section}[{key}]"
            try:
                value = quantity_value(raw)
            except ValueError as exc:
                causes.append(cause(where, "FieldValueInvalid", f"Invalid value: {json.dumps(raw)}: {exc}"))
                continue
            if value < 0:
                causes.append(
                    cause(
                        where,
                        "FieldValueInvalid",
                        f"Invalid value: {json.dumps(raw)}: must be greater than or equal to 0",
                    )
                )
            if is_extended_resource(key) and value.denominator != 1:
                causes.append(
                    cause(where, "FieldValueInvalid", f"Invalid value: {json.dumps(raw)}: must be an integer")
                )
            parsed[section][key] = value
    for key, value in parsed["requests"].items():
        limit = parsed["limits"].get(key)
        where = f"{path}.requests[{key}]"
        if is_extended_resource(key):
            if limit is None:
                causes.append(
                    cause(
                        f"{path}.limits",
                        "FieldValueRequired",
                        "Required value: Limit must be set for non overcommitable resources",
                    )
                )
            elif limit != value:
                causes.append(
                    cause(
                        where,
                        "FieldValueInvalid",
                        f"Invalid value: {json.dumps(format_quantity(value))}: must be equal to {key} limit",
                    )
                )
        elif limit is not None and value > limit:
            causes.append(
                cause(
                    where,
                    "FieldValueInvalid",
                    f"Invalid value: {json.dumps(format_quantity(value))}: must be less than or equal to "
                    f"{key} limit of {format_quantity(limit)}",
                )
            )
    return causes


_POD_MUTABLE = ("activeDeadlineSeconds", "tolerations", "schedulingGates", "terminationGracePeriodSeconds")


def _pod_update_causes(new: JSON, old: JSON) -> list[crds.FieldCause]:
    def comparable(spec: JSON) -> JSON:
        copied = {k: copy.deepcopy(v) for k, v in spec.items() if k not in _POD_MUTABLE}
        for group in ("containers", "initContainers"):
            for container in copied.get(group) or []:
                container.pop("image", None)
        if not old.get("nodeName"):
            copied.pop("nodeName", None)  # binding sets nodeName once
        return copied

    if comparable(new) != comparable(old):
        return [
            cause(
                "spec",
                "FieldValueForbidden",
                "Forbidden: a pod update may only change container images, activeDeadlineSeconds, "
                "tolerations and terminationGracePeriodSeconds",
            )
        ]
    return []


def _service_causes(spec: JSON) -> list[crds.FieldCause]:
    causes: list[crds.FieldCause] = []
    ports = spec.get("ports") or []
    if not ports and spec.get("clusterIP") != "None" and spec.get("type") != "ExternalName":
        causes.append(cause("spec.ports", "FieldValueRequired", "Required value"))
    names: set[str] = set()
    for index, port in enumerate(ports):
        where = f"spec.ports[{index}]"
        number = port.get("port")
        if not isinstance(number, int) or not 1 <= number <= 65535:
            causes.append(
                cause(
                    f"{where}.port",
                    "FieldValueInvalid",
                    f"Invalid value: {json.dumps(number)}: must be between 1 and 65535, inclusive",
                )
            )
        pname = port.get("name")
        if len(ports) > 1 and not pname:
            causes.append(cause(f"{where}.name", "FieldValueRequired", "Required value"))
        if pname in names:
            causes.append(cause(f"{where}.name", "FieldValueDuplicate", f"Duplicate value: {json.dumps(pname)}"))
        names.add(pname)
    stype = spec.get("type", "ClusterIP")
    if stype not in ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName"):
        causes.append(
            cause(
                "spec.type",
                "FieldValueNotSupported",
                f'Unsupported value: {json.dumps(stype)}: supported values: "ClusterIP", '
                '"ExternalName", "LoadBalancer", "NodePort"',
            )
        )
    return causes


def _ingress_causes(spec: JSON) -> list[crds.FieldCause]:
    causes: list[crds.FieldCause] = []
    for rindex, rule in enumerate(spec.get("rules") or []):
        where = f"spec.rules[{rindex}]"
        host = rule.get("host")
        if host:
            bare = host[2:] if host.startswith("*.") else host
            for problem in name_problems(bare, "subdomain"):
                causes.append(
                    cause(f"{where}.host", "FieldValueInvalid", f"Invalid value: {json.dumps(host)}: {problem}")
                )
        for pindex, item in enumerate(((rule.get("http") or {}).get("paths")) or []):
            pwhere = f"{where}.http.paths[{pindex}]"
            path_type = item.get("pathType")
            if not path_type:
                causes.append(
                    cause(
                        f"{pwhere}.pathType",
                        "FieldValueRequired",
                        "Required value: pathType must be specified",
                    )
                )
            elif path_type not in ("Exact", "Prefix", "ImplementationSpecific"):
                causes.append(
                    cause(
                        f"{pwhere}.pathType",
                        "FieldValueNotSupported",
                        f'Unsupported value: {json.dumps(path_type)}: supported values: "Exact", '
                        '"ImplementationSpecific", "Prefix"',
                    )
                )
            if path_type in ("Exact", "Prefix") and not str(item.get("path", "")).startswith("/"):
                causes.append(
                    cause(
                        f"{pwhere}.path",
                        "FieldValueInvalid",
                        f"Invalid value: {json.dumps(item.get('path'))}: must be an absolute path",
                    )
                )
            service = ((item.get("backend") or {}).get("service")) or {}
            if not service.get("name"):
                causes.append(
                    cause(
                        f"{pwhere}.backend",
                        "FieldValueInvalid",
                        'Invalid value: "": one backend (service or resource) must be specified',
                    )
                )
            port = service.get("port") or {}
            if service and not (port.get("number") or port.get("name")):
                causes.append(
                    cause(
                        f"{pwhere}.backend.service.port",
                        "FieldValueInvalid",
                        'Invalid value: "": port name or number is required',
                    )
                )
    return causes


# Re-exported for the controller and tests.
__all__ = [
    "ApiError",
    "FakeKubernetes",
    "Fault",
    "LabelSelector",
    "RequestRecord",
    "ResourceType",
    "canonical_quantity",
    "format_quantity",
    "parse_quantity",
    "pod_spec_causes",
    "resource_list",
]
