//! The runtime core that every collective and primitive stands on: checking the context and the
//! regions a call is given, a call's coordinates and cross-rank synchronization (epochs, the
//! barrier, bounded waits), the per-CTA scratch slices, element types and reductions, and moving
//! words in exact units.

#[macro_use]
mod unroll;
pub mod call_id;
pub mod context;
pub mod elem;
pub mod grid;
pub mod mem;
pub mod nodes;
pub mod region;
pub mod scratch;
pub mod sync;
