"""`ironlink.bitcode_path`: arch spellings, search order, error messages; the IR signature parser."""

from __future__ import annotations

from pathlib import Path

import pytest

import ironlink
from ironlink.language import _lib


@pytest.mark.parametrize(
    "arch, cc",
    [
        ("sm_90", (9, 0)),
        ("sm90", (9, 0)),
        ("sm_90a", (9, 0)),
        ("SM_80", (8, 0)),
        (" sm_86 ", (8, 6)),
        ("sm_100", (10, 0)),
        ("sm_100a", (10, 0)),
        ("90", (9, 0)),
        (90, (9, 0)),
        (100, (10, 0)),
        (89, (8, 9)),
        ((9, 0), (9, 0)),
        ((10, 3), (10, 3)),
    ],
)
def test_parse_arch(arch: _lib.ArchLike, cc: tuple[int, int]) -> None:
    assert _lib.parse_arch(arch) == cc


@pytest.mark.parametrize("arch", ["gfx942", "sm_", "compute_90", 9, -90, (9,), (9, "0")])
def test_parse_arch_rejects_nonsense(arch: object) -> None:
    with pytest.raises(ValueError):
        _lib.parse_arch(arch)  # type: ignore[arg-type]


@pytest.mark.parametrize("arch", [9.0, True, None])
def test_parse_arch_rejects_wrong_types(arch: object) -> None:
    with pytest.raises(TypeError):
        _lib.parse_arch(arch)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "cc, candidates",
    [
        ((9, 0), ["ironlink_sm90.bc"]),  # Hopper: only its own bitcode
        ((8, 0), ["ironlink_sm80.bc"]),
        ((8, 6), ["ironlink_sm86.bc", "ironlink_sm80.bc"]),  # Ampere/Ada run sm_80 code
        ((8, 9), ["ironlink_sm89.bc", "ironlink_sm80.bc"]),
        ((10, 0), ["ironlink_sm100.bc"]),
        ((10, 3), ["ironlink_sm103.bc", "ironlink_sm100.bc"]),  # Blackwell family: exact first
        ((12, 0), ["ironlink_sm120.bc"]),
    ],
)
def test_candidate_archs(cc: tuple[int, int], candidates: list[str]) -> None:
    assert [_lib.bitcode_filename(c) for c in _lib.candidate_archs(cc)] == candidates


@pytest.fixture
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """Three empty search directories standing in for $IRONLINK_BITCODE_DIR, ironlink/lib, build/."""
    d = {k: tmp_path / k for k in ("env", "package", "build")}
    for p in d.values():
        p.mkdir()
    monkeypatch.setenv(_lib.ENV_BITCODE_DIR, str(d["env"]))
    monkeypatch.setattr(_lib, "PACKAGE_LIB_DIR", d["package"])
    monkeypatch.setattr(_lib, "REPO_BUILD_DIR", d["build"])
    return d


def _touch(d: Path, name: str) -> str:
    (d / name).write_bytes(b"BC")
    return str(d / name)


