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
//!   `PUSH_MIN_BYTES` on, by stores only, in rounds through the scratch (`store_rounds`), or,
//!   where that cannot run, from `SEPARATE_PHASES_MIN_BYTES` on with a barrier between the loads
//!   and the stores.
//!
//! The choice and its thresholds are in `choice`. Every rank computes each result element once,
//! in rank order, so results are bitwise equal.

use super::choice::{choose, two_shot_variant, Algorithm, TwoShot};
use crate::runtime::elem::Reduction;
use crate::runtime::mem::{div_ceil32, load_unit, rotate, split, store_unit, unit_bytes};
use crate::runtime::region::Region;
use crate::runtime::sync::Call;
use crate::transport::bulk::{push_to_all, reduce_units, Deliver};
use crate::transport::ll_packet::{self, Mailboxes};
use crate::transport::store_rounds::{self, Dest};

pub fn all_reduce(call: &Call, r: &Region, red: &Reduction) -> Result<(), i32> {
    if cfg!(ironlink_diag = "call_begun") {
        return Ok(()); // as in the tile all-reduce
    }
    if r.bytes == 0 {
        return Ok(());
    }
    match choose(call.c, call.ctas, r.bytes) {
        Algorithm::OneShotLl => one_shot_ll(call, r, red),
        Algorithm::TwoShotLl => two_shot_ll(call, r, red),
        Algorithm::TwoShot => two_shot(call, r, red),
    }
}

// One unit per thread at a time here, where the LL tile all-reduce moves two
// (`ll_packet::one_shot_reduce`): the op runs many CTAs with about one unit per thread, and the
// batched loop measured 0.3-0.6 us slower at 1-16 KiB in both orders of an A/B on 2 H200s
// (docs/record.md, session 27).
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
    call.agree_on_wait(late)
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
                unsafe {
                    ll_packet::send(
                        mb.slot(call, p, call.rank, i - slo),
                        d,
                        ll_packet::Flags::of(call),
                    )
                };
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

    // Gather: every peer's reduced shard. A thread whose reduce failed skips it; one that had no
    // unit of this rank's shard to reduce (the last rank's is shorter) may time out here and
    // store what its slots held into x (docs/reliability.md: different grids).
    let mut i = slo + call.tid;
    while !late && i < shi {
        let expect = |p: usize| unit_of(p, i) < units;
        let inbox = |p: usize| mb.slot(call, call.rank, call.world + p, i - slo);
        let ok = ll_packet::receive_each(
            call,
            [0; 2],
            expect,
            inbox,
            ll_packet::Flags::of(call),
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
    call.agree_on_wait(late)
}

fn two_shot(call: &Call, r: &Region, red: &Reduction) -> Result<(), i32> {
    let variant = two_shot_variant(call.c, r);
    if variant == TwoShot::Push {
        return two_shot_by_stores(call, r, red);
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

/// Two-shot by stores only: every rank stores its part of shard p into rank p's scratch in
/// rounds, rank p reduces its shard there and stores the result into every rank's buffer
/// (`store_rounds`). Callers check `store_rounds::usable` first.
pub fn two_shot_by_stores(call: &Call, r: &Region, red: &Reduction) -> Result<(), i32> {
    let units = r.bytes.div_ceil(16);
    store_rounds::run(call, r, div_ceil32(units, call.world), Dest::Everyone, red)?;
    // Every shard's result has arrived in every rank's buffer.
    call.barrier(1)
}
