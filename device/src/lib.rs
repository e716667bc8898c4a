//! ironlink's device library: collective communication that Triton kernels call inline.
//!
//! Built for `nvptx64-nvidia-cuda` this crate becomes LLVM bitcode (`build/ironlink_sm90.bc`)
//! whose only exported symbols are the `extern "C"` functions of `api`. Built for the host it is
//! the CPU simulator of those same functions (see `hw/host/`) and the ABI crate that the host
//! library and `build.rs` read.
//!
//! The layers, bottom up; each uses only the ones above it in this list.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(stdarch_nvptx, asm_experimental_arch))]

/// Every number that crosses a boundary (status codes, dtypes, the context layout, ...).
pub mod abi;

/// The hardware layer: thread indices, barriers, scoped memory operations (the only inline PTX).
pub mod hw;

/// The runtime core: the context, regions, calls (epochs, barriers, waits), scratch, elements.
#[macro_use]
pub mod runtime;

/// Transports: LL packets, 16-byte bulk moves, per-round flags, store-only rounds.
pub mod transport;

/// Collectives, one file per collective; `collectives::choice` holds every algorithm choice.
pub mod collectives;

/// Building blocks for user-written algorithms: put, get, signal, wait.
pub mod primitives;

/// The exported C functions: the whole ABI of the bitcode.
pub mod api;

/// A simulated node for running the device code on the CPU (host builds only).
#[cfg(not(target_arch = "nvptx64"))]
pub mod sim;

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // Device code is written not to panic; if it ever does, trap rather than loop forever.
    // SAFETY: `trap` aborts the kernel; it has no preconditions.
    unsafe { core::arch::nvptx::trap() }
}