def test_search_order_env_then_package_then_build(dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    in_build = _touch(dirs["build"], "ironlink_sm90.bc")
    assert ironlink.bitcode_path("sm_90") == in_build
    in_package = _touch(dirs["package"], "ironlink_sm90.bc")
    assert ironlink.bitcode_path("sm_90") == in_package
    in_env = _touch(dirs["env"], "ironlink_sm90.bc")
    assert ironlink.bitcode_path(90) == in_env
    monkeypatch.delenv(_lib.ENV_BITCODE_DIR)
    assert ironlink.bitcode_path((9, 0)) == in_package


def test_exact_arch_first_within_a_directory(dirs: dict[str, Path]) -> None:
    base = _touch(dirs["package"], "ironlink_sm80.bc")
    assert ironlink.bitcode_path("sm_86") == base
    exact = _touch(dirs["package"], "ironlink_sm86.bc")
    assert ironlink.bitcode_path("sm_86") == exact
    assert ironlink.bitcode_path("sm_80") == base


def test_earlier_directory_wins_over_closer_arch(dirs: dict[str, Path]) -> None:
    # One installation is never mixed with another: sm_80 from the package beats sm_86 in build/.
    base = _touch(dirs["package"], "ironlink_sm80.bc")
    _touch(dirs["build"], "ironlink_sm86.bc")
    assert ironlink.bitcode_path("sm_86") == base


def test_hopper_does_not_fall_back_to_ampere(dirs: dict[str, Path]) -> None:
    _touch(dirs["package"], "ironlink_sm80.bc")
    with pytest.raises(ironlink.BitcodeNotFoundError):
        ironlink.bitcode_path("sm_90")


def test_missing_bitcode_error_names_paths_and_command(dirs: dict[str, Path]) -> None:
    with pytest.raises(FileNotFoundError) as e:
        ironlink.bitcode_path("sm_103")
    msg = str(e.value)
    assert isinstance(e.value, ironlink.BitcodeNotFoundError)
    for d in dirs.values():
        assert str(d / "ironlink_sm103.bc") in msg
        assert str(d / "ironlink_sm100.bc") in msg
    assert "make CUDA_ARCH=sm_103" in msg
    assert _lib.ENV_BITCODE_DIR in msg


def test_no_arch_uses_the_current_gpu(dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_lib, "current_capability", lambda: (8, 9))
    expected = _touch(dirs["build"], "ironlink_sm80.bc")
    assert ironlink.bitcode_path() == expected


def test_no_arch_without_a_gpu_says_what_to_do() -> None:
    try:
        _lib.current_capability()
    except RuntimeError as e:
        assert "pass an arch" in str(e) or "NVIDIA" in str(e)
    else:
        pytest.skip("a GPU is present")


def test_repository_build_is_the_development_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_lib.ENV_BITCODE_DIR, raising=False)
    assert _lib.REPO_BUILD_DIR == Path(__file__).resolve().parents[2] / "build"
    if not (_lib.PACKAGE_LIB_DIR / "ironlink_sm90.bc").exists():
        assert ironlink.bitcode_path("sm_90") == str(_lib.REPO_BUILD_DIR / "ironlink_sm90.bc")


# --- the IR parser behind bitcode_signatures ---------------------------------------------------------

IR = """
@msg = private unnamed_addr constant [3 x i8] c"hi\\00", align 1
define noundef range(i32 -9, 1) i32 @status(i64 noundef %ctx, i32 noundef range(i32 0, 8) %peer) unnamed_addr #0 {
define i64 @addr(ptr addrspace(1) noalias align 8 captures(address, read_provenance) %p, i64 %n) #1 {
define internal fastcc void @helper() unnamed_addr #2 {
define private void @hidden(i32 %x) {
define hidden void @"quoted.name"(<2 x i32> %v, { i32, i64 } %s) #3 {
define ptr addrspace(1) @retptr() {
declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()
"""


def test_parse_defines_reads_types_and_linkage() -> None:
    defs = _lib.parse_defines(IR)
    assert defs["status"][:2] == (("i64", "i32"), "i32")
    assert defs["addr"][:2] == (("ptr addrspace(1)", "i64"), "i64")
    assert defs["quoted.name"][:2] == (("<2 x i32>", "{ i32, i64 }"), "void")
    assert defs["retptr"][:2] == ((), "ptr addrspace(1)")
    assert "internal" in defs["helper"][2] and "private" in defs["hidden"][2]
    assert "llvm.nvvm.read.ptx.sreg.tid.x" not in defs


def test_bitcode_signatures_keeps_only_external_definitions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_lib, "disassemble", lambda path: IR)
    assert set(_lib.bitcode_signatures("x.bc")) == {"status", "addr", "quoted.name", "retptr"}


def test_llvm_tool_error_names_the_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(_lib.ENV_LLVM_BIN, str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=_lib.ENV_LLVM_BIN):
        _lib.llvm_tool("llvm-dis")


def test_disassemble_reads_text_ir_as_is(tmp_path: Path) -> None:
    ll = tmp_path / "ironlink_sm90.bc"  # text IR under a .bc name: Triton links it all the same
    ll.write_text(IR)
    assert _lib.disassemble(ll) == IR
