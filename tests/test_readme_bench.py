"""README.md's benchmark tables are exactly what bench/table.py makes of the newest committed result per world size."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_readme_tables_match_newest_results() -> None:
    spec = importlib.util.spec_from_file_location("bench_table", REPO / "bench" / "table.py")
    assert spec and spec.loader
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    want = table.readme_block()
    names = ", ".join(p.name for p in table.newest_per_world())
    readme = (REPO / "README.md").read_text()
    begin, end = "<!-- bench:begin -->\n", "<!-- bench:end -->"
    assert begin in readme and end in readme, "README.md lacks the bench:begin/bench:end markers"
    got = readme.split(begin, 1)[1].split(end, 1)[0]
    assert got == want, f"README.md's benchmark tables are stale: paste the output of `python3 bench/table.py` ({names})"
