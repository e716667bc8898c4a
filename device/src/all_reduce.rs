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

use crate::abi::{SymmContext, MAX_CTAS, MAX_RANKS};
use crate::elem::{Acc, Reduction};
use crate::hw;
use crate::mem::{div32, div_ceil32, load_unit, rotate, split, store_unit, unit_bytes};
use crate::region::Region;
use crate::sync::{wait_until, Call};

/// Runs `$body` with `$p` bound to each constant 0..MAX_RANKS, unrolled by the macro itself.
macro_rules! for_each_rank {
    ($p:ident => $body:stmt) => {{
        const _: () = assert!(crate::abi::MAX_RANKS == 8);
        {
            let $p: usize = 0;
            $body
        }
        {
            let $p: usize = 1;
            $body
        }
        {
            let $p: usize = 2;
            $body
        }
        {
            let $p: usize = 3;
            $body
        }
        {
            let $p: usize = 4;
            $body
        }
        {
            let $p: usize = 5;
            $body
        }
        {
            let $p: usize = 6;
            $body
        }
        {
            let $p: usize = 7;
            $body
        }
    }};
}

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
    // Shards of `shard` units (the last one shorter); every CTA takes the same slice
    // `[slo, shi)` of every shard, so one split serves all ranks.
    let units = r.bytes.div_ceil(16);
    let shard = div_ceil32(units, call.world);
    let (slo, shi) = split(shard, call.ctas, call.cta);
    let slice = |p: usize| ((p * shard + slo).min(units), (p * shard + shi).min(units));
    call.barrier(0)?;
    // Reduce-scatter: this rank reduces its slice of its own shard, in place.
    let (lo, hi) = slice(call.rank);
    reduce_units(call, r, r, lo, hi, red);
    call.barrier(1)?;
    // All-gather: pull every other shard's slice from its owner.
    copy_from_peers(call, |p| {
        let (lo, hi) = slice(p);
        (p != call.rank).then_some(Copy {
            src: r.offset,
            dst: r.offset,
            bytes: r.bytes,
            lo,
            hi,
        })
    });
    call.barrier(2)
}

/// `dst[i] = reduce over ranks p of src@p[i]` for 16-byte units `lo..hi` (thread-strided).
///
/// Full, aligned units take the batched path: a thread loads its unit from every rank before
/// combining any, so `world` loads are in flight per thread instead of one (NVLink latency is
/// microseconds; one outstanding 16-byte load per thread leaves the links mostly idle).
pub fn reduce_units(
    call: &Call,
    src: &Region,
    dst: &Region,
    lo: usize,
    hi: usize,
    red: &Reduction,
) {
    let c = call.c;
    let out = dst.at(c, call.rank);
    let aligned = (src.offset | dst.offset).is_multiple_of(16);
    let fast_hi = if aligned { hi.min(src.bytes / 16) } else { lo };
    let mut i = lo + call.tid;
    while i < fast_hi {
        // Constant indices (not a loop the compiler may leave rolled) keep `v` in registers.
        let mut v = [[0u32; 4]; MAX_RANKS];
        for_each_rank!(p => if p < call.world {
            // SAFETY: unit i is a full unit inside `src` on every rank (same offsets).
            v[p] = unsafe { hw::load_v4((src.at(c, p) + 16 * i) as *const [u32; 4]) };
        });
        let mut acc = Acc::<4>::first(red, v[0]);
        for_each_rank!(p => if p > 0 && p < call.world {
            acc.add(red, v[p]);
        });
        // SAFETY: inside `dst` (callers pass regions of at least `src.bytes`), 16-byte aligned.
        unsafe { hw::store_v4((out + 16 * i) as *mut [u32; 4], acc.finish(red, call.world)) };
        i += call.threads;
    }
    // The narrow path: a partial last unit, or everything when the region is not 16-aligned.
    let mut i = lo.max(fast_hi) + call.tid;
    while i < hi {
        let valid = unit_bytes(i, 16, src.bytes);
        // SAFETY: as above, with `valid` bytes of unit i inside the regions.
        unsafe {
            let mut acc = Acc::<4>::first(red, load_unit::<4>(src.at(c, 0) + 16 * i, valid));
            for p in 1..call.world {
                acc.add(red, load_unit::<4>(src.at(c, p) + 16 * i, valid));
            }
            store_unit::<4>(out + 16 * i, valid, acc.finish(red, call.world));
        }
        i += call.threads;
    }
}

/// One rank's part of a `copy_from_peers`: 16-byte units `lo..hi` of the region at heap offset
/// `src` on that rank (`bytes` long) go to the same units of the region at heap offset `dst` here.
pub struct Copy {
    pub src: usize,
    pub dst: usize,
    pub bytes: usize,
    pub lo: usize,
    pub hi: usize,
}

/// Copies, for every rank p for which `plan(p)` is `Some`, its units into this rank's memory,
/// spread over the CTA's threads. Full, aligned units move in batches: a thread loads unit `j`
/// of every rank's range before storing any (see `reduce_units` for why).
pub fn copy_from_peers(call: &Call, plan: impl Fn(usize) -> Option<Copy>) {
    let c = call.c;
    // Units of `cp` that take the batched path: full and 16-byte aligned.
    let fast_hi = |cp: &Copy| {
        if (cp.src | cp.dst).is_multiple_of(16) {
            cp.hi.min(cp.bytes / 16)
        } else {
            cp.lo
        }
    };
    let mut span = 0;
    for p in 0..call.world {
        if let Some(cp) = plan(p) {
            span = span.max(fast_hi(&cp).saturating_sub(cp.lo));
        }
    }
    let mut j = call.tid;
    while j < span {
        let mut v = [[0u32; 4]; MAX_RANKS];
        for_each_rank!(p => if let Some(cp) = plan(p).filter(|cp| p < call.world && cp.lo + j < fast_hi(cp)) {
            // SAFETY: a full unit inside rank p's source region.
            v[p] = unsafe { hw::load_v4((c.heap_base(p) + cp.src + 16 * (cp.lo + j)) as *const [u32; 4]) };
        });
        for_each_rank!(p => if let Some(cp) = plan(p).filter(|cp| p < call.world && cp.lo + j < fast_hi(cp)) {
            let at = c.heap_base(call.rank) + cp.dst + 16 * (cp.lo + j);
            // SAFETY: the same unit of the destination region here, 16-byte aligned.
            unsafe { hw::store_v4(at as *mut [u32; 4], v[p]) };
        });
        j += call.threads;
    }
    // The narrow path: a partial last unit, or every unit of an unaligned range.
    for p in 0..call.world {
        if let Some(cp) = plan(p) {
            let (a, b) = (c.heap_base(p) + cp.src, c.heap_base(call.rank) + cp.dst);
            let mut i = cp.lo.max(fast_hi(&cp)) + call.tid;
            while i < cp.hi {
                let valid = unit_bytes(i, 16, cp.bytes);
                // SAFETY: `valid` bytes of unit i lie inside both regions.
                unsafe { store_unit::<4>(b + 16 * i, valid, load_unit::<4>(a + 16 * i, valid)) };
                i += call.threads;
            }
        }
    }
}
