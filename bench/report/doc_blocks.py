"""Generated blocks inside the docs: the text between a begin and an end marker comment, which
the bench/report/*_table.py scripts rewrite (`make docs`) and tests/packaging/test_readme_bench.py checks."""

from __future__ import annotations


def replace_between(text: str, begin: str, end: str, body: str, where: str) -> str:
    """`text` with what lies between `begin` and `end` replaced by `body` (markers kept);
    SystemExit naming `where` if a marker is missing."""
    if begin not in text or end not in text:
        raise SystemExit(f"{where} lacks the {begin.strip()} / {end.strip()} markers")
    before, rest = text.split(begin, 1)
    return before + begin + body + end + rest.split(end, 1)[1]
