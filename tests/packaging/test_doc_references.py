"""What README.md and docs/ point at exists: the repository paths they name in code spans, the
files and headings their links reach, the cargo test targets and packages and the make targets
of the commands they give. docs/ say what is true today; a moved file or a renamed test target
must not leave a command there that fails (`cargo test -p ironlink-host` named a package that
never existed until 2026-12-01). docs/record.md is history and is left out."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "record.md")]
# Where a code span names a file of the repository; other spans are code, options or names.
TOP_DIRS = ("python/", "bench/", "tests/", "device/", "host/", "docs/", "examples/", "tutorial/", ".ci/")
PLACEHOLDER = re.compile(r"[*<>{}$|]")  # `bench/results/<part>-w<N>.log`: a pattern, not a path


def _code_spans(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def _named_paths(text: str) -> set[str]:
    """The repository paths in the code spans of `text`, without a test's `::name` or a line."""
    out = set()
    for span in _code_spans(text):
        for word in span.split():
            word = word.strip("(),;:.'\"")
            word = re.sub(r"'s$", "", word)
            if word.startswith(TOP_DIRS) and not PLACEHOLDER.search(word):
                out.add(re.sub(r":\d+$", "", word.split("::")[0]))
    return out


def _exists(path: str) -> bool:
    """A file or folder, or `module.attribute` of a Python file (`tests/_archs.sampled`)."""
    if (ROOT / path).exists():
        return True
    module, _, attr = path.rpartition(".")
    return bool(attr) and (ROOT / f"{module}.py").is_file()


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(md: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", md.read_text(), flags=re.S)
    return {_slug(h) for h in re.findall(r"^#+ (.*)$", text, flags=re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_named_paths_exist(doc: Path) -> None:
    missing = sorted(p for p in _named_paths(doc.read_text()) if not _exists(p))
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_links_reach_a_file_and_heading(doc: Path) -> None:
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            bad.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target} (no such heading)")
    assert not bad, f"{doc.relative_to(ROOT)}: {bad}"


def test_cargo_and_make_commands_name_what_exists() -> None:
    cargo = shutil.which("cargo")
    if cargo is None:
        pytest.skip("no cargo")
    meta = json.loads(subprocess.run([cargo, "metadata", "--no-deps", "--format-version", "1", "--offline"],
                                     cwd=ROOT, capture_output=True, text=True, check=True).stdout)
    packages = {p["name"] for p in meta["packages"]}
    tests = {t["name"] for p in meta["packages"] for t in p["targets"] if "test" in t["kind"]}
    make_targets = set(re.findall(r"^([\w.-]+):", (ROOT / "Makefile").read_text(), flags=re.M))
    bad = []
    for doc in DOCS:
        for span in _code_spans(doc.read_text()):
            if span.startswith("cargo "):
                bad += [f"{doc.name}: --test {t}" for t in re.findall(r"--test ([\w-]+)", span) if t not in tests]
                bad += [f"{doc.name}: -p {p}" for p in re.findall(r"-p ([\w-]+)", span) if p not in packages]
            make = re.match(r"make ([\w.-]+)(\s|$)", span)
            if make and "=" not in make.group(1) and make.group(1) not in make_targets:
                bad.append(f"{doc.name}: make {make.group(1)}")
    assert not bad, f"commands in the docs name what does not exist: {bad}"


def test_the_checks_can_fail() -> None:
    # the parsers find what the docs hold: a stale name would be seen, not skipped
    assert _named_paths("see `tests/cpu/nothing_here.py::test_x` and `python/ironlink/x.py:12`") == {
        "tests/cpu/nothing_here.py", "python/ironlink/x.py"}
    assert not _exists("tests/cpu/nothing_here.py")
    assert _exists("tests/_archs.sampled") and not _exists("tests/_archs_none.sampled")
    assert _slug("Sanitizers: what was found") == "sanitizers-what-was-found"
    assert "sanitizers-what-was-found" in _anchors(ROOT / "docs" / "reliability.md")
