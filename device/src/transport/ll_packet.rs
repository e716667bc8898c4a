//! LL ("low latency") packets: 16 bytes = 8 data bytes + the call's flag, twice, written with one
//! volatile vector store, so a reader that sees both flags equal to the call's has the data too.
//! No fence and no barrier: a packet is ready when its flags say so. The flag is the call's epoch
//! with the sender's grid xor'ed into its high bits (`Flags`): a packet from a peer that runs this
//! call on another grid is never ready, so nothing is stored. When the wait times out, the CTA
//! reads the call word each peer announced when it opened its mailboxes (`Call::announce`, as a
//! first barrier announces it) and returns `GRID_MISMATCH` if a grid differs
//! (`Call::agree_on_wait`), where the other paths' first barrier finds it at once. Telling a
//! packet of another grid apart in the poll itself cost the LL all-reduce registers, and ptxas
//! spilled.
//!
//! Packets land in the receiver's scratch region, in the slice of the same-index CTA (see
//! `scratch`; a slice never depends on the grid), in one half of it.
//! The halves alternate over the calls in which the CTA exchanges packets at all ("LL calls":
//! its share of the message is not empty, the same on every rank); the CTA's epoch word keeps
//! which half is next. Same-index CTAs of two ranks are never more than one LL call apart: a CTA
//! finishes LL call k only after receiving a call-k packet that depends on every peer having
//! entered call k, i.e. having finished LL call k-1 on every thread. So a sender in LL call k+1
//! writes the other half than a receiver still reading LL call k. (Alternating by epoch parity
//! instead would break when the CTA has nothing to do in a call: a sender could then pass
//! through a call and reach the receiver's half two calls later, while the receiver still reads
//! it.) Flags are epochs, which never repeat within the lifetime of a packet, so nothing is ever
//! cleared.
//!
//! Every algorithm lays out its mailboxes inside the half, so algorithms can alternate from call
//! to call.

use crate::abi::{SymmContext, MAX_CTAS, MAX_RANKS};
use crate::hw;
use crate::runtime::elem::{Acc, Reduction};
use crate::runtime::mem::{div32, div_ceil32, load_unit, rotate, split, store_unit};
use crate::runtime::scratch::slice_bytes;
use crate::runtime::sync::{wait_until, Call, Deadline};

/// Bytes per packet (8 of them data).
pub const PACKET_BYTES: usize = 16;

/// Where the grid sits in the flag: above every bit a `MAX_CTAS` grid needs less, so a packet of
/// this epoch from another grid differs from this call's flag only there. For one grid the flags
/// of 2^32 epochs differ; an older packet of another grid carries this call's flag only if it is
/// 2^GRID_SHIFT LL calls old.
const GRID_SHIFT: u32 = 32 - (MAX_CTAS.ilog2() + 1);

/// The flag of a call's packets: its epoch with the grid (`call.ctas`, 1 for a tile call)
/// xor'ed into the high bits.
#[derive(Clone, Copy)]
pub struct Flags {
    flag: u32,
}

impl Flags {
    #[inline(always)]
    pub fn of(call: &Call) -> Self {
        Flags {
            flag: call.epoch ^ ((call.ctas as u32) << GRID_SHIFT),
        }
    }
}

/// LL algorithms index 8-byte units with 32-bit arithmetic; above this size they are never chosen.
pub const LL_HARD_MAX_BYTES: usize = 1 << 31;

/// `boxes` mailboxes of `capacity` packets each, in this CTA's half of its scratch slice for
/// this LL call. Box `b` of rank `dst` starts at `slot(dst, b, 0)`.
pub struct Mailboxes {
    offset: usize,
    pub capacity: usize,
}

