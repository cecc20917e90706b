"""The Chinese catalogue: every portal string is translated, and the compiled .mo matches the .po."""

import ast
import gettext
import re

from kernel.paths import BASE_DIR

CATALOGUE = BASE_DIR / "trainyard" / "locale" / "zh_Hans" / "LC_MESSAGES"


def _entries() -> list[dict]:
    """msgid, msgid_plural, msgstr / msgstr[0] and flags of each entry (a small reader for our own file)."""
    entries = []
    for block in (CATALOGUE / "django.po").read_text(encoding="utf-8").split("\n\n"):
        entry: dict = {"flags": ""}
        key = None
        for line in block.splitlines():
            if line.startswith("#,"):
                entry["flags"] += line
                continue
            if line.startswith("#"):
                continue
            match = re.match(r"^(msgctxt|msgid_plural|msgid|msgstr\[0\]|msgstr\[\d+\]|msgstr) (\".*\")$", line)
            if match:
                key = match.group(1)
                entry[key] = ast.literal_eval(match.group(2))
            elif line.startswith('"') and key:
                entry[key] += ast.literal_eval(line)
        if entry.get("msgid"):
            entries.append(entry)
    return entries


def test_every_portal_string_has_a_chinese_translation():
    entries = _entries()
    assert len(entries) > 250
    for entry in entries:
        translated = entry.get("msgstr") or entry.get("msgstr[0]")
        assert translated, f"untranslated: {entry['msgid']!r}"
        assert "fuzzy" not in entry["flags"], f"fuzzy: {entry['msgid']!r}"
        placeholders = sorted(re.findall(r"%\(\w+\)[sd]|\{\w+\}", entry["msgid"]))
        assert sorted(re.findall(r"%\(\w+\)[sd]|\{\w+\}", translated)) == placeholders, entry["msgid"]


def test_compiled_catalogue_matches_the_source():
    with open(CATALOGUE / "django.mo", "rb") as f:
        compiled = gettext.GNUTranslations(f)
    for entry in _entries():
        if "msgctxt" in entry:
            assert compiled.pgettext(entry["msgctxt"], entry["msgid"]) == entry["msgstr"], entry["msgid"]
        elif "msgid_plural" in entry:
            assert compiled.ngettext(entry["msgid"], entry["msgid_plural"], 1) == entry["msgstr[0]"]
        else:
            assert compiled.gettext(entry["msgid"]) == entry["msgstr"], f"stale .mo for {entry['msgid']!r}"


def _stored_templates() -> dict[str, str]:
    """Every template the code passes to kernel.sentences.stored(), with the file that makes it."""
    found: dict[str, str] = {}
    for path in BASE_DIR.rglob("*.py"):
        parts = path.relative_to(BASE_DIR).parts
        if parts[0].startswith(".") or "tests" in parts or "migrations" in parts or parts[0] == "bench":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "stored" and node.args:
                first = node.args[0]
                options = [first.body, first.orelse] if isinstance(first, ast.IfExp) else [first]
                for option in options:
                    if isinstance(option, ast.Constant) and isinstance(option.value, str):
                        found.setdefault(option.value, str(path))
    return found


def test_every_stored_sentence_is_in_the_catalogue_with_its_context():
    from jobs import lifecycle

    stored = {e["msgid"] for e in _entries() if e.get("msgctxt") == "stored"}
    templates = _stored_templates()
    assert len(templates) > 60  # the reader finds the producers' calls
    for words in (lifecycle.FAILURE_WORDS, lifecycle.REACTION_WORDS, lifecycle.ALREADY):
        templates.update({w: "jobs/lifecycle.py" for w in words.values()})
    missing = {t: where for t, where in templates.items() if t not in stored}
    assert not missing, f"stored sentences without a msgctxt 'stored' entry: {missing}"
