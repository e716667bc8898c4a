//! The exported whole-buffer collectives (each with its version for several nodes) and the
//! barriers.

use super::call_shapes::{any_nodes_collective, code, collective};
use super::checks::{
    all_gather_regions, all_to_all_regions, all_to_all_v_plan, blocks, check_dtype, check_op_dtype,
    check_rank, reduce_regions, reduce_scatter_regions,
};
use crate::abi::status;
use crate::collectives::{
    all_gather, all_reduce, all_to_all, all_to_all_v, broadcast, hierarchical, reduce,
    reduce_scatter,
};
use crate::runtime::context as ctx;
use crate::runtime::elem::Reduction;
use crate::runtime::region::{overlap, Region};

exports! {
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
            |c| reduce_regions(c, in_ptr, out_ptr, num_elements, check_op_dtype(reduce_op, dtype)?, root),
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
            |c| reduce_regions(c, in_ptr, out_ptr, num_elements, check_op_dtype(reduce_op, dtype)?, root),
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
}