impl Mailboxes {
    /// This CTA's share `[lo, hi)` of `units` (split the same way on every rank) and its
    /// mailboxes, making this call an LL call of the CTA; None when the share is empty (then the
    /// CTA exchanges nothing on any rank, and the call is not an LL call for it). Every thread
    /// calls it.
    #[inline(always)]
    pub fn open_share(call: &Call, units: usize, boxes: usize) -> Option<(usize, usize, Self)> {
        let (lo, hi) = split(units, call.ctas, call.cta);
        if lo == hi {
            return None;
        }
        call.flip_ll_half();
        call.announce();
        let mb = Mailboxes {
            offset: call.cta * slice_bytes(call.c) + call.ll_half * half_bytes(call.c),
            capacity: capacity(call.c, boxes),
        };
        Some((lo, hi, mb))
    }

    /// Address of packet `idx` of box `b` in rank `dst`'s scratch.
    #[inline(always)]
    pub fn slot(&self, call: &Call, dst: usize, b: usize, idx: usize) -> usize {
        call.c.scratch_base(dst) + self.offset + (b * self.capacity + idx) * PACKET_BYTES
    }
}

#[inline(always)]
fn half_bytes(c: &SymmContext) -> usize {
    slice_bytes(c) / 2
}

/// Packets per mailbox when a half holds `boxes` of them (the same on every rank).
#[inline(always)]
fn capacity(c: &SymmContext, boxes: usize) -> usize {
    div32(half_bytes(c), boxes * PACKET_BYTES)
}

/// Whether a CTA's share of `units` packets, split over `ctas` CTAs, fits a mailbox when a half
/// holds `boxes` of them (what `Mailboxes::open_share` callers must check first).
#[inline(always)]
pub fn fits(c: &SymmContext, ctas: usize, units: usize, boxes: usize) -> bool {
    div_ceil32(units, ctas) <= capacity(c, boxes)
}

/// Sends 8 bytes as one packet with `flags`.
///
/// # Safety
/// `slot` is a packet slot inside a mapped scratch region.
#[inline(always)]
pub unsafe fn send(slot: usize, data: [u32; 2], flags: Flags) {
    hw::store_v4_volatile(slot as *mut [u32; 4], packet(data, flags));
}

#[inline(always)]
fn packet(data: [u32; 2], flags: Flags) -> [u32; 4] {
    [data[0], flags.flag, data[1], flags.flag]
}

#[inline(always)]
fn ready(pkt: &[u32; 4], flags: Flags) -> bool {
    pkt[1] == flags.flag && pkt[3] == flags.flag
}

/// Calls `take(p, data)` for every rank p < world in rank order: with `mine` for this rank, and
/// for each peer p with `expect(p)` with the data of the packet at `slot(p)` once it carries
/// `flags`. False on timeout (then `take` was not called for the ranks after the one that timed
/// out, and was called for that one with whatever its slot held: skipping it cost the LL
/// all-reduce registers, and ptxas spilled; the reductions' callers store nothing after a
/// timeout, the gathers store that unit).
///
/// All packets are loaded before waiting on any, so a thread has one round trip to memory in
/// flight per peer instead of waiting on each in turn; each is consumed as soon as it is ready
/// (and its registers freed).
#[inline(always)]
pub fn receive_each(
    call: &Call,
    mine: [u32; 2],
    expect: impl Fn(usize) -> bool,
    slot: impl Fn(usize) -> usize,
    flags: Flags,
    deadline: &mut Deadline,
    mut take: impl FnMut(usize, [u32; 2]),
) -> bool {
    let wanted = |p: usize| p < call.world && p != call.rank && expect(p);
    let mut pkt = [[0u32; 4]; MAX_RANKS];
    // SAFETY (both loops): callers pass slots inside this rank's scratch.
    for_each_rank!(p => if wanted(p) {
        pkt[p] = unsafe { hw::load_v4_volatile(slot(p) as *const [u32; 4]) };
    });
    let mut ok = true;
    for_each_rank!(p => if ok && p == call.rank {
        take(p, mine);
    } else if ok && wanted(p) {
        if !ready(&pkt[p], flags) {
            ok = wait_until(deadline, || {
                pkt[p] = unsafe { hw::load_v4_volatile(slot(p) as *const [u32; 4]) };
                ready(&pkt[p], flags)
            });
        }
        take(p, [pkt[p][0], pkt[p][2]]);
    });
    ok
}

