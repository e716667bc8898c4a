//! All-reduce, in place, three algorithms chosen by message size (the same choice on every rank,
//! from arguments and context fields that are equal on all ranks):
//!
//! - one-shot LL (small messages): every rank pushes its data to every peer as LL packets (see
//!   `ll_packet`), then reduces the packets it received. One hop, no barrier; `world - 1` copies
//!   of the message cross each rank's links.
//! - two-shot LL (mid sizes): rank p owns shard p of the message. Every rank sends its part of
//!   shard p to rank p as packets; rank p reduces them and sends the result back to every rank as
//!   packets. Two hops, no barrier; 2 x (world - 1) / world of the message crosses the links.
//! - two-shot (large messages): rank p reduces shard p by loading it from every peer's buffer
//!   with 16-byte vectors, then stores the result into every rank's buffer. Barriers among
//!   same-index CTAs before (the inputs are ready) and after (every shard has arrived). From
//!   `PUSH_MIN_BYTES` on, by stores only through the scratch (`two_shot_push`), or, where that
//!   cannot run, from `SEPARATE_PHASES_MIN_BYTES` on with a barrier between the loads and the
//!   stores.
//!
//! Every rank computes each result element once, in rank order, so results are bitwise equal.

use crate::abi::SymmContext;
use crate::bulk::{push_to_all, reduce_units, Deliver};
use crate::elem::Reduction;
use crate::ll_packet::{self, Mailboxes};
use crate::mem::{div_ceil32, load_unit, rotate, split, store_unit, unit_bytes};
use crate::region::Region;
use crate::sync::Call;
use crate::two_shot_push;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    OneShotLl,
    TwoShotLl,
    TwoShot,
}

/// The algorithm for a message of `bytes` on a grid of `ctas` CTAs: by the context's size
/// limits, where the packets fit.
#[inline(always)]
pub fn choose(c: &SymmContext, ctas: usize, bytes: usize) -> Algorithm {
    if bytes > ll_packet::LL_HARD_MAX_BYTES {
        return Algorithm::TwoShot;
    }
    let world = c.world_size as usize;
    let units = bytes.div_ceil(8);
    if bytes as u64 <= c.ar_one_shot_max_bytes && ll_packet::fits(c, ctas, units, world) {
        Algorithm::OneShotLl
    } else if bytes as u64 <= c.ar_ll_max_bytes
        && ll_packet::fits(c, ctas, div_ceil32(units, world), 2 * world)
    {
        Algorithm::TwoShotLl
    } else {
        Algorithm::TwoShot
    }
}

pub fn all_reduce(call: &Call, r: &Region, red: &Reduction) -> Result<(), i32> {
    if r.bytes == 0 {
        return Ok(());
    }
    match choose(call.c, call.ctas, r.bytes) {
        Algorithm::OneShotLl => one_shot_ll(call, r, red),
        Algorithm::TwoShotLl => two_shot_ll(call, r, red),
        Algorithm::TwoShot => two_shot(call, r, red),
    }
}

fn one_shot_ll(call: &Call, r: &Region, red: &Reduction) -> Result<(), i32> {
    // Box p of every rank holds rank p's packets; this CTA sends its units [lo, hi).
    let units = r.bytes.div_ceil(8);
    let Some((lo, hi, mb)) = Mailboxes::open_share(call, units, call.world) else {
        return Ok(()); // Nothing to send or receive, on any rank.
    };
    let own = r.at(call.c, call.rank);

    let mut i = lo + call.tid;
    while i < hi {
        // SAFETY: unit i lies inside the checked region.
        let d = unsafe { load_unit::<2>(own + 8 * i, unit_bytes(i, 8, r.bytes)) };
        // SAFETY: i - lo < capacity (`choose` checked that the CTA's share fits); box rank < world.
        unsafe { ll_packet::send_to_peers(call, &mb, call.rank, i - lo, d) };
        i += call.threads;
    }

    let mut deadline = call.deadline();
    let mut late = false;
    let mut i = lo + call.tid;
    while i < hi {
        let valid = unit_bytes(i, 8, r.bytes);
        // SAFETY: inside the checked region; only this thread touches unit i.
        let mine = unsafe { load_unit::<2>(own + 8 * i, valid) };
        let inbox = |p: usize| mb.slot(call, call.rank, p, i - lo);
        let Some(sum) = ll_packet::receive_reduced(call, red, mine, inbox, &mut deadline) else {
            late = true;
            break;
        };
        // SAFETY: as above.
        unsafe { store_unit::<2>(own + 8 * i, valid, sum) };
        i += call.threads;
    }
    call.agree_on_timeout(late)
}

