//! Host implementation of the hardware layer: the CPU simulator.
//!
//! Each simulated GPU thread is an OS thread. A thread-local record holds its thread and block
//! indices and its CTA's barrier; `launch` creates ranks x CTAs x threads of them over shared host
//! memory and runs one body per thread. Every memory operation is a std atomic, so concurrent
//! access between simulated threads and ranks is defined behaviour.
//!
//! What this can and cannot catch: wrong indexing, missing or mismatched barriers (the CTA barrier
//! times out and panics with the thread counts), epochs that drift, waits that never end (the
//! device code's own timeout fires, `now_ns` is wall time here), out-of-bounds writes (into
//! guarded host buffers). The host's memory model is stronger than the GPU's (x86 is TSO, and
//! every access here is an atomic), so a missing release/acquire pair or fence that only matters
//! on weak hardware is NOT caught; those are checked by reading the PTX and on the GPUs.
//! Setting `IRONLINK_SIM_YIELD=1` adds random yields at every memory operation and barrier to
//! shake out orderings the OS scheduler would rarely produce; `sim_faults` drops, delays or
//! reorders synchronizing stores for the fault-injection tests.
//!
//! `threads`: the simulated threads, their launch, indices and CTA barrier, the timer;
//! `memory`: the memory operations (where `sim_faults` intervenes), `held`: the stores it holds
//! back, delivered; `convert`: the float conversions the GPU does in one instruction.

mod convert;
mod held;
mod memory;
mod threads;

pub use convert::*;
pub use memory::*;
pub use threads::*;
