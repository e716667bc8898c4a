//! One-sided network operations to a peer on another node: put-with-signal, and quiet. The only
//! place the device code reaches a network, so the three builds differ here alone:
//!
//! - host (the CPU simulator): `sim_net` models a network whose puts land later than they are
//!   issued, can be delayed, reordered or lose their signal (`sim_faults`);
//! - nvptx with `--cfg ironlink_nvshmem`: NVSHMEM's device API (the NVSHMEM bitcode);
//! - nvptx without it (the P2P bitcode): there is no network; a put returns `PEER_NOT_MAPPED`.
//!
//! Addresses are this process's addresses of symmetric memory (this rank's heap, signal or
//! scratch region), as NVSHMEM takes them; the target rank is a PE number. Every function is
//! CTA-collective: every thread calls it with the same arguments, after a CTA barrier that
//! follows the last write of the data being put.

#[allow(unused_imports)] // Not every arm reports a status.
use crate::abi::status;
use crate::abi::SymmContext;

/// Whether this build has a network at all (the P2P bitcode has none: collectives that need one
/// refuse with `PEER_NOT_MAPPED` before touching any data).
pub const NETWORK: bool = cfg!(any(not(target_arch = "nvptx64"), ironlink_nvshmem));

/// Starts copying `bytes` from this rank's `src` to the same symmetric address as `dst` on rank
/// `pe`, then sets (or, with `add`, adds `value` to) the u64 at the symmetric address `sig` on
/// `pe`, with release semantics (whoever sees the signal sees the data). Returns at once
/// (non-blocking): `src` must not change until `quiet`. 0, or a negative status when this build
/// cannot reach `pe`.
///
/// # Safety
/// `dst` and `src` are `bytes` inside one symmetric region of this rank, `sig` an 8-byte aligned
/// word of this rank's signal region; `pe` is a rank of `c`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn put_signal_nbi(
    c: &SymmContext,
    dst: usize,
    src: usize,
    bytes: usize,
    sig: usize,
    value: u64,
    add: bool,
    pe: usize,
) -> i32 {
    #[cfg(not(target_arch = "nvptx64"))]
    {
        if super::host::thread_rank_fresh() == 0 {
            return super::sim_net::put_signal(c, dst, src, bytes, (sig, value, add), pe);
        }
        super::sim_net::check(c, pe)
    }
    #[cfg(all(target_arch = "nvptx64", ironlink_nvshmem))]
    {
        // nvshmemx_putmem_signal_nbi_block: every thread of the CTA calls it (hw/nvshmem.rs).
        let _ = c;
        super::nvshmem::put_signal_nbi_block(
            dst,
            src,
            bytes,
            sig,
            value,
            if add {
                super::nvshmem::NVSHMEM_SIGNAL_ADD
            } else {
                super::nvshmem::NVSHMEM_SIGNAL_SET
            },
            pe as i32,
        );
        status::OK
    }
    #[cfg(all(target_arch = "nvptx64", not(ironlink_nvshmem)))]
    {
        let _ = (c, dst, src, bytes, sig, value, add, pe);
        status::PEER_NOT_MAPPED
    }
}

/// Waits until every put this CTA issued has landed at its target (data and signal): after it,
/// their sources may be overwritten. CTA-collective.
#[inline(always)]
pub fn quiet() {
    #[cfg(not(target_arch = "nvptx64"))]
    super::sim_net::progress();
    // nvshmem_quiet() (hw/nvshmem.rs).
    #[cfg(all(target_arch = "nvptx64", ironlink_nvshmem))]
    super::nvshmem::quiet();
}
