"""Where Trainyard keeps its local state: `./var/` of a checkout by default, `~/.local/state/trainyard` for an
installed platform (no checkout around it), `TRAINYARD_VAR_DIR` to put it anywhere."""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
CHECKOUT = (BASE_DIR / "manage.py").exists()
VAR_DIR = Path(
    os.environ.get("TRAINYARD_VAR_DIR")
    or (BASE_DIR / "var" if CHECKOUT else Path.home() / ".local" / "state" / "trainyard")
).resolve()
