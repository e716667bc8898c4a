//! Tile calls on a context of several nodes (`symm_tile_*_hierarchical`): the one-node tile
//! algorithm among the ranks of a node, the remote transport between nodes, matched by tile index
//! (a tile call's remote signal words are the tile's own, `Call::remote_words`).
//!
//! - all_gather: rank (n, l) tells each partner (m, l) that its tile is free (it is in this
//!   call: an `Ack` alone), waits for the same from each, and puts its block straight into each
//!   partner's tile with an `Arrive` signal (one put when the block's rows are contiguous; else
//!   a put per row, `quiet`, then the signal: NVSHMEM orders a signal after its own put only).
//!   Meanwhile, over stores, it pushes its block into the tiles of its node; once the partners'
//!   blocks have arrived it pushes each of them into the tiles of its node.
//! - all_reduce: the tile's units are split among the ranks of a node; rank (n, l) reduces its
//!   share over its node into node n's partial, exchanges the partials with its partners (the
//!   same share on every node), reduces them in node order and stores the result into every
//!   tile of its node. Bitwise the same on every rank: each partner reduces the same partials in
//!   the same order.
//! - reduce_scatter: rank (n, l) reduces over its node, for each partner (m, l), that partner's
//!   block (node n's partial of it) and sends it; it reduces the partials of its own block it
//!   receives, with its node's, in node order into its output tile.
//!
//! The reductions land in boxes: a tile's CTA differs from rank to rank, so each round a rank
//! tells its partners which CTA it runs on (the low byte of its `Ack`: "my boxes are free, they
//! are those of CTA c") and puts into the boxes of the CTA each partner named, in the signal
//! region (`signal::TILE_BOX_OFFSET`: apart from the scratch, which whole-tensor calls of a
//! partner's same-index CTA may fill meanwhile). A rank cannot leave a round before its
//! partners' data arrived, so no final `Ack` is needed: the next Ack, of the next round or call,
//! frees the boxes.

mod rounds;

use super::{node_partial, nodes_for, other_node, partial_op, partner, signal_partners};
use crate::collectives::tile::for_my_units;
use crate::collectives::tile_shape::Tile;
use crate::hw;
use crate::runtime::elem::Reduction;
use crate::runtime::mem::{load_unit, rotate, split, store_unit};
use crate::runtime::nodes::Nodes;
use crate::runtime::sync::Call;
use crate::transport::remote::{self, Kind, Place};
use rounds::{boxes_for_the_grid, in_rounds, reduce_boxes, Boxes, TileRounds};

/// In-place all-gather of `world` blocks of `tile`'s shape, `block_bytes` apart, the first at
/// `tile`: every rank's block p gets rank p's (see the module docs).
pub fn all_gather(call: &Call, tile: &Tile, block_bytes: usize) -> Result<(), i32> {
    let nodes = nodes_for(call, 0)?;
    if tile.rows == 0 {
        return Ok(());
    }
    let mine = tile.shifted(call.rank * block_bytes);
    let network = hw::remote::NETWORK && nodes.multi();
    let v = remote::value(call, 0);

    if network {
        signal_partners(call, &nodes, Kind::Ack, v, |_| true)?;
        remote::wait_signals(call, Kind::Ack, v, other_node(&nodes))?;
        put_to_partners(call, &nodes, &mine, v)?;
    }

    // The node's tiles are free; our block to each of them.
    call.barrier_among(0, nodes.first(), nodes.size)?;
    push_to_node(call, &nodes, &mine);

    if network {
        remote::wait_signals(call, Kind::Arrive, v, other_node(&nodes))?;
        for k in 1..nodes.count {
            let m = rotate(nodes.node, k, nodes.count);
            push_to_node(
                call,
                &nodes,
                &tile.shifted(partner(&nodes, m) * block_bytes),
            );
        }
        // Our block has landed everywhere: the caller may overwrite it once we return.
        remote::quiet();
    }
    call.barrier_among(1, nodes.first(), nodes.size)
}

