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
//!
//! The reductions (tile all_reduce, reduce_scatter) need a box on the partner to land in, keyed
//! by tile rather than CTA; they are not served across nodes yet (docs/backends.md, "Next").

use super::{nodes_for, other_node, partner, signal_partners};
use crate::collectives::tile::{for_my_units, Tile};
use crate::hw;
use crate::runtime::mem::{load_unit, rotate, store_unit};
use crate::runtime::nodes::Nodes;
use crate::runtime::sync::Call;
use crate::transport::remote::{self, Kind, Place};

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
