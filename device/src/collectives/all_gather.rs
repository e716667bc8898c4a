//! all_gather: `out[p * n ..][.. n] = input@p` for every rank p. Small buffers go over one hop
//! of LL packets (no barrier); the rest is pushed into every peer's output between two barriers.
//!
//! LL units are 8 bytes of one rank's block of `n` bytes; CTA c handles units `split(units, ctas,
//! c)` of every block, the same on every rank. Box p of a rank's mailboxes holds rank p's packets.

use super::choice::use_ll;
use super::my_units;
use crate::runtime::mem::{load_unit, store_unit, unit_bytes};
use crate::runtime::region::Region;
use crate::runtime::sync::Call;
use crate::transport::bulk::push_to_all;
use crate::transport::ll_packet::{self, Mailboxes};

/// `out[p * n ..][.. n] = input@p` for every rank p: every rank pushes its input into block
/// `rank` of every rank's `out`. In place when `input` is this rank's block of `out` (then
/// there is nothing to copy locally).
pub fn all_gather(call: &Call, input: &Region, out: &Region) -> Result<(), i32> {
    if use_ll(call.c, call.ctas, out.bytes, input.bytes) {
        return by_packets(call, input, out);
    }
    call.barrier(0)?;
    let n = input.bytes;
    let in_place = input.offset == out.offset + call.rank * n;
    let (lo, hi) = my_units(call, n);
    push_to_all(
        call,
        input.offset,
        out.offset + call.rank * n,
        n,
        lo,
        hi,
        !in_place,
    );
    call.barrier(1)
}

/// `out[p * n ..][.. n] = input@p` for every rank p (`n = input.bytes`); in place when `input`
/// is this rank's block of `out`.
fn by_packets(call: &Call, input: &Region, out: &Region) -> Result<(), i32> {
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
            ll_packet::Flags::of(call),
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
    call.agree_on_wait(late)
}
