//! Validating the context pointer that every device function receives, and recording errors in it.

use crate::abi::{
    backend, is_failure_among_ranks, status, SymmContext, ABI_VERSION, CTX_MAGIC, MAX_NODES,
    MAX_RANKS, MAX_WORLD,
};
use crate::hw;
use crate::runtime::nodes::Nodes;

/// Checks `ctx` and returns the context it points to, or the status code that explains why not:
/// what every one-node function (all but the queries and the `*_hierarchical` collectives) calls.
///
/// A null pointer gives `NULL_CONTEXT`; a pointer to something that is not an ironlink context
/// (wrong magic, a backend kind this build does not serve, rank or world out of range) gives
/// `UNKNOWN_CONTEXT`; a context from another ABI version gives `ABI_MISMATCH`; a multi-node
/// context (`backend::NVSHMEM_MULTI_NODE`) gives `UNSUPPORTED_OP`.
///
/// P2P and NVSHMEM contexts are served by the same code: both describe every peer's regions by
/// their address in this process; the host builds an NVSHMEM context only when every peer has
/// one (one node: NVSHMEM's pointer to every peer is non-null).
#[inline(always)]
pub fn context<'a>(ctx: i64) -> Result<&'a SymmContext, i32> {
    let c = header(ctx)?;
    if c.world_size < 1 || c.world_size as usize > MAX_RANKS || c.rank < 0 || c.rank >= c.world_size
    {
        return Err(refused(c));
    }
    match c.backend {
        // The host writes an NVSHMEM context only when every peer is mapped (it refuses to
        // build one otherwise, naming the ranks). Checking the 24 addresses here too pushed the
        // register allocation of reduce_scatter and tile_reduce_scatter on sm_100 into spills.
        backend::P2P | backend::NVSHMEM => Ok(c),
        _ => Err(refused(c)),
    }
}

/// `context` for the functions that also serve multi-node contexts: those with a rank count up
/// to MAX_WORLD whose `node_size` (1 to MAX_RANKS, dividing the world into at most MAX_NODES
/// nodes) groups the ranks; otherwise `UNKNOWN_CONTEXT`.
#[inline(always)]
pub fn any_context<'a>(ctx: i64) -> Result<&'a SymmContext, i32> {
    let c = header(ctx)?;
    if c.backend != backend::NVSHMEM_MULTI_NODE {
        // The header is checked again inside: splitting `context` into header + the rest, to
        // share the rest here, made symm_all_reduce spill 64 bytes on sm_80 (127 -> 128 registers).
        return context(ctx);
    }
    let (world, size) = (c.world_size, c.node_size as i32);
    let whole_nodes = size >= 1 && size as usize <= MAX_RANKS && world % size == 0;
    if !whole_nodes || world as usize > MAX_WORLD || world / size > MAX_NODES as i32 {
        return Err(status::UNKNOWN_CONTEXT);
    }
    if c.rank < 0 || c.rank >= world {
        return Err(status::UNKNOWN_CONTEXT);
    }
    Ok(c)
}

/// The checks every context passes first: not null, ironlink's magic, this ABI version.
#[inline(always)]
fn header<'a>(ctx: i64) -> Result<&'a SymmContext, i32> {
    if ctx == 0 {
        return Err(status::NULL_CONTEXT);
    }
    // SAFETY: the caller passes the device address of a context it obtained from the host crate
    // (or a foreign context whose first words we only compare). The context is immutable while
    // kernels run, except `error`, which is only accessed atomically.
    let c = unsafe { &*(ctx as *const SymmContext) };
    if c.magic != CTX_MAGIC {
        return Err(status::UNKNOWN_CONTEXT);
    }
    if c.version != ABI_VERSION {
        return Err(status::ABI_MISMATCH);
    }
    Ok(c)
}

/// Why `context` refuses `c`: a multi-node context is a real one that the function has no
/// version for; anything else is not a context this build serves. (Only on the error path.)
#[inline(always)]
fn refused(c: &SymmContext) -> i32 {
    if c.backend == backend::NVSHMEM_MULTI_NODE {
        status::UNSUPPORTED_OP
    } else {
        status::UNKNOWN_CONTEXT
    }
}

