//! The receive area of LL tile calls: where a rank's tile, sent as LL packets (`ll_packet`),
//! lands in every peer. Keyed by (tile index, LL half, source rank), so that it belongs to one
//! tile whichever CTA runs it on either side: a tile's CTA differs from rank to rank, and the
//! CTAs' scratch slices are no place for it (a whole-tensor call may fill a peer's slice while
//! that peer's same-index CTA is still in a tile call).
//!
//! Layout (in each rank's signal region, from `signal::TILE_LL_OFFSET`, `signal::TILE_LL_BYTES`
//! long): `[MAX_LL_TILES][2 halves][world - 1 sources][capacity]` packets; the receiver's own
//! rank has no box (source s < dst is box s, s > dst is box s - 1). The capacity depends on the
//! world size only, so it is the same on every rank.
//!
//! Why a fast rank never overwrites packets a slow peer has not read yet. The halves alternate
//! over the tile's LL calls (those of its calls that exchange packets here; the tile's epoch
//! word keeps which half is next, `Call::flip_ll_half`). Whether a call is an LL call depends
//! only on the tile's shape and index, the world size and the context's signal size, equal on
//! every rank, so every rank counts the same LL calls, and LL call k of the tile uses half k % 2
//! everywhere. Rank r writes half (k + 1) % 2 of peer q only in LL call k + 1 of the tile. r
//! entered that call after its previous calls on the tile had finished on every thread of its
//! CTA (a rank's calls on one tile index follow one another, and `Call::begin_tile` starts with
//! a CTA barrier), LL call k among them; LL calls are never empty (an empty tile returns before
//! choosing), so LL call k received at least one packet from q carrying call k's epoch. q sent
//! it in LL call k, which q entered only after finishing LL call k - 1, the last call in which
//! q read half (k + 1) % 2. So the packets r overwrites have been read. (Alternating by the
//! parity of the tile's epoch instead would break on a call of the tile that meets no peer: an
//! empty tile returns at once, so r could pass through it and write the half of the call before
//! it while q still reads that. Two-shot calls in between would be harmless: their barriers
//! meet q.)
//!
//! Flags are the tile's call epochs, which never repeat within a packet's lifetime (and are
//! never 0, what a fresh signal region holds), so nothing is ever cleared: CUDA-graph safe.

use crate::abi::{signal, SymmContext, MAX_LL_TILES, MAX_RANKS};
use crate::runtime::sync::Call;
use crate::transport::ll_packet::PACKET_BYTES;

const _: () = assert!(signal::TILE_LL_OFFSET.is_multiple_of(PACKET_BYTES));

/// Packets per box at each world size (index `world`; 0 where there is no peer).
const CAPACITY: [usize; MAX_RANKS + 1] = {
    let mut t = [0; MAX_RANKS + 1];
    let mut w = 2;
    while w <= MAX_RANKS {
        t[w] = signal::TILE_LL_BYTES / (MAX_LL_TILES * 2 * (w - 1) * PACKET_BYTES);
        w += 1;
    }
    t
};

/// Packets one box holds on a context of `world` ranks (0 for a world without peers).
#[inline(always)]
pub fn capacity(world: usize) -> usize {
    if world > MAX_RANKS {
        return 0;
    }
    CAPACITY[world]
}

/// Whether a tile call on tile index `tile` that sends `packets` packets to every peer fits
/// the area: the context carries it, the index has a slot and the packets fit one box.
#[inline(always)]
pub fn fits(c: &SymmContext, tile: usize, packets: usize) -> bool {
    c.signal_size >= signal::FULL_BYTES as u64
        && tile < MAX_LL_TILES
        && packets <= capacity(c.world_size as usize)
}

/// The boxes of one tile's LL call: its tile and half, on every rank.
pub struct TileInbox {
    /// Byte offset in the signal region of this call's `[world - 1][capacity]` boxes.
    offset: usize,
    /// Bytes per box.
    box_bytes: usize,
}

impl TileInbox {
    /// The boxes of this LL call of the tile, making it one (the tile's next LL call uses the
    /// other half). The caller checked `fits`. Every thread calls it.
    #[inline(always)]
    pub fn open(call: &Call) -> Self {
        call.flip_ll_half();
        let box_bytes = capacity(call.world) * PACKET_BYTES;
        let half = call.cta * 2 + call.ll_half;
        TileInbox {
            offset: signal::TILE_LL_OFFSET + half * (call.world - 1) * box_bytes,
            box_bytes,
        }
    }

    /// Address, as mapped here, of packet `idx` from rank `src` in rank `dst`'s box (`src !=
    /// dst`, both on this node).
    #[inline(always)]
    pub fn slot(&self, call: &Call, dst: usize, src: usize, idx: usize) -> usize {
        let source = src - (src > dst) as usize;
        call.c.signal_base(dst) + self.offset + source * self.box_bytes + idx * PACKET_BYTES
    }
}
