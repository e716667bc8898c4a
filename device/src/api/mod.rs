//! The exported device functions: the whole C ABI of the bitcode library. Each checks its
//! arguments and hands them to a collective (`crate::collectives`) or primitive.
//!
//! Every function is called by every thread of the CTA (Triton's scalar extern semantics) and is
//! CTA-cooperative: it elects threads and synchronizes by itself. All ranks must launch the same
//! grid and make the same sequence of calls. Status-returning functions give 0 on success and a
//! negative `abi::status` code otherwise; arguments are checked before anything is written.
//! Pointers are device addresses (Triton passes a tensor pointer as i64).

#[macro_use]
mod export_macro;
mod checks;
/// The NVSHMEM wrappers (functions in the NVSHMEM bitcode only; their table everywhere).
pub mod nvshmem;

use crate::abi::{status, SymmContext, ABI_VERSION, MAX_TILES};
use crate::collectives::{
    all_gather, all_reduce, all_to_all, all_to_all_v, broadcast, hierarchical, reduce,
    reduce_scatter, tile, tile_shape,
};
use crate::runtime::context as ctx;
use crate::runtime::elem::Reduction;
use crate::runtime::region::{overlap, Region};
use crate::runtime::sync::Call;
use crate::{hw, primitives};
use checks::{
    all_gather_regions, all_to_all_regions, all_to_all_v_plan, blocks, check_dtype, check_op_dtype,
    check_rank, reduce_regions, reduce_scatter_regions,
};
use tile_shape::{tile_index, Shape, Tile};

fn code(r: Result<(), i32>) -> i32 {
    match r {
        Ok(()) => status::OK,
        Err(e) => e,
    }
}

/// The shape shared by every collective: check the context, check the arguments (`prepare`,
/// which must not touch memory), then run `body` inside a call (epoch advanced, CTA synced).
/// A multi-node context gets UNSUPPORTED_OP from `ctx::context`'s backend check (a gate of its
/// own in this prologue, even two compares, made all_gather spill on sm_90/100).
#[inline(always)]
fn collective<P>(
    ctx: i64,
    which: i32,
    prepare: impl FnOnce(&SymmContext) -> Result<P, i32>,
    body: impl FnOnce(&Call, P) -> Result<(), i32>,
) -> i32 {
    code(call_in(ctx::context(ctx), which, prepare, body))
}

/// `collective` for one with a multi-node version (`symm_*_hierarchical`): serves every context.
#[inline(always)]
fn any_nodes_collective<P>(
    ctx: i64,
    which: i32,
    prepare: impl FnOnce(&SymmContext) -> Result<P, i32>,
    body: impl FnOnce(&Call, P) -> Result<(), i32>,
) -> i32 {
    code(call_in(ctx::any_context(ctx), which, prepare, body))
}

#[inline(always)]
fn call_in<P>(
    c: Result<&SymmContext, i32>,
    which: i32,
    prepare: impl FnOnce(&SymmContext) -> Result<P, i32>,
    body: impl FnOnce(&Call, P) -> Result<(), i32>,
) -> Result<(), i32> {
    c.and_then(|c| {
        let p = prepare(c)?;
        // Timing diagnostic "call_checked" (never in a normal build; results wrong): every call
        // returns once its context and arguments are checked, before `Call::begin`.
        if cfg!(ironlink_diag = "call_checked") {
            return Ok(());
        }
        let call = Call::begin(c, which)?;
        body(&call, p)
    })
}

/// The shape of every tile collective: check the context, the tile index and the arguments
/// (`prepare`, which must not touch memory and returns the body), then run the body in a tile call.
#[inline(always)]
fn tile_call<B: FnOnce(&Call) -> Result<(), i32>>(
    ctx: i64,
    which: i32,
    tile: i64,
    prepare: impl FnOnce(&SymmContext) -> Result<B, i32>,
) -> i32 {
    tile_call_in(ctx::context(ctx), which, tile, prepare)
}

/// `tile_call` for one with a multi-node version (`symm_tile_*_hierarchical`): serves every context.
#[inline(always)]
fn any_nodes_tile_call<B: FnOnce(&Call) -> Result<(), i32>>(
    ctx: i64,
    which: i32,
    tile: i64,
    prepare: impl FnOnce(&SymmContext) -> Result<B, i32>,
) -> i32 {
    tile_call_in(ctx::any_context(ctx), which, tile, prepare)
}

#[inline(always)]
fn tile_call_in<B: FnOnce(&Call) -> Result<(), i32>>(
    c: Result<&SymmContext, i32>,
    which: i32,
    tile: i64,
    prepare: impl FnOnce(&SymmContext) -> Result<B, i32>,
) -> i32 {
    let r = c.and_then(|c| {
        let index = tile_index(tile)?;
        let body = prepare(c)?;
        if cfg!(ironlink_diag = "call_checked") {
            return Ok(()); // as in `call_in`
        }
        body(&Call::begin_tile(c, which, index))
    });
    code(r)
}

