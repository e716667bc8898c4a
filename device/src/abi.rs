//! The ABI shared by the device library, the host crate and the Python package.
//!
//! This file is the single source of truth for every number that crosses a boundary: status codes,
//! reduce ops, dtypes, backend kinds, the `SymmContext` layout and the layout of the signal region.
//! (Algorithm thresholds are not ABI facts: they live in `collectives::choice`.)
//! The host crate uses these types directly; `build.rs` at the top of the workspace projects them
//! into `python/ironlink/language/_abi.py`; a test checks that the checked-in Python file is up to date.
//!
//! Values that PyTorch's `torch_symm` extern library also defines (status codes -1..-4,
//! `REDUCE_OP_SUM = 0`, `DTYPE_FLOAT32 = 0`, backend kinds 1 and 2, signal ops, compare ops,
//! fence scopes) keep PyTorch's numbers so kernels written against that API read the same.

/// Defines `pub mod $group` with one `pub const` per entry and `ALL`, the (name, value) table
/// that `build.rs` projects into Python.
macro_rules! const_group {
    ($(#[$gm:meta])* $group:ident : $ty:ty { $($(#[$m:meta])* $name:ident = $val:expr;)* }) => {
        $(#[$gm])*
        pub mod $group {
            $($(#[$m])* pub const $name: $ty = $val;)*
            /// Every constant of this group as (name, value).
            pub const ALL: &[(&str, i64)] = &[$((stringify!($name), $name as i64)),*];
        }
    };
}

/// `'IRLK'` in little-endian bytes: the first word of every ironlink context.
pub const CTX_MAGIC: u32 = 0x4b4c_5249;
/// Bumped whenever `SymmContext` or the signal layout changes incompatibly.
pub const ABI_VERSION: u32 = 8;

/// Most ranks one node holds: the peer tables of a context (and every per-peer array of the
/// signal region) have this many slots, rank `r` in slot `r % MAX_RANKS` (one node's ranks are
/// consecutive, so they never share a slot). A one-node context has at most this many ranks.
pub const MAX_RANKS: usize = 8;
const _: () = assert!(MAX_RANKS.is_power_of_two());
/// Most nodes a multi-node context (`backend::NVSHMEM_MULTI_NODE`) may span.
pub const MAX_NODES: usize = 32;
const _: () = assert!(MAX_NODES.is_power_of_two());
/// Most ranks a multi-node context may have.
pub const MAX_WORLD: usize = MAX_NODES * MAX_RANKS;
/// Most CTAs per rank that a collective may be launched with (two waves on an H200's 132 SMs fit).
pub const MAX_CTAS: usize = 256;
/// Tile indices a tile-scoped call may name (`0..MAX_TILES`): each has its own call counter and
/// barrier slots in the signal region.
pub const MAX_TILES: usize = 4096;
/// Tile indices `0..MAX_LL_TILES` have a slot in the LL receive area of tile all-reduces
/// (`signal::TILE_LL_OFFSET`); a tile all-reduce on a higher index runs two-shot. One per CTA of
/// the largest grid, so a kernel that runs tile `pid` on CTA `pid` (all_reduce_rmsnorm's rows)
/// always has one.
pub const MAX_LL_TILES: usize = MAX_CTAS;

const_group! {
/// Status codes returned by every `i32` device function. 0 is success; errors are negative.
status: i32 {
    OK = 0;
    /// The context pointer is 0.
    NULL_CONTEXT = -1;
    /// The context's magic word is not ironlink's, or its backend kind is not one this build
    /// serves (NCCL), or its rank / world size is out of range.
    UNKNOWN_CONTEXT = -2;
    /// Also: a function without a multi-node version called on a multi-node context.
    UNSUPPORTED_OP = -3;
    UNSUPPORTED_DTYPE = -4;
    /// A region lies (partly) outside the symmetric heap.
    OUT_OF_BOUNDS = -5;
    /// A region is not aligned to its element size.
    MISALIGNED = -6;
    /// A peer did not arrive within the context's timeout; also recorded in the context.
    TIMEOUT = -7;
    /// The context was built for another ABI version of this library.
    ABI_MISMATCH = -8;
    /// An argument is out of its documented range (peer index, count, tile index, grid larger
    /// than `MAX_CTAS`, a grid barrier's grid larger than the GPU).
    INVALID_ARGUMENT = -9;
    /// A variable all-to-all would deliver more rows to some rank than its output holds: every
    /// rank returns it, nothing is written but the receive counts and offsets.
    CAPACITY_EXCEEDED = -10;
    /// A peer pointer asked for a rank on another node (reached only by the remote transport),
    /// or a cross-node exchange ran in a build without a network (the P2P bitcode).
    PEER_NOT_MAPPED = -11;
    /// The ranks' symmetric heaps differ: a peer's digest of its heap's allocations and frees
    /// (`SymmContext::heap_digest`) is not this rank's, so the same offset names different
    /// tensors on different ranks. Checked at a call's first barrier, before any data moves;
    /// recorded, and returned on every rank that saw it.
    HEAP_ASYMMETRIC = -12;
    /// The same-index CTAs of two ranks run one call in grids of different sizes (checked at a
    /// call's first barrier; a CTA with no partner times out and then returns this when a
    /// sibling CTA recorded it). Recorded.
    GRID_MISMATCH = -13;
}}

/// Whether `code` reports a failure among ranks (a peer lost or stuck, grids or heaps that differ):
/// the ranks' calls no longer match, so when one is recorded the context's wait timeout drops to
/// 0 until the host clears the error (`runtime::context::record_error`, the host's
/// `DeviceContext`). Other errors concern one rank's own call.
pub const fn is_failure_among_ranks(code: i32) -> bool {
    code == status::TIMEOUT || code == status::GRID_MISMATCH || code == status::HEAP_ASYMMETRIC
}

const_group! {
/// Reduce operations (`REDUCE_OP_SUM = 0` as in torch_symm).
reduce_op: i32 {
    SUM = 0;
    MAX = 1;
    MIN = 2;
    PROD = 3;
    AVG = 4;
}}

const_group! {
/// Element types (`DTYPE_FLOAT32 = 0` as in torch_symm).
dtype: i32 {
    FLOAT32 = 0;
    FLOAT16 = 1;
    BFLOAT16 = 2;
}}

/// Size in bytes of one element of `dtype`, or 0 for an unknown dtype.
pub const fn dtype_size(dtype: i32) -> usize {
    match dtype {
        dtype::FLOAT32 => 4,
        dtype::FLOAT16 | dtype::BFLOAT16 => 2,
        _ => 0,
    }
}

const_group! {
/// Backend kinds stored in `SymmContext::backend` (NCCL = 1 and NVSHMEM = 2 as in torch_symm).
backend: u32 {
    NCCL = 1;
    /// NVSHMEM symmetric memory (PyTorch's NVSHMEM backend): the same regions and layout as P2P,
    /// every peer's address from `nvshmem_ptr`. Served when every peer is mapped (one node).
    NVSHMEM = 2;
    /// ironlink's own peer-to-peer heap: every peer's memory is mapped into this process.
    P2P = 3;
    /// NVSHMEM symmetric memory over several nodes of `node_size` ranks: the peer tables hold
    /// this rank's node, other nodes are reached by NVSHMEM puts. Served only by the functions
    /// with a multi-node version (`symm_*_hierarchical`) and the queries; every other function
    /// returns UNSUPPORTED_OP for it. A kind of its own so that the one-node functions refuse it
    /// with the backend check they already make (a gate in their prologue cost registers).
    NVSHMEM_MULTI_NODE = 4;
}}

const_group! {
/// Signal operations for `symm_signal` (as in torch_symm).
signal_op: i32 {
    SET = 0;
    ADD = 1;
}}

const_group! {
/// Compare operations for `symm_signal_wait` (as in torch_symm / NVSHMEM).
cmp: i32 {
    EQ = 1;
    NE = 2;
    GT = 3;
    GE = 4;
    LT = 5;
    LE = 6;
}}

const_group! {
/// Fence scopes for `symm_fence` (as in torch_symm).
fence_scope: i32 {
    CTA = 0;
    GPU = 1;
    SYSTEM = 2;
}}

/// The running digest of a heap's allocations and frees (`SymmContext::heap_digest`): the host
/// folds every event into it in order, so ranks that made the same calls with the same sizes
/// hold the same digest and any difference (a size, an extra or missing call, another order)
/// changes it. The host crate keeps it; the simulator's tests fold the same way.
pub mod heap_digest {
    /// The digest of a heap nothing was allocated from (and of contexts over external memory).
    pub const EMPTY: u64 = 0;
    /// Low bits of the digest that the device compares (the rest of its call word holds the
    /// call's tag and grid: `runtime::call_id`).
    pub const BITS: u32 = 40;
    /// Event kinds.
    pub const ALLOC: u64 = 1;
    pub const FREE: u64 = 2;

    /// `digest` after the event `kind` of `bytes` at user-region `offset` (the bytes the
    /// allocator reserved, rounded as it rounds).
    pub const fn fold(digest: u64, kind: u64, offset: u64, bytes: u64) -> u64 {
        let event = mix(kind ^ mix(offset ^ mix(bytes)));
        // Order matters: folding a then b differs from b then a.
        mix(digest.rotate_left(23) ^ event)
    }

    /// splitmix64's finalizer: every input bit flips about half of the output bits.
    const fn mix(x: u64) -> u64 {
        let x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    }
}

/// Default for `SymmContext::timeout_ns`: a wait on a peer gives up after this long.
pub const DEFAULT_TIMEOUT_NS: u64 = 5_000_000_000;
/// What a kernel reaches through its one context pointer. Lives in device memory of its rank.
///
/// Written once by the host when the heap is built; afterwards the device only writes `error`
/// (first error wins) and `error_detail`. Addresses are virtual addresses valid in this process
/// (for the P2P backend every peer's regions are mapped here; for NVSHMEM they are NVSHMEM's
/// `nvshmem_ptr` of each peer, 0 for a peer this process cannot reach by loads and stores).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SymmContext {
    pub magic: u32,
    pub version: u32,
    pub backend: u32,
    pub rank: i32,
    pub world_size: i32,
    /// First error status a device function recorded (0 = none); the host reads and clears it.
    pub error: i32,
    /// Which function recorded `error` (its index in the export table), for the host's message.
    pub error_detail: i32,
    /// Ranks per node of a `NVSHMEM_MULTI_NODE` context (rank r is on node `r / node_size`; at
    /// most MAX_RANKS; divides `world_size`); ignored by the one-node kinds. Peers on another node
    /// are reached only through the remote transport (`transport::remote`), even when their
    /// addresses are mapped here: that is how one machine runs the cross-node path as simulated
    /// nodes (4 GPUs as 2 nodes of 2).
    pub node_size: u32,
    /// Bytes in each rank's user-buffer region.
    pub heap_size: u64,
    /// Bytes in each rank's signal region (see `signal` below for its layout).
    pub signal_size: u64,
    /// Bytes in each rank's scratch region (packet buffers of the collectives).
    pub scratch_size: u64,
    /// A wait on a peer gives up after this many nanoseconds of `%globaltimer`.
    pub timeout_ns: u64,
    /// All-reduce algorithm by message size, in bytes (all ranks must hold the same values):
    /// one-shot LL up to this size, where its packets fit the CTA's scratch slice ...
    pub ar_one_shot_max_bytes: u64,
    /// ... then two-shot LL up to this size (where they fit), then two-shot over the buffers.
    pub ar_ll_max_bytes: u64,
    /// all_gather (by output bytes) and reduce_scatter (by input bytes) use one-shot LL packets
    /// up to this size, where they fit the CTA's scratch slice; pushes/pulls between barriers above.
    pub gather_ll_max_bytes: u64,
    /// Base of each rank's user-buffer region, as mapped in this process, in slot
    /// `rank % MAX_RANKS`; 0 for a slot no rank of this node fills.
    pub peer_heap: [u64; MAX_RANKS],
    /// Base of each rank's signal region, as mapped in this process.
    pub peer_signal: [u64; MAX_RANKS],
    /// Base of each rank's scratch region, as mapped in this process.
    pub peer_scratch: [u64; MAX_RANKS],
    /// Running digest of this rank's allocations and frees in its user-buffer region
    /// (`heap_digest::fold`), written by the host in stream order before the next launch that
    /// follows them (the Python heap: when `heap.ctx` is read). Every rank
    /// that made the same calls holds the same value; a call compares its low
    /// `heap_digest::BITS` bits with the peers' at its first barrier (`HEAP_ASYMMETRIC`).
    pub heap_digest: u64,
}

impl SymmContext {
    /// Base of `rank`'s user-buffer region (`rank` on this rank's node). The index is the rank's
    /// slot, `rank % MAX_RANKS`: the identity on a one-node context, and the mask also keeps a
    /// bounds-check panic, and the call it costs in SASS, out of the device code.
    #[inline(always)]
    pub fn heap_base(&self, rank: usize) -> usize {
        self.peer_heap[rank & (MAX_RANKS - 1)] as usize
    }

    /// Base of `rank`'s signal region (index masked as in `heap_base`).
    #[inline(always)]
    pub fn signal_base(&self, rank: usize) -> usize {
        self.peer_signal[rank & (MAX_RANKS - 1)] as usize
    }

    /// Base of `rank`'s scratch region (index masked as in `heap_base`).
    #[inline(always)]
    pub fn scratch_base(&self, rank: usize) -> usize {
        self.peer_scratch[rank & (MAX_RANKS - 1)] as usize
    }

    /// A context with no peers mapped; the host fills in the addresses and the algorithm limits
    /// (0 here: `collectives::choice::with_default_limits` gives the defaults, which live with
    /// every other threshold).
    pub const fn new(rank: i32, world_size: i32) -> Self {
        SymmContext {
            magic: CTX_MAGIC,
            version: ABI_VERSION,
            backend: backend::P2P,
            rank,
            world_size,
            error: 0,
            error_detail: 0,
            node_size: 0,
            heap_size: 0,
            signal_size: 0,
            scratch_size: 0,
            timeout_ns: DEFAULT_TIMEOUT_NS,
            ar_one_shot_max_bytes: 0,
            ar_ll_max_bytes: 0,
            gather_ll_max_bytes: 0,
            peer_heap: [0; MAX_RANKS],
            peer_signal: [0; MAX_RANKS],
            peer_scratch: [0; MAX_RANKS],
            heap_digest: heap_digest::EMPTY,
        }
    }
}

const_group! {
/// Layout of each rank's signal region, in bytes from the region's base. Peers write into it;
/// the host zeroes it when the heap is built.
signal: usize {
    /// Barrier flags: `[MAX_CTAS][MAX_RANKS]` u32; slot `[cta][p]` is written by rank `p`.
    BARRIER_OFFSET = 0;
    BARRIER_BYTES = super::MAX_CTAS * super::MAX_RANKS * 4;
    /// Per-CTA call counters (epochs), local to the rank: `[MAX_CTAS]` u32.
    EPOCH_OFFSET = BARRIER_OFFSET + BARRIER_BYTES;
    EPOCH_BYTES = super::MAX_CTAS * 4;
    /// Per-CTA, per-source-rank progress flags of the bandwidth collectives: `[MAX_CTAS][MAX_RANKS]` u32.
    FLAG_OFFSET = EPOCH_OFFSET + EPOCH_BYTES;
    FLAG_BYTES = super::MAX_CTAS * super::MAX_RANKS * 4;
    /// User signal slots for `symm_signal` / `symm_signal_wait`: `[USER_SLOTS]` u64.
    USER_OFFSET = FLAG_OFFSET + FLAG_BYTES;
    USER_SLOTS = 1024;
    USER_BYTES = USER_SLOTS * 8;
    /// The grid barrier of this rank's launches: arrival count (u32) and generation (u32),
    /// alone on a 128-byte line.
    GRID_OFFSET = USER_OFFSET + USER_BYTES;
    GRID_BYTES = 128;
    /// Per-tile call counters (epochs) of tile-scoped calls, local to the rank: `[MAX_TILES]` u32.
    TILE_EPOCH_OFFSET = GRID_OFFSET + GRID_BYTES;
    TILE_EPOCH_BYTES = super::MAX_TILES * 4;
    /// Barrier flags of tile-scoped calls: `[MAX_TILES][MAX_RANKS]` u32; slot `[tile][p]` is
    /// written by rank `p`.
    TILE_BARRIER_OFFSET = TILE_EPOCH_OFFSET + TILE_EPOCH_BYTES;
    TILE_BARRIER_BYTES = super::MAX_TILES * super::MAX_RANKS * 4;
    /// Push-as-produced semaphores: `[MAX_TILES][MAX_RANKS]` u32; slot `[tile][p]` counts the
    /// signals rank `p` sent for `tile` that this rank has not yet waited for.
    TILE_SIGNAL_OFFSET = TILE_BARRIER_OFFSET + TILE_BARRIER_BYTES;
    TILE_SIGNAL_BYTES = super::MAX_TILES * super::MAX_RANKS * 4;
    /// Remote-transport arrivals: `[MAX_CTAS][MAX_NODES]` u64; slot `[cta][n]` is set by the
    /// rank of node `n` this rank exchanges with, by its put-with-signal once its data has landed
    /// here (`transport::remote`).
    REMOTE_ARRIVE_OFFSET = TILE_SIGNAL_OFFSET + TILE_SIGNAL_BYTES;
    REMOTE_ARRIVE_BYTES = super::MAX_CTAS * super::MAX_NODES * 8;
    /// Remote-transport acknowledgements: `[MAX_CTAS][MAX_NODES]` u64; slot `[cta][n]` is set by
    /// that rank of node `n` once it has consumed what this rank put into its scratch.
    REMOTE_ACK_OFFSET = REMOTE_ARRIVE_OFFSET + REMOTE_ARRIVE_BYTES;
    REMOTE_ACK_BYTES = super::MAX_CTAS * super::MAX_NODES * 8;
    /// Acknowledgements owed to this rank, local to it: `[MAX_CTAS][MAX_NODES]` u64; slot
    /// `[cta][n]` is the Ack value the rank of node `n` still owes for the last exchange this
    /// CTA slot put into its scratch (0: none), waited for before the next put there.
    REMOTE_OWED_OFFSET = REMOTE_ACK_OFFSET + REMOTE_ACK_BYTES;
    REMOTE_OWED_BYTES = super::MAX_CTAS * super::MAX_NODES * 8;
    /// The same two kinds for tile calls across nodes: `[MAX_TILES][MAX_NODES]` u64 each, slot
    /// `[tile][n]` set by this rank's partner on node `n` (a tile's CTA differs from rank to rank).
    REMOTE_TILE_ARRIVE_OFFSET = REMOTE_OWED_OFFSET + REMOTE_OWED_BYTES;
    REMOTE_TILE_ARRIVE_BYTES = super::MAX_TILES * super::MAX_NODES * 8;
    REMOTE_TILE_ACK_OFFSET = REMOTE_TILE_ARRIVE_OFFSET + REMOTE_TILE_ARRIVE_BYTES;
    REMOTE_TILE_ACK_BYTES = super::MAX_TILES * super::MAX_NODES * 8;
    /// Landing boxes of tile reductions across nodes: `[MAX_CTAS]` areas of `TILE_BOX_AREA`
    /// bytes, area `c` used by whichever tile call runs on CTA `c` of this rank (the partners
    /// learn `c` from its acknowledgement word). Apart from the scratch: a whole-tensor call may
    /// fill a partner's scratch slice while that partner's same-index CTA is still in a tile call.
    TILE_BOX_OFFSET = REMOTE_TILE_ACK_OFFSET + REMOTE_TILE_ACK_BYTES;
    TILE_BOX_AREA = 8192;
    TILE_BOX_BYTES = super::MAX_CTAS * TILE_BOX_AREA;
    /// What each rank announces with its arrival at a call's first barrier (`call_id`):
    /// `[MAX_CTAS][MAX_RANKS]` u64; slot `[cta][p]` is written by rank `p` just before its
    /// barrier flag `[cta][p]`.
    BARRIER_ID_OFFSET = TILE_BOX_OFFSET + TILE_BOX_BYTES;
    BARRIER_ID_BYTES = super::MAX_CTAS * super::MAX_RANKS * 8;
    /// The same for tile-scoped calls: `[MAX_TILES][MAX_RANKS]` u64.
    TILE_BARRIER_ID_OFFSET = BARRIER_ID_OFFSET + BARRIER_ID_BYTES;
    TILE_BARRIER_ID_BYTES = super::MAX_TILES * super::MAX_RANKS * 8;
    /// The smallest signal region a context may carry.
    MIN_BYTES = TILE_BARRIER_ID_OFFSET + TILE_BARRIER_ID_BYTES;
    /// The LL receive area of small tile all-reduces (`transport::tile_inbox`), past `MIN_BYTES`:
    /// a context whose signal region ends before `FULL_BYTES` runs every tile all-reduce
    /// two-shot (as one over torch's signal pads of `MIN_BYTES` does). `[MAX_LL_TILES][2]` halves,
    /// each `[world - 1]` boxes (one per source rank, this rank skipped) of packets, as many as
    /// fit: 16 KiB of tile data per box at world 2, 8 KiB at 3, 5.3 KiB at 4, 2.3 KiB at 8.
    TILE_LL_OFFSET = MIN_BYTES;
    TILE_LL_BYTES = 16 << 20;
    /// The signal region the host allocates: everything above.
    FULL_BYTES = TILE_LL_OFFSET + TILE_LL_BYTES;
}}

/// `(name, byte offset, bytes)` of `SymmContext`'s fields, for the layout test and the Python
/// projection.
macro_rules! context_fields {
    ($($field:ident: $bytes:expr),* $(,)?) => {
        &[$((stringify!($field), core::mem::offset_of!(SymmContext, $field), $bytes)),*]
    };
}
pub const CONTEXT_FIELDS: &[(&str, usize, usize)] = context_fields![
    magic: 4,
    version: 4,
    backend: 4,
    rank: 4,
    world_size: 4,
    error: 4,
    error_detail: 4,
    node_size: 4,
    heap_size: 8,
    signal_size: 8,
    scratch_size: 8,
    timeout_ns: 8,
    ar_one_shot_max_bytes: 8,
    ar_ll_max_bytes: 8,
    gather_ll_max_bytes: 8,
    peer_heap: 8 * MAX_RANKS,
    peer_signal: 8 * MAX_RANKS,
    peer_scratch: 8 * MAX_RANKS,
    heap_digest: 8,
];
pub const CONTEXT_SIZE: usize = core::mem::size_of::<SymmContext>();

/// One exported device function: its C name, argument names and types, and return type,
/// as LLVM type names (`i32`, `i64`). Generated by the `exports!` macro from the functions
/// themselves, so it cannot drift from them.
#[derive(Clone, Copy, Debug)]
pub struct FnSig {
    pub name: &'static str,
    pub args: &'static [(&'static str, &'static str)],
    pub ret: &'static str,
    pub doc: &'static str,
}
