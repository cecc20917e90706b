"""What a page read in Chinese must not show: the English of the catalogue (UI strings and the sentences the
platform stores), or any run of English words outside code. Shared by the page walk through Django's test client
and the walk in a real browser."""

import ast
import html
import re

from kernel.paths import BASE_DIR

PO = BASE_DIR / "trainyard" / "locale" / "zh_Hans" / "LC_MESSAGES" / "django.po"
PLACEHOLDER = re.compile(r"%\(\w+\)[sd]|\{\{ ?\w+ ?\}\}|%%|\{% plural %\}")
# Words that stay as they are in Chinese text: names of things, units, protocols.
KEPT = re.compile(r"\b(GPU|GPUs|GiB|MiB|NVIDIA|CUDA|NVML|Xid|TensorBoard|Webhook|CSV|API|CLI|UTC|ID|FIFO)\b")


def _msgids() -> list[str]:
    """Every English text of the catalogue (UI strings and stored sentences alike)."""
    ids = []
    for block in PO.read_text(encoding="utf-8").split("\n\n"):
        match = re.search(r'^msgid ("(?:[^"\\]|\\.)*"(?:\n"(?:[^"\\]|\\.)*")*)', block, re.M)
        if match:
            text = "".join(ast.literal_eval(part) for part in match.group(1).split("\n"))
            if text:
                ids.append(text)
    return ids


def known_english() -> set[str]:
    """Pieces of the catalogue's English of at least three words: none may show on a page read in Chinese."""
    pieces = set()
    for text in _msgids():
        for piece in PLACEHOLDER.split(text):
            piece = piece.strip(" .,;:()—-'\"")
            if len(re.findall(r"[A-Za-z]{2,}", KEPT.sub("", piece))) >= 3:
                pieces.add(piece)
    return pieces


def visible_text(body: str) -> str:
    """What a reader sees (and a screen reader says): text outside code, plus labels in attributes."""
    labels = "\n".join(re.findall(r'(?:aria-label|title|placeholder|data-confirm)="([^"]*)"', body))
    body = re.sub(r"(?is)<(script|style|code|pre|kbd|samp|textarea|select|option)\b.*?</\1>", " ", body)
    body = re.sub(r"(?s)<[^>]+>", "\n", body)  # a run of words never spans two elements (table cells)
    return re.sub(r"[ \t]+", " ", html.unescape(body + "\n" + labels))


def english_runs(text: str) -> list[str]:
    """Runs of four or more English words (identifiers such as job names and queue names are single words)."""
    return re.findall(r"[A-Za-z][A-Za-z'’]*(?:[ ,;:]+[A-Za-z][A-Za-z'’]*){3,}", KEPT.sub("·", text))
