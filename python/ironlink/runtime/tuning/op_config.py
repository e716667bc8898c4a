"""An op's launch choices as a frozen config object passed to it (`config=`), and the string a
torch.compile graph carries in its place (custom operators take no Python objects).

Each op family's module defines its config (`collectives.AllReduceConfig`,
`rmsnorm.RmsnormConfig`); its defaults are the family's tuned numbers, so `XConfig()` is what
the op does unasked and a benchmark or test that times another choice builds its own config.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Optional, TypeVar

C = TypeVar("C")


def as_arg(config: Optional[Any]) -> str:
    """`config` (a frozen dataclass of numbers, strings and booleans, or None) as an operator's
    string argument: "" for None, else its fields as JSON (`from_arg` reads it back)."""
    return "" if config is None else json.dumps(dataclasses.asdict(config), sort_keys=True)


def from_arg(kind: type[C], text: str) -> Optional[C]:
    """The config of type `kind` that `as_arg` wrote (None for "")."""
    return kind(**json.loads(text)) if text else None


__all__ = ["as_arg", "from_arg"]
