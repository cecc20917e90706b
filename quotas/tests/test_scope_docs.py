"""docs/security.md's scope table is the code's: every operation a `read` token cannot do, with the scope the
permission really asks for (quotas.tokens.scope_table), and nothing else."""

import re

from kernel.paths import BASE_DIR
from quotas.tokens import scope_table


def _documented() -> list[tuple[str, str, str]]:
    text = (BASE_DIR / "docs" / "security.md").read_text()
    block = text.split("<!-- scope-table:begin -->", 1)[1].split("<!-- scope-table:end -->", 1)[0]
    return [(m.group(1), m.group(2), m.group(3)) for m in re.finditer(r"^\| `(\w+)` \| `(\w+) (\S+)` \|$", block, re.M)]


def test_the_documented_scope_table_is_the_codes():
    documented, code = _documented(), scope_table()
    assert documented, "docs/security.md has no scope table between its markers"
    assert set(documented) - set(code) == set(), "documented but not what the code asks"
    assert set(code) - set(documented) == set(), "asked by the code but not documented"


def test_submit_creates_templates_and_builds_project_images_and_nothing_staff_only():
    submit = {(m, p) for s, m, p in scope_table() if s == "submit"}
    assert ("POST", "/api/v1/templates/") in submit
    assert ("POST", "/api/v1/project-images/") in submit and ("POST", "/api/v1/project-images/{pk}/build/") in submit
    admin = {(m, p) for s, m, p in scope_table() if s == "admin"}
    assert ("POST", "/api/v1/images/{name}/build/") in admin  # base images are staff's
    assert ("GET", "/api/v1/tokens/") in admin and ("POST", "/api/v1/tokens/") in admin


def test_every_api_operation_checks_token_scopes():
    """The table is only true if every route applies the permission that reads it."""
    from drf_spectacular.generators import EndpointEnumerator

    from quotas.tokens import TokenScopePermission

    unchecked = []
    for path, _regex, method, callback in EndpointEnumerator().get_api_endpoints():
        if not path.startswith("/api/v1/"):
            continue  # the schema and its docs page: public, GET only
        view = callback.cls(**(getattr(callback, "initkwargs", None) or {}))
        view.action = (getattr(callback, "actions", None) or {}).get(method.lower())
        if not any(isinstance(p, TokenScopePermission) for p in view.get_permissions()):
            unchecked.append(f"{method} {path}")
    assert unchecked == []