/// Puts `block` (in this rank's heap) into the same place of every partner's heap, then signals
/// `Arrive` with `value` to each.
fn put_to_partners(call: &Call, nodes: &Nodes, block: &Tile, value: u64) -> Result<(), i32> {
    let rows_apart = block.rows > 1 && block.stride_bytes != block.row_bytes;
    for k in 1..nodes.count {
        let to = partner(nodes, rotate(nodes.node, k, nodes.count));
        let at = Place::Heap(block.offset);
        if !rows_apart {
            let bytes = block.rows * block.row_bytes;
            remote::put_with_signal(call, nodes, at, at, bytes, Kind::Arrive, value, to)?;
            continue;
        }
        for row in 0..block.rows {
            let at = Place::Heap(block.offset + row * block.stride_bytes);
            remote::put(call, nodes, at, at, block.row_bytes, to)?;
        }
    }
    if rows_apart {
        remote::quiet(); // every row has landed before its signal
        signal_partners(call, nodes, Kind::Arrive, value, |_| true)?;
    }
    Ok(())
}

/// Stores `block` (in this rank's tile) into the same place of every other rank of the node.
fn push_to_node(call: &Call, nodes: &Nodes, block: &Tile) {
    let c = call.c;
    let here = c.heap_base(call.rank);
    for_my_units(call, block, 0, block.units(), |offset, valid| {
        // SAFETY: inside the checked blocks, at the same offset on every rank of the node.
        let v = unsafe { load_unit::<4>(here + offset, valid) };
        for k in 1..nodes.size {
            let p = nodes.first() + rotate(nodes.local, k, nodes.size);
            unsafe { store_unit::<4>(c.heap_base(p) + offset, valid, v) };
        }
    });
}

/// In-place all-reduce of `tile` with the same tile on every rank (see the module docs).
pub fn all_reduce(call: &Call, tile: &Tile, red: &Reduction) -> Result<(), i32> {
    let nodes = nodes_for(call, 0)?;
    if !nodes.multi() {
        return crate::collectives::tile::all_reduce(call, tile, red);
    }
    if tile.rows == 0 {
        return Ok(());
    }
    boxes_for_the_grid()?;
    let share = split(tile.units(), nodes.size, nodes.local);
    call.barrier_among(0, nodes.first(), nodes.size)?;
    in_rounds(call, &nodes, share, &AllReduce { tile, red })?;
    call.barrier_among(1, nodes.first(), nodes.size)
}

/// Reduce-scatter of `world` blocks of `out`'s shape, `block_bytes` apart, the first at `input`:
/// `out` gets block `rank` reduced over every rank's input (see the module docs).
pub fn reduce_scatter(
    call: &Call,
    input: &Tile,
    out: &Tile,
    block_bytes: usize,
    red: &Reduction,
) -> Result<(), i32> {
    let nodes = nodes_for(call, 0)?;
    if out.rows == 0 {
        return Ok(());
    }
    if !nodes.multi() {
        return one_node_reduce_scatter(call, &nodes, input, out, block_bytes, red);
    }
    boxes_for_the_grid()?;
    call.barrier_among(0, nodes.first(), nodes.size)?;
    let rounds = ReduceScatter {
        input,
        out,
        block_bytes,
        red,
    };
    in_rounds(call, &nodes, (0, out.units()), &rounds)?;
    call.barrier_among(1, nodes.first(), nodes.size)
}

