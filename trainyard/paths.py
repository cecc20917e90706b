"""Where Trainyard keeps its local state (`./var/` by default, `TRAINYARD_VAR_DIR` to move it)."""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("TRAINYARD_VAR_DIR") or BASE_DIR / "var").resolve()
