//! All-reduce, in place, two algorithms chosen by size (the same choice on every rank):
//!
//! - one-shot LL (small messages): every rank pushes its data to every peer as LL packets
//!   (16 bytes = 8 data bytes + the call's epoch twice, one volatile vector store), then reduces
//!   the packets it received. No barrier: a packet is ready when its flags equal the epoch.
//!   Packets land in the receiver's scratch, in this CTA's slice, double-buffered by epoch
//!   parity: a sender can only be one call ahead of a receiver's CTA, so it never overwrites
//!   packets that have not been read.
//! - two-shot (large messages): reduce-scatter then all-gather, both pulling 16-byte vectors
//!   from the peers' buffers, with barriers among same-index CTAs around each phase.

use crate::abi::{SymmContext, MAX_CTAS};
use crate::elem::{Acc, Reduction};
use crate::hw;
use crate::mem::{div32, div_ceil32, load_unit, rotate, split, store_unit, unit_bytes};
use crate::region::Region;
use crate::sync::{wait_until, Call};

/// Messages up to this size may use the one-shot LL algorithm (when they fit the scratch).
pub const LL_MAX_BYTES: usize = 256 * 1024;

/// LL packets (of 16 bytes) that each (parity, source rank) pair gets in one CTA's scratch slice.
#[inline(always)]
fn ll_capacity(c: &SymmContext) -> usize {
    let per_cta = c.scratch_size as usize / MAX_CTAS;
    div32(
        per_cta.min(u32::MAX as usize),
        2 * c.world_size as usize * 16,
    )
}

/// Which algorithm a call uses: a pure function of arguments that are equal on all ranks.
#[inline(always)]
pub fn use_one_shot(c: &SymmContext, bytes: usize, ctas: usize) -> bool {
    let units = bytes.div_ceil(8);
    bytes <= LL_MAX_BYTES && div_ceil32(units, ctas) <= ll_capacity(c)
}

pub fn all_reduce(call: &Call, r: &Region, red: &Reduction) -> Result<(), i32> {
    if r.bytes == 0 {
        return Ok(());
    }
    if use_one_shot(call.c, r.bytes, call.ctas) {
        one_shot_ll(call, r, red)
    } else {
        two_shot(call, r, red)
    }
}

/// This CTA's LL packet area in `dst`'s scratch for this call's parity: packets from source
/// rank `src` start at `area + src * capacity * 16`.
#[inline(always)]
fn packet_area(call: &Call, dst: usize, parity: usize) -> usize {
    let c = call.c;
    let per_cta = c.scratch_size as usize / MAX_CTAS;
    c.scratch_base(dst) + call.cta * per_cta + parity * call.world * ll_capacity(c) * 16
}

/// Waits for the LL packet at `slot` to carry `flag` in both flag words; its data, or None on
/// timeout.
#[inline(always)]
fn receive(slot: usize, flag: u32, deadline: u64) -> Option<[u32; 2]> {
    let mut pkt = [0u32; 4];
    // SAFETY: callers pass a packet slot inside this rank's scratch.
    let ok = wait_until(deadline, || {
        pkt = unsafe { hw::load_v4_volatile(slot as *const [u32; 4]) };
        pkt[1] == flag && pkt[3] == flag
    });
    ok.then_some([pkt[0], pkt[2]])
}

