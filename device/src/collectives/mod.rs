//! The collectives, one file per collective: each reads as its algorithms, built from the
//! transports (`crate::transport`); `choice` decides which algorithm a call runs.
//!
//! The bandwidth collectives over the symmetric buffers move 16-byte vectors: reductions pull
//! (each rank loads what it reduces from every peer; large ones push through the scratch
//! instead), pure data movement pushes where every rank sends (all_gather, all_to_all: stores are
//! posted, loads wait a round trip). A barrier among same-index CTAs before the transfers makes
//! the peers' inputs visible and their outputs free; one after makes the results complete and
//! keeps a rank from overwriting an input a peer still reads. Work is split by 16-byte units:
//! across CTAs, then across threads. Small all_gather / reduce_scatter go over one hop of LL
//! packets instead, with no barrier; so do small tile all-reduces (`tile_ll`).

pub mod all_gather;
pub mod all_reduce;
pub mod all_to_all;
pub mod all_to_all_v;
pub mod broadcast;
pub mod choice;
pub mod hierarchical;
pub mod reduce;
pub mod reduce_scatter;
pub mod tile;
pub mod tile_ll;
pub mod tile_shape;

use crate::runtime::mem::split;
use crate::runtime::sync::Call;

/// CTA `call.cta`'s share of a region of `bytes` bytes, in 16-byte units.
#[inline(always)]
fn my_units(call: &Call, bytes: usize) -> (usize, usize) {
    split(bytes.div_ceil(16), call.ctas, call.cta)
}
