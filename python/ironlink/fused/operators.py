"""Where a public op of this layer goes while Dynamo traces it (`runtime.eager.routed`): this layer's
torch.library operators, imported only then (they import torch; the public modules must not)."""

from __future__ import annotations

from typing import Any


def torch_operators() -> Any:
    """This layer's `torch_library` module."""
    from . import torch_library

    return torch_library


__all__ = ["torch_operators"]
