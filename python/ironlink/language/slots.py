"""Peer slots: a workspace in the heap in which every rank has a slot at every peer (rank r's slot
at rank d is (r - d - 1) mod world: `slot_of`), used in alternate halves by alternate launches, with a
launch counter per CTA that every CTA keeps equal whatever grid each launch has. Two ways to
read a slot:

- after a tile signal that the peer posts behind its stores (matmul_all_reduce's and
  all_reduce_rmsnorm's "push"): `store_to_peer_slots`, then `add_in_rank_order`;
- as the data lands (Lamport's scheme, as TensorRT-LLM's one-shot all-reduce uses it): every
  element of the slots is -0.0 ("empty") until a peer stores into it, senders store -0.0 as
  +0.0, and the reader polls the data itself until no element is empty, then stores empty back,
  so the slots are all empty between calls (`lamport_send`, `lamport_reduce`; the workspace is
  `ironlink.runtime.workspaces.lamport_workspace`; `lamport_store` and `lamport_reduce_values`
  take values in registers).
  No signal, no fence; the bytes cross NVLink once. The peers' copies of the slots are
  `peer_distances` away, read from the context before a kernel's PDL wait.
"""

from __future__ import annotations

import triton
import triton.language as tl

from . import _abi
from . import typed as ilt
from ._flags import empty_like, unempty, wait_written

EPOCH_COUNTERS = tl.constexpr(_abi.MAX_CTAS)  # the launch counters: one per possible CTA
PEERS = tl.constexpr(_abi.MAX_RANKS)  # lanes of `peer_distances`: the ranks of one node at most
# Where a lamport wait that timed out is recorded: the detail names symm_tile_wait, the wait a
# signalled slot takes for the same data.
TILE_WAIT = tl.constexpr(list(_abi.FUNCTIONS).index("symm_tile_wait"))
# The reductions of a lamport exchange, as the device library numbers them (`_abi.REDUCE_OP`).
_SUM = tl.constexpr(_abi.REDUCE_OP["SUM"])
_PROD = tl.constexpr(_abi.REDUCE_OP["PROD"])
_MAX = tl.constexpr(_abi.REDUCE_OP["MAX"])
_MIN = tl.constexpr(_abi.REDUCE_OP["MIN"])
_AVG = tl.constexpr(_abi.REDUCE_OP["AVG"])
# The most elements (ranks x a block's) that `lamport_reduce_values` polls in one loop: 4 ranks of a
# row of hidden 8192 (at 16 warps, 32 registers a thread for the bf16 rows). Larger blocks (8 ranks
# of such a row) poll in groups of ranks that fit.
POLL_TOGETHER_MAX_ELEMENTS = tl.constexpr(32768)


@triton.constexpr_function
def poll_group(world, block_elems):
    """How many ranks' blocks of `block_elems` elements `lamport_reduce_values` polls in one loop
    at `world` ranks: at 4 and 8 ranks the largest of world, 4 and 2 whose blocks fit in
    POLL_TOGETHER_MAX_ELEMENTS; else 0 (peer by peer)."""
    if world not in (4, 8):
        return 0
    return next((g for g in (world, 4, 2) if g * block_elems <= POLL_TOGETHER_MAX_ELEMENTS.value), 0)


@triton.jit
def slot_of(sender, receiver, WORLD: tl.constexpr):
    """The index of rank `sender`'s slot in rank `receiver`'s workspace: (sender - receiver - 1)
    mod world (the world - 1 peers of a rank, in rank order starting after it)."""
    return (sender - receiver - 1 + WORLD) % WORLD


@triton.jit
def store_to_peer_slots(ctx, slots, slot_elems, offs, v, mask, rank, WORLD: tl.constexpr):
    """Stores `v` at element offsets `offs` of this rank's slot (`slot_of`) in every other rank
    dest's `slots` (a heap address; slots of `slot_elems` elements each)."""
    for k in tl.static_range(1, WORLD):
        dest = (rank + k) % WORLD
        slot = tl.cast(slot_of(rank, dest, WORLD), tl.int64) * slot_elems
        tl.store(ilt.peer_pointer(ctx, slots, dest) + slot + offs, v, mask=mask)


@triton.jit
def add_in_rank_order(total, own, slots, slot_elems, offs, mask, rank, WORLD: tl.constexpr):
    """`total` (fp32) plus, in rank order, every rank's values at element offsets `offs`: this
    rank's from `own`, peer q's from its slot (`slot_of`) of `slots` (as `store_to_peer_slots`
    filled them). Unrolled over the ranks: every load is in flight at once.
    Lanes outside `mask` hold no value: the callers store `total` under the same mask."""
    for q in tl.static_range(WORLD):
        src = tl.where(q == rank, own, slots + slot_of(q, rank, WORLD) * slot_elems)
        total += tl.load(src + offs, mask=mask).to(tl.float32)
    return total


