"""What a dispatch hands to its combine: `Handle`, shared by the exchange and its torch.compile
operators (moe/torch_library.py), which must not import each other."""

from __future__ import annotations

from typing import Any, NamedTuple


class Handle(NamedTuple):
    """What combine needs from a dispatch."""

    tokens: int
    send_row: Any  # relay path: [T, world] int64, the token's row in the send (and combine's receive) buffer,
    # -1: not sent; the one-node paths: None
    slot: Any  # [world * max_tokens, topk] int64: recv_x row of each received token's choice, -1: not here
    weight: Any  # [world * max_tokens, topk] fp32: the received tokens' top-k weights
    received: Any  # [1] int64: tokens received (direct path: every rank's tokens)


__all__ = ["Handle"]
