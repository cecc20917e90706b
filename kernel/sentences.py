"""Sentences the platform makes in English and the portal says in the reader's language.

Wait reasons, timeline entries, exit descriptions and validation messages are made by services and workers that
know no reader: they are stored (on jobs and events) and returned by the API in English, as before. A producer
writes `stored("queue %(queue)s is closed", queue=name)`; the template is a msgid with the context "stored" in each
catalogue. On a page, `said(text)` finds the template a stored text was made from (each template, its placeholders
turned into a pattern) and says it in the active language, and its values too where they are stored sentences
themselves (an exit description inside a failure message). Text no template made (an admin's own words, a
backend's message) is shown as it is. Nothing translated is ever written to the database.
"""

from __future__ import annotations

import re
from functools import lru_cache

from django.utils.translation import get_language, gettext, pgettext, trans_real

CONTEXT = "stored"
# Values that may hold a stored sentence themselves (the rest are names and numbers, shown as they are: a queue
# named `running` stays `running`); of those, the ones that may hold a plain catalogue entry (a rule's suggestion).
SENTENCE_VALUES = frozenset(
    {"detail", "suggestion", "summary", "failure", "reaction", "what", "fault", "why", "need", "free", "left"}
    | {"most", "quota", "known", "window", "held", "level", "reason"}
)
PLAIN_VALUES = frozenset({"suggestion"})
PLACEHOLDER = re.compile(r"%\((\w+)\)([sd])")
# Values that are numbers, so that a short template (`%(n)s GPUs`) matches nothing else.
NUMBERS = frozenset({"n", "code", "signal"})
NUMBER = r"-?\d+(?:\.\d+)?"


def stored(template: str, /, **values: object) -> str:
    """The English sentence to store or return; `template` must be a msgid with context "stored"."""
    return template % values if values else template


def _pattern(template: str) -> re.Pattern[str]:
    parts, seen, at = [], set(), 0
    for match in PLACEHOLDER.finditer(template):
        parts.append(re.escape(template[at : match.start()].replace("%%", "%")))
        name, kind = match.groups()
        if name in seen:
            parts.append(f"(?P={name})")
        else:
            seen.add(name)
            parts.append(f"(?P<{name}>{NUMBER})" if kind == "d" or name in NUMBERS else f"(?P<{name}>.+?)")
        at = match.end()
    parts.append(re.escape(template[at:].replace("%%", "%")))
    return re.compile("".join(parts), re.S)


@lru_cache(maxsize=8)
def _templates(language: str) -> tuple[tuple[str, re.Pattern[str]], ...]:
    """The active catalogue's stored templates with placeholders, the most literal text first (the most specific)."""
    catalog = trans_real.translation(language)._catalog  # Django keeps "context\x04msgid" keys
    templates = []
    for key in catalog.keys():  # noqa: SIM118 (a TranslationCatalog, not a dict)
        if isinstance(key, str) and key.startswith(CONTEXT + "\x04"):
            template = key[len(CONTEXT) + 1 :]
            if PLACEHOLDER.search(template):
                templates.append(template)
    templates.sort(key=lambda t: (-len(PLACEHOLDER.sub("", t)), t))
    return tuple((t, _pattern(t)) for t in templates)


def _loose(template: str) -> bool:
    """A template with little text of its own (`%(detail)s. %(suggestion)s`) matches much that it did not make:
    it is used only where one of its values is a sentence the catalogue knows."""
    words = sum(ch.isalpha() for ch in PLACEHOLDER.sub("", template))
    return words < 5 and any(name not in NUMBERS for name, _kind in PLACEHOLDER.findall(template))


def said(text: str | None, *, plain: bool = True) -> str:
    """`text` in the reader's language where a stored template (or, with `plain`, any catalogue entry) made it."""
    if not text:
        return text or ""
    language = get_language()
    if not language or language.split("-")[0] == "en":
        return text  # stored texts are English already
    exact = pgettext(CONTEXT, text)
    if exact != text:
        return exact
    if plain:
        translated = gettext(text)
        if translated != text:
            return translated
    for template, pattern in _templates(language):
        match = pattern.fullmatch(text)
        if match:
            found = match.groupdict()
            values = {k: said(v, plain=k in PLAIN_VALUES) if k in SENTENCE_VALUES else v for k, v in found.items()}
            if _loose(template) and values == found:
                continue
            return pgettext(CONTEXT, template) % values
    return text
