"""The public functions that ironlink's PyTorch custom operators (`torch.ops.ironlink.*`) run,
by name, entered by the modules that own them, and the routing of those functions to the
operators while Dynamo traces them (`routed`).

Each layer's `torch_library` (`ops/`, `fused/`) defines its operators with torch at import; the
public functions it runs (`ops.collectives.all_reduce`, ...) live in modules that must import
without torch, and those route to their `torch_library` while Dynamo traces them. Were the
operators to import the public modules too, each layer would be an import circle. So the
imports run one way: a public module imports this table (no torch) and enters its function with
`@routed` (or `@register`) when it is imported; the operator's implementation looks the function
up here by name (`function`) when the compiled graph runs it.

Every public module is entered before any operator can run: a `torch_library` module is imported
through its package (`ironlink.ops`, `ironlink.fused`), whose `__init__` imports all of that
layer's public modules. MoeExchange needs no entry: its operators call the methods of the
exchange their handle names (`runtime.handles`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

from .errors import IronlinkError
from .handles import compiling

F = TypeVar("F", bound=Callable[..., Any])

# Public function name -> the function (all_reduce_rmsnorm serves two operators).
FUNCTIONS: dict[str, Callable[..., Any]] = {}


def register(fn: F) -> F:
    """Decorator: enters `fn` under its name as what the operators of that name run; returns
    `fn` itself (the public function is unchanged)."""
    FUNCTIONS[fn.__name__] = fn
    return fn


def routed(library: Callable[[], Any], enter: bool = True) -> Callable[[F], F]:
    """Decorator of a public op: enters it (`register`), and while Dynamo traces a call
    (`handles.compiling()`) calls instead the routing function of the same name in the module
    `library()` returns (its layer's `torch_library`, imported only then: it imports torch), which
    calls the registered operator with the same arguments; in eager the op itself runs.
    `enter=False` for a method (MoeExchange.dispatch / combine: the routing function takes the
    object first): routed, not entered, as its operators find the object by its handle.
    `library` is a function of the layer's own (`from . import torch_library`), not a module
    name: Dynamo traces an import statement but refuses `importlib.import_module` (a graph break
    under fullgraph)."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if compiling():
                return getattr(library(), fn.__name__)(*args, **kwargs)
            return fn(*args, **kwargs)

        # The operators run the public function itself (when a compiled graph runs them, nothing
        # is tracing: `call` runs `fn`).
        return register(call) if enter else call  # type: ignore[return-value]

    return decorate


def function(name: str) -> Callable[..., Any]:
    """The public function entered as `name`; IronlinkError if its module was never imported."""
    fn = FUNCTIONS.get(name)
    if fn is None:
        raise IronlinkError(f"torch.ops.ironlink: no function {name!r} entered for the operator to run (the "
                            "module that defines it enters it when imported: import ironlink.ops and ironlink.fused)")
    return fn


__all__ = ["FUNCTIONS", "function", "register", "routed"]