/// The reduction of one 8-byte unit over all ranks, in rank order: `mine` for this rank, the
/// packets in `inbox(p)` for the others. None on timeout.
#[inline(always)]
pub fn receive_reduced(
    call: &Call,
    red: &Reduction,
    mine: [u32; 2],
    inbox: impl Fn(usize) -> usize,
    deadline: &mut Deadline,
) -> Option<[u32; 2]> {
    let mut acc = Acc::<2>::first(red, [0; 2]);
    let ok = receive_each(
        call,
        mine,
        |_| true,
        inbox,
        Flags::of(call),
        deadline,
        |p, d| {
            if p == 0 {
                acc = Acc::first(red, d);
            } else {
                acc.add(red, d);
            }
        },
    );
    ok.then(|| acc.finish(red, call.world))
}

/// Units a thread moves at once in `one_shot_reduce` (`unroll4!`): their loads, and later the
/// polls of their packets, in flight together. One at a time, a thread pays a memory round trip
/// per unit in each phase: a CTA alone on a 16 KiB row (all_reduce_rmsnorm's decode rows, 512
/// threads) has four units per thread (whole-tensor one-shot LL keeps one at a time:
/// `all_reduce::one_shot_ll`). On 2 H200s two took all_reduce_rmsnorm at 1 / 8 tokens
/// (hidden 8192) from 9.26 / 9.59 to 7.93 / 8.00 us, and four did less (8.74 / 9.23: ptxas
/// spills in the rows kernels at 128 registers); docs/record.md.
const UNITS_IN_FLIGHT: usize = 2;
const _: () = assert!(UNITS_IN_FLIGHT <= 4, "unroll4! runs the batch");

