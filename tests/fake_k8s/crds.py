"""The real Volcano CustomResourceDefinitions, loaded for the fake API server.

Reads the CRD YAML files copied from volcano-sh/volcano (default `<repo root>/../shared/volcano-crds`,
override with the environment variable `TRAINYARD_VOLCANO_CRDS`) and treats a custom object the way a
kube-apiserver with structural schemas does:

1. null values of fields that are not `nullable` are dropped;
2. fields the schema does not know are pruned (unless `x-kubernetes-preserve-unknown-fields` keeps
   them), with a warning under `fieldValidation=Warn` (the server's default, which the official client
   never reads) and rejected only under `fieldValidation=Strict`. `validate()` defaults to Strict so that a
   manifest test catches a typo (`minAvaliable`) or a field an older release lacks;
3. the schema's `default` values are applied;
4. the object is validated against the openAPIV3Schema (jsonschema), and `x-kubernetes-list-type`
   `set`/`map` uniqueness is enforced, with error messages shaped like the API server's.
"""

from __future__ import annotations

import copy
import functools
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from kubernetes.client import models as k8s_models

ENV_VAR = "TRAINYARD_VOLCANO_CRDS"

# The files this harness needs; the folder also holds example manifests.
CRD_FILES = (
    "batch.volcano.sh_jobs.yaml",
    "scheduling.volcano.sh_queues.yaml",
    "scheduling.volcano.sh_podgroups.yaml",
    "bus.volcano.sh_commands.yaml",
)

FIELD_VALIDATION_MODES = ("Strict", "Warn", "Ignore")
# Volcano releases whose CRDs sit in sub-folders of that name: the oldest the platform supports (1.9), one in the
# middle, and the first with every Queue field the platform sets (1.14).
RELEASES = ("v1.9.0", "v1.12.0", "v1.14.0")

JSON = dict[str, Any]


def crds_dir() -> Path:
    """The folder holding the Volcano CRD files (`TRAINYARD_VOLCANO_CRDS` wins over the default)."""
    override = os.environ.get(ENV_VAR)
    if override:
        return Path(override).expanduser()
    repo_root = Path(__file__).resolve().parents[2]
    return repo_root.parent / "shared" / "volcano-crds"


def crds_available(directory: Path | None = None) -> bool:
    """True when every CRD file the fake server needs is present."""
    folder = directory or crds_dir()
    return all((folder / name).is_file() for name in CRD_FILES)


def unavailable_reason(directory: Path | None = None) -> str:
    """A message for `pytest.skip` when `crds_available()` is False: what is missing and how to get it."""
    folder = directory or crds_dir()
    missing = [name for name in CRD_FILES if not (folder / name).is_file()]
    return (
        f"Volcano CRDs not found in {folder} (missing: {', '.join(missing)}). To get them, copy "
        "config/crd/volcano/bases/*.yaml of github.com/volcano-sh/volcano into that folder (a recent commit at "
        f"the top, the release tags {', '.join(RELEASES)} into sub-folders of those names), or set {ENV_VAR} to "
        "a folder laid out that way"
    )


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require(directory: Path | None = None) -> None:
    """Skip the calling test when the CRD files are missing; under CI (`CI=true`) fail it instead, so that a
    CI run without them cannot pass by skipping every test that needs them."""
    if crds_available(directory):
        return
    import pytest

    if in_ci():
        pytest.fail(f"CI=true and {unavailable_reason(directory)}", pytrace=False)
    pytest.skip(unavailable_reason(directory))


def release_dirs() -> dict[str, Path]:
    """Every CRD folder to test against, oldest first: the released versions, then the newest snapshot."""
    top = crds_dir()
    return {**{release: top / release for release in RELEASES}, "newest": top}


def release_version(name: str) -> tuple[int, int] | None:
    """(major, minor) of a release folder name such as `v1.12.0`; None for the newest snapshot."""
    if name not in RELEASES:
        return None
    major, minor = name.lstrip("v").split(".")[:2]
    return int(major), int(minor)


