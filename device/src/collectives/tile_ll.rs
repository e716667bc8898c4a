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
use crate::runtime::sync::Call;
use crate::transport::ll_packet;
use crate::transport::tile_inbox::TileInbox;

use super::tile_shape::Tile;

/// In-place all-reduce of the non-empty `tile` with the same tile on every rank; the caller
/// chose this algorithm (`choice::tile_all_reduce`: the tile's packets fit its boxes).
pub fn all_reduce(call: &Call, tile: &Tile, red: &Reduction) -> Result<(), i32> {
    let inbox = TileInbox::open(call);
    let local = call.c.heap_base(call.rank);
    let unit = |u: usize| {
        let (offset, valid) = tile.ll_unit(u);
        (local + offset, valid)
    };
    // SAFETY: unit u < ll_units lies inside the checked tile of this rank's heap; u is below
    // the boxes' capacity (`tile_inbox::fits`), so box `rank` of peer p and box p here hold it.
    unsafe {
        ll_packet::one_shot_reduce(
            call,
            red,
            tile.ll_units(),
            unit,
            |p, u| inbox.slot(call, p, call.rank, u),
            |p, u| inbox.slot(call, call.rank, p, u),
        )
    }
}
