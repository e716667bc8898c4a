"""The built bitcode files export exactly the ABI table, and nothing Triton's linker would trip over.

`make test` builds build/ironlink_sm{80,90,100}.bc first, so a missing file is a failure here.
The table (`_abi.FUNCTIONS`) is generated from the Rust sources, so these tests catch a bitcode
that is stale or was built from other sources than the committed table, a renamed or dropped
symbol, and a Python signature edited by hand.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import NamedTuple

import pytest
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ironlink.language import _abi, _lib

REPO = Path(__file__).resolve().parents[2]
ARCHS = ("sm_80", "sm_90", "sm_100")


@functools.lru_cache(maxsize=None)
def ir(arch: str) -> str:
    path = REPO / "build" / _lib.bitcode_filename(_lib.parse_arch(arch))
    assert path.is_file(), f"{path} is missing: run `make all-archs` (make test does)"
    return _lib.disassemble(path)


@pytest.mark.parametrize("arch", ARCHS)
def test_exports_equal_the_abi_table(arch: str) -> None:
    path = REPO / "build" / _lib.bitcode_filename(_lib.parse_arch(arch))
    exported = _lib.bitcode_signatures(path)
    missing = sorted(set(_abi.FUNCTIONS) - set(exported))
    extra = sorted(set(exported) - set(_abi.FUNCTIONS))
    assert not missing and not extra, (
        f"{path.name}: in the table but not exported: {missing}; exported but not in the table: {extra} "
        "(rebuild with `make all-archs` and regenerate _abi.py with `make abi`)"
    )
    for name, (args, ret, _) in _abi.FUNCTIONS.items():
        want = (tuple(t for _, t in args), ret)
        assert exported[name] == want, f"{path.name}: {name} is {exported[name]} in the bitcode, {want} in _abi.py"


@pytest.mark.parametrize("arch", ARCHS)
def test_declares_only_llvm_intrinsics(arch: str) -> None:
    # Anything else would be an unresolved symbol in the kernel ("Unresolved extern function" from
    # ptxas), e.g. a memcpy or a panic routine that core expected a runtime to provide.
    declared = re.findall(r'^declare\b[^@]*@("[^"]+"|[\w.$-]+)\(', ir(arch), re.MULTILINE)
    foreign = sorted(n for n in declared if not n.strip('"').startswith("llvm."))
    assert not foreign, f"{arch}: declarations that are not LLVM intrinsics: {foreign}"


def _attribute_groups(text: str) -> dict[str, str]:
    return dict(re.findall(r"^attributes (#\d+) = \{(.*)\}$", text, re.MULTILINE))


@pytest.mark.parametrize("arch", ARCHS)
def test_every_function_targets_the_files_arch(arch: str) -> None:
    # Catches a file built for another arch (or copied under the wrong name). Functions from
    # `core` (built by -Z build-std) count too: they are linked into kernels like ours.
    text = ir(arch)
    groups = _attribute_groups(text)
    wrong = {}
    for m in re.finditer(r'^define\b.*?@("[^"]+"|[\w.$-]+)\(.*\)([^()]*)\{\s*$', text, re.MULTILINE):
        name, group = m.group(1), re.search(r"#\d+", m.group(2))
        cpu = re.search(r'"target-cpu"="([^"]*)"', groups.get(group.group(0), "") if group else "")
        if cpu is None or cpu.group(1) != arch:
            wrong[name] = cpu.group(1) if cpu else None
    assert not wrong, f'{arch}: functions whose "target-cpu" is not "{arch}": {wrong}'


@pytest.mark.parametrize("arch", ARCHS)
def test_no_externally_visible_globals(arch: str) -> None:
    # Triton internalizes linked functions, not globals; an exported or external global would
    # collide between two libraries or need a definition from elsewhere.
    bad = []
    for m in re.finditer(r"^@(\S+) = ([^\"]*?)\b(global|constant)\b", ir(arch), re.MULTILINE):
        words = set(m.group(2).split())
        if not words & {"private", "internal"}:
            bad.append(f"@{m.group(1)} ({m.group(2).strip() or 'external'} {m.group(3)})")
    assert not bad, f"{arch}: externally visible globals: {bad}"


# Attributes that LLVM writes into bitcode but the LLVMs inside Triton 3.5 and 3.6 (22.0.0git at
# 7d5de303 and f6ded0be; 3.5 is the oldest supported) do not know; their bitcode reader then rejects
# the whole file ("Failed to parse library at ...").
# `nocreateundeforpoison` appeared in LLVM 22.1 on intrinsics such as llvm.umax, llvm.usub.sat,
# llvm.umul.with.overflow and llvm.minnum; Rust code that lowers to those intrinsics brings it in.
TOO_NEW_FOR_TRITON = ("nocreateundeforpoison",)


@pytest.mark.parametrize("arch", ARCHS)
def test_no_attributes_tritons_llvm_cannot_read(arch: str) -> None:
    groups = _attribute_groups(ir(arch))
    found = {a: sorted(g for g, body in groups.items() if re.search(rf"\b{a}\b", body)) for a in TOO_NEW_FOR_TRITON}
    found = {a: g for a, g in found.items() if g}
    assert not found, (
        f"{arch}: attributes Triton 3.5/3.6's LLVM cannot read (it refuses the file): {found}; avoid the "
        "intrinsics that carry them (see the functions calling declarations with these attribute groups)"
    )


# --- module flags ----------------------------------------------------------------------------------


class Flag(NamedTuple):
    behavior: int
    value: str


# llvm::Module::ModFlagBehavior
ERROR, WARNING, REQUIRE, OVERRIDE, APPEND, APPEND_UNIQUE, MAX, MIN = range(1, 9)


def module_flags(text: str) -> dict[str, Flag]:
    """{key: (merge behaviour, value as written)} of `!llvm.module.flags` in textual IR."""
    m = re.search(r"^!llvm\.module\.flags = !\{(.*)\}$", text, re.MULTILINE)
    if not m:
        return {}
    nodes = dict(re.findall(r"^(!\d+) = (?:distinct )?!\{(.*)\}$", text, re.MULTILINE))
    flags = {}
    for ref in (r.strip() for r in m.group(1).split(",")):
        fm = re.fullmatch(r'i32 (\d+), !"([^"]+)", (.*)', nodes[ref])
        assert fm, f"unparsed module flag {ref} = {nodes[ref]}"
        flags[fm.group(2)] = Flag(int(fm.group(1)), fm.group(3))
    return flags


def link_conflicts(dst: dict[str, Flag], src: dict[str, Flag]) -> list[str]:
    """The errors LLVM's IRMover (linkModuleFlagsMetadata) reports when `src` is linked into `dst`.

    Triton links our bitcode (src) into its kernel module (dst) with llvm::Linker, which merges
    module flags by these rules: a key present on one side only is copied (except that `Require`
    flags must be met by the result); for a key on both sides the behaviours must agree unless one
    is `Override` (which wins; two Overrides must agree) or it is Min/Max paired with Warning; with
    equal behaviours, `Error` needs equal values, Warning/Min/Max/Append merge without failing.
    """
    errors = []
    for key, s in src.items():
        d = dst.get(key)
        if s.behavior == REQUIRE or d is None:
            continue
        if s.behavior == OVERRIDE and d.behavior == OVERRIDE:
            if s.value != d.value:
                errors.append(f"{key}: two Override flags with different values ({d.value} vs {s.value})")
            continue
        if OVERRIDE in (s.behavior, d.behavior):
            continue
        if s.behavior != d.behavior and {s.behavior, d.behavior} not in ({MIN, WARNING}, {MAX, WARNING}):
            errors.append(f"{key}: conflicting behaviours (Triton {d.behavior}, ours {s.behavior})")
        elif s.behavior == ERROR and s.value != d.value:
            errors.append(f"{key}: Error flag with different values (Triton {d.value}, ours {s.value})")
    merged = {**src, **dst}
    for key, s in src.items():
        if s.behavior == REQUIRE:
            rm = re.fullmatch(r'!\{!"([^"]+)", (.*)\}', s.value)
            if not rm or merged.get(rm.group(1), Flag(0, "")).value != rm.group(2):
                errors.append(f"{key}: requires {s.value}, which the linked module does not have")
    return errors


@triton.jit
def _trivial_kernel(out_ptr):
    tl.store(out_ptr, 1)


def test_link_conflicts_follows_llvm_rules() -> None:
    assert link_conflicts({"a": Flag(ERROR, "i32 1")}, {"a": Flag(ERROR, "i32 2")})
    assert not link_conflicts({"a": Flag(ERROR, "i32 1")}, {"a": Flag(ERROR, "i32 1")})
    assert link_conflicts({"a": Flag(ERROR, "i32 1")}, {"a": Flag(MIN, "i32 1")})
    assert not link_conflicts({"a": Flag(WARNING, "i32 1")}, {"a": Flag(MIN, "i32 2")})
    assert not link_conflicts({"a": Flag(ERROR, "i32 1")}, {"a": Flag(OVERRIDE, "i32 2")})
    assert link_conflicts({}, {"r": Flag(REQUIRE, '!{!"a", i32 1}')})
    assert not link_conflicts({"a": Flag(ERROR, "i32 1")}, {"r": Flag(REQUIRE, '!{!"a", i32 1}')})
    assert not link_conflicts({}, {"PIC Level": Flag(MIN, "i32 2")})


@functools.lru_cache(maxsize=None)
def tritons_module_flags(cc: int) -> dict[str, Flag]:
    """Triton's own flags, from a kernel that links nothing: the module our library is linked into."""
    kernel = triton.compile(
        ASTSource(_trivial_kernel, {"out_ptr": "*i32"}, {}), target=GPUTarget("cuda", cc, 32), options={}
    )
    return module_flags(kernel.asm["llir"])


@pytest.mark.parametrize("arch", ARCHS)
def test_module_flags_link_into_a_triton_kernel(arch: str) -> None:
    cc = _lib.parse_arch(arch)
    tritons = tritons_module_flags(cc[0] * 10 + cc[1])
    ours = module_flags(ir(arch))
    assert not link_conflicts(tritons, ours), link_conflicts(tritons, ours)
