//! ironlink's device library: collective communication that Triton kernels call inline.
//!
//! Built for `nvptx64-nvidia-cuda` this crate becomes LLVM bitcode (`build/ironlink_sm90.bc`)
//! whose only exported symbols are the `extern "C"` functions of `exports.rs`. Built for the host
//! it is the CPU simulator of those same functions (see `hw/host.rs`) and the ABI crate that the
//! host library and `build.rs` read.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(stdarch_nvptx, asm_experimental_arch))]

#[macro_use]
mod unroll;
pub mod abi;
pub mod all_reduce;
pub mod bulk;
pub mod collectives;
pub mod ctx;
pub mod elem;
pub mod hw;
pub mod ll_gather;
pub mod ll_packet;
pub mod mem;
pub mod primitives;
pub mod progress;
pub mod region;
pub mod scratch;
#[cfg(not(target_arch = "nvptx64"))]
pub mod sim;
pub mod sync;
pub mod two_shot_push;
#[macro_use]
mod export_macro;
pub mod exports;

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // Device code is written not to panic; if it ever does, trap rather than loop forever.
    // SAFETY: `trap` aborts the kernel; it has no preconditions.
    unsafe { core::arch::nvptx::trap() }
}