@triton.jit
def launch_slots(ws, epochs, half):
    """(this CTA's launch count, its parity, the half of `ws` of this parity): slot kernels use
    alternate halves of their workspace in alternate launches, each half `half` elements, half
    the workspace whatever this call's shape (`runtime.workspaces.slot_half`). A rank in launch m
    knows its peers are past launch m - 2, not m - 1: a half placed by the call's shape ((world -
    1) x M x N) let launch m of another shape store into the part of the other half that a slower
    peer still read for launch m - 1."""
    epoch = tl.load(epochs + tl.program_id(0))
    parity = epoch % 2
    return epoch, parity, ws + parity.to(tl.int64) * half


@triton.jit
def advance_epochs(epochs, epoch):
    """Sets every CTA's launch counter (MAX_CTAS of them) to `epoch`, this CTA a share of them, so
    the counters stay equal whatever grid each launch has: the two-shot kernel's CTAs meet the
    peers' CTAs of other indices in the same slots. One masked vector store: counter e is this
    CTA's when e % grid == its index (a loop of scalar stores cost a one-CTA grid 256 of them)."""
    e = tl.arange(0, EPOCH_COUNTERS)
    tl.store(epochs + e, epoch + e * 0, mask=e % tl.num_programs(0) == tl.program_id(0))


@triton.jit
def peer_distances(ctx, ptr, rank, WORLD: tl.constexpr):
    """int64 [PEERS]: lane k holds the byte distance from `ptr` (any heap address) to the same
    address at rank (rank + k) % WORLD (lane 0 and lanes from WORLD: 0). The heap's mapping is
    fixed for its life, so a kernel may compute this before it waits for the previous kernel
    (`pdl`): the context's reads, a chain of dependent loads, then overlap that kernel."""
    k = tl.arange(0, PEERS)
    d = tl.zeros([PEERS], dtype=tl.int64)
    for j in tl.static_range(1, WORLD):
        d = tl.where(k == j, ilt.peer_pointer(ctx, ptr, (rank + j) % WORLD).to(tl.int64) - ptr.to(tl.int64), d)
    return d


@triton.jit
def lamport_send(x, slots, slot, at, mk, rank, dists, WORLD: tl.constexpr):
    """This rank's elements of x at offsets `at` (where `mk`) into its slot at every peer:
    `lamport_store` of them."""
    lamport_store(tl.load(x + at, mask=mk), slots, slot, at, mk, rank, dists, WORLD)


@triton.jit
def lamport_store(v, slots, slot, at, mk, rank, dists, WORLD: tl.constexpr):
    """Values `v` (x's dtype, at element offsets `at`, where `mk`) into this rank's slot at every
    peer (`slots` of `slot` elements each; the peers' copies `dists` bytes away,
    `peer_distances`), -0.0 sent as +0.0."""
    v = unempty(v)
    for k in tl.static_range(1, WORLD):
        dest = (rank + k) % WORLD
        tl.store(at_peer(slots, dists, k) + tl.cast(slot_of(rank, dest, WORLD), tl.int64) * slot + at, v, mask=mk)


@triton.jit
def at_peer(ptr, dists, k):
    """`ptr` (a heap address) at rank (rank + k) % world: lane k of `peer_distances` added."""
    # Heap bases are 256-byte aligned: saying so keeps the stores' vector width.
    d = tl.sum(tl.where(tl.arange(0, PEERS) == k, dists, 0)) // 256 * 256
    return (ptr.to(tl.pointer_type(tl.int8)) + d).to(ptr.dtype)


@triton.jit
def _combine(acc, v, OP: tl.constexpr):
    if OP == _PROD:
        r = acc * v
    elif OP == _MAX:
        r = tl.maximum(acc, v)
    elif OP == _MIN:
        r = tl.minimum(acc, v)
    else:
        r = acc + v
    return r


@triton.jit
def lamport_receive(ctx, ptrs, mask):
    """(the elements at `ptrs` where `mask`, polled until none is empty (`wait_written`, bounded
    by the context's timeout, TIMEOUT recorded as symm_tile_wait), status), the slots read set
    back to empty; after a failed wait they are left as they are."""
    got, s = wait_written(ctx, ptrs, mask, TILE_WAIT)
    if s == 0:
        tl.store(ptrs, empty_like(got), mask=mask)
    return got, s


@triton.jit
def lamport_reduce(ctx, x, slots, slot, at, mk, rank, WORLD: tl.constexpr, OP: tl.constexpr = _SUM):
    """`lamport_reduce_values` with this rank's elements loaded from x (as `lamport_send` sent
    them)."""
    return lamport_reduce_values(ctx, tl.load(x + at, mask=mk, other=0.0), slots, slot, at, mk, rank, WORLD, OP)