@dataclass(frozen=True)
class FieldCause:
    """One failed field, as the API server reports it in `Status.details.causes`."""

    field: str
    reason: str  # FieldValueInvalid, FieldValueRequired, FieldValueNotSupported, ...
    message: str  # the full "<field>: <detail>" line

    def as_status_cause(self) -> JSON:
        return {"reason": self.reason, "message": self.message, "field": self.field}


class CrdValidationError(ValueError):
    """A custom object that the API server would refuse."""

    status_code = 422

    def __init__(self, kind: str, name: str, causes: list[FieldCause]) -> None:
        self.kind = kind
        self.name = name
        self.causes = causes
        super().__init__(self.summary())

    def summary(self) -> str:
        lines = [cause.message for cause in self.causes]
        body = lines[0] if len(lines) == 1 else "[" + ", ".join(lines) + "]"
        return f'{self.kind} "{self.name}" is invalid: {body}'

    @property
    def paths(self) -> list[str]:
        return [cause.field for cause in self.causes]


class UnknownFieldsError(CrdValidationError):
    """Fields the schema does not declare (the server's strict decoding error, HTTP 400)."""

    status_code = 400

    def summary(self) -> str:
        # For this error `name` holds the version, as in the server's own wording.
        listed = ", ".join(f'unknown field "{cause.field}"' for cause in self.causes)
        return (
            f'{self.kind} in version "{self.name}" cannot be handled as a {self.kind}: strict decoding error: {listed}'
        )


@dataclass(frozen=True)
class CustomResource:
    """One served version of a CRD."""

    group: str
    version: str
    plural: str
    singular: str
    kind: str
    list_kind: str
    namespaced: bool
    short_names: tuple[str, ...]
    status_subresource: bool
    schema: JSON = field(repr=False, compare=False)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @property
    def group_kind(self) -> str:
        return f"{self.kind}.{self.group}"


@dataclass
class Prepared:
    """A custom object after pruning, defaulting and validation."""

    obj: JSON
    warnings: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)  # the fields dropped, as `unknown field "<path>"`


