//! How data crosses between ranks. Each transport fixes a wire format and its synchronization;
//! collectives combine them.
//!
//! - `ll_packet`: LL packets (8 data bytes + the call's epoch as flag in one 16-byte store): no
//!   barrier, the flag in the data; for small messages.
//! - `bulk`: 16-byte vector loads and stores between the ranks' buffers, between barriers.
//! - `progress`: per-round flags, "my data for round r has landed in your scratch".
//! - `store_rounds`: a message moved by stores only, in rounds through the receivers' scratch,
//!   then reduced there (large all-reduce and reduce-scatter).
//! - `tile_inbox`: where LL packets of tile calls land, by tile index (small tile all-reduces).

pub mod bulk;
pub mod ll_packet;
pub mod progress;
pub mod remote;
pub mod store_rounds;
pub mod tile_inbox;