@triton.jit
def lamport_reduce_values(ctx, own, slots, slot, at, mk, rank, WORLD: tl.constexpr, OP: tl.constexpr = _SUM):
    """(the reduction OP over the ranks, fp32, of the elements at offsets `at` (a 1-D or 2-D
    block): this rank's `own` values, as `lamport_store` sent them, each peer's polled in its slot
    here until none is empty, status). The slots read are set back to empty. After a failed wait
    (TIMEOUT, recorded in the context) the result is not for use and the slots are left as they
    are. The order of the reduction is the same on every rank (results are bitwise identical).
    At 4 and 8 ranks the ranks' slots are polled in groups, each group's in one loop
    (`_reduce_in_groups`): every rank at once where all their blocks fit in registers
    (POLL_TOGETHER_MAX_ELEMENTS), else groups of 4 or 2 ranks that do (`poll_group`), so a CTA
    waits one round trip a group where a poll a peer waits one each (about 0.5 us each:
    decode_probe's `copies[k]`); otherwise peer by peer, in rank order."""
    GROUP: tl.constexpr = poll_group(WORLD, at.numel)
    if GROUP:
        total, s = _reduce_in_groups(ctx, own, slots, slot, at, mk, rank, WORLD, GROUP, OP)
    else:
        total, s = _reduce_peer_by_peer(ctx, own, slots, slot, at, mk, rank, WORLD, OP)
    return total, s


@triton.jit
def _reduce_in_groups(ctx, own, slots, slot, at, mk, rank, WORLD: tl.constexpr, GROUP: tl.constexpr,
                      OP: tl.constexpr):
    """`lamport_reduce_values` over the ranks in groups of GROUP (a power of two dividing WORLD),
    in rank order: each group's slots polled in one loop (`_poll_group`), its rows reduced, the
    groups' results combined one after another. Every rank groups and reduces the same way."""
    total, s = _poll_group(ctx, own, slots, slot, at, mk, rank, 0, WORLD, GROUP, OP)
    for g in tl.static_range(1, WORLD // GROUP):
        part, w = _poll_group(ctx, own, slots, slot, at, mk, rank, g * GROUP, WORLD, GROUP, OP)
        total = _combine(total, part, OP)
        s = ilt.failure_or(s, w)
    if OP == _AVG:
        total = total / WORLD
    return total, s


@triton.jit
def _poll_group(ctx, own, slots, slot, at, mk, rank, FIRST: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr,
                OP: tl.constexpr):
    """(ranks FIRST .. FIRST + GROUP - 1 reduced (AVG as SUM), status): a block [GROUP, *at] whose
    row i is rank FIRST + i's elements (this rank's row `own`, not polled), loaded together, so a
    CTA waits one round trip for the group's data. Reduced over the rows in one fixed order."""
    q = FIRST + tl.arange(0, GROUP)
    if len(at.shape) == 1:
        q = q[:, None]
        at_q, mk_q, own_q = at[None, :], mk[None, :], own[None, :]
    else:
        q = q[:, None, None]
        at_q, mk_q, own_q = at[None, :, :], mk[None, :, :], own[None, :, :]
    peer = q != rank
    # Row q = rank points past the slots (index WORLD - 1); it is masked out of every access.
    inbox = slots + slot_of(q, rank, WORLD).to(tl.int64) * slot + at_q
    got, s = lamport_receive(ctx, inbox, mk_q & peer)
    v = tl.where(peer, got, unempty(own_q)).to(tl.float32)
    if OP == _PROD:
        total = tl.reduce(v, 0, _multiply)
    elif OP == _MAX:
        total = tl.max(v, axis=0)
    elif OP == _MIN:
        total = tl.min(v, axis=0)
    else:
        total = tl.sum(v, axis=0)
    return total, s


@triton.jit
def _multiply(a, b):
    return a * b


@triton.jit
def _reduce_peer_by_peer(ctx, own, slots, slot, at, mk, rank, WORLD: tl.constexpr, OP: tl.constexpr):
    """`lamport_reduce_values` one peer at a time, in rank order: a block of one rank in
    registers at a time."""
    s = tl.zeros((), dtype=tl.int32)
    total = tl.zeros_like(at).to(tl.float32)
    for q in tl.static_range(WORLD):
        if q == rank:
            v = unempty(own).to(tl.float32)
        else:
            got, waited = lamport_receive(ctx, slots + slot_of(q, rank, WORLD) * slot + at, mk)
            s = ilt.failure_or(s, waited)
            v = got.to(tl.float32)
        if q == 0:
            total = v
        else:
            total = _combine(total, v, OP)
    if OP == _AVG:
        total = total / WORLD
    return total, s


__all__ = ["EPOCH_COUNTERS", "PEERS", "POLL_TOGETHER_MAX_ELEMENTS", "TILE_WAIT", "add_in_rank_order", "advance_epochs",
           "at_peer", "lamport_receive", "lamport_reduce", "lamport_reduce_values", "lamport_send", "lamport_store",
           "launch_slots", "peer_distances", "slot_of", "store_to_peer_slots"]