/// Records `code` in the context (the first error wins) so the host can raise it after the kernel;
/// returns the error that stands: `code`, or the one recorded before it. A failure among ranks
/// (`TIMEOUT`, `GRID_MISMATCH`, `HEAP_ASYMMETRIC`) also sets the context's wait timeout to 0: the
/// ranks' calls no longer match (docs/reliability.md: close the heap), so every wait that begins
/// after it gives up at once instead of spinning out the timeout (a CUDA graph of many calls
/// after a lost peer ends in one timeout, not one each), the device library's (`sync::Deadline`)
/// and the Triton-level polls (`language/_flags.py`, which records the same way) alike, with
/// nothing added to a wait's set-up. The host puts the timeout back when it clears the error.
/// Other errors (a bad argument on this rank) do not stop the peers' calls and leave it alone.
#[inline(always)]
pub fn record_error(c: &SymmContext, code: i32, which: i32) -> i32 {
    let err = &c.error as *const i32 as *mut u32;
    // SAFETY: `error` is a 4-byte aligned field of a live context; only accessed atomically.
    let before = unsafe { hw::atomic_cas_u32(err, 0, code as u32) };
    if before == 0 {
        let detail = &c.error_detail as *const i32 as *mut u32;
        // SAFETY: as above.
        unsafe { hw::store_relaxed_u32(detail, which as u32) };
        if is_failure_among_ranks(code) {
            let timeout = &c.timeout_ns as *const u64 as *mut u64;
            // SAFETY: `timeout_ns` is an 8-byte aligned field of a live context; the device
            // accesses it atomically only (`wait_timeout_ns`).
            unsafe { hw::store_relaxed_u64(timeout, 0) };
        }
        return code;
    }
    before as i32
}

/// How long a wait that begins now may spin: the context's timeout, 0 once this rank has recorded
/// a failure among ranks that the host has not cleared (`record_error`).
#[inline(always)]
pub fn wait_timeout_ns(c: &SymmContext) -> u64 {
    // SAFETY: `timeout_ns` is an 8-byte aligned field of a live context; other CTAs write it atomically.
    unsafe { hw::load_relaxed_u64(&c.timeout_ns as *const u64) }
}

/// `record_error` for a cause found after its symptom: `GRID_MISMATCH`, which an LL wait finds
/// only once it times out, replaces a `TIMEOUT` that a CTA without a partner on the peer's grid
/// recorded first (its wait timed out because of the mismatch). Returns the error that stands.
#[cold]
#[inline(always)]
pub fn record_grid_mismatch(c: &SymmContext, which: i32) -> i32 {
    let standing = record_error(c, status::GRID_MISMATCH, which);
    if standing == status::TIMEOUT {
        let err = &c.error as *const i32 as *mut u32;
        // SAFETY: as in `record_error`.
        let before = unsafe {
            hw::atomic_cas_u32(err, status::TIMEOUT as u32, status::GRID_MISMATCH as u32)
        };
        if before == status::TIMEOUT as u32 || before == status::GRID_MISMATCH as u32 {
            let detail = &c.error_detail as *const i32 as *mut u32;
            // SAFETY: as above.
            unsafe { hw::store_relaxed_u32(detail, which as u32) };
            return status::GRID_MISMATCH;
        }
        return before as i32;
    }
    standing
}

/// The local address `ptr` translated to the same byte in `peer`'s user-buffer region, if
/// `[ptr, ptr + len)` lies inside this rank's region.
#[inline(always)]
pub fn peer_address(c: &SymmContext, ptr: u64, len: u64, peer: i32) -> Result<u64, i32> {
    if peer < 0 || peer >= c.world_size {
        return Err(status::INVALID_ARGUMENT);
    }
    if c.backend == backend::NVSHMEM_MULTI_NODE && !Nodes::of(c).same_node(peer as usize) {
        return Err(status::PEER_NOT_MAPPED); // reached only by the remote transport
    }
    let base = c.heap_base(c.rank as usize) as u64;
    let off = ptr.wrapping_sub(base);
    if ptr < base || off > c.heap_size || len > c.heap_size - off {
        return Err(status::OUT_OF_BOUNDS);
    }
    Ok(c.heap_base(peer as usize) as u64 + off)
}
