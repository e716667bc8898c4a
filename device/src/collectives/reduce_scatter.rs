//! reduce_scatter: `out = reduce over p of input@p[rank * n ..][.. n]`, where `input` holds
//! `world` blocks of `n = out.bytes`. Three algorithms (chosen in `choice`):
//!
//! - by LL packets (small buffers): every rank sends block p to rank p as packets, which reduces
//!   them; one hop, no barrier;
//! - by stores in rounds through the scratch (`store_rounds`, very large buffers): every rank
//!   stores block p into rank p's scratch, rank p reduces from local memory;
//! - by loads (the rest): rank p pulls block p from every peer between two barriers.

use super::choice::{reduce_scatter_by_stores, use_ll};
use super::my_units;
use crate::runtime::elem::Reduction;
use crate::runtime::mem::{load_unit, rotate, store_unit, unit_bytes};
use crate::runtime::region::Region;
use crate::runtime::sync::Call;
use crate::transport::bulk::{reduce_units, Deliver};
use crate::transport::ll_packet::{self, Mailboxes};
use crate::transport::store_rounds::{self, Dest};

/// `out = reduce over p of input@p[rank * n ..][.. n]`; `input` holds `world` blocks of `out.bytes`.
pub fn reduce_scatter(
    call: &Call,
    input: &Region,
    out: &Region,
    red: &Reduction,
) -> Result<(), i32> {
    if use_ll(call.c, call.ctas, input.bytes, out.bytes) {
        return by_packets(call, input, out, red);
    }
    if reduce_scatter_by_stores(call.c, input, out) {
        return by_stores(call, input, out, red);
    }
    call.barrier(0)?;
    let block = input.sub(call.rank * out.bytes, out.bytes);
    let (lo, hi) = my_units(call, out.bytes);
    reduce_units(call, &block, out, lo, hi, red, Deliver::Local);
    call.barrier(1)
}

/// `out` = the reduction over ranks of block `rank` of `input` (`world` blocks of `out.bytes`;
/// `out` may be that block), by stores in rounds through the scratch. Callers check
/// `store_rounds::usable_for_reduce_scatter` first.
pub fn by_stores(call: &Call, input: &Region, out: &Region, red: &Reduction) -> Result<(), i32> {
    store_rounds::run(call, input, out.bytes / 16, Dest::Local(out.offset), red)?;
    // Every peer has read its scratch: a next call without an entry barrier (LL) may write it.
    call.barrier(1)
}

/// `out = reduce over p of input@p[rank * n ..][.. n]` (`n = out.bytes`); `out` may be this
/// rank's block of `input`.
fn by_packets(call: &Call, input: &Region, out: &Region, red: &Reduction) -> Result<(), i32> {
    let n = out.bytes;
    let units = n.div_ceil(8);
    let Some((lo, hi, mb)) = Mailboxes::open_share(call, units, call.world) else {
        return Ok(()); // Nothing to send or receive, on any rank.
    };
    let (src, dst) = (input.at(call.c, call.rank), out.at(call.c, call.rank));

    // Block p of our input goes to rank p.
    let mut i = lo + call.tid;
    while i < hi {
        let valid = unit_bytes(i, 8, n);
        for k in 1..call.world {
            let p = rotate(call.rank, k, call.world);
            // SAFETY: unit i of block p of the checked input region.
            let d = unsafe { load_unit::<2>(src + p * n + 8 * i, valid) };
            // SAFETY: i - lo < capacity (`use_ll`), so the slot lies in p's scratch.
            unsafe {
                ll_packet::send(
                    mb.slot(call, p, call.rank, i - lo),
                    d,
                    ll_packet::Flags::of(call),
                )
            };
        }
        i += call.threads;
    }

    let mut deadline = call.deadline();
    let mut late = false;
    let mut i = lo + call.tid;
    while i < hi {
        let valid = unit_bytes(i, 8, n);
        // SAFETY: unit i of our own block of the input; only this thread touches it (and the
        // same unit of `out`, which may be that block).
        let mine = unsafe { load_unit::<2>(src + call.rank * n + 8 * i, valid) };
        let inbox = |p: usize| mb.slot(call, call.rank, p, i - lo);
        let Some(sum) = ll_packet::receive_reduced(call, red, mine, inbox, &mut deadline) else {
            late = true;
            break;
        };
        // SAFETY: unit i of the checked output region.
        unsafe { store_unit::<2>(dst + 8 * i, valid, sum) };
        i += call.threads;
    }
    call.agree_on_wait(late)
}
