//! The exported tile calls: collectives over one tile of a persistent kernel's output, and
//! push-as-produced (a tile put, signalled and waited for, alone or in batches).

use super::call_shapes::{any_nodes_tile_call, code, tile_call};
use super::checks::{check_dtype, check_op_dtype, check_rank};
use crate::abi::{status, MAX_TILES};
use crate::collectives::{hierarchical, tile, tile_shape};
use crate::primitives;
use crate::runtime::context as ctx;
use crate::runtime::elem::Reduction;
use crate::runtime::sync::Call;
use tile_shape::{tile_index, Shape, Tile};

exports! {
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
}
