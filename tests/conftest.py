"""What every test under tests/ shares."""

from __future__ import annotations

import os
from pathlib import Path

# The tests check the committed decode tables (python/ironlink/runtime/tuning/tables/), not a tuning file
# that `python -m ironlink.tune` wrote for this machine's user: the ops look for those in a folder
# that does not exist (a test that writes tuning files names its own folder).
os.environ["IRONLINK_TUNING_DIR"] = str(Path(__file__).resolve().parent / "no-tuning-files")
