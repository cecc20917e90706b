"""Job files for `trainyard submit`: a YAML mapping with the fields of the submission API, read with the line
of every field remembered so the server's field errors can point at `job.yaml:LINE`."""

from __future__ import annotations

import datetime as dt
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .errors import EXIT_USAGE, CliError

EXAMPLE_FIELDS = "team, queue, spec, image and command"


@dataclass(frozen=True)
class JobFile:
    name: str
    data: dict[str, Any]
    lines: dict[str, int]

    def line_of(self, path: str) -> int | None:
        """The line of the deepest field of a dotted path (`env.EPOCHS`) that the file names."""
        parts = path.split(".") if path else []
        while parts:
            line = self.lines.get(".".join(parts))
            if line is not None:
                return line
            parts.pop()
        return None


def _read_text(source: str) -> str:
    if source == "-":
        return sys.stdin.read()
    path = Path(source)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CliError(f"job file {source} does not exist", EXIT_USAGE)
    except IsADirectoryError:
        raise CliError(f"{source} is a directory, not a job file", EXIT_USAGE)
    except UnicodeDecodeError:
        raise CliError(f"job file {source} is not UTF-8 text", EXIT_USAGE)
    except OSError as exc:
        raise CliError(f"cannot read job file {source}: {exc.strerror or exc}", EXIT_USAGE)


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "mapping"
    if isinstance(node, yaml.SequenceNode):
        return "list"
    return "single value"


def _index_lines(node: yaml.MappingNode, name: str, prefix: str, lines: dict[str, int]) -> None:
    """Record the line of each key (1-based) and refuse duplicate keys, which YAML loaders silently merge."""
    for key_node, value_node in node.value:
        line = key_node.start_mark.line + 1
        if not isinstance(key_node, yaml.ScalarNode):
            raise CliError(f"{name}:{line}: a field name must be plain text", EXIT_USAGE)
        path = f"{prefix}.{key_node.value}" if prefix else key_node.value
        if path in lines:
            raise CliError(f"{name}:{line}: {path} is given twice (first on line {lines[path]})", EXIT_USAGE)
        lines[path] = line
        if isinstance(value_node, yaml.MappingNode):
            _index_lines(value_node, name, path, lines)


def _jsonable(value: Any) -> Any:
    # YAML reads `2024-05-01` as a date; the API wants text.
    if isinstance(value, dt.date | dt.datetime):
        return value.isoformat()
    return str(value)


def load_jobfile(source: str) -> JobFile:
    name = "<stdin>" if source == "-" else source
    text = _read_text(source)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text) if root is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark is not None else name
        problem = exc.problem or exc.context or "not valid YAML"
        raise CliError(f"{where}: invalid YAML: {problem}", EXIT_USAGE)
    except yaml.YAMLError as exc:
        raise CliError(f"{name}: invalid YAML: {exc}", EXIT_USAGE)
    if root is None:
        raise CliError(f"{name} is empty: give the job's fields ({EXAMPLE_FIELDS}) as a YAML mapping", EXIT_USAGE)
    if not isinstance(root, yaml.MappingNode):
        raise CliError(
            f"{name}:{root.start_mark.line + 1}: expected a mapping of job fields ({EXAMPLE_FIELDS}) "
            f"at the top level, found a {_kind(root)}",
            EXIT_USAGE,
        )
    lines: dict[str, int] = {}
    _index_lines(root, name, "", lines)
    plain = json.loads(json.dumps(data, default=_jsonable))
    return JobFile(name=name, data=plain, lines=lines)
