"""Linking NVSHMEM without a GPU: the P2P bitcode stays free of it, the NVSHMEM bitcode exports both
tables, libnvshmem_device.bc is found in both wheel layouts and through the override, `extern_libs`
comes in the right order, and the module-init hook runs only for registered kernels."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any, Iterator

import pytest
import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import ironlink
import ironlink.language as il
from ironlink.language import _abi, _lib, _nvshmem

REPO = Path(__file__).resolve().parents[2]
ARCHS = ("sm_80", "sm_90", "sm_100")


def built(arch: str, nvshmem: bool) -> Path:
    path = REPO / "build" / _lib.bitcode_filename(_lib.parse_arch(arch), nvshmem)
    assert path.is_file(), f"{path} is missing: run `make all-archs` (make test does)"
    return path


@pytest.mark.parametrize("arch", ARCHS)
def test_p2p_bitcode_has_no_nvshmem(arch: str) -> None:
    text = _lib.disassemble(built(arch, nvshmem=False))
    hits = sorted({m.group(0) for m in re.finditer(r"\w*nvshmem\w*", text, re.IGNORECASE)})
    assert not hits, f"{arch}: the P2P bitcode mentions NVSHMEM: {hits[:10]}"


@pytest.mark.parametrize("arch", ARCHS)
def test_nvshmem_bitcode_exports_both_tables(arch: str) -> None:
    path = built(arch, nvshmem=True)
    exported = _lib.bitcode_signatures(path)
    table = {**_abi.FUNCTIONS, **_abi.NVSHMEM_FUNCTIONS}
    assert set(exported) == set(table), (sorted(set(table) - set(exported)), sorted(set(exported) - set(table)))
    for name, (args, ret, _) in table.items():
        assert exported[name] == (tuple(t for _, t in args), ret), name
    # Undefined symbols: LLVM intrinsics and NVSHMEM's functions only (libnvshmem_device.bc has them).
    declared = re.findall(r'^declare\b[^@]*@("[^"]+"|[\w.$-]+)\(', _lib.disassemble(path), re.MULTILINE)
    foreign = sorted(n for n in declared if not n.startswith(("llvm.", "nvshmem_", "nvshmemx_")))
    assert not foreign, foreign
    assert any(n.startswith("nvshmem") for n in declared)


# --- finding libnvshmem_device.bc ----------------------------------------------------------------


def fake_package(root: Path, files: list[str]) -> Path:
    lib = root / "nvidia" / "nvshmem" / "lib"
    lib.mkdir(parents=True)
    for f in files:
        (lib / f).write_bytes(b"BC\xc0\xde")
    return lib


@pytest.fixture
def no_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_nvshmem.ENV_NVSHMEM_BITCODE, raising=False)


def test_finds_the_single_file_of_3_4(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_override: None) -> None:
    lib = fake_package(tmp_path, ["libnvshmem_device.bc", "libnvshmem_host.so.3"])
    monkeypatch.setattr(_nvshmem, "package_lib_dir", lambda: lib)
    assert _nvshmem.device_bitcode_path("sm_90") == str(lib / "libnvshmem_device.bc")
    assert _nvshmem.host_library_path() == str(lib / "libnvshmem_host.so.3")


def test_per_arch_files_of_3_7_come_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_override: None) -> None:
    lib = fake_package(tmp_path, ["libnvshmem_device.bc", "libnvshmem_device_sm_90.bc", "libnvshmem_device_sm_80.bc"])
    monkeypatch.setattr(_nvshmem, "package_lib_dir", lambda: lib)
    assert _nvshmem.device_bitcode_path("sm_90") == str(lib / "libnvshmem_device_sm_90.bc")
    assert _nvshmem.device_bitcode_path("sm_86") == str(lib / "libnvshmem_device_sm_80.bc")  # the family's base


def test_package_dir_is_found_without_importing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = fake_package(tmp_path, ["libnvshmem_device.bc"])
    monkeypatch.syspath_prepend(str(tmp_path))
    for m in [m for m in sys.modules if m == "nvidia" or m.startswith("nvidia.")]:
        monkeypatch.delitem(sys.modules, m)
    assert _nvshmem.package_lib_dir() == lib


def test_override_file_or_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = fake_package(tmp_path, ["libnvshmem_device_sm_90.bc"])
    monkeypatch.setattr(_nvshmem, "package_lib_dir", lambda: None)
    monkeypatch.setenv(_nvshmem.ENV_NVSHMEM_BITCODE, str(lib))
    assert _nvshmem.device_bitcode_path("sm_90") == str(lib / "libnvshmem_device_sm_90.bc")
    other = tmp_path / "custom.bc"
    other.write_bytes(b"BC\xc0\xde")
    monkeypatch.setenv(_nvshmem.ENV_NVSHMEM_BITCODE, str(other))
    assert _nvshmem.device_bitcode_path("sm_100") == str(other)
    monkeypatch.setenv(_nvshmem.ENV_NVSHMEM_BITCODE, str(tmp_path / "missing.bc"))
    with pytest.raises(_nvshmem.NvshmemBitcodeNotFoundError, match="neither a file nor a directory"):
        _nvshmem.device_bitcode_path("sm_90")


def test_not_found_says_what_to_do(monkeypatch: pytest.MonkeyPatch, no_override: None) -> None:
    monkeypatch.setattr(_nvshmem, "package_lib_dir", lambda: None)
    with pytest.raises(_nvshmem.NvshmemBitcodeNotFoundError, match="pip install nvidia-nvshmem-cu13") as e:
        _nvshmem.device_bitcode_path("sm_90")
    assert _nvshmem.ENV_NVSHMEM_BITCODE in str(e.value)


# --- extern_libs --------------------------------------------------------------------------------


@triton.jit
def _k(x):
    pass


def test_extern_libs_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nv = tmp_path / "libnvshmem_device.bc"
    nv.write_bytes(b"BC\xc0\xde")
    monkeypatch.setenv(_nvshmem.ENV_NVSHMEM_BITCODE, str(nv))
    plain = ironlink.jit(_k, arch="sm_90")
    assert plain.extern_libs() == {"ironlink": str(built("sm_90", nvshmem=False))}
    k = ironlink.jit(_k, arch="sm_90", nvshmem=True)
    libs = k.extern_libs({"libnvshmem_device": "/user/nv.bc", "mine": "/user/mine.bc"})
    # The user's own libraries first, then ironlink's NVSHMEM bitcode, then NVSHMEM's (the user's wins).
    assert list(libs.items()) == [("mine", "/user/mine.bc"), ("ironlink", str(built("sm_90", nvshmem=True))),
                                  ("libnvshmem_device", "/user/nv.bc")]
    assert list(k.extern_libs()) == ["ironlink", "libnvshmem_device"]
    assert k.extern_libs()["libnvshmem_device"] == str(nv)
    assert k.kernel_name() == "_k"


@triton.jit
def _calls_nvshmem(out):
    triton.language.store(out, il.symm_nvshmem_n_pes(0))


def test_nvshmem_functions_without_nvshmem_linked_fail_early() -> None:
    with pytest.raises(Exception, match=r"nvshmem=True") as e:
        triton.compile(ASTSource(_calls_nvshmem, {"out": "*i32"}, {}), target=GPUTarget("cuda", 90, 32),
                       options={"extern_libs": (("ironlink", str(built("sm_90", nvshmem=True))),)})
    assert "symm_nvshmem" in str(e.value) or "symm_nvshmem" in repr(e.value.__cause__)


# --- the module-init hook -----------------------------------------------------------------------


@pytest.fixture
def hook_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, Any]]]:
    """A fresh hook registry and a fake `ironlink._native` recording its calls; the hook is
    taken off Triton's chain afterwards."""
    calls: list[tuple[int, Any]] = []
    answer: dict[str, Any] = {"result": True}

    def init(module: int, library: Any = None) -> bool:
        calls.append((module, library))
        if isinstance(answer["result"], BaseException):
            raise answer["result"]
        return bool(answer["result"])

    fake = types.SimpleNamespace(nvshmem_cumodule_init=init, answer=answer)
    monkeypatch.setitem(sys.modules, "ironlink._native", fake)
    monkeypatch.setattr(ironlink, "_native", fake, raising=False)
    for name, value in (("_kernel_names", set()), ("_hook_added", False), ("_initialized", set()), ("_failure", None)):
        monkeypatch.setattr(_nvshmem, name, value)
    yield calls
    knobs.runtime.kernel_load_end_hook.remove(_nvshmem._on_load)