/// One-shot LL all-reduce, in place, of `units` 8-byte units by the calling CTA: unit u (at
/// `unit(u)` = (address in this rank's heap, valid bytes)) goes as a packet to `outbox(p, u)`
/// in every peer p; then each unit is reduced in rank order, in f32, with the packets at
/// `inbox(p, u)` here and stored back. Every thread calls it; `TIMEOUT` if a packet never came.
/// Tile calls use it (`tile_ll`), whose CTA works alone: their grids may differ by rank, so it
/// tells no grid apart (its flags carry a grid of 1).
///
/// A thread takes UNITS_IN_FLIGHT units at a time: loads them all, then sends them all; on the
/// way back it goes through the ranks in order, loading rank r + 1's words (its packets, or this
/// rank's own units) before it waits for rank r's, so about one round trip serves a batch.
///
/// # Safety
/// For u < units: `unit(u)` lies inside this rank's checked data (each unit touched by one
/// thread only), `outbox(p, u)` is a packet slot in peer p's mapped memory and `inbox(p, u)` one
/// in this rank's, not written by anything else during the call.
#[inline(always)]
pub unsafe fn one_shot_reduce(
    call: &Call,
    red: &Reduction,
    units: usize,
    unit: impl Fn(usize) -> (usize, usize),
    outbox: impl Fn(usize, usize) -> usize,
    inbox: impl Fn(usize, usize) -> usize,
) -> Result<(), i32> {
    // Timing diagnostics, never in a normal build (`bench/probes/diag_build.sh`; results wrong):
    // "ll_tile_no_exchange" leaves both phases out (what the call costs around its exchange),
    // "ll_tile_no_wait" takes the packets as they are, flags unchecked (the exchange less the
    // wait for arrivals).
    if cfg!(ironlink_diag = "ll_tile_no_exchange") {
        return call.agree_on_timeout(false);
    }
    let flags = Flags::of(call);
    let batch = UNITS_IN_FLIGHT * call.threads;
    let at = |base: usize, j: usize| base + j * call.threads;

    let mut base = call.tid;
    while base < units {
        let mut data = [[0u32; 2]; UNITS_IN_FLIGHT];
        unroll4!(UNITS_IN_FLIGHT, j => if at(base, j) < units {
            let (addr, valid) = unit(at(base, j));
            // SAFETY: by the caller's guarantee.
            data[j] = unsafe { load_unit::<2>(addr, valid) };
        });
        unroll4!(UNITS_IN_FLIGHT, j => if at(base, j) < units {
            for k in 1..call.world {
                let p = rotate(call.rank, k, call.world);
                // SAFETY: by the caller's guarantee.
                unsafe { send(outbox(p, at(base, j)), data[j], flags) };
            }
        });
        base += batch;
    }

    let mut deadline = call.deadline();
    let mut late = false;
    let mut base = call.tid;
    'batches: while base < units {
        // Rank r's words of the batch, as packets: the received ones for a peer, this rank's own
        // units dressed as ready packets for itself.
        let fetch = |r: usize| {
            let mut pkt = [[0u32; 4]; UNITS_IN_FLIGHT];
            unroll4!(UNITS_IN_FLIGHT, j => if at(base, j) < units {
                pkt[j] = if r == call.rank {
                    let (addr, valid) = unit(at(base, j));
                    // SAFETY: by the caller's guarantee.
                    let d = unsafe { load_unit::<2>(addr, valid) };
                    packet(d, flags)
                } else {
                    // SAFETY: by the caller's guarantee.
                    unsafe { hw::load_v4_volatile(inbox(r, at(base, j)) as *const [u32; 4]) }
                };
            });
            pkt
        };
        let mut acc = [const { Acc::<2>::zero() }; UNITS_IN_FLIGHT];
        // Rank after rank, in rank order; the next rank's words go out before waiting on these.
        let mut pkt = fetch(0);
        for r in 0..call.world {
            let pkt_next = if r + 1 < call.world {
                fetch(r + 1)
            } else {
                pkt
            };
            unroll4!(UNITS_IN_FLIGHT, j => if !late && at(base, j) < units {
                if !ready(&pkt[j], flags) && !cfg!(ironlink_diag = "ll_tile_no_wait") {
                    late = !wait_until(&mut deadline, || {
                        // SAFETY: as above (only a peer's packet can be not ready).
                        pkt[j] = unsafe { hw::load_v4_volatile(inbox(r, at(base, j)) as *const [u32; 4]) };
                        ready(&pkt[j], flags)
                    });
                }
                let d = [pkt[j][0], pkt[j][2]];
                if r == 0 {
                    acc[j] = Acc::first(red, d);
                } else {
                    acc[j].add(red, d);
                }
            });
            if late {
                break 'batches;
            }
            pkt = pkt_next;
        }
        unroll4!(UNITS_IN_FLIGHT, j => if at(base, j) < units {
            let (addr, valid) = unit(at(base, j));
            // SAFETY: by the caller's guarantee.
            unsafe { store_unit::<2>(addr, valid, acc[j].finish(red, call.world)) };
        });
        base += batch;
    }
    call.agree_on_timeout(late)
}

/// Sends `data` as a packet into box `b` at index `idx` of every peer, in rotated order.
///
/// # Safety
/// `idx < mb.capacity` and `b` is one of the boxes `mb` was opened with.
#[inline(always)]
pub unsafe fn send_to_peers(call: &Call, mb: &Mailboxes, b: usize, idx: usize, data: [u32; 2]) {
    for k in 1..call.world {
        let p = rotate(call.rank, k, call.world);
        // SAFETY: by the caller's guarantee the slot lies in p's scratch.
        unsafe { send(mb.slot(call, p, b, idx), data, Flags::of(call)) };
    }
}