/// The one-node tile reduce-scatter: this rank's block reduced over the ranks in rank order,
/// into `out`. (Not a call of `tile::reduce_scatter`: with a second caller LLVM stopped inlining
/// it, and the one-node export passed the tile on the stack.)
fn one_node_reduce_scatter(
    call: &Call,
    nodes: &Nodes,
    input: &Tile,
    out: &Tile,
    block_bytes: usize,
    red: &Reduction,
) -> Result<(), i32> {
    let mine = input.shifted(call.rank * block_bytes);
    let to_out = out.offset.wrapping_sub(mine.offset);
    let here = call.c.heap_base(call.rank);
    call.barrier(0)?;
    for_my_units(call, &mine, 0, mine.units(), |offset, valid| {
        // SAFETY: inside the checked blocks on every rank; `out` has their shape, checked too.
        unsafe {
            let sum = node_partial(call, nodes, offset, 0, valid, red);
            store_unit::<4>(here + offset.wrapping_add(to_out), valid, sum);
        }
    });
    call.barrier(1)
}

struct AllReduce<'a> {
    tile: &'a Tile,
    red: &'a Reduction,
}

impl TileRounds for AllReduce<'_> {
    fn prepare(&self, call: &Call, nodes: &Nodes, boxes: &Boxes, a: usize, b: usize) {
        let to = call.c.signal_base(call.rank) + boxes.send(nodes.node);
        let op = partial_op(self.red, nodes);
        let mut u = a + call.tid;
        while u < b {
            let (offset, valid) = self.tile.unit(u);
            // SAFETY: `valid` bytes at `offset` lie inside the checked tile on every rank; the
            // box unit inside this CTA's area (b - a <= boxes.units).
            unsafe {
                let v = node_partial(call, nodes, offset, 0, valid, &op);
                store_unit::<4>(to + 16 * (u - a), valid, v);
            }
            u += call.threads;
        }
    }

    fn send_box(&self, boxes: &Boxes, nodes: &Nodes, _m: usize) -> usize {
        boxes.send(nodes.node) // the same partial to every partner
    }

    fn consume(&self, call: &Call, nodes: &Nodes, boxes: &Boxes, a: usize, b: usize) {
        let c = call.c;
        let valid = |u: usize| self.tile.unit(u).1;
        reduce_boxes(call, nodes, boxes, (a, b), valid, self.red, |u, sum| {
            let (offset, valid) = self.tile.unit(u);
            for k in 0..nodes.size {
                let p = nodes.first() + rotate(nodes.local, k, nodes.size);
                // SAFETY: inside the checked tile, at the same offset on every rank.
                unsafe { store_unit::<4>(c.heap_base(p) + offset, valid, sum) };
            }
        });
    }
}

struct ReduceScatter<'a> {
    input: &'a Tile,
    out: &'a Tile,
    block_bytes: usize,
    red: &'a Reduction,
}

impl TileRounds for ReduceScatter<'_> {
    fn prepare(&self, call: &Call, nodes: &Nodes, boxes: &Boxes, a: usize, b: usize) {
        let signals = call.c.signal_base(call.rank);
        let op = partial_op(self.red, nodes);
        for m in 0..nodes.count {
            let block = self.input.shifted(partner(nodes, m) * self.block_bytes);
            let to = signals + boxes.send(m);
            let mut u = a + call.tid;
            while u < b {
                let (offset, valid) = block.unit(u);
                // SAFETY: as in AllReduce::prepare (the blocks were checked on every rank).
                unsafe {
                    let v = node_partial(call, nodes, offset, 0, valid, &op);
                    store_unit::<4>(to + 16 * (u - a), valid, v);
                }
                u += call.threads;
            }
        }
    }

    fn send_box(&self, boxes: &Boxes, _nodes: &Nodes, m: usize) -> usize {
        boxes.send(m)
    }

    fn consume(&self, call: &Call, nodes: &Nodes, boxes: &Boxes, a: usize, b: usize) {
        let here = call.c.heap_base(call.rank);
        let valid = |u: usize| self.out.unit(u).1;
        reduce_boxes(call, nodes, boxes, (a, b), valid, self.red, |u, sum| {
            let (offset, valid) = self.out.unit(u);
            // SAFETY: inside the checked output tile.
            unsafe { store_unit::<4>(here + offset, valid, sum) };
        });
    }
}