fn two_shot_ll(call: &Call, r: &Region, red: &Reduction) -> Result<(), i32> {
    // Shard p = units [p * shard, (p + 1) * shard) (the last ones shorter or empty); this CTA
    // handles index range [slo, shi) of every shard. Box p collects rank p's contributions to
    // this rank's shard; box world + p collects rank p's reduced shard.
    let units = r.bytes.div_ceil(8);
    let shard = div_ceil32(units, call.world);
    // Every rank exchanges packets with rank 0 (shard 0 is full), so the LL-call argument of
    // `ll_packet` holds.
    let Some((slo, shi, mb)) = Mailboxes::open_share(call, shard, 2 * call.world) else {
        return Ok(()); // Nothing to send or receive, on any rank.
    };
    let own = r.at(call.c, call.rank);
    let unit_of = |p: usize, i: usize| p * shard + i;

    // Scatter: our part of each peer's shard goes to that peer.
    let mut i = slo + call.tid;
    while i < shi {
        for k in 1..call.world {
            let p = rotate(call.rank, k, call.world);
            let u = unit_of(p, i);
            if u < units {
                // SAFETY: unit u lies inside the checked region.
                let d = unsafe { load_unit::<2>(own + 8 * u, unit_bytes(u, 8, r.bytes)) };
                // SAFETY: i - slo < capacity (checked by `choose`).
                unsafe { ll_packet::send(mb.slot(call, p, call.rank, i - slo), d, call.epoch) };
            }
        }
        i += call.threads;
    }

    // Reduce our shard and send the result to every peer.
    let mut deadline = call.deadline();
    let mut late = false;
    let mut i = slo + call.tid;
    while i < shi && unit_of(call.rank, i) < units {
        let u = unit_of(call.rank, i);
        let valid = unit_bytes(u, 8, r.bytes);
        // SAFETY: inside the checked region; only this thread touches unit u.
        let mine = unsafe { load_unit::<2>(own + 8 * u, valid) };
        let inbox = |p: usize| mb.slot(call, call.rank, p, i - slo);
        let Some(sum) = ll_packet::receive_reduced(call, red, mine, inbox, &mut deadline) else {
            late = true;
            break;
        };
        // SAFETY: i - slo < capacity (checked by `choose`); box world + rank < 2 world.
        unsafe { ll_packet::send_to_peers(call, &mb, call.world + call.rank, i - slo, sum) };
        // SAFETY: as above.
        unsafe { store_unit::<2>(own + 8 * u, valid, sum) };
        i += call.threads;
    }

    // Gather: every peer's reduced shard.
    let mut i = slo + call.tid;
    while !late && i < shi {
        let expect = |p: usize| unit_of(p, i) < units;
        let inbox = |p: usize| mb.slot(call, call.rank, call.world + p, i - slo);
        let ok = ll_packet::receive_each(
            call,
            [0; 2],
            expect,
            inbox,
            call.epoch,
            &mut deadline,
            |p, d| {
                if p != call.rank {
                    let u = unit_of(p, i);
                    // SAFETY: unit u lies inside the checked region; only this thread touches it.
                    unsafe { store_unit::<2>(own + 8 * u, unit_bytes(u, 8, r.bytes), d) };
                }
            },
        );
        if !ok {
            late = true;
            break;
        }
        i += call.threads;
    }
    call.agree_on_timeout(late)
}

/// How the two-shot algorithm runs a message (the same on every rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TwoShot {
    /// Each thread loads a unit from every rank, reduces it and stores the result to every rank.
    Fused,
    /// All loads, a barrier, then all stores (large messages whose region is not 16-byte
    /// aligned, or when the scratch is too small for `Push`).
    Separate,
    /// Stores only, in rounds through the scratch (`two_shot_push`): large messages.
    Push,
}

#[inline(always)]
pub fn two_shot_variant(c: &SymmContext, r: &Region) -> TwoShot {
    if r.bytes >= PUSH_MIN_BYTES && two_shot_push::usable(c, r) {
        TwoShot::Push
    } else if r.bytes >= SEPARATE_PHASES_MIN_BYTES {
        TwoShot::Separate
    } else {
        TwoShot::Fused
    }
}

fn two_shot(call: &Call, r: &Region, red: &Reduction) -> Result<(), i32> {
    let variant = two_shot_variant(call.c, r);
    if variant == TwoShot::Push {
        return two_shot_push::all_reduce(call, r, red);
    }
    // Shards of `shard` units (the last one shorter); every CTA takes the same slice
    // `[slo, shi)` of every shard, so one split serves all ranks.
    let units = r.bytes.div_ceil(16);
    let shard = div_ceil32(units, call.world);
    let (slo, shi) = split(shard, call.ctas, call.cta);
    let lo = (call.rank * shard + slo).min(units);
    let hi = (call.rank * shard + shi).min(units);
    call.barrier(0)?;
    if variant == TwoShot::Fused {
        // Only this CTA of this rank reads units [lo, hi) of any rank's buffer, so it may
        // overwrite them on every rank as soon as it has read them: no barrier in between.
        reduce_units(call, r, r, lo, hi, red, Deliver::ToAll);
        return call.barrier(1);
    }
    // All loads first, then all stores (a barrier between), rather than each thread
    // alternating between loading from and storing to the peers.
    reduce_units(call, r, r, lo, hi, red, Deliver::Local);
    call.barrier(1)?;
    push_to_all(call, r.offset, r.offset, r.bytes, lo, hi, false);
    call.barrier(2)
}

/// From this size on, two-shot runs as `Push` where it can. Measured on 4 H200s (bf16, A/B/B/A,
/// same GPUs, best grid of each), fused vs push: 2 MiB 17.4 vs 21.1 us, 4 MiB 27.2 vs 30.3,
/// 6 MiB 38.0 vs 40.0, 8 MiB 49.0 vs 48.9, 12 MiB 68.4 vs 66.0, 16 MiB 87.2 vs 84.0.
pub const PUSH_MIN_BYTES: usize = 8 << 20;

/// From this size on, two-shot runs its two halves one after the other where `Push` cannot run.
/// Measured on 4 H200s (bf16, same session), fused vs separate: 16 MiB 88.0 vs 89.4 us, 64 MiB
/// 331 vs 320 us, 256 MiB 1285 vs 1259 us, 1 GiB 5070 vs 4887 us; separate vs push (one run
/// each): 64 MiB 317.5 vs 312.1 us, 256 MiB 1247 vs 1219 us, 1 GiB 4871 vs 4823 us.
pub const SEPARATE_PHASES_MIN_BYTES: usize = 32 << 20;
const _: () = assert!(PUSH_MIN_BYTES <= SEPARATE_PHASES_MIN_BYTES);
