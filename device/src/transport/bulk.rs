//! Bulk transfers between the ranks' symmetric buffers in 16-byte vectors: reducing units over
//! all ranks (`reduce_units`) and copying units between this rank and its peers, pulling or
//! pushing (`copy_between`). The two-shot all-reduce and the other collectives are built from
//! these; the caller splits the work across CTAs and places the barriers.
//!
//! Full, 16-byte aligned units take the batched path: a thread issues the loads of a unit from
//! every rank before using any, so `world` loads are in flight per thread instead of one (NVLink
//! latency is microseconds; one outstanding 16-byte load per thread leaves the links mostly
//! idle). A partial last unit, or a region that is not 16-byte aligned, takes the narrow path.

use crate::abi::MAX_RANKS;
use crate::hw;
use crate::runtime::elem::{Acc, Reduction};
use crate::runtime::mem::{load_unit, rotate, store_unit, unit_bytes};
use crate::runtime::region::Region;
use crate::runtime::sync::Call;

/// Where `reduce_units` stores its results.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Deliver {
    /// Into this rank's `dst`.
    Local,
    /// Into `dst` on every rank (this one first, then the peers in rotated order).
    ToAll,
}

/// `dst[i] = reduce over ranks p of src@p[i]` for 16-byte units `lo..hi` (thread-strided),
/// stored where `to` says.
pub fn reduce_units(
    call: &Call,
    src: &Region,
    dst: &Region,
    lo: usize,
    hi: usize,
    red: &Reduction,
    to: Deliver,
) {
    // Two units per thread per step while both are full (twice the loads in flight: measured
    // 1-2% faster at 256 MiB on 4 H200s), then one.
    reduce_units_among::<2>(call, (0, call.world), src, dst, lo, hi, red, to);
}

/// `reduce_units` over the ranks `first..first + count` only (`ranks = (first, count)`, which
/// holds this rank): one node of a multi-node context. `Deliver::ToAll` stores into those ranks.
/// `U` full units per thread per step (1 or 2; 2 keeps twice the loads in flight and costs
/// twice their registers).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn reduce_units_among<const U: usize>(
    call: &Call,
    ranks: (usize, usize),
    src: &Region,
    dst: &Region,
    lo: usize,
    hi: usize,
    red: &Reduction,
    to: Deliver,
) {
    let c = call.c;
    let (first, count) = ranks;
    let out = dst.at(c, call.rank);
    let peers = if to == Deliver::ToAll { count } else { 1 };
    let aligned = (src.offset | dst.offset).is_multiple_of(16);
    let fast_hi = if aligned { hi.min(src.bytes / 16) } else { lo };
    let mut i = lo + call.tid;
    while i + (U - 1) * call.threads < fast_hi {
        reduce_full_units::<U>(call, ranks, src, dst, i, red, peers);
        i += U * call.threads;
    }
    if U > 1 && i < fast_hi {
        reduce_full_units::<1>(call, ranks, src, dst, i, red, peers);
    }
    // The narrow path: a partial last unit, or everything when the region is not 16-aligned.
    let mut i = lo.max(fast_hi) + call.tid;
    while i < hi {
        let valid = unit_bytes(i, 16, src.bytes);
        // SAFETY: as above, with `valid` bytes of unit i inside the regions.
        unsafe {
            let mut acc = Acc::<4>::first(red, load_unit::<4>(src.at(c, first) + 16 * i, valid));
            for p in 1..count {
                acc.add(red, load_unit::<4>(src.at(c, first + p) + 16 * i, valid));
            }
            let sum = acc.finish(red, count);
            store_unit::<4>(out + 16 * i, valid, sum);
            for k in 1..peers {
                let at = dst.at(c, first + rotate(call.rank - first, k, count)) + 16 * i;
                store_unit::<4>(at, valid, sum);
            }
        }
        i += call.threads;
    }
}

/// Reduces the full, 16-byte aligned units `i + k * threads` (k < U) over the ranks
/// `(first, count)` and stores the results into `dst` on the first `peers` of them in rotated
/// order (this one first). Every load is issued before any result is combined.
#[inline(always)]
fn reduce_full_units<const U: usize>(
    call: &Call,
    (first, count): (usize, usize),
    src: &Region,
    dst: &Region,
    i: usize,
    red: &Reduction,
    peers: usize,
) {
    const { assert!(U <= 2, "unroll2! unrolls two units") };
    let c = call.c;
    let unit = |k: usize| 16 * (i + k * call.threads);
    let mut v = [[[0u32; 4]; MAX_RANKS]; U];
    for_each_rank!(p => if p < count {
        unroll2!(U, k => {
            // SAFETY: a full unit inside `src` on every rank (same offsets).
            v[k][p] = unsafe { hw::load_v4((src.at(c, first + p) + unit(k)) as *const [u32; 4]) };
        });
    });
    let mut sum = [[0u32; 4]; U];
    unroll2!(U, k => {
        let mut acc = Acc::<4>::first(red, v[k][0]);
        for_each_rank!(p => if p > 0 && p < count {
            acc.add(red, v[k][p]);
        });
        sum[k] = acc.finish(red, count);
    });
    for j in 0..peers {
        let at = dst.at(c, first + rotate(call.rank - first, j, count));
        unroll2!(U, k => {
            // SAFETY: the same full unit of `dst` on that rank (callers pass regions of at
            // least `src.bytes`; offsets are the same on every rank); 16-byte aligned.
            unsafe { hw::store_v4((at + unit(k)) as *mut [u32; 4], sum[k]) };
        });
    }
}

