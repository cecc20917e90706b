"""Schema-driven fuzzing: every operation of the OpenAPI schema gets generated path values, query strings and
bodies (shaped by the schema, and plain junk), as staff and as a member. Zero 5xx, every error JSON with a code,
every 2xx body as the schema says.

Bounded: `TRAINYARD_FUZZ_EXAMPLES` examples per operation and caller (default 12; some tens of seconds in all).
"""

import os
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.api_matrix import call, check_against_schema, client_for, make_world, operations, schema, url_for

pytestmark = pytest.mark.django_db

EXAMPLES = int(os.environ.get("TRAINYARD_FUZZ_EXAMPLES", "12"))

WEIRD_TEXT = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", "..", "../../etc/passwd", "%00", "\x00", "a\nb", "A=B", "2025-02-30", "-1", "9" * 40]),
)
JUNK_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | WEIRD_TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(WEIRD_TEXT, children, max_size=4),
    max_leaves=12,
)


def _resolve(node: dict) -> dict:
    while "$ref" in node:
        node = schema()["components"]["schemas"][node["$ref"].rsplit("/", 1)[-1]]
    return node


def from_schema(node: dict, depth: int = 0) -> st.SearchStrategy:
    """Values shaped like an OpenAPI schema object: right types and names, arbitrary contents."""
    node = _resolve(node)
    if depth > 4:
        return JUNK_JSON
    for key in ("allOf", "oneOf", "anyOf"):
        if key in node:
            found = st.one_of([from_schema(n, depth + 1) for n in node[key]])
            return st.one_of(st.none(), found) if node.get("nullable") else found
    kind = node.get("type")
    if "enum" in node:
        found = st.sampled_from([v for v in node["enum"] if v is not None] or [""]) | WEIRD_TEXT
    elif kind == "object":
        props = {k: v for k, v in (node.get("properties") or {}).items() if not v.get("readOnly")}
        required = [k for k in node.get("required", []) if k in props]
        found = st.fixed_dictionaries(
            {k: from_schema(props[k], depth + 1) for k in required},
            optional={k: from_schema(v, depth + 1) for k, v in props.items() if k not in required},
        )
        if not props:
            found = st.dictionaries(WEIRD_TEXT, JUNK_JSON, max_size=3)
    elif kind == "array":
        found = st.lists(from_schema(node.get("items") or {}, depth + 1), max_size=3)
    elif kind == "integer":
        found = st.integers(min_value=-(2**70), max_value=2**70)
    elif kind == "number":
        found = st.floats(allow_nan=False, allow_infinity=False)
    elif kind == "boolean":
        found = st.booleans()
    elif kind == "string" and node.get("format") == "date-time":
        found = st.datetimes().map(lambda d: d.isoformat()) | WEIRD_TEXT
    elif kind == "string":
        found = WEIRD_TEXT
    else:
        found = JUNK_JSON
    return st.one_of(st.none(), found) if node.get("nullable") else found


def _query(op) -> st.SearchStrategy:
    names = [p["name"] for p in op.spec.get("parameters", []) if p["in"] == "query"]
    values = st.one_of(WEIRD_TEXT, st.integers().map(str), st.datetimes().map(lambda d: d.isoformat()))
    return st.fixed_dictionaries({}, optional={name: values for name in names})


def _body(op) -> st.SearchStrategy:
    content = (op.spec.get("requestBody") or {}).get("content", {}).get("application/json")
    return st.one_of(from_schema(content["schema"]), JUNK_JSON) if content else st.just(None)


OPS = operations()


@pytest.fixture
def world(settings, registry_url):
    settings.TRAINYARD_BACKEND = "local"
    settings.TRAINYARD_LOCAL_GPUS = "4x24GiB"
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_CLASSES": []}
    return make_world(registry_url)


def _fuzz(client, op, url):
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(query=_query(op), body=_body(op), junk_path=st.one_of(st.none(), WEIRD_TEXT))
    def fuzz(query, body, junk_path):
        target = url
        if junk_path is not None and "{" in op.path:  # the last path value replaced by junk
            head, _, _ = url.rstrip("/").rpartition("/")
            target = f"{head}/{quote(junk_path, safe='')}/"
        if query and op.unsafe:
            target += "?" + "&".join(f"{quote(k)}={quote(v, safe='')}" for k, v in query.items())
        response = call(client, op, target, body=body, query=query)
        status = response.status_code
        assert status < 500, (str(op), target, query, body, response.content[:300])
        if status >= 400:
            assert response["Content-Type"].startswith("application/json"), (str(op), target, status)
            assert response.json().get("code"), (str(op), target, response.content[:300])
            same_route = target == url or op.path.rstrip("/").rsplit("/", 1)[-1].startswith("{")
            if same_route:  # a junk last segment of a route without a parameter there is another route
                assert str(status) in op.spec.get("responses", {}), (str(op), target, status, "not declared")
        elif target == url:
            check_against_schema(op, response)

    fuzz()


@pytest.mark.parametrize("principal", ["staff", "member"])
def test_no_input_makes_the_api_fail(world, principal):
    """One world per caller (seeding is the slow part); every operation fuzzed in it, reads before writes."""
    client = client_for(principal)
    for op in OPS:
        _fuzz(client, op, url_for(op, world))