/// Which end of a put/get is the symmetric address on the peer.
enum Side {
    Src,
    Dst,
}

/// `symm_put` (the destination is on `peer`) and `symm_get` (the source is): the symmetric end
/// is checked inside the heap and translated to the peer; the other end is the caller's memory.
fn peer_copy(
    ctx: i64,
    dst: i64,
    src: i64,
    nbytes: i64,
    peer: i32,
    remote: Side,
) -> Result<(), i32> {
    // Any context: a peer on another node of a multi-node one is PEER_NOT_MAPPED (peer_address).
    let c = ctx::any_context(ctx)?;
    if nbytes < 0 {
        return Err(status::INVALID_ARGUMENT);
    }
    let (mut dst, mut src) = (dst as u64, src as u64);
    match remote {
        Side::Dst => dst = ctx::peer_address(c, dst, nbytes as u64, peer)?,
        Side::Src => src = ctx::peer_address(c, src, nbytes as u64, peer)?,
    }
    // SAFETY: the remote end was checked inside the peer's heap; the local end is the caller's.
    unsafe { primitives::cta_copy(dst as usize, src as usize, nbytes as usize) };
    Ok(())
}

/// The context and `peer`'s copy of the u64 at `ptr` (this rank's heap, 8-byte aligned), for
/// `symm_signal_at` / `symm_signal_wait_at`.
fn heap_word<'a>(ctx: i64, ptr: i64, peer: i32) -> Result<(&'a SymmContext, *mut u64), i32> {
    let c = ctx::any_context(ctx)?;
    if !(ptr as u64).is_multiple_of(8) {
        return Err(status::MISALIGNED);
    }
    let word = ctx::peer_address(c, ptr as u64, 8, peer)?;
    Ok((c, word as *mut u64))
}