/// One rank's part of a `copy_between`: 16-byte units `lo..hi` of the region at heap offset
/// `src` (`bytes` long) go to the same units of the region at heap offset `dst`.
pub struct Copy {
    pub src: usize,
    pub dst: usize,
    pub bytes: usize,
    pub lo: usize,
    pub hi: usize,
}

/// Which side of a `copy_between` is the peer.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Load from rank p, store here.
    Pull,
    /// Load here, store to rank p (NVLink writes are posted; reads wait for their reply).
    Push,
}

/// Copies, for every rank p for which `plan(p)` is `Some`, its units between rank p and this
/// rank in direction `dir`, spread over the CTA's threads. Full, aligned units move in batches:
/// a thread loads unit `j` of every rank's range before storing any.
pub fn copy_between(call: &Call, dir: Direction, plan: impl Fn(usize) -> Option<Copy>) {
    let c = call.c;
    // (source base, destination base) of rank p's copy.
    let ends = |p: usize| match dir {
        Direction::Pull => (c.heap_base(p), c.heap_base(call.rank)),
        Direction::Push => (c.heap_base(call.rank), c.heap_base(p)),
    };
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
            // SAFETY: a full unit inside the source region.
            v[p] = unsafe { hw::load_v4((ends(p).0 + cp.src + 16 * (cp.lo + j)) as *const [u32; 4]) };
        });
        for_each_rank!(p => if let Some(cp) = plan(p).filter(|cp| p < call.world && cp.lo + j < fast_hi(cp)) {
            let at = ends(p).1 + cp.dst + 16 * (cp.lo + j);
            // SAFETY: the same unit of the destination region, 16-byte aligned.
            unsafe { hw::store_v4(at as *mut [u32; 4], v[p]) };
        });
        j += call.threads;
    }
    // The narrow path: a partial last unit, or every unit of an unaligned range.
    for p in 0..call.world {
        if let Some(cp) = plan(p) {
            let (a, b) = ends(p);
            let (a, b) = (a + cp.src, b + cp.dst);
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

/// Stores units `lo..hi` of this rank's region at heap offset `src` (`bytes` long) into the same
/// units of the region at heap offset `dst` on every rank (this one too when `with_self`), peers
/// in rotated order. Each unit is loaded once and stored `world` (or `world - 1`) times.
pub fn push_to_all(
    call: &Call,
    src: usize,
    dst: usize,
    bytes: usize,
    lo: usize,
    hi: usize,
    with_self: bool,
) {
    push_to_all_among(call, (0, call.world), src, dst, bytes, lo, hi, with_self);
}

/// `push_to_all` into the ranks `base..base + count` only (`ranks = (base, count)`, which holds
/// this rank): one node of a multi-node context.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn push_to_all_among(
    call: &Call,
    (base, count): (usize, usize),
    src: usize,
    dst: usize,
    bytes: usize,
    lo: usize,
    hi: usize,
    with_self: bool,
) {
    let c = call.c;
    let from = c.heap_base(call.rank) + src;
    let first = if with_self { 0 } else { 1 };
    let fast_hi = if (src | dst).is_multiple_of(16) {
        hi.min(bytes / 16)
    } else {
        lo
    };
    let mut i = lo + call.tid;
    while i < fast_hi {
        // SAFETY: a full unit inside the source region.
        let v = unsafe { hw::load_v4((from + 16 * i) as *const [u32; 4]) };
        for k in first..count {
            let at = c.heap_base(base + rotate(call.rank - base, k, count)) + dst + 16 * i;
            // SAFETY: the same unit of the destination region on that rank, 16-byte aligned.
            unsafe { hw::store_v4(at as *mut [u32; 4], v) };
        }
        i += call.threads;
    }
    // The narrow path: a partial last unit, or every unit of an unaligned range.
    let mut i = lo.max(fast_hi) + call.tid;
    while i < hi {
        let valid = unit_bytes(i, 16, bytes);
        // SAFETY: `valid` bytes of unit i lie inside the source and every destination region.
        unsafe {
            let v = load_unit::<4>(from + 16 * i, valid);
            for k in first..count {
                let at = c.heap_base(base + rotate(call.rank - base, k, count)) + dst + 16 * i;
                store_unit::<4>(at, valid, v);
            }
        }
        i += call.threads;
    }
}

/// Stores units `lo..hi` of this rank's region at heap offset `src` (`bytes` long) into the same
/// units of the region at heap offset `dst` on rank `p` (one peer: no per-rank batch to keep in
/// registers, for callers that go over the peers one by one).
pub fn push_to(call: &Call, p: usize, src: usize, dst: usize, bytes: usize, lo: usize, hi: usize) {
    let c = call.c;
    let (from, to) = (c.heap_base(call.rank) + src, c.heap_base(p) + dst);
    let fast_hi = if (src | dst).is_multiple_of(16) {
        hi.min(bytes / 16)
    } else {
        lo
    };
    let mut i = lo + call.tid;
    while i < fast_hi {
        // SAFETY: a full unit inside the source region; the same unit of the destination region
        // on rank p, 16-byte aligned.
        unsafe {
            let v = hw::load_v4((from + 16 * i) as *const [u32; 4]);
            hw::store_v4((to + 16 * i) as *mut [u32; 4], v);
        }
        i += call.threads;
    }
    // The narrow path: a partial last unit, or every unit of an unaligned range.
    let mut i = lo.max(fast_hi) + call.tid;
    while i < hi {
        let valid = unit_bytes(i, 16, bytes);
        // SAFETY: `valid` bytes of unit i lie inside both regions.
        unsafe { store_unit::<4>(to + 16 * i, valid, load_unit::<4>(from + 16 * i, valid)) };
        i += call.threads;
    }
}
