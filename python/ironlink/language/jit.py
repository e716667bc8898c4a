"""`@ironlink.jit`: a Triton kernel that links ironlink's device bitcode at every launch.

The wrapper is a Triton `KernelInterface` (like `triton.autotune`'s Autotuner): `kernel[grid](...)`
and `kernel.warmup(...)` both end in `run`, which adds ``extern_libs={"ironlink": <bitcode for the
current GPU>}`` and forwards to the wrapped kernel's `run`. Nothing global is patched and no
post-compile hook runs: the device library keeps all its state behind the context pointer the
kernel receives, so linking the bitcode is all that is needed.

``@ironlink.jit(nvshmem=True)`` links ironlink's NVSHMEM bitcode (``ironlink_nvshmem_smXX.bc``: the
same functions plus the NVSHMEM wrappers) and, after it, NVSHMEM's ``libnvshmem_device.bc`` (Triton
links in order, each library resolving what the earlier ones need), and runs
``nvshmemx_cumodule_init`` on each module of the kernel when Triton loads it (`_nvshmem`). That is
the one case with a hook, and only kernels that ask for it get it.

On a context of several nodes (the launch's ``ctx`` argument, `topology.spans_several_nodes`) a
kernel links the NVSHMEM bitcode and NVSHMEM's library whatever `nvshmem` says, under the key
that makes ironlink's collectives take their hierarchical algorithms (`topology`): one kernel
source serves both kinds of heap.

Triton puts `extern_libs` into the compile options, so the in-memory kernel cache (keyed on the
launch options) and the on-disk cache (keyed on the bitcode file's hash) both tell two
architectures, a rebuilt bitcode file, or the two kinds of context apart.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Generic, Mapping, Optional, TypeVar, Union, overload

import triton
from triton.runtime.jit import KernelInterface, MockTensor

from . import _lib, _nvshmem, topology

T = TypeVar("T")

# Name of our entry in `extern_libs`. Triton links by path and ignores the key, but the language
# wrappers look for this key to name the library in the IR, and users may set it to override us.
# Kernels launched on a context of several nodes use `topology.SEVERAL_NODES_LIB_NAME` instead.
LIB_NAME = topology.LIB_NAME

ExternLibs = Union[Mapping[str, str], tuple[tuple[str, str], ...], None]


class IronlinkKernel(KernelInterface[T], Generic[T]):
    """A Triton kernel whose launches link the ironlink bitcode; see the module docstring."""

    def __init__(self, fn: KernelInterface[T], arch: Optional[_lib.ArchLike] = None, nvshmem: bool = False,
                 several_nodes: Optional[bool] = None) -> None:
        # `.fn` is the wrapped kernel, as for Triton's Autotuner: code that walks `.fn` down to the
        # Python function (autotune, heuristics, tooling) keeps working on top of us.
        self.fn = fn
        self.arch = None if arch is None else _lib.parse_arch(arch)
        self.nvshmem = nvshmem
        self.several_nodes = several_nodes
        # (library, device index or pinned arch, its override variable) -> path: the search touches
        # the file system, and launches of small collectives are microseconds.
        self._paths: dict[tuple[str, Any, Optional[str]], str] = {}
        self._registered = False
        self._ctx_index: Optional[int] = None  # position of the `ctx` parameter, found at first launch

    def _cached(self, lib: str, env_var: str, find: Callable[[Any], str]) -> str:
        """`find(arch)` for the pinned arch or the current device's, cached per device and override."""
        env = os.environ.get(env_var)
        if self.arch is not None:
            key: tuple[str, Any, Optional[str]] = (lib, self.arch, env)
            if key not in self._paths:
                self._paths[key] = find(self.arch)
            return self._paths[key]
        from triton.runtime import driver  # the same driver JITFunction.run launches through

        key = (lib, driver.active.get_current_device(), env)
        if key not in self._paths:
            # The target Triton compiles for on this device: its arch is what the bitcode must match.
            self._paths[key] = find(driver.active.get_current_target().arch)
        return self._paths[key]

    def bitcode_path(self, nvshmem: Optional[bool] = None) -> str:
        """The ironlink bitcode this kernel links on the current device (or for its pinned arch):
        the NVSHMEM one with `nvshmem` (default: the kernel's own setting)."""
        nvshmem = self.nvshmem if nvshmem is None else nvshmem
        lib = f"{LIB_NAME}+nvshmem" if nvshmem else LIB_NAME
        return self._cached(lib, _lib.ENV_BITCODE_DIR, lambda a: _lib.bitcode_path(a, nvshmem=nvshmem))

    def nvshmem_bitcode_path(self) -> str:
        """NVSHMEM's device bitcode for the current device (or the pinned arch)."""
        return self._cached(_nvshmem.LIB_NAME, _nvshmem.ENV_NVSHMEM_BITCODE, _nvshmem.device_bitcode_path)

    def extern_libs(self, user: ExternLibs = None, several_nodes: bool = False,
                    nvshmem: Optional[bool] = None) -> dict[str, str]:
        """`user`'s extern libraries plus ours; an explicit "ironlink" entry of the user's wins.

        `several_nodes`: ours under `topology.SEVERAL_NODES_LIB_NAME` (the collectives'
        hierarchical algorithms). With NVSHMEM (default: the kernel's setting), ironlink's and
        then NVSHMEM's library ("libnvshmem_device", the user's if given) go last, in that order:
        a library links only what those before it call.
        """
        nvshmem = self.nvshmem if nvshmem is None else nvshmem
        libs = dict(user or {})
        key = topology.SEVERAL_NODES_LIB_NAME if several_nodes else LIB_NAME
        given = [libs.pop(k) for k in (LIB_NAME, topology.SEVERAL_NODES_LIB_NAME) if k in libs]
        ours = given[0] if given else self.bitcode_path(nvshmem)
        if not nvshmem:
            return {**libs, key: ours}
        nvshmem_lib = libs.pop(_nvshmem.LIB_NAME, None) or self.nvshmem_bitcode_path()
        return {**libs, key: ours, _nvshmem.LIB_NAME: nvshmem_lib}

    def _launch_ctx(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The launch's `ctx` argument (None if the kernel has no parameter of that name)."""
        if "ctx" in kwargs:
            return kwargs["ctx"]
        if self._ctx_index is None:
            names = list(getattr(self.fn, "arg_names", None) or ())
            self._ctx_index = names.index("ctx") if "ctx" in names else -1
        return args[self._ctx_index] if 0 <= self._ctx_index < len(args) else None

    def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        several = self.several_nodes
        if several is None:
            several = topology.spans_several_nodes(self._launch_ctx(args, kwargs))
        # A context of several nodes needs NVSHMEM between nodes (unless pinned: tests that run the
        # hierarchical algorithms on one node with the P2P bitcode).
        nvshmem = self.nvshmem or (several and self.several_nodes is None)
        kwargs["extern_libs"] = self.extern_libs(kwargs.get("extern_libs"), several, nvshmem)
        if nvshmem:
            # Before anything can load the module (this launch, or a compiled kernel from warmup
            # launched by hand): the load hook must know this kernel.
            _nvshmem.check_usable()
            if not self._registered:
                _nvshmem.register_kernel(self.kernel_name())
                self._registered = True
        return self.fn.run(*args, grid=grid, warmup=warmup, **kwargs)

    def kernel_name(self) -> str:
        """The name Triton gives the compiled kernel (the Python function's): what the load hook sees."""
        inner: Any = self.fn
        while not hasattr(inner, "__name__") and hasattr(inner, "fn"):  # autotuners, heuristics
            inner = inner.fn
        return str(inner.__name__)

    def warmup(self, *args: Any, grid: Any, **kwargs: Any) -> Any:
        # Triton 3.6+'s KernelInterface has this; 3.5's does not, and `__getattr__` would then hand
        # it to the inner JITFunction, whose warmup compiles without our bitcode.
        return self.run(*map(MockTensor.wrap_dtype, args), grid=grid, warmup=True, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # Everything else (arg_names, params, src, cache_key, device_caches, ...) is the kernel's.
        # Only called for attributes not found normally; guard `fn` so a half-built object cannot loop.
        if name == "fn":
            raise AttributeError(name)
        return getattr(self.fn, name)

    def __repr__(self) -> str:
        return f"IronlinkKernel({self.fn!r}, arch={self.arch}, nvshmem={self.nvshmem}, several_nodes={self.several_nodes})"


@overload
def jit(fn: Callable[..., Any]) -> IronlinkKernel[Any]: ...


@overload
def jit(
    fn: None = None, *, arch: Optional[_lib.ArchLike] = None, nvshmem: bool = False,
    several_nodes: Optional[bool] = None, **triton_jit_kwargs: Any
) -> Callable[[Callable[..., Any]], IronlinkKernel[Any]]: ...


def jit(
    fn: Optional[Callable[..., Any]] = None,
    *,
    arch: Optional[_lib.ArchLike] = None,
    nvshmem: bool = False,
    several_nodes: Optional[bool] = None,
    **triton_jit_kwargs: Any,
) -> Any:
    """Makes a kernel that links ironlink's bitcode at launch.

    Use as ``@ironlink.jit`` over a ``@triton.jit`` kernel (or an autotuned one), or directly over
    a plain function (then ``triton.jit`` is applied here, with any extra keyword arguments, e.g.
    ``@ironlink.jit(do_not_specialize=["ctx"])``). ``arch="sm_90"`` pins the bitcode instead of
    choosing it from the current GPU at each launch. ``nvshmem=True`` links NVSHMEM's device
    library too, for the ``symm_nvshmem_*`` functions, and initializes each loaded module for it
    (docs/backends.md); NVSHMEM must be initialized in the process before the first launch.

    A launch whose ``ctx`` argument is a context of several nodes links NVSHMEM anyway and
    compiles ironlink's collectives to their hierarchical algorithms (`topology`); on one node
    they are the node-local ones. ``several_nodes=True`` / ``False`` pins that choice instead
    (pinned True with the P2P bitcode: the hierarchical algorithms on one node, for tests).

    Device helpers that a kernel calls stay plain ``@triton.jit`` functions: linking happens per
    launched kernel, and it covers everything the kernel inlines.
    """

    if arch is not None:
        _lib.parse_arch(arch)  # a typo in `arch` fails at decoration, not at the first launch

    def wrap(f: Callable[..., Any]) -> IronlinkKernel[Any]:
        if isinstance(f, KernelInterface):
            if triton_jit_kwargs:
                raise TypeError(
                    f"ironlink.jit: {sorted(triton_jit_kwargs)} are triton.jit options, but {f!r} is "
                    "already a Triton kernel; pass them to its @triton.jit"
                )
            kernel: KernelInterface[Any] = f
        else:
            kernel = triton.jit(f, **triton_jit_kwargs)
        return IronlinkKernel(kernel, arch, nvshmem, several_nodes)

    return wrap if fn is None else wrap(fn)