exports! {
    /// ABI version of this library (`abi::ABI_VERSION`); `unused` is ignored (Triton needs an argument).
    fn ironlink_abi_version(unused: i32) -> i32 {
        let _ = unused;
        ABI_VERSION as i32
    }

    /// This process's rank in the context's group, or a negative status.
    fn symm_rank(ctx: i64) -> i32 {
        match ctx::any_context(ctx) {
            Ok(c) => c.rank,
            Err(e) => e,
        }
    }

    /// Number of ranks in the context's group, or a negative status.
    fn symm_world_size(ctx: i64) -> i32 {
        match ctx::any_context(ctx) {
            Ok(c) => c.world_size,
            Err(e) => e,
        }
    }

    /// The address of the same byte as `ptr` in `peer`'s copy of the symmetric heap.
    /// Returns 0 when `ptr` is not inside the local heap, `peer` is out of range or on another
    /// node, or the context is bad.
    fn symm_peer_ptr(ctx: i64, ptr: i64, peer: i32) -> i64 {
        let r = ctx::any_context(ctx).and_then(|c| ctx::peer_address(c, ptr as u64, 0, peer));
        match r {
            Ok(a) => a as i64,
            Err(_) => 0,
        }
    }

    /// Like `symm_peer_ptr`, but returns the negative status instead of 0 on failure
    /// (`OUT_OF_BOUNDS` when `[ptr, ptr + nbytes)` leaves the heap, `INVALID_ARGUMENT` for a bad peer,
    /// `PEER_NOT_MAPPED` for a peer on another node).
    fn symm_peer_ptr_checked(ctx: i64, ptr: i64, nbytes: i64, peer: i32) -> i64 {
        if nbytes < 0 {
            return status::INVALID_ARGUMENT as i64;
        }
        match ctx::any_context(ctx).and_then(|c| ctx::peer_address(c, ptr as u64, nbytes as u64, peer)) {
            Ok(a) => a as i64,
            Err(e) => e as i64,
        }
    }

    /// The first error a device function recorded in the context (0 if none), or a negative
    /// status for a bad context. The host clears it.
    fn symm_last_error(ctx: i64) -> i32 {
        match ctx::any_context(ctx) {
            Ok(c) => c.error,
            Err(e) => e,
        }
    }

    /// In-place all-reduce of `num_elements` elements at `local_ptr + byte_offset` (torch_symm's
    /// signature). Result bitwise identical on all ranks; fp16/bf16 accumulate in fp32.
    fn symm_all_reduce(ctx: i64, local_ptr: i64, byte_offset: i64, num_elements: i64, reduce_op: i32, dtype: i32) -> i32 {
        if cfg!(ironlink_diag = "call_entry") {
            return status::OK; // as in symm_tile_all_reduce
        }
        collective(
            ctx,
            which!(symm_all_reduce),
            |c| Region::new(c, local_ptr, byte_offset, num_elements, check_op_dtype(reduce_op, dtype)?),
            |call, r| all_reduce::all_reduce(call, &r, &Reduction { op: reduce_op, dtype }),
        )
    }

    /// `symm_all_reduce` for a context of any number of nodes: a node-local reduce-scatter over
    /// NVLink, an exchange of each shard with the same local rank of every other node (NVSHMEM
    /// put-with-signal; the NVSHMEM bitcode only, else PEER_NOT_MAPPED), a node-local all-gather.
    /// Needs a scratch region (INVALID_ARGUMENT without). On one node it is a two-shot
    /// all-reduce. Results bitwise identical on all ranks; with more than one rank per node they
    /// may differ from `symm_all_reduce`'s by rounding (each node's partial sum is rounded to
    /// the dtype). AVG sums and divides once by the world size.
    fn symm_all_reduce_hierarchical(ctx: i64, local_ptr: i64, byte_offset: i64, num_elements: i64, reduce_op: i32, dtype: i32) -> i32 {
        any_nodes_collective(
            ctx,
            which!(symm_all_reduce_hierarchical),
            |c| Region::new(c, local_ptr, byte_offset, num_elements, check_op_dtype(reduce_op, dtype)?),
            |call, r| hierarchical::all_reduce::all_reduce(call, &r, &Reduction { op: reduce_op, dtype }),
        )
    }

    /// Reduce-scatter: `out_ptr` (num_elements) gets the reduction over ranks of block `rank` of
    /// `in_ptr` (world * num_elements). `out` may be this rank's block of `in`; no other overlap.
    fn symm_reduce_scatter(ctx: i64, in_ptr: i64, out_ptr: i64, num_elements: i64, reduce_op: i32, dtype: i32) -> i32 {
        collective(
            ctx,
            which!(symm_reduce_scatter),
            |c| reduce_scatter_regions(c, in_ptr, out_ptr, num_elements, check_op_dtype(reduce_op, dtype)?),
            |call, (input, out)| reduce_scatter::reduce_scatter(call, &input, &out, &Reduction { op: reduce_op, dtype }),
        )
    }

    /// `symm_reduce_scatter` for a context of any number of nodes: each node's partial of every
    /// block, reduced over the node's NVLink, is exchanged with the same local rank of every other
    /// node (NVSHMEM put-with-signal through the scratch; the NVSHMEM bitcode only, else
    /// PEER_NOT_MAPPED) and reduced by the block's owner. Needs a scratch region with several
    /// nodes (INVALID_ARGUMENT without). AVG sums and divides once by the world size.
    fn symm_reduce_scatter_hierarchical(ctx: i64, in_ptr: i64, out_ptr: i64, num_elements: i64, reduce_op: i32, dtype: i32) -> i32 {
        any_nodes_collective(
            ctx,
            which!(symm_reduce_scatter_hierarchical),
            |c| reduce_scatter_regions(c, in_ptr, out_ptr, num_elements, check_op_dtype(reduce_op, dtype)?),
            |call, (input, out)| hierarchical::reduce_scatter::reduce_scatter(call, &input, &out, &Reduction { op: reduce_op, dtype }),
        )
    }

    /// All-gather: block p of `out_ptr` (world * num_elements) gets rank p's `in_ptr`
    /// (num_elements). In place when `in_ptr` is this rank's block of `out_ptr`.
    fn symm_all_gather(ctx: i64, in_ptr: i64, out_ptr: i64, num_elements: i64, dtype: i32) -> i32 {
        collective(
            ctx,
            which!(symm_all_gather),
            // `all_gather_regions`' checks, written out: calling it (even inlined) made this
            // function spill 8 bytes on sm_90/100; the other collectives call theirs.
            |c| {
                let es = check_dtype(dtype)?;
                let input = Region::new(c, in_ptr, 0, num_elements, es)?;
                let out = blocks(c, out_ptr, num_elements, es)?;
                let mine = out.sub(c.rank as usize * input.bytes, input.bytes);
                if overlap(&input, &out) && input.offset != mine.offset {
                    return Err(status::INVALID_ARGUMENT);
                }
                Ok((input, out))
            },
            |call, (input, out)| all_gather::all_gather(call, &input, &out),
        )
    }

    /// `symm_all_gather` for a context of any number of nodes: the input is put straight into
    /// the output of the same local rank of every other node (NVSHMEM put-with-signal; the
    /// NVSHMEM bitcode only, else PEER_NOT_MAPPED), and every rank pushes what it holds over its
    /// node's NVLink.
    fn symm_all_gather_hierarchical(ctx: i64, in_ptr: i64, out_ptr: i64, num_elements: i64, dtype: i32) -> i32 {
        any_nodes_collective(
            ctx,
            which!(symm_all_gather_hierarchical),
            |c| all_gather_regions(c, in_ptr, out_ptr, num_elements, check_dtype(dtype)?),
            |call, (input, out)| hierarchical::all_gather::all_gather(call, &input, &out),
        )
    }

    /// Broadcast in place: every rank's `ptr` (num_elements) gets `root`'s.
    fn symm_broadcast(ctx: i64, ptr: i64, num_elements: i64, dtype: i32, root: i32) -> i32 {
        collective(
            ctx,
            which!(symm_broadcast),
            |c| Ok((Region::new(c, ptr, 0, num_elements, check_dtype(dtype)?)?, check_rank(c, root)?)),
            |call, (r, root)| broadcast::broadcast(call, &r, root),
        )
    }

    /// `symm_broadcast` for a context of any number of nodes: the root puts its buffer straight
    /// into the same local rank of every other node (NVSHMEM put-with-signal; the NVSHMEM
    /// bitcode only, else PEER_NOT_MAPPED), which pushes it to its node over NVLink.
    fn symm_broadcast_hierarchical(ctx: i64, ptr: i64, num_elements: i64, dtype: i32, root: i32) -> i32 {
        any_nodes_collective(
            ctx,
            which!(symm_broadcast_hierarchical),
            |c| Ok((Region::new(c, ptr, 0, num_elements, check_dtype(dtype)?)?, check_rank(c, root)?)),
            |call, (r, root)| hierarchical::broadcast::broadcast(call, &r, root),
        )
    }

    /// Reduce to `root`: root's `out_ptr` gets the reduction over ranks of `in_ptr`
    /// (num_elements each; `out` may equal `in`). Other ranks' `out` is not written.
    fn symm_reduce(ctx: i64, in_ptr: i64, out_ptr: i64, num_elements: i64, reduce_op: i32, dtype: i32, root: i32) -> i32 {
        collective(
            ctx,
            which!(symm_reduce),
            |c| {
                let (input, out) = reduce_regions(c, in_ptr, out_ptr, num_elements, check_op_dtype(reduce_op, dtype)?)?;
                Ok((input, out, check_rank(c, root)?))
            },
            |call, (input, out, root)| reduce::reduce(call, &input, &out, &Reduction { op: reduce_op, dtype }, root),
        )
    }

    /// `symm_reduce` for a context of any number of nodes: each node's partial of shard l (reduced
    /// over its NVLink) goes to the rank with local index l on the root's node (NVSHMEM
    /// put-with-signal through the scratch; the NVSHMEM bitcode only, else PEER_NOT_MAPPED),
    /// which reduces the partials in node order and stores into the root's `out`. Needs a
    /// scratch region with several nodes (INVALID_ARGUMENT without). AVG divides once by the
    /// world size.
    fn symm_reduce_hierarchical(ctx: i64, in_ptr: i64, out_ptr: i64, num_elements: i64, reduce_op: i32, dtype: i32, root: i32) -> i32 {
        any_nodes_collective(
            ctx,
            which!(symm_reduce_hierarchical),
            |c| {
                let (input, out) = reduce_regions(c, in_ptr, out_ptr, num_elements, check_op_dtype(reduce_op, dtype)?)?;
                Ok((input, out, check_rank(c, root)?))
            },
            |call, (input, out, root)| hierarchical::reduce::reduce(call, &input, &out, &Reduction { op: reduce_op, dtype }, root),
        )
    }

    /// All-to-all with equal splits: block p of `out_ptr` gets block `rank` of rank p's `in_ptr`
    /// (both world * num_elements; they must not overlap).
    fn symm_all_to_all(ctx: i64, in_ptr: i64, out_ptr: i64, num_elements: i64, dtype: i32) -> i32 {
        collective(
            ctx,
            which!(symm_all_to_all),
            |c| all_to_all_regions(c, in_ptr, out_ptr, num_elements, check_dtype(dtype)?),
            |call, (input, out, n)| all_to_all::all_to_all(call, &input, &out, n),
        )
    }

    /// `symm_all_to_all` for a context of any number of nodes: the blocks a node sends to a rank
    /// of another node are gathered over NVLink by the rank with its local index, put in one
    /// piece per round through the scratch (NVSHMEM put-with-signal; the NVSHMEM bitcode only,
    /// else PEER_NOT_MAPPED) and copied into place; blocks within the node go over NVLink. Needs
    /// a scratch region with several nodes (INVALID_ARGUMENT without).
    fn symm_all_to_all_hierarchical(ctx: i64, in_ptr: i64, out_ptr: i64, num_elements: i64, dtype: i32) -> i32 {
        any_nodes_collective(
            ctx,
            which!(symm_all_to_all_hierarchical),
            |c| all_to_all_regions(c, in_ptr, out_ptr, num_elements, check_dtype(dtype)?),
            |call, (input, out, n)| hierarchical::all_to_all::all_to_all(call, &input, &out, n),
        )
    }

    /// All-to-all with variable splits whose counts are in device memory (no host involvement).
    /// `send_counts_ptr` ([world] i64, in the heap: the peers read it) gives the rows of
    /// `row_elements` elements this rank sends to each rank, taken from `in_ptr` (room for
    /// `in_rows` rows; the counts must sum to at most that) in rank order. Rank p's rows land in
    /// `out_ptr` (room for `out_rows` rows) in sender rank order; `recv_counts_ptr` /
    /// `recv_offsets_ptr` ([world] i64 each, in the heap) get the rows received from each rank and
    /// where they start. CAPACITY_EXCEEDED (every rank; recorded) when some rank would receive
    /// more than `out_rows` rows: then only the receive counts and offsets are written.
    fn symm_all_to_all_v(ctx: i64, in_ptr: i64, in_rows: i64, send_counts_ptr: i64, out_ptr: i64, out_rows: i64, recv_counts_ptr: i64, recv_offsets_ptr: i64, row_elements: i64, dtype: i32) -> i32 {
        collective(
            ctx,
            which!(symm_all_to_all_v),
            |c| all_to_all_v_plan(c, (in_ptr, in_rows), send_counts_ptr, (out_ptr, out_rows), (recv_counts_ptr, recv_offsets_ptr), row_elements, dtype),
            |call, plan| all_to_all_v::all_to_all_v(call, &plan),
        )
    }

    /// `symm_all_to_all_v` for a context of any number of nodes: counts exchanged with the
    /// partners, node-local pushes, cross-node streams in rounds through the scratch. On several
    /// nodes it needs a scratch slice that holds the `world` x `world` count matrix and a unit
    /// per box (`INVALID_ARGUMENT` otherwise). On one node the one-node algorithm.
    fn symm_all_to_all_v_hierarchical(ctx: i64, in_ptr: i64, in_rows: i64, send_counts_ptr: i64, out_ptr: i64, out_rows: i64, recv_counts_ptr: i64, recv_offsets_ptr: i64, row_elements: i64, dtype: i32) -> i32 {
        any_nodes_collective(
            ctx,
            which!(symm_all_to_all_v_hierarchical),
            |c| all_to_all_v_plan(c, (in_ptr, in_rows), send_counts_ptr, (out_ptr, out_rows), (recv_counts_ptr, recv_offsets_ptr), row_elements, dtype),
            |call, plan| hierarchical::all_to_all_v::all_to_all_v(call, &plan),
        )
    }

    /// Barrier among the same-index CTAs of all ranks; memory written before it by this CTA is
    /// visible to the peers' CTAs after it.
    fn symm_barrier(ctx: i64) -> i32 {
        collective(ctx, which!(symm_barrier), |_| Ok(()), |call, ()| call.barrier(0))
    }

    /// `symm_barrier` for a context of any number of nodes: a node barrier, a signal to and from
    /// the same local rank of every other node (NVSHMEM; the NVSHMEM bitcode only, else
    /// PEER_NOT_MAPPED) after this CTA's puts have landed, a node barrier. Stores and puts this
    /// CTA made before it are visible to the same-index CTA of every rank after it.
    fn symm_barrier_hierarchical(ctx: i64) -> i32 {
        any_nodes_collective(ctx, which!(symm_barrier_hierarchical), |_| Ok(()), |call, ()| hierarchical::barrier::barrier(call))
    }

    /// Barrier among all CTAs of this rank's launch (not across ranks): what any CTA wrote before
    /// it is visible to every CTA after it. The grid must be resident at once: more CTAs than the
    /// GPU has SMs gives INVALID_ARGUMENT; CTAs that cannot all be resident give TIMEOUT. Serves
    /// multi-node contexts too (it touches only this rank's signal region).
    fn symm_grid_barrier(ctx: i64) -> i32 {
        code(ctx::any_context(ctx).and_then(|c| crate::runtime::grid::grid_barrier(c, which!(symm_grid_barrier))))
    }

    /// Tile all-reduce, in place, by this CTA alone: the `rows` x `cols` elements at `ptr`, rows
    /// `row_stride` elements apart, with tile `tile` (< MAX_TILES) of every rank. Any CTA may run
    /// any tile; every rank must call each tile index the same number of times with the same
    /// shape. Small tiles go one-shot over LL packets (no barrier), the others two-shot.
    fn symm_tile_all_reduce(ctx: i64, ptr: i64, rows: i64, cols: i64, row_stride: i64, tile: i64, reduce_op: i32, dtype: i32) -> i32 {
        // Timing diagnostic, never in a normal build (`bench/probes/diag_build.sh`; results wrong):
        // "call_entry" returns before anything, the cost of calling at all.
        if cfg!(ironlink_diag = "call_entry") {
            return status::OK;
        }
        tile_call(ctx, which!(symm_tile_all_reduce), tile, |c| {
            let t = Tile::new(c, ptr, Shape { rows, cols, row_stride }, check_op_dtype(reduce_op, dtype)?)?;
            Ok(move |call: &Call| tile::all_reduce(call, &t, &Reduction { op: reduce_op, dtype }))
        })
    }

    /// `symm_tile_all_reduce` on a context of any number of nodes: node reduce-scatter of the
    /// tile, exchange of the node partials with the same local rank of every other node over
    /// NVSHMEM (boxes in the signal region, the CTA's index told in each round; the grid must have
    /// at most MAX_CTAS CTAs), node all-gather. The NVSHMEM bitcode; PEER_NOT_MAPPED in the P2P
    /// one on several nodes. On one node the one-node algorithm.
    fn symm_tile_all_reduce_hierarchical(ctx: i64, ptr: i64, rows: i64, cols: i64, row_stride: i64, tile: i64, reduce_op: i32, dtype: i32) -> i32 {
        any_nodes_tile_call(ctx, which!(symm_tile_all_reduce_hierarchical), tile, |c| {
            let t = Tile::new(c, ptr, Shape { rows, cols, row_stride }, check_op_dtype(reduce_op, dtype)?)?;
            Ok(move |call: &Call| hierarchical::tile::all_reduce(call, &t, &Reduction { op: reduce_op, dtype }))
        })
    }

    /// Tile all-gather, in place, by this CTA alone: `world` blocks of `rows` x `cols` elements
    /// (rows `row_stride` apart), block p at `ptr + p * block_stride` elements; every rank's block
    /// p gets rank p's. Blocks may be stacked or interleaved but must not overlap.
    fn symm_tile_all_gather(ctx: i64, ptr: i64, rows: i64, cols: i64, row_stride: i64, block_stride: i64, tile: i64, dtype: i32) -> i32 {
        tile_call(ctx, which!(symm_tile_all_gather), tile, |c| {
            let shape = Shape { rows, cols, row_stride };
            let (t, block) = Tile::with_blocks(c, ptr, shape, block_stride, c.world_size as usize, check_dtype(dtype)?)?;
            Ok(move |call: &Call| tile::all_gather(call, &t, block))
        })
    }

    /// `symm_tile_all_gather` on a context of any number of nodes: the blocks of this node over
    /// stores, those of other nodes put by NVSHMEM straight into the tile (the NVSHMEM bitcode;
    /// PEER_NOT_MAPPED on several nodes in the P2P one). On one node the one-node algorithm.
    fn symm_tile_all_gather_hierarchical(ctx: i64, ptr: i64, rows: i64, cols: i64, row_stride: i64, block_stride: i64, tile: i64, dtype: i32) -> i32 {
        any_nodes_tile_call(ctx, which!(symm_tile_all_gather_hierarchical), tile, |c| {
            let shape = Shape { rows, cols, row_stride };
            let (t, block) = Tile::with_blocks(c, ptr, shape, block_stride, c.world_size as usize, check_dtype(dtype)?)?;
            Ok(move |call: &Call| hierarchical::tile::all_gather(call, &t, block))
        })
    }

    /// Tile reduce-scatter by this CTA alone: `in_ptr` holds `world` blocks as in
    /// `symm_tile_all_gather`; `out_ptr` (one block's shape) gets block `rank` reduced over ranks.
    /// `out_ptr` may be this rank's block of the input; no other overlap.
    fn symm_tile_reduce_scatter(ctx: i64, in_ptr: i64, out_ptr: i64, rows: i64, cols: i64, row_stride: i64, block_stride: i64, tile: i64, reduce_op: i32, dtype: i32) -> i32 {
        tile_call(ctx, which!(symm_tile_reduce_scatter), tile, |c| {
            let es = check_op_dtype(reduce_op, dtype)?;
            let (shape, world) = (Shape { rows, cols, row_stride }, c.world_size as usize);
            let (input, block) = Tile::with_blocks(c, in_ptr, shape, block_stride, world, es)?;
            let out = Tile::new(c, out_ptr, shape, es)?;
            tile::check_scatter_overlap(&input, &out, block, c.rank as usize, world)?;
            Ok(move |call: &Call| tile::reduce_scatter(call, &input, &out, block, &Reduction { op: reduce_op, dtype }))
        })
    }

    /// `symm_tile_reduce_scatter` on a context of any number of nodes: each rank's node partial
    /// of each partner's block goes to that partner over NVSHMEM, which reduces them in node
    /// order (boxes and grid as `symm_tile_all_reduce_hierarchical`). On one node the one-node
    /// algorithm.
    fn symm_tile_reduce_scatter_hierarchical(ctx: i64, in_ptr: i64, out_ptr: i64, rows: i64, cols: i64, row_stride: i64, block_stride: i64, tile: i64, reduce_op: i32, dtype: i32) -> i32 {
        any_nodes_tile_call(ctx, which!(symm_tile_reduce_scatter_hierarchical), tile, |c| {
            let es = check_op_dtype(reduce_op, dtype)?;
            let (shape, world) = (Shape { rows, cols, row_stride }, c.world_size as usize);
            let (input, block) = Tile::with_blocks(c, in_ptr, shape, block_stride, world, es)?;
            let out = Tile::new(c, out_ptr, shape, es)?;
            tile::check_scatter_overlap(&input, &out, block, c.rank as usize, world)?;
            Ok(move |call: &Call| hierarchical::tile::reduce_scatter(call, &input, &out, block, &Reduction { op: reduce_op, dtype }))
        })
    }

    /// Push-as-produced: copies the `rows` x `cols` tile at local `src_ptr` (rows `row_stride`
    /// elements apart) to the symmetric `dst_ptr` (same layout) on `peer`, then signals tile
    /// `tile` to that peer (as `symm_tile_signal`). `src_ptr` is not checked against the heap.
    fn symm_tile_put(ctx: i64, dst_ptr: i64, src_ptr: i64, rows: i64, cols: i64, row_stride: i64, tile: i64, peer: i32, dtype: i32) -> i32 {
        let r = ctx::context(ctx).and_then(|c| {
            let es = check_dtype(dtype)?;
            let t = Tile::new(c, dst_ptr, Shape { rows, cols, row_stride }, es)?;
            let (index, peer) = (tile_index(tile)?, check_rank(c, peer)?);
            if !(src_ptr as u64).is_multiple_of(es as u64) {
                return Err(status::MISALIGNED);
            }
            // SAFETY: the destination tile was checked in the heap; the source is the caller's.
            unsafe { tile::put(c, &t, src_ptr as usize, peer) };
            primitives::tile_signal(c, index, peer);
            Ok(())
        });
        code(r)
    }

    /// Push-as-produced: tells `peer` that this CTA's earlier writes for tile `tile` (stores
    /// through `symm_peer_ptr`, `symm_put`, TMA stores) are visible to it. Pairs with one
    /// `symm_tile_wait`.
    fn symm_tile_signal(ctx: i64, tile: i64, peer: i32) -> i32 {
        let r = ctx::context(ctx).and_then(|c| {
            let (index, peer) = (tile_index(tile)?, check_rank(c, peer)?);
            primitives::tile_signal(c, index, peer);
            Ok(())
        });
        code(r)
    }

    /// Push-as-produced: waits for the next signal of tile `tile` from `peer` (signals are
    /// counted: each wait takes one); what the peer wrote before it is then visible to this CTA.
    /// TIMEOUT (recorded) after the context's timeout.
    fn symm_tile_wait(ctx: i64, tile: i64, peer: i32) -> i32 {
        let r = ctx::context(ctx).and_then(|c| {
            let (index, peer) = (tile_index(tile)?, check_rank(c, peer)?);
            primitives::tile_wait(c, index, peer, which!(symm_tile_wait))
        });
        code(r)
    }

    /// `symm_tile_signal` to `peer` of `count` (1 to 32) tiles with one release: tiles
    /// `(first_tile + i * stride) % wrap` for i < count, e.g. the last `count` tiles of a CTA's
    /// grid-stride walk over `wrap` tiles. A signal costs a CTA its system-scope release (about
    /// 2 us with every SM signalling), so a CTA that pushes several tiles to one peer and whose
    /// reader can wait signals them together. INVALID_ARGUMENT unless 0 <= first_tile < wrap <=
    /// MAX_TILES, stride >= 0 and 1 <= count <= 32.
    fn symm_tile_signal_batch(ctx: i64, first_tile: i64, stride: i64, count: i32, wrap: i64, peer: i32) -> i32 {
        let r = ctx::context(ctx).and_then(|c| {
            let peer = check_rank(c, peer)?;
            let wrap_ok = wrap >= 1 && wrap as u64 <= MAX_TILES as u64;
            if !wrap_ok || first_tile < 0 || first_tile >= wrap || stride < 0 || !(1..=32).contains(&count) {
                return Err(status::INVALID_ARGUMENT);
            }
            let stride = (stride % wrap) as usize; // (first + i * stride) % wrap stays in usize
            primitives::tile_signal_batch(c, first_tile as usize, stride, count as usize, wrap as usize, peer);
            Ok(())
        });
        code(r)
    }

    /// `symm_tile_signal` to every other rank at once (one thread per rank): what a tile's
    /// producer calls after storing it into every peer, or to announce a tile every peer reads.
    fn symm_tile_signal_others(ctx: i64, tile: i64) -> i32 {
        let r = ctx::context(ctx).and_then(|c| {
            primitives::tile_signal_others(c, tile_index(tile)?);
            Ok(())
        });
        code(r)
    }

    /// `symm_tile_wait` for every other rank at once (one thread per rank): returns when each has
    /// signalled `tile` once more than this rank waited for it. TIMEOUT (recorded) as
    /// `symm_tile_wait`.
    fn symm_tile_wait_others(ctx: i64, tile: i64) -> i32 {
        let r = ctx::context(ctx).and_then(|c| {
            primitives::tile_wait_others(c, tile_index(tile)?, which!(symm_tile_wait_others))
        });
        code(r)
    }

    /// CTA-cooperative copy of `nbytes` from local `src_ptr` to `peer`'s copy of the symmetric
    /// `dst_ptr`. Not ordered with the peer: follow with `symm_signal` or `symm_barrier`. A peer
    /// on another node of a multi-node context gives PEER_NOT_MAPPED (no load/store path; put
    /// with `symm_nvshmem_put_signal`).
    fn symm_put(ctx: i64, dst_ptr: i64, src_ptr: i64, nbytes: i64, peer: i32) -> i32 {
        code(peer_copy(ctx, dst_ptr, src_ptr, nbytes, peer, Side::Dst))
    }

    /// CTA-cooperative copy of `nbytes` from `peer`'s copy of the symmetric `src_ptr` to local
    /// `dst_ptr`. A peer on another node of a multi-node context gives PEER_NOT_MAPPED.
    fn symm_get(ctx: i64, dst_ptr: i64, src_ptr: i64, nbytes: i64, peer: i32) -> i32 {
        code(peer_copy(ctx, dst_ptr, src_ptr, nbytes, peer, Side::Src))
    }

    /// Sets (`SIGNAL_OP_SET`) or adds to (`SIGNAL_OP_ADD`) `peer`'s user signal slot `slot`,
    /// after this CTA's earlier writes (e.g. `symm_put`) are visible to that peer. On a
    /// multi-node context a peer on another node is signalled over NVSHMEM after this CTA's puts
    /// have landed (the NVSHMEM bitcode; PEER_NOT_MAPPED in the P2P one).
    fn symm_signal(ctx: i64, slot: i64, value: i64, signal_op: i32, peer: i32) -> i32 {
        match ctx::any_context(ctx) {
            Ok(c) => primitives::signal(c, slot, value, signal_op, peer),
            Err(e) => e,
        }
    }

    /// Waits until this rank's user signal slot `slot` compares (`CMP_*`) true against `value`;
    /// gives TIMEOUT after the context's timeout (and records it).
    fn symm_signal_wait(ctx: i64, slot: i64, cmp_op: i32, value: i64) -> i32 {
        match ctx::any_context(ctx) {
            Ok(c) => primitives::signal_wait(c, slot, cmp_op, value, which!(symm_signal_wait)),
            Err(e) => e,
        }
    }

    /// `symm_signal` at a u64 of the heap instead of a slot: sets (`SIGNAL_OP_SET`) or adds to
    /// (`SIGNAL_OP_ADD`) `peer`'s copy of the word at `flag_ptr` (a local heap address, 8-byte
    /// aligned; `peer` may be this rank) after this CTA's earlier writes are visible to that
    /// peer. For flags that work on streams also writes or waits on (`runtime.stream_flags`: a
    /// copy engine's transfer announced by `cuStreamWriteValue64`). A peer on another node of a
    /// multi-node context gives PEER_NOT_MAPPED.
    fn symm_signal_at(ctx: i64, flag_ptr: i64, value: i64, signal_op: i32, peer: i32) -> i32 {
        match heap_word(ctx, flag_ptr, peer) {
            // SAFETY: `heap_word` translated and checked the word (inside the heap, aligned).
            Ok((_, word)) => unsafe { primitives::signal_at(word, value, signal_op) },
            Err(e) => e,
        }
    }

    /// `symm_signal_wait` on a u64 of this rank's heap (`flag_ptr`, 8-byte aligned) instead of a
    /// slot: waits until it compares (`CMP_*`) true against `value`, then the CTA (its TMA loads
    /// too) sees what was written before the word was set; TIMEOUT after the context's timeout
    /// (recorded).
    fn symm_signal_wait_at(ctx: i64, flag_ptr: i64, cmp_op: i32, value: i64) -> i32 {
        match ctx::any_context(ctx).and_then(|c| heap_word(ctx, flag_ptr, c.rank)) {
            // SAFETY: as in `symm_signal_at`, this rank's own word.
            Ok((c, word)) => unsafe {
                primitives::signal_wait_at(c, word, cmp_op, value, which!(symm_signal_wait_at))
            },
            Err(e) => e,
        }
    }

    /// The current value of this rank's user signal slot `slot` (or a negative status for a bad
    /// context or slot; slot values are the caller's, so reserve negatives if you need both).
    fn symm_signal_read(ctx: i64, slot: i64) -> i64 {
        match ctx::any_context(ctx).and_then(|c| primitives::signal_slot(c, c.rank as usize, slot)) {
            // SAFETY: a checked slot of our own signal region.
            Ok(p) => unsafe { hw::load_acquire_u64(p) as i64 },
            Err(e) => e as i64,
        }
    }

    /// Memory fence at `scope` (`FENCE_SCOPE_CTA` syncs the CTA; GPU and SYSTEM fence each thread).
    fn symm_fence(scope: i32) -> i32 {
        match scope {
            crate::abi::fence_scope::CTA => {
                hw::sync_threads();
                status::OK
            }
            crate::abi::fence_scope::GPU => {
                hw::fence_gpu();
                status::OK
            }
            crate::abi::fence_scope::SYSTEM => {
                hw::fence_system();
                status::OK
            }
            _ => status::INVALID_ARGUMENT,
        }
    }
}
