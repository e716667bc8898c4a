"""Loading a program of `bench/` by its path (a helper, no tests of its own): `bench/` is not a
package, and the CPU tests of its pure parts import it as the module it names itself."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def load_bench(name: str) -> Any:
    """bench/<name>.py as module `name` (registered in sys.modules, as its own imports expect),
    with bench/ on sys.path for what it imports from there (models/, ironlink_bench)."""
    if str(REPO / "bench") not in sys.path:
        sys.path.append(str(REPO / "bench"))
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
