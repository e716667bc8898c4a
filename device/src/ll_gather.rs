//! all_gather and reduce_scatter for small messages: one hop of LL packets (see `ll_packet`),
//! no barrier. Chosen when the whole buffer (all_gather's output, reduce_scatter's input) is at
//! most the context's `gather_ll_max_bytes` and this CTA's share fits its mailboxes; the bulk
//! versions in `collectives` (two barriers) serve the rest.
//!
//! Units are 8 bytes of one rank's block of `n` bytes; CTA c handles units `split(units, ctas,
//! c)` of every block, the same on every rank. Box p of a rank's mailboxes holds rank p's packets.

use crate::abi::SymmContext;
use crate::elem::Reduction;
use crate::ll_packet::{self, Mailboxes};
use crate::mem::{load_unit, rotate, store_unit, unit_bytes};
use crate::region::Region;
use crate::sync::Call;

/// Whether a gather/scatter over a buffer of `total` bytes (blocks of `n`) goes over LL packets.
#[inline(always)]
pub fn use_ll(c: &SymmContext, ctas: usize, total: usize, n: usize) -> bool {
    total <= ll_packet::LL_HARD_MAX_BYTES
        && total as u64 <= c.gather_ll_max_bytes
        && ll_packet::fits(c, ctas, n.div_ceil(8), c.world_size as usize)
}

/// `out[p * n ..][.. n] = input@p` for every rank p (`n = input.bytes`); in place when `input`
/// is this rank's block of `out`.
pub fn all_gather(call: &Call, input: &Region, out: &Region) -> Result<(), i32> {
    let n = input.bytes;
    let units = n.div_ceil(8);
    let Some((lo, hi, mb)) = Mailboxes::open_share(call, units, call.world) else {
        return Ok(()); // Nothing to send or receive, on any rank.
    };
    let (src, dst) = (input.at(call.c, call.rank), out.at(call.c, call.rank));
    let in_place = input.offset == out.offset + call.rank * n;

    let mut i = lo + call.tid;
    while i < hi {
        let valid = unit_bytes(i, 8, n);
        // SAFETY: unit i lies inside the checked input region.
        let d = unsafe { load_unit::<2>(src + 8 * i, valid) };
        // SAFETY: i - lo < capacity (`use_ll`); box rank < world.
        unsafe { ll_packet::send_to_peers(call, &mb, call.rank, i - lo, d) };
        if !in_place {
            // SAFETY: unit i of our own block of the checked output region.
            unsafe { store_unit::<2>(dst + call.rank * n + 8 * i, valid, d) };
        }
        i += call.threads;
    }

    let mut deadline = call.deadline();
    let mut late = false;
    let mut i = lo + call.tid;
    while i < hi {
        let valid = unit_bytes(i, 8, n);
        let inbox = |p: usize| mb.slot(call, call.rank, p, i - lo);
        let ok = ll_packet::receive_each(
            call,
            [0; 2],
            |_| true,
            inbox,
            call.epoch,
            &mut deadline,
            |p, d| {
                if p != call.rank {
                    // SAFETY: unit i of block p of the checked output region; only this thread
                    // writes it.
                    unsafe { store_unit::<2>(dst + p * n + 8 * i, valid, d) };
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

/// `out = reduce over p of input@p[rank * n ..][.. n]` (`n = out.bytes`); `out` may be this
/// rank's block of `input`.
pub fn reduce_scatter(
    call: &Call,
    input: &Region,
    out: &Region,
    red: &Reduction,
) -> Result<(), i32> {
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
            unsafe { ll_packet::send(mb.slot(call, p, call.rank, i - lo), d, call.epoch) };
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
    call.agree_on_timeout(late)
}