fn one_shot_ll(call: &Call, r: &Region, red: &Reduction) -> Result<(), i32> {
    let units = r.bytes.div_ceil(8);
    let (lo, hi) = split(units, call.ctas, call.cta);
    let parity = (call.epoch & 1) as usize;
    let flag = call.epoch;
    let own = r.at(call.c, call.rank);
    let src_stride = ll_capacity(call.c) * 16; // bytes between two source ranks' packets

    // Push: one volatile 16-byte store per packet per peer, peers in rotated order.
    let mut i = lo + call.tid;
    while i < hi {
        let valid = unit_bytes(i, 8, r.bytes);
        // SAFETY: unit i lies inside the checked region; packet slots lie inside each peer's
        // scratch (i - lo < capacity, checked by `use_one_shot`).
        unsafe {
            let d = load_unit::<2>(own + 8 * i, valid);
            for k in 1..call.world {
                let p = rotate(call.rank, k, call.world);
                let slot = packet_area(call, p, parity) + call.rank * src_stride + (i - lo) * 16;
                hw::store_v4_volatile(slot as *mut [u32; 4], [d[0], flag, d[1], flag]);
            }
        }
        i += call.threads;
    }

    // Reduce in rank order (rank 0 first) so every rank computes bitwise the same result.
    let deadline = call.deadline();
    let inbox = packet_area(call, call.rank, parity);
    let mut late = false;
    let mut i = lo + call.tid;
    while i < hi {
        let valid = unit_bytes(i, 8, r.bytes);
        // Rank p's data for unit i: our own from the buffer, a peer's from its packet.
        let fetch = |p: usize| {
            if p == call.rank {
                // SAFETY: inside the checked region; only this thread writes unit i.
                Some(unsafe { load_unit::<2>(own + 8 * i, valid) })
            } else {
                receive(inbox + p * src_stride + (i - lo) * 16, flag, deadline)
            }
        };
        let Some(first) = fetch(0) else {
            late = true;
            break;
        };
        let mut acc = Acc::<2>::first(red, first);
        for p in 1..call.world {
            match fetch(p) {
                Some(words) => acc.add(red, words),
                None => {
                    late = true;
                    break;
                }
            }
        }
        if late {
            break;
        }
        // SAFETY: inside the checked region.
        unsafe { store_unit::<2>(own + 8 * i, valid, acc.finish(red, call.world)) };
        i += call.threads;
    }
    if hw::sync_threads_or(late) {
        return Err(call.timed_out());
    }
    Ok(())
}

fn two_shot(call: &Call, r: &Region, red: &Reduction) -> Result<(), i32> {
    let units = r.bytes.div_ceil(16);
    call.barrier(0)?;
    // Reduce-scatter: this rank owns shard `rank`; this CTA its slice of that shard.
    let (s_lo, s_hi) = split(units, call.world, call.rank);
    let (lo, hi) = split(s_hi - s_lo, call.ctas, call.cta);
    reduce_units(call, r, r, s_lo + lo, s_lo + hi, red);
    call.barrier(1)?;
    // All-gather: pull every other shard's slice from its owner.
    for k in 1..call.world {
        let p = rotate(call.rank, k, call.world);
        let (s_lo, s_hi) = split(units, call.world, p);
        let (lo, hi) = split(s_hi - s_lo, call.ctas, call.cta);
        copy_units(call, r, p, r, s_lo + lo, s_lo + hi);
    }
    call.barrier(2)
}

/// `dst[i] = reduce over ranks p of src@p[i]` for 16-byte units `lo..hi` (thread-strided).
pub fn reduce_units(
    call: &Call,
    src: &Region,
    dst: &Region,
    lo: usize,
    hi: usize,
    red: &Reduction,
) {
    let mut i = lo + call.tid;
    let out = dst.at(call.c, call.rank);
    while i < hi {
        let valid = unit_bytes(i, 16, src.bytes);
        // SAFETY: unit i lies inside `src` on every rank (same offsets, checked region) and
        // inside `dst` (callers pass regions of at least `src.bytes`).
        unsafe {
            let mut acc = Acc::<4>::first(red, load_unit::<4>(src.at(call.c, 0) + 16 * i, valid));
            for p in 1..call.world {
                acc.add(red, load_unit::<4>(src.at(call.c, p) + 16 * i, valid));
            }
            store_unit::<4>(out + 16 * i, valid, acc.finish(red, call.world));
        }
        i += call.threads;
    }
}

/// Copies 16-byte units `lo..hi` of `src` on rank `from` into `dst` here (thread-strided).
pub fn copy_units(call: &Call, src: &Region, from: usize, dst: &Region, lo: usize, hi: usize) {
    let a = src.at(call.c, from);
    let b = dst.at(call.c, call.rank);
    let mut i = lo + call.tid;
    while i < hi {
        let valid = unit_bytes(i, 16, src.bytes);
        // SAFETY: unit i lies inside both regions (callers pass equal-sized regions).
        unsafe { store_unit::<4>(b + 16 * i, valid, load_unit::<4>(a + 16 * i, valid)) };
        i += call.threads;
    }
}
