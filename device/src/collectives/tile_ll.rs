//! One-shot LL all-reduce of a small tile, by the calling CTA alone: every rank pushes its tile
//! to every peer as LL packets (`ll_packet`: 8 data bytes and the tile's call epoch as flag in
//! one 16-byte store) into the tile's boxes (`tile_inbox`), then reduces its own tile with the
//! packets it received, in rank order in f32, and writes the result into its own tile. So every
//! rank computes each element from the same values in the same order: bitwise the same results
//! everywhere (and the same as the two-shot's).
//!
//! No barrier and no fence: a packet is ready when its flags carry this call's epoch, and no
//! peer reads or writes this rank's tile (only its boxes), so the call may return as soon as
//! its own tile is written. `tile_inbox` explains why the boxes are never overwritten before
//! they are read. A packet that never arrives makes the waiting thread give up after the
//! context's timeout: `TIMEOUT`, recorded.

use crate::runtime::elem::Reduction;
use crate::runtime::mem::{load_unit, rotate, store_unit};
use crate::runtime::sync::Call;
use crate::transport::ll_packet;
use crate::transport::tile_inbox::TileInbox;

use super::tile_shape::Tile;

/// In-place all-reduce of the non-empty `tile` with the same tile on every rank; the caller
/// chose this algorithm (`choice::tile_all_reduce`: the tile's packets fit its boxes).
pub fn all_reduce(call: &Call, tile: &Tile, red: &Reduction) -> Result<(), i32> {
    let inbox = TileInbox::open(call);
    let local = call.c.heap_base(call.rank);
    let units = tile.ll_units();

    // Push: unit u to box `rank` of every peer, at index u.
    let mut u = call.tid;
    while u < units {
        let (offset, valid) = tile.ll_unit(u);
        // SAFETY: unit u lies inside the checked tile of this rank's heap.
        let d = unsafe { load_unit::<2>(local + offset, valid) };
        for k in 1..call.world {
            let p = rotate(call.rank, k, call.world);
            // SAFETY: u < units <= the boxes' capacity (`tile_inbox::fits`), p is a peer of
            // this node: the slot lies in p's tile area.
            unsafe { ll_packet::send(inbox.slot(call, p, call.rank, u), d, call.epoch) };
        }
        u += call.threads;
    }

    // Reduce: each unit with the packets of every peer, in rank order.
    let mut deadline = call.deadline();
    let mut late = false;
    let mut u = call.tid;
    while u < units {
        let (offset, valid) = tile.ll_unit(u);
        // SAFETY: as above; only this thread touches unit u of this rank's tile.
        let mine = unsafe { load_unit::<2>(local + offset, valid) };
        let boxes = |p: usize| inbox.slot(call, call.rank, p, u);
        let Some(sum) = ll_packet::receive_reduced(call, red, mine, boxes, &mut deadline) else {
            late = true;
            break;
        };
        // SAFETY: as above.
        unsafe { store_unit::<2>(local + offset, valid, sum) };
        u += call.threads;
    }
    call.agree_on_timeout(late)
}
