"""The triggers docs/scheduler.md describes are the triggers the database has: a trigger added, dropped or moved to
another table without the table in the docs changing fails here."""

import re

import pytest
from django.db import connection

from kernel.paths import BASE_DIR

pytestmark = pytest.mark.django_db


def _documented() -> set[tuple[str, str]]:
    text = (BASE_DIR / "docs" / "scheduler.md").read_text()
    section = text.split("## Database objects the scheduler relies on", 1)[1].split("\n## ", 1)[0]
    pairs = set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`trainyard_"):
            name = cells[0].strip("`")
            for table in re.findall(r"`(\w+)`", cells[1]):
                pairs.add((name, table))
    return pairs


def _in_database() -> set[tuple[str, str]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT t.tgname, c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "WHERE NOT t.tgisinternal AND t.tgname LIKE 'trainyard\\_%'"
        )
        return set(cursor.fetchall())


def test_the_documented_triggers_are_the_databases():
    documented = _documented()
    assert len(documented) >= 19, "the table in docs/scheduler.md was not found or not read"
    real = _in_database()
    assert real - documented == set(), "triggers in the database that docs/scheduler.md does not describe"
    assert documented - real == set(), "triggers docs/scheduler.md describes that the database does not have"


def test_the_version_tables_exist():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_name LIKE 'trainyard\\_%\\_version'"
        )
        assert {r[0] for r in cursor.fetchall()} == {
            "trainyard_pool_version",
            "trainyard_backlog_version",
            "trainyard_reference_version",
        }
