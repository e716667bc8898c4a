//! The hardware layer: everything that touches the machine (thread and block indices, the CTA
//! barrier, scoped and volatile memory operations, the timer). Collective code calls only these
//! functions, so the same algorithm compiles to PTX (`nvptx.rs`) and runs on the CPU simulator
//! (`host/`, one OS thread per simulated GPU thread).
//!
//! Both implementations export the same free functions with the same signatures; nothing here is
//! generic, so the nvptx build pays nothing for the abstraction (each call inlines to one
//! instruction or intrinsic).
//!
//! Memory-model contract (what collective code may rely on):
//! - `load_acquire`/`store_release`/`atomic_*` are system-scoped: they order accesses to peer GPUs'
//!   memory mapped into this process.
//! - `store_v4_volatile` writes 16 bytes that a peer's `load_v4_volatile` sees either entirely old
//!   or entirely new (the LL-packet guarantee of 16-byte aligned vector stores on NVLink).
//! - `sync_threads` is a CTA barrier that also orders the CTA's memory accesses among its threads.

// The pointer-taking functions of both implementations share one safety contract, stated at the
// top of nvptx.rs: a valid, mapped address aligned to the access size.
#[cfg(target_arch = "nvptx64")]
#[allow(clippy::missing_safety_doc)]
mod nvptx;
#[cfg(target_arch = "nvptx64")]
pub use nvptx::*;

/// NVSHMEM's device functions, declared only in the NVSHMEM bitcode (`--cfg ironlink_nvshmem`).
#[cfg(all(target_arch = "nvptx64", ironlink_nvshmem))]
pub mod nvshmem;

#[cfg(not(target_arch = "nvptx64"))]
#[allow(clippy::missing_safety_doc)]
pub mod host;
#[cfg(not(target_arch = "nvptx64"))]
pub use host::*;
#[cfg(not(target_arch = "nvptx64"))]
pub mod sim_faults;
#[cfg(not(target_arch = "nvptx64"))]
pub mod sim_net;

/// One-sided puts to ranks on other nodes (the network: simulated, NVSHMEM, or none).
pub mod remote;

/// Thread index within the CTA, flattened over x, y, z.
#[inline(always)]
pub fn thread_rank() -> u32 {
    let (x, y, z) = thread_idx();
    let (nx, ny, _) = block_dim();
    x + nx * (y + ny * z)
}

/// Threads in the CTA.
#[inline(always)]
pub fn cta_threads() -> u32 {
    let (nx, ny, nz) = block_dim();
    nx * ny * nz
}

/// CTA index within the grid, flattened over x, y, z (Triton's program ids).
#[inline(always)]
pub fn cta_rank() -> u32 {
    let (x, y, z) = block_idx();
    let (nx, ny, _) = grid_dim();
    x + nx * (y + ny * z)
}

/// CTAs in the grid.
#[inline(always)]
pub fn grid_ctas() -> u32 {
    let (nx, ny, nz) = grid_dim();
    nx * ny * nz
}
