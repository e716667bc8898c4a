//! The NVSHMEM wrappers: exported only by the NVSHMEM bitcode (`build/ironlink_nvshmem_smXX.bc`),
//! which a kernel links with `@ironlink.jit(nvshmem=True)` ahead of `libnvshmem_device.bc`.
//!
//! They reach NVSHMEM's symmetric heap directly, with no ironlink context: addresses are local
//! addresses of NVSHMEM symmetric objects (e.g. tensors from torch's NVSHMEM backend) and peers
//! are NVSHMEM PE numbers. Codes are ironlink's (`SIGNAL_OP_*`, `CMP_*`, statuses), mapped here to
//! NVSHMEM's. Like every export they are called by all threads of the CTA with the same arguments.
//!
//! Their table is `EXPORTS` of this module (`_abi.NVSHMEM_FUNCTIONS` in Python), apart from the P2P
//! table so that its indices, which error records carry, are the same in both bitcode files.

#[cfg(all(target_arch = "nvptx64", ironlink_nvshmem))]
use crate::abi::{cmp, signal_op, status};
#[cfg(all(target_arch = "nvptx64", ironlink_nvshmem))]
use crate::hw::{self, nvshmem};

/// `pe` if it names one of NVSHMEM's PEs: NVSHMEM indexes tables with it unchecked.
#[cfg(all(target_arch = "nvptx64", ironlink_nvshmem))]
#[inline(always)]
fn check_pe(pe: i32) -> Result<i32, i32> {
    if pe < 0 || pe >= nvshmem::n_pes() {
        return Err(status::INVALID_ARGUMENT);
    }
    Ok(pe)
}

/// An ironlink `CMP_*` code as NVSHMEM's `nvshmem_cmp_type`.
#[cfg(all(target_arch = "nvptx64", ironlink_nvshmem))]
#[inline(always)]
fn nvshmem_cmp(op: i32) -> Result<i32, i32> {
    Ok(match op {
        cmp::EQ => nvshmem::NVSHMEM_CMP_EQ,
        cmp::NE => nvshmem::NVSHMEM_CMP_NE,
        cmp::GT => nvshmem::NVSHMEM_CMP_GT,
        cmp::GE => nvshmem::NVSHMEM_CMP_GE,
        cmp::LT => nvshmem::NVSHMEM_CMP_LT,
        cmp::LE => nvshmem::NVSHMEM_CMP_LE,
        _ => return Err(status::UNSUPPORTED_OP),
    })
}

#[cfg(all(target_arch = "nvptx64", ironlink_nvshmem))]
#[inline(always)]
fn code(r: Result<(), i32>) -> i32 {
    match r {
        Ok(()) => status::OK,
        Err(e) => e,
    }
}

#[cfg(all(target_arch = "nvptx64", ironlink_nvshmem))]
#[inline(always)]
fn put_signal(
    dst: i64,
    src: i64,
    nbytes: i64,
    sig: i64,
    value: i64,
    op: i32,
    pe: i32,
) -> Result<(), i32> {
    let pe = check_pe(pe)?;
    if nbytes < 0 {
        return Err(status::INVALID_ARGUMENT);
    }
    if !(sig as u64).is_multiple_of(8) {
        return Err(status::MISALIGNED);
    }
    let op = match op {
        signal_op::SET => nvshmem::NVSHMEM_SIGNAL_SET,
        signal_op::ADD => nvshmem::NVSHMEM_SIGNAL_ADD,
        _ => return Err(status::UNSUPPORTED_OP),
    };
    // SAFETY: every thread of the CTA runs this with the same arguments (Triton's scalar extern
    // semantics); pe, op and the signal's alignment were checked; that the addresses are
    // symmetric is the caller's contract, as in NVSHMEM.
    unsafe {
        nvshmem::put_signal_nbi_block(
            dst as usize,
            src as usize,
            nbytes as usize,
            sig as usize,
            value as u64,
            op,
            pe,
        )
    };
    Ok(())
}

#[cfg(all(target_arch = "nvptx64", ironlink_nvshmem))]
#[inline(always)]
fn signal_wait(sig: i64, cmp_op: i32, value: i64) -> Result<(), i32> {
    let c = nvshmem_cmp(cmp_op)?;
    if !(sig as u64).is_multiple_of(8) {
        return Err(status::MISALIGNED);
    }
    // SAFETY: aligned (checked), a valid code (mapped); symmetry is the caller's contract.
    unsafe { nvshmem::signal_wait_until(sig as usize, c, value as u64) };
    Ok(())
}

exports! { cfg(all(target_arch = "nvptx64", ironlink_nvshmem));
    /// Non-blocking NVSHMEM put with signal by the whole CTA: `nbytes` from local `src_ptr` to PE `pe`.
    /// Copies to `pe`'s copy of the symmetric `dst_ptr`, then sets (`SIGNAL_OP_SET`) or adds to (`SIGNAL_OP_ADD`)
    /// `pe`'s copy of the symmetric u64 at `sig_ptr` once the data is there. Returns at once
    /// (non-blocking): `symm_nvshmem_quiet` waits for completion; `src_ptr` must stay unchanged
    /// until then.
    fn symm_nvshmem_put_signal(dst_ptr: i64, src_ptr: i64, nbytes: i64, sig_ptr: i64, value: i64, signal_op: i32, pe: i32) -> i32 {
        code(put_signal(dst_ptr, src_ptr, nbytes, sig_ptr, value, signal_op, pe))
    }

    /// Waits (no timeout) until this PE's symmetric u64 at `sig_ptr` compares true against `value`.
    /// `cmp_op` is a `CMP_*` code; this is NVSHMEM's wait, which has no timeout. Every thread waits, so each then sees the data the signal
    /// announced.
    fn symm_nvshmem_signal_wait(sig_ptr: i64, cmp_op: i32, value: i64) -> i32 {
        code(signal_wait(sig_ptr, cmp_op, value))
    }

    /// Waits until this CTA's earlier NVSHMEM puts and signals are complete at their targets.
    /// (`symm_nvshmem_put_signal`'s, also the signal updates.) `unused` is ignored (Triton needs an argument).
    fn symm_nvshmem_quiet(unused: i32) -> i32 {
        let _ = unused;
        // A block put may be issued by any of the CTA's threads, and quiet completes only the
        // calling thread's operations: so every thread quiets, after all have issued theirs.
        hw::sync_threads();
        nvshmem::quiet();
        hw::sync_threads();
        status::OK
    }

    /// The symmetric `ptr`'s address on PE `pe` when this GPU can load and store it there, else 0.
    /// (Same node, over NVLink or PCIe peer access; also 0 for a bad `pe`.)
    fn symm_nvshmem_ptr(ptr: i64, pe: i32) -> i64 {
        match check_pe(pe) {
            // SAFETY: `pe` is one of NVSHMEM's PEs (checked).
            Ok(pe) => unsafe { nvshmem::ptr(ptr as usize, pe) as i64 },
            Err(_) => 0,
        }
    }

    /// This process's NVSHMEM PE number; `unused` is ignored.
    fn symm_nvshmem_my_pe(unused: i32) -> i32 {
        let _ = unused;
        nvshmem::my_pe()
    }

    /// The number of NVSHMEM PEs; `unused` is ignored.
    fn symm_nvshmem_n_pes(unused: i32) -> i32 {
        let _ = unused;
        nvshmem::n_pes()
    }
}
