//! Store-only rounds: the transport of the large two-shot all-reduce and reduce-scatter
//! (`collectives::all_reduce::two_shot_by_stores`, `collectives::reduce_scatter`), moving a
//! message by stores only, in rounds through the receivers' scratch.
//!
//! Rank p owns shard p of the message. Per round, every rank pushes its part of each peer's
//! shard into that peer's scratch ("scatter"), posts the round (see `progress`), and once every
//! peer has posted it reduces its own shard from its input and the scratch (local loads) and
//! stores the result into every rank's buffer ("reduce and broadcast"; the reduce-scatter stores
//! it into its output only). Everything crosses NVLink as stores: on 4 H200s, SM stores to peers
//! move 352 GB/s per GPU where loads from peers move 322 (`bench/probes/nvlink_probe.py`).
//!
//! A call starts and ends with a barrier among same-index CTAs: a peer's previous call, or its
//! next one, may be an LL call, which writes the same scratch slice without a barrier of its own.
//!
//! Each CTA works in its own slice of every rank's scratch (see `scratch`), cut into
//! `BUFFERS` buffers that rounds use in turn; in buffer b of rank j, sender p has box
//! `(p - j - 1) mod world` of one chunk (at most `capacity` 16-byte units: see `Plan::chunk`
//! for how shards are cut and dealt to CTAs). A CTA pushes round r + 1, waits for
//! round r, posts round r + 1 and then reduces round r, so the flags of round r have had a whole
//! round to arrive. That needs four buffers: the push of round r + 1 reuses the buffer of round
//! r - 3, which a receiver has finished reading once it posts round r - 1, and this CTA waited
//! for round r - 1 before.
//!
//! Every result element is computed by one rank (its shard's owner), so results are bitwise
//! equal on every rank.

use super::progress::Progress;
use crate::abi::{SymmContext, MAX_RANKS};
use crate::hw;
use crate::runtime::elem::{Acc, Reduction};
use crate::runtime::mem::{div32, div_ceil32, load_unit, rotate, store_unit, unit_bytes};
use crate::runtime::region::Region;
use crate::runtime::scratch::{slice_base, slice_bytes};
use crate::runtime::sync::Call;

/// Buffers per CTA slice (see the module docs for why four).
pub const BUFFERS: usize = 4;

/// Peers whose units a thread holds at once: loads in flight without registers for all eight
/// (the kernel's other paths need them; more spilled on sm_80 and sm_100).
const GROUP: usize = 4;
const _: () = assert!(GROUP * 2 == MAX_RANKS, "unroll2! runs two groups");

/// Bytes in one buffer (a multiple of 16).
#[inline(always)]
fn buffer_bytes(c: &SymmContext) -> usize {
    slice_bytes(c) / BUFFERS / 16 * 16
}

/// 16-byte units each sender has per receiver and round: 0 when the scratch is too small (or
/// there are no peers), and then this algorithm is not used.
#[inline(always)]
pub fn capacity(c: &SymmContext, world: usize) -> usize {
    if world < 2 {
        return 0;
    }
    div32(buffer_bytes(c) / 16, world - 1)
}

/// Box of `sender`'s data in `receiver`'s buffers: `(sender - receiver - 1) mod world`.
#[inline(always)]
fn box_of(sender: usize, receiver: usize, world: usize) -> usize {
    rotate(sender, world - 1 - receiver, world)
}

/// Where the reduced shard goes.
#[derive(Clone, Copy)]
pub enum Dest {
    /// Into the message itself on every rank (all-reduce, in place).
    Everyone,
    /// Into this rank's region at this heap offset (reduce-scatter; may be its own shard).
    Local(usize),
}

/// One call's geometry, the same on every rank.
struct Plan<'a> {
    call: &'a Call<'a>,
    /// The message: `world` shards (this rank's input).
    r: &'a Region,
    dest: Dest,
    /// 16-byte units in the message and in each shard (the last shard shorter or empty).
    units: usize,
    shard: usize,
    /// Shard units one round of one CTA moves, and the size of a sender's box in a buffer
    /// (<= `capacity`): every shard is cut into chunks dealt to the CTAs in turn, chunk j being
    /// round j / ctas of CTA j % ctas, so that at any time the CTAs move neighbouring chunks.
    /// (The integer widths here are ptxas's register allocation's: other shapes spilled.)
    chunk: u32,
    /// Where this CTA's first chunk starts, and how far its next one is.
    first: usize,
    step: usize,
}