class CrdCatalog:
    """The CRDs of one folder, indexed by (group, version, plural) and by (apiVersion, kind)."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or crds_dir()
        if not crds_available(self.directory):
            raise FileNotFoundError(unavailable_reason(self.directory))
        self._by_plural: dict[tuple[str, str, str], CustomResource] = {}
        self._by_kind: dict[tuple[str, str], CustomResource] = {}
        self.definitions: list[JSON] = []  # the CustomResourceDefinition objects as installed
        for name in CRD_FILES:
            with (self.directory / name).open(encoding="utf-8") as handle:
                for doc in yaml.safe_load_all(handle):
                    if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                        self.definitions.append(doc)
                        for resource in _served_versions(doc):
                            self._by_plural[(resource.group, resource.version, resource.plural)] = resource
                            self._by_kind[(resource.api_version, resource.kind)] = resource

    @property
    def resources(self) -> list[CustomResource]:
        return list(self._by_plural.values())

    def get(self, group: str, version: str, plural: str) -> CustomResource:
        try:
            return self._by_plural[(group, version, plural)]
        except KeyError:
            raise KeyError(f"no CRD serves {group}/{version} {plural}") from None

    def for_object(self, obj: Mapping[str, Any]) -> CustomResource:
        key = (str(obj.get("apiVersion", "")), str(obj.get("kind", "")))
        try:
            return self._by_kind[key]
        except KeyError:
            raise KeyError(f"no CRD serves apiVersion={key[0]!r} kind={key[1]!r}") from None

    def crd_schema(self, group: str, version: str, plural: str) -> JSON:
        return copy.deepcopy(self.get(group, version, plural).schema)

    def prepare(self, resource: CustomResource, obj: JSON, *, field_validation: str = "Strict") -> Prepared:
        """Prune, default and validate a copy of `obj`; raise `CrdValidationError` when it is refused."""
        if field_validation not in FIELD_VALIDATION_MODES:
            raise ValueError(f"fieldValidation must be one of {FIELD_VALIDATION_MODES}")
        name = str((obj.get("metadata") or {}).get("name") or (obj.get("metadata") or {}).get("generateName") or "")
        work = copy.deepcopy(obj)
        unknown = _prune(work, resource.schema, "", root=True)
        unknown += model_unknown_fields("V1ObjectMeta", work.get("metadata"), "metadata")
        warnings: list[str] = []
        if unknown:
            if field_validation == "Strict":
                causes = [FieldCause(path, "FieldValueUnknown", f'unknown field "{path}"') for path in unknown]
                raise UnknownFieldsError(resource.kind, resource.version, causes)
            if field_validation == "Warn":
                warnings = [f'unknown field "{path}"' for path in unknown]
            for path in unknown:
                _drop_path(work, path)
        _apply_defaults(work, resource.schema)
        causes = _schema_causes(work, resource.schema)
        causes += _list_type_causes(work, resource.schema, "")
        if causes:
            raise CrdValidationError(resource.group_kind, name, causes)
        return Prepared(work, warnings, [f'unknown field "{path}"' for path in unknown])

    def validate(self, obj: JSON, *, field_validation: str = "Strict") -> JSON:
        """Validate `obj` (apiVersion/kind pick the CRD); return the pruned, defaulted copy."""
        return self.prepare(self.for_object(obj), obj, field_validation=field_validation).obj


@functools.lru_cache(maxsize=4)
def load_catalog(directory: str | None = None) -> CrdCatalog:
    """A cached catalog for `directory` (default: `crds_dir()`)."""
    return CrdCatalog(Path(directory) if directory else None)


def crd_schema(group: str, version: str, plural: str) -> JSON:
    """The openAPIV3Schema of a served CRD version from the default folder."""
    return load_catalog().crd_schema(group, version, plural)


def validate(obj: JSON, *, field_validation: str = "Strict") -> JSON:
    """Validate a custom object against its CRD from the default folder; see `CrdCatalog.validate`."""
    return load_catalog().validate(obj, field_validation=field_validation)


# --- loading --------------------------------------------------------------------------------------


def _served_versions(crd: JSON) -> Iterator[CustomResource]:
    spec = crd["spec"]
    names = spec["names"]
    for version in spec.get("versions", []):
        if not version.get("served", False):
            continue
        yield CustomResource(
            group=spec["group"],
            version=version["name"],
            plural=names["plural"],
            singular=names.get("singular", names["kind"].lower()),
            kind=names["kind"],
            list_kind=names.get("listKind", names["kind"] + "List"),
            namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            short_names=tuple(names.get("shortNames", ())),
            status_subresource="status" in (version.get("subresources") or {}),
            schema=version["schema"]["openAPIV3Schema"],
        )


# --- pruning and defaulting -----------------------------------------------------------------------


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _prune(value: Any, schema: Mapping[str, Any], path: str, *, root: bool = False) -> list[str]:
    """Drop non-nullable nulls in place and return the paths of fields the schema does not know."""
    unknown: list[str] = []
    if isinstance(value, dict):
        props: Mapping[str, Any] = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        preserve = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
        embedded = bool(schema.get("x-kubernetes-embedded-resource"))
        for key in list(value):
            item = value[key]
            child = props.get(key)
            if child is None and isinstance(additional, dict):
                child = additional
            if child is None and (root or embedded) and key in ("apiVersion", "kind", "metadata"):
                continue
            if item is None and not (child or {}).get("nullable", False):
                del value[key]
                continue
            if child is None:
                if not preserve and additional is not True:
                    unknown.append(_join(path, key))
                continue
            # Root metadata is ObjectMeta, checked against the client model, not the CRD schema.
            if root and key == "metadata":
                continue
            unknown += _prune(item, child, _child_path(path, key, key in props))
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            for index, item in enumerate(value):
                unknown += _prune(item, items, f"{path}[{index}]")
    return unknown


def _child_path(path: str, key: str, declared: bool) -> str:
    return _join(path, key) if declared else f"{path}[{key}]"


def _drop_path(obj: JSON, path: str) -> None:
    *parents, last = _split_path(path)
    target: Any = obj
    for part in parents:
        target = target[_key_for(target, part)]
    del target[_key_for(target, last)]


def _key_for(container: Any, part: str | int) -> str | int:
    return str(part) if isinstance(container, dict) else part


def _split_path(path: str) -> Iterator[str | int]:
    buf = ""
    i = 0
    while i < len(path):
        ch = path[i]
        if ch == ".":
            if buf:
                yield buf
            buf = ""
        elif ch == "[":
            if buf:
                yield buf
            buf = ""
            end = path.index("]", i)
            token = path[i + 1 : end]
            yield int(token) if token.isdigit() else token
            i = end
        else:
            buf += ch
        i += 1
    if buf:
        yield buf


def _apply_defaults(value: Any, schema: Mapping[str, Any]) -> None:
    if isinstance(value, dict):
        props: Mapping[str, Any] = schema.get("properties") or {}
        for key, child in props.items():
            if key not in value and "default" in child:
                value[key] = copy.deepcopy(child["default"])
        for key, item in value.items():
            child = props.get(key)
            if child is None and isinstance(schema.get("additionalProperties"), dict):
                child = schema["additionalProperties"]
            if child is not None:
                _apply_defaults(item, child)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            _apply_defaults(item, schema["items"])


# --- validation -----------------------------------------------------------------------------------

# OpenAPI v3 schemas follow draft 4 keywords, but the API server accepts 1.0 where an integer is expected.
_Validator = jsonschema.validators.extend(
    jsonschema.Draft4Validator, type_checker=jsonschema.Draft7Validator.TYPE_CHECKER
)


_VALIDATORS: dict[int, tuple[Mapping[str, Any], Any]] = {}


def _validator(schema: Mapping[str, Any]) -> Any:
    # Keyed by identity: catalogs are cached, and compiling the Job schema on every write is slow.
    cached = _VALIDATORS.get(id(schema))
    if cached is None or cached[0] is not schema:
        cached = _VALIDATORS[id(schema)] = (schema, _Validator(schema))
    return cached[1]


def _format_path(parts: Iterable[Any]) -> str:
    out = ""
    for part in parts:
        out = f"{out}[{part}]" if isinstance(part, int) else _join(out, str(part))
    return out


def _render(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


_JSON_TYPES = (
    (bool, "boolean"),
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (list, "array"),
    (dict, "object"),
)


def _json_type(value: Any) -> str:
    for python_type, name in _JSON_TYPES:
        if isinstance(value, python_type):
            return name
    return "null"


def _schema_causes(obj: JSON, schema: Mapping[str, Any]) -> list[FieldCause]:
    # Root metadata is ObjectMeta and validated by the server itself.
    body = {key: value for key, value in obj.items() if key != "metadata"}
    validator = _validator(schema)
    causes: list[FieldCause] = []
    seen: set[tuple[str, str]] = set()
    for error in sorted(validator.iter_errors(body), key=lambda e: (list(map(str, e.absolute_path)), e.validator)):
        cause = _cause_from_error(error)
        if (cause.field, cause.message) not in seen:
            seen.add((cause.field, cause.message))
            causes.append(cause)
    return causes


def _cause_from_error(error: jsonschema.ValidationError) -> FieldCause:
    where = _format_path(error.absolute_path)
    value = error.instance
    kind = error.validator
    arg = error.validator_value
    if kind == "required":
        missing = error.message.split("'")[1] if "'" in error.message else str(arg)
        target = _join(where, missing)
        return FieldCause(target, "FieldValueRequired", f"{target}: Required value")
    if kind == "type":
        expected = arg if isinstance(arg, str) else ",".join(arg)
        return FieldCause(
            where,
            "FieldValueTypeInvalid",
            f'{where}: Invalid value: "{_json_type(value)}": {where} in body must be of type {expected}: '
            f'"{_json_type(value)}"',
        )
    if kind == "enum":
        supported = ", ".join(_render(item) for item in arg)
        return FieldCause(
            where,
            "FieldValueNotSupported",
            f"{where}: Unsupported value: {_render(value)}: supported values: {supported}",
        )
    if kind == "maxLength":
        return FieldCause(where, "FieldValueTooLong", f"{where}: Too long: may not be more than {arg} bytes")
    if kind == "maxItems":
        return FieldCause(where, "FieldValueTooMany", f"{where}: Too many: {len(value)}: must have at most {arg} items")
    details = {
        "minimum": f"{where} in body should be greater than or equal to {arg}",
        "maximum": f"{where} in body should be less than or equal to {arg}",
        "pattern": f"{where} in body should match '{arg}'",
        "minLength": f"{where} in body should be at least {arg} chars long",
        "minItems": f"{where} in body should have at least {arg} items",
        "anyOf": f"{where} in body must be of type integer or string",
    }
    detail = details.get(str(kind), error.message)
    return FieldCause(where, "FieldValueInvalid", f"{where}: Invalid value: {_render(value)}: {detail}")


def _list_type_causes(value: Any, schema: Mapping[str, Any], path: str) -> list[FieldCause]:
    causes: list[FieldCause] = []
    if isinstance(value, dict):
        props: Mapping[str, Any] = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        for key, item in value.items():
            child = props.get(key) or (additional if isinstance(additional, dict) else None)
            if child is not None and not (path == "" and key == "metadata"):
                causes += _list_type_causes(item, child, _child_path(path, key, key in props))
    elif isinstance(value, list):
        list_type = schema.get("x-kubernetes-list-type")
        keys = schema.get("x-kubernetes-list-map-keys") or []
        seen: set[str] = set()
        for index, item in enumerate(value):
            where = f"{path}[{index}]"
            if list_type == "set" or (list_type == "map" and isinstance(item, dict)):
                identity = item if list_type == "set" else {key: item.get(key) for key in keys}
                marker = json.dumps(identity, sort_keys=True)
                if marker in seen:
                    causes.append(
                        FieldCause(where, "FieldValueDuplicate", f"{where}: Duplicate value: {_render(identity)}")
                    )
                seen.add(marker)
            if isinstance(schema.get("items"), dict):
                causes += _list_type_causes(item, schema["items"], where)
    return causes


# --- strict decoding of ObjectMeta (and of built-in kinds, used by the server) --------------------


def model_unknown_fields(model: str, value: Any, path: str = "") -> list[str]:
    """Paths in `value` that the official client's model `model` (e.g. "V1Pod") does not declare."""
    cls = getattr(k8s_models, model, None)
    if cls is None or not isinstance(value, dict):
        return []
    declared = {cls.attribute_map[attr]: type_name for attr, type_name in cls.openapi_types.items()}
    unknown: list[str] = []
    for key, item in value.items():
        where = _join(path, key)
        if key not in declared:
            unknown.append(where)
        elif item is not None:
            unknown += _typed_unknown_fields(declared[key], item, where)
    return unknown


def _typed_unknown_fields(type_name: str, value: Any, path: str) -> list[str]:
    if type_name.startswith("List[") and isinstance(value, list):
        inner = type_name[5:-1]
        return [found for i, item in enumerate(value) for found in _typed_unknown_fields(inner, item, f"{path}[{i}]")]
    if type_name.startswith("Dict[str, ") and isinstance(value, dict):
        inner = type_name[10:-1]
        return [found for k, item in value.items() for found in _typed_unknown_fields(inner, item, f"{path}[{k}]")]
    if hasattr(k8s_models, type_name):
        return model_unknown_fields(type_name, value, path)
    return []