def test_hook_initializes_only_registered_kernels(hook_state: list[tuple[int, Any]]) -> None:
    chain = knobs.runtime.kernel_load_end_hook
    assert _nvshmem._on_load not in chain.calls
    _nvshmem.register_kernel("uses_nvshmem")
    _nvshmem.register_kernel("also_nvshmem")
    assert chain.calls.count(_nvshmem._on_load) == 1  # added once, next to anyone else's hooks
    chain(0x1000, 0x2000, "plain_kernel", {}, "h0")
    assert hook_state == []  # an unrelated kernel: no native call at all
    chain(0x1000, 0x2000, "uses_nvshmem", {}, "h1")
    chain(0x3000, 0x4000, "also_nvshmem", {}, "h2")
    assert [m for m, _ in hook_state] == [0x1000, 0x3000]
    assert _nvshmem.initialized_modules() == {0x1000, 0x3000}
    _nvshmem.check_usable()


def test_a_failed_init_blocks_later_launches(hook_state: list[tuple[int, Any]]) -> None:
    _nvshmem.register_kernel("uses_nvshmem")
    sys.modules["ironlink._native"].answer["result"] = RuntimeError("NVSHMEM: not initialized")  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="not initialized"):
        knobs.runtime.kernel_load_end_hook(0x5000, 0x6000, "uses_nvshmem", {}, "h")
    with pytest.raises(RuntimeError, match="cannot run safely") as e:
        _nvshmem.check_usable()
    assert "not initialized" in str(e.value.__cause__)
    assert not _nvshmem.initialized_modules()