impl Plan<'_> {
    /// Shard indices of `round` (empty past the shard's end).
    fn window(&self, round: usize) -> (usize, usize) {
        let lo = (self.first + round * self.step).min(self.shard);
        (lo, (lo + self.chunk as usize).min(self.shard))
    }

    /// Address in `receiver`'s scratch of `sender`'s unit for shard index `i` of `round`.
    fn scratch_unit(&self, receiver: usize, sender: usize, round: usize, i: usize) -> usize {
        let c = self.call.c;
        let buffer = slice_base(c, receiver, self.call.cta) + (round % BUFFERS) * buffer_bytes(c);
        let start = self.window(round).0;
        buffer
            + (box_of(sender, receiver, self.call.world) * self.chunk as usize + (i - start)) * 16
    }

    /// Pushes this rank's units of `round` of every peer's shard into that peer's scratch.
    fn scatter(&self, round: usize) {
        let call = self.call;
        let own = self.r.at(call.c, call.rank);
        let (lo, hi) = self.window(round);
        let mut i = lo + call.tid;
        while i < hi {
            // Loads before stores, four peers at a time: several local loads in flight per
            // thread (each store waits for its load), with registers for four units only.
            unroll2!(MAX_RANKS / GROUP, g => {
                let mut v = [[0u32; 4]; GROUP];
                for_each_rank!(k => if k / GROUP == g && k >= 1 && k < call.world {
                    let u = rotate(call.rank, k, call.world) * self.shard + i;
                    if u < self.units {
                        // SAFETY: `valid` bytes of unit u lie inside the checked region.
                        v[k % GROUP] = unsafe { load_unit::<4>(own + 16 * u, unit_bytes(u, 16, self.r.bytes)) };
                    }
                });
                for_each_rank!(k => if k / GROUP == g && k >= 1 && k < call.world {
                    let p = rotate(call.rank, k, call.world);
                    if p * self.shard + i < self.units {
                        let at = self.scratch_unit(p, call.rank, round, i);
                        // SAFETY: a 16-byte unit inside box `box_of(rank, p)` of this CTA's
                        // buffer in p's scratch (i - window start < chunk); scratch is 16-byte aligned.
                        unsafe { hw::store_v4(at as *mut [u32; 4], v[k % GROUP]) };
                    }
                });
            });
            i += call.threads;
        }
    }

    /// Reduces this rank's units of `round` of its own shard (input here, peers' parts in the
    /// scratch) and stores the results where `dest` says. The order is rotated, starting
    /// with this rank (the shard's owner, the only rank that computes these elements).
    fn reduce_and_deliver(&self, round: usize, red: &Reduction) {
        let call = self.call;
        let c = call.c;
        let (lo, hi) = self.window(round);
        // Peer rotate(rank, k)'s box is k - 1: its units are `stride` apart in our buffer.
        let first_box = self.scratch_unit(call.rank, rotate(call.rank, 1, call.world), round, lo);
        let stride = self.chunk as usize * 16;
        let mut i = lo + call.tid;
        while i < hi && call.rank * self.shard + i < self.units {
            let u = call.rank * self.shard + i;
            // Reduce-scatter blocks are whole units (`usable_for_reduce_scatter`): no narrow path,
            // which also keeps the loop from being duplicated per case (registers).
            let valid = match self.dest {
                Dest::Everyone => unit_bytes(u, 16, self.r.bytes),
                Dest::Local(_) => 16,
            };
            let row = first_box + (i - lo) * 16;
            let own = self.r.at(c, call.rank) + 16 * u;
            let mine = match self.dest {
                // SAFETY: `valid` bytes of unit u lie inside the checked region.
                Dest::Everyone => unsafe { load_unit::<4>(own, valid) },
                // SAFETY: a whole, 16-byte aligned unit inside the checked region.
                Dest::Local(_) => unsafe { hw::load_v4(own as *const [u32; 4]) },
            };
            let mut acc = Acc::<4>::first(red, mine);
            // Peers in rotated order, four at a time (all four loads before their adds).
            unroll2!(MAX_RANKS / GROUP, g => {
                let mut v = [[0u32; 4]; GROUP];
                for_each_rank!(k => if k / GROUP == g && k >= 1 && k < call.world {
                    // SAFETY: unit i - lo of box k - 1 of our own scratch, which peer
                    // rotate(rank, k) filled for this round.
                    v[k % GROUP] = unsafe { hw::load_v4((row + (k - 1) * stride) as *const [u32; 4]) };
                });
                for_each_rank!(k => if k / GROUP == g && k >= 1 && k < call.world {
                    acc.add(red, v[k % GROUP]);
                });
            });
            let sum = acc.finish(red, call.world);
            match self.dest {
                Dest::Everyone => {
                    for k in 0..call.world {
                        let at = self.r.at(c, rotate(call.rank, k, call.world)) + 16 * u;
                        // SAFETY: the same `valid` bytes of the region on that rank (same offsets).
                        unsafe { store_unit::<4>(at, valid, sum) };
                    }
                }
                Dest::Local(out) => {
                    let at = c.heap_base(call.rank) + out + 16 * i;
                    // SAFETY: whole unit i of the 16-byte aligned output region (shard-sized,
                    // checked by the caller).
                    unsafe { hw::store_v4(at as *mut [u32; 4], sum) };
                }
            }
            i += call.threads;
        }
    }
}

