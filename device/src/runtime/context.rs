//! Validating the context pointer that every device function receives, and recording errors in it.

use crate::abi::{backend, status, SymmContext, ABI_VERSION, CTX_MAGIC, MAX_RANKS};
use crate::hw;
use crate::runtime::nodes::{self, Nodes};

/// Checks `ctx` and returns the context it points to, or the status code that explains why not.
///
/// A null pointer gives `NULL_CONTEXT`; a pointer to something that is not an ironlink context
/// (wrong magic, a backend kind this build does not serve, rank or world out of range) gives
/// `UNKNOWN_CONTEXT` (so does a `node_size` that does not divide the world); a context from
/// another ABI version gives `ABI_MISMATCH`.
///
/// P2P and NVSHMEM contexts are served by the same code: both describe every peer's regions by
/// their address in this process; the host builds an NVSHMEM context only when every peer has
/// one (one node: NVSHMEM's pointer to every peer is non-null).
#[inline(always)]
pub fn context<'a>(ctx: i64) -> Result<&'a SymmContext, i32> {
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
    if c.world_size < 1 || c.world_size as usize > MAX_RANKS || c.rank < 0 || c.rank >= c.world_size
    {
        return Err(status::UNKNOWN_CONTEXT);
    }
    // node_size is checked where it is used (`one_node`'s multi-node branch, `multi_node`):
    // checked here, in every function's prologue, its code made all_gather spill on sm_90.
    match c.backend {
        // The host writes an NVSHMEM context only when every peer is mapped (it refuses to
        // build one otherwise, naming the ranks). Checking the 24 addresses here too pushed the
        // register allocation of reduce_scatter and tile_reduce_scatter on sm_100 into spills.
        backend::P2P | backend::NVSHMEM => Ok(c),
        _ => Err(status::UNKNOWN_CONTEXT),
    }
}

/// Records `code` in the context (the first error wins) so the host can raise it after the kernel.
#[inline(always)]
pub fn record_error(c: &SymmContext, code: i32, which: i32) {
    let err = &c.error as *const i32 as *mut u32;
    // SAFETY: `error` is a 4-byte aligned field of a live context; only accessed atomically.
    if unsafe { hw::atomic_cas_u32(err, 0, code as u32) } == 0 {
        let detail = &c.error_detail as *const i32 as *mut u32;
        // SAFETY: as above.
        unsafe { hw::store_relaxed_u32(detail, which as u32) };
    }
}

/// `Err(PEER_NOT_MAPPED)` when `peer` is on another node than this rank: such peers are reached
/// only through the remote transport, even where their memory happens to be mapped here.
#[inline(always)]
pub fn one_node_with(c: &SymmContext, peer: usize) -> Result<(), i32> {
    if c.node_size == 0 || c.node_size as i32 == c.world_size {
        return Ok(());
    }
    if Nodes::of(multi_node(c)?).same_node(peer) {
        Ok(())
    } else {
        Err(status::PEER_NOT_MAPPED)
    }
}

/// `Err(UNSUPPORTED_OP)` for a context of more than one node: what every collective without a
/// multi-node version returns (all-reduce has one, `collectives::hierarchical`).
#[inline(always)]
pub fn one_node(c: &SymmContext) -> Result<&SymmContext, i32> {
    // No division here (`Nodes::of` divides): this gate sits in every collective's prologue,
    // and the extra registers made reduce_scatter spill. `context` checked that node_size
    // divides the world.
    if c.node_size != 0 && c.node_size as i32 != c.world_size {
        Err(multi_node(c).err().unwrap_or(status::UNSUPPORTED_OP))
    } else {
        Ok(c)
    }
}

/// `UNKNOWN_CONTEXT` unless `node_size` groups the world into whole nodes: what a function
/// serving several nodes checks before it uses the grouping.
#[inline(always)]
pub fn multi_node(c: &SymmContext) -> Result<&SymmContext, i32> {
    if nodes::valid(c.node_size, c.world_size) {
        Ok(c)
    } else {
        Err(status::UNKNOWN_CONTEXT)
    }
}

/// The local address `ptr` translated to the same byte in `peer`'s user-buffer region, if
/// `[ptr, ptr + len)` lies inside this rank's region.
#[inline(always)]
pub fn peer_address(c: &SymmContext, ptr: u64, len: u64, peer: i32) -> Result<u64, i32> {
    if peer < 0 || peer >= c.world_size {
        return Err(status::INVALID_ARGUMENT);
    }
    one_node_with(c, peer as usize)?;
    let base = c.heap_base(c.rank as usize) as u64;
    let off = ptr.wrapping_sub(base);
    if ptr < base || off > c.heap_size || len > c.heap_size - off {
        return Err(status::OUT_OF_BOUNDS);
    }
    Ok(c.heap_base(peer as usize) as u64 + off)
}