/// Whether the all-reduce can run on `r` here: 16-byte aligned (scratch boxes hold whole units)
/// and a scratch slice with room for at least one unit per sender.
#[inline(always)]
pub fn usable(c: &SymmContext, r: &Region) -> bool {
    r.offset.is_multiple_of(16) && capacity(c, c.world_size as usize) > 0
}

/// Whether the reduce-scatter can run: as `usable`, with blocks of whole units and an aligned
/// output.
#[inline(always)]
pub fn usable_for_reduce_scatter(c: &SymmContext, input: &Region, out: &Region) -> bool {
    usable(c, input) && (out.offset | out.bytes).is_multiple_of(16)
}

/// Scatter by stores and reduce, round by round, of `r` cut into shards of `shard` units. Starts
/// with a barrier among same-index CTAs; the caller ends the call with one (`barrier(1)`), so
/// that a next call without an entry barrier (LL) may write the scratch again.
pub fn run(call: &Call, r: &Region, shard: usize, dest: Dest, red: &Reduction) -> Result<(), i32> {
    let cap = capacity(call.c, call.world);
    // As few rounds as the boxes allow, every CTA the same number, each as full as an even
    // split makes it. ceil(ceil(a / b) / c) = ceil(a / (b c)), and ctas * cap may pass 2^32.
    let rounds = div_ceil32(div_ceil32(shard, cap), call.ctas);
    let chunk = div_ceil32(shard, call.ctas * rounds.max(1)) as u32;
    let plan = Plan {
        call,
        r,
        dest,
        units: r.bytes.div_ceil(16),
        shard,
        chunk,
        first: call.cta * chunk as usize,
        step: call.ctas * chunk as usize,
    };
    // Entry barrier: the same-index CTA of every peer has left its previous call, so nobody
    // still reads the scratch slice this call writes (an LL call ends without a barrier).
    call.barrier(0)?;
    let progress = Progress::open(call);
    if rounds > 0 {
        stage_scatter(&plan, 0);
        progress.sync_and_post(call, 0);
    }
    for round in 0..rounds {
        if round + 1 < rounds {
            stage_scatter(&plan, round + 1);
        }
        // One CTA barrier per round: the wait's, after which round + 1's stores are complete
        // CTA-wide and can be posted; only the posting threads then wait for their release.
        progress.wait(call, round)?;
        if round + 1 < rounds {
            progress.post(call, round + 1);
        }
        stage_reduce(&plan, round, red);
    }
    progress.close(call, rounds);
    Ok(())
}

// Timing diagnostics, never in a normal build: `--cfg ironlink_diag="no_scatter"`, `"no_reduce"`
// or `"no_stages"` leaves that stage out (flags and barriers stay), so that each stage's time
// comes out by difference (`bench/probes/diag_build.sh`). The results of such a build are wrong.
#[inline(always)]
fn stage_scatter(plan: &Plan, round: usize) {
    if !cfg!(ironlink_diag = "no_scatter") && !cfg!(ironlink_diag = "no_stages") {
        plan.scatter(round);
    }
}

#[inline(always)]
fn stage_reduce(plan: &Plan, round: usize, red: &Reduction) {
    if !cfg!(ironlink_diag = "no_reduce") && !cfg!(ironlink_diag = "no_stages") {
        plan.reduce_and_deliver(round, red);
    }
}
