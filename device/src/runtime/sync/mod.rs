//! Cross-rank synchronization of same-index CTAs: per-call epochs, the barrier, and bounded waits.
//!
//! Every collective call on CTA `c` of rank `r` talks only to CTA `c` of the other ranks. Each
//! CTA keeps a call counter (its epoch) in its rank's signal region; because all ranks make the
//! same calls with the same grid, the counters of same-index CTAs stay equal, so a call can tag
//! its flags with the epoch and never has to clear them (CUDA-graph safe: the state lives in
//! device memory, not in kernel arguments).
//!
//! A tile-scoped call does the same on a tile's slot instead of a CTA's: its own counter and
//! barrier slots, matched with the same tile index on every rank, whichever CTA runs it.
//!
//! Here the call's epoch and its barriers; `failures` holds how a call finds that the ranks
//! disagree (its call words) and records why it failed, `deadline` the bounded waits.

use crate::abi::{signal, status, SymmContext, MAX_RANKS};
use crate::hw;
use crate::runtime::context;

mod deadline;
mod failures;

pub use deadline::{wait_until, Deadline};

/// Epochs live in 30 bits and skip 0, so that LL flags (`epoch`) are never 0 (what an untouched
/// scratch word holds) and barrier values (`epoch << 2 | phase`) run through all of u32 in order,
/// wrapping around with the epoch; barriers compare them in wrapping arithmetic.
const EPOCH_MASK: u32 = (1 << 30) - 1;
/// Bit 30 of the epoch word: which half of its scratch slice the CTA's next LL exchange uses
/// (see `ll_packet`).
const LL_HALF_SHIFT: u32 = 30;

/// Barrier phases available within one call (`epoch << 2 | phase`).
pub const MAX_PHASES: u32 = 4;

/// The slots a call synchronizes on: the CTAs' (whole-tensor calls) or the tiles' (tile calls).
/// (Two words: with the remote-transport offsets here too, `Call` grew enough that LLVM kept it
/// in local memory in the one-node all-reduce; `Call::remote_words` derives those instead.)
#[derive(Clone, Copy)]
struct Slots {
    /// Byte offsets in the signal region of the `[slot]` epoch words and `[slot][rank]` barrier flags.
    epoch: usize,
    barrier: usize,
}

const CTA_SLOTS: Slots = Slots {
    epoch: signal::EPOCH_OFFSET,
    barrier: signal::BARRIER_OFFSET,
};
const TILE_SLOTS: Slots = Slots {
    epoch: signal::TILE_EPOCH_OFFSET,
    barrier: signal::TILE_BARRIER_OFFSET,
};

/// The context and this CTA's coordinates for one call.
pub struct Call<'a> {
    pub c: &'a SymmContext,
    pub rank: usize,
    pub world: usize,
    /// The slot this call is matched on across ranks: the CTA index, or, for a tile call, the
    /// tile index. Scratch slices and round flags (whole-tensor calls only) are per CTA slot too.
    pub cta: usize,
    /// CTAs sharing the work: the grid, or 1 for a tile call (its CTA works alone).
    pub ctas: usize,
    pub tid: usize,
    pub threads: usize,
    pub epoch: u32,
    /// The scratch half (0 or 1) this CTA's next LL exchange uses.
    pub ll_half: usize,
    /// Which exported function this is (its index in `EXPORTS`), for the error record.
    pub which: i32,
    slots: Slots,
}

fn epoch_word(c: &SymmContext, slots: Slots, slot: usize) -> *mut u32 {
    (c.signal_base(c.rank as usize) + slots.epoch + slot * 4) as *mut u32
}

impl<'a> Call<'a> {
    /// Starts a call: every thread reads this CTA's epoch and one thread advances it.
    ///
    /// The barrier before the read keeps a thread from reading before the previous call's
    /// increment, and keeps every thread out of this call until all threads of the CTA have
    /// finished the previous one (whose scratch slots this call's successor reuses); the one
    /// after keeps thread 0 from writing before everyone has read. So a call needs no barrier at
    /// its end.
    pub fn begin(c: &'a SymmContext, which: i32) -> Result<Self, i32> {
        let cta = hw::cta_rank() as usize;
        let ctas = hw::grid_ctas() as usize;
        if ctas > crate::abi::MAX_CTAS {
            return Err(status::INVALID_ARGUMENT);
        }
        Ok(Self::start(c, which, CTA_SLOTS, cta, ctas))
    }

    /// Starts a tile call: this CTA alone, matched with tile `tile` on every rank (the caller
    /// checked `tile < MAX_TILES`). Every thread calls it.
    pub fn begin_tile(c: &'a SymmContext, which: i32, tile: usize) -> Self {
        Self::start(c, which, TILE_SLOTS, tile, 1)
    }

    #[inline(always)]
    fn start(c: &'a SymmContext, which: i32, slots: Slots, cta: usize, ctas: usize) -> Self {
        let tid = hw::thread_rank() as usize;
        let word = epoch_word(c, slots, cta);
        hw::sync_threads();
        // SAFETY: `word` is inside this rank's signal region (cta < MAX_CTAS, or tile < MAX_TILES).
        let state = unsafe { hw::load_relaxed_u32(word) };
        let ll_half = state >> LL_HALF_SHIFT & 1;
        let mut epoch = state.wrapping_add(1) & EPOCH_MASK;
        if epoch == 0 {
            epoch = 1;
        }
        hw::sync_threads();
        if hw::thread_rank_fresh() == 0 {
            // SAFETY: as above.
            unsafe { hw::store_relaxed_u32(word, epoch | ll_half << LL_HALF_SHIFT) };
        }
        Call {
            c,
            rank: c.rank as usize,
            world: c.world_size as usize,
            cta,
            ctas,
            tid,
            threads: hw::cta_threads() as usize,
            epoch,
            ll_half: ll_half as usize,
            which,
            slots,
        }
    }

    /// Marks this call as one in which the CTA exchanges LL packets in half `ll_half`: the next
    /// such call uses the other half. Every thread calls it (thread 0 writes).
    pub fn flip_ll_half(&self) {
        if hw::thread_rank_fresh() == 0 {
            let next = self.epoch | ((self.ll_half as u32) ^ 1) << LL_HALF_SHIFT;
            // SAFETY: this CTA's epoch word, inside this rank's signal region; only thread 0
            // writes it, and readers pass a CTA barrier first (in the next `begin`).
            unsafe { hw::store_relaxed_u32(epoch_word(self.c, self.slots, self.cta), next) };
        }
    }

    /// Byte offset in the signal region of this call's `[slot][MAX_NODES]` remote-transport
    /// words: arrivals (`arrive`) or acknowledgements (`transport::remote`).
    #[inline(always)]
    pub fn remote_words(&self, arrive: bool) -> usize {
        match (self.is_tile(), arrive) {
            (false, true) => signal::REMOTE_ARRIVE_OFFSET,
            (false, false) => signal::REMOTE_ACK_OFFSET,
            (true, true) => signal::REMOTE_TILE_ARRIVE_OFFSET,
            (true, false) => signal::REMOTE_TILE_ACK_OFFSET,
        }
    }

    /// Whether this is a tile call (`cta` is then a tile index, and the CTA has no scratch
    /// slice of that index).
    #[inline(always)]
    pub fn is_tile(&self) -> bool {
        self.slots.epoch == signal::TILE_EPOCH_OFFSET
    }

    /// A deadline for this call's waits (the clock starts at the first wait that spins).
    pub fn deadline(&self) -> Deadline {
        Deadline::new(self.c)
    }

    /// Barrier among CTA `self.cta` of every rank. `phase` < MAX_PHASES distinguishes the
    /// barriers of one call. All memory accesses this CTA made before it are visible to the
    /// same-index CTAs of every peer after it.
    ///
    /// At phase 0, the call's first barrier, the ranks also compare their call words
    /// (`call_id`): a peer that runs this call on another grid gives `GRID_MISMATCH`, one whose
    /// heap digest differs `HEAP_ASYMMETRIC`, on every rank, before the call touches any data
    /// (every collective that addresses peers' buffers by offset starts with this barrier).
    pub fn barrier(&self, phase: u32) -> Result<(), i32> {
        self.barrier_among(phase, 0, self.world)
    }

    /// `barrier` among the ranks `first..first + count` only (one node of a multi-node context,
    /// `collectives::hierarchical`). Flags are indexed by rank slot (slot `[cta][p % MAX_RANKS]`
    /// is written by rank p alone among the node's ranks), so node barriers and whole-world ones
    /// share them.
    #[inline(always)]
    pub fn barrier_among(&self, phase: u32, first: usize, count: usize) -> Result<(), i32> {
        // The diagnostic build `--cfg ironlink_diag="no_call_check"` leaves the check out, so that
        // its cost comes out by difference (bench/ab.sh); never in a normal build.
        let check = phase == 0 && !cfg!(ironlink_diag = "no_call_check");
        self.sync_among(phase, first, count, check)
    }

    /// `barrier_among`, announcing and comparing call words if `check` (a constant where this
    /// inlines).
    #[inline(always)]
    fn sync_among(&self, phase: u32, first: usize, count: usize, check: bool) -> Result<(), i32> {
        let value = (self.epoch << 2) | phase;
        let mut late = false;
        hw::sync_threads();
        let tid = hw::thread_rank_fresh() as usize;
        if tid < count {
            let p = first + tid;
            let peer = signal_base_fresh(self.c, p);
            if check {
                // Before the flag: its release store below carries this word to rank p too.
                // SAFETY: peer p's signal region is mapped; the slot is inside its call words.
                unsafe { hw::store_relaxed_u64(self.call_word(peer, self.rank), self.call_id()) };
            }
            // Thread p tells rank p that this rank arrived, then waits for rank p to arrive here.
            // No separate fence: the release store is one (`fence.acq_rel.sys` + store), and it
            // is cumulative over the CTA's earlier writes, which the CTA barrier above ordered
            // before it; the acquire load below pairs with the peer's release in the same way.
            // SAFETY: peer p's signal region is mapped; the slot index is < MAX_CTAS * MAX_RANKS (MAX_TILES * MAX_RANKS for tile slots).
            unsafe { hw::store_release_u32(self.flag(peer, self.rank), value) };
            let mine = self.flag(signal_base_fresh(self.c, self.rank), p);
            // Reached, not equal: rank p may already have passed this barrier (it saw our
            // arrival) and announced the next one before we looked.
            // SAFETY: our own signal region, same index bounds as above.
            late = !unsafe { self.wait_reached(mine, value) };
        }
        if check {
            return self.check_call_words(late, first, count);
        }
        self.agree_on_timeout(late)
    }

    /// This rank's barrier flag `[slot][from]` in the signal region at `rank_base`. Flags by rank
    /// slot (`rank % MAX_RANKS`): distinct within one node.
    #[inline(always)]
    fn flag(&self, rank_base: usize, from: usize) -> *mut u32 {
        let from = from & (MAX_RANKS - 1);
        (rank_base + self.slots.barrier + (self.cta * MAX_RANKS + from) * 4) as *mut u32
    }

    /// Spins until the u32 at `flag` (loaded with acquire) has reached `value`, counting in
    /// wrapping arithmetic (flags only grow, and wrap around u32); false after the context's
    /// timeout.
    ///
    /// # Safety
    /// `flag` is a mapped, 4-byte aligned word.
    #[inline(always)]
    pub unsafe fn wait_reached(&self, flag: *const u32, value: u32) -> bool {
        wait_until(&mut self.deadline(), || {
            // SAFETY: by the caller's guarantee.
            let seen = unsafe { hw::load_acquire_u32(flag) };
            seen.wrapping_sub(value) as i32 >= 0
        })
    }

    /// Ends a wait that some of the CTA's threads did: a CTA barrier at which they agree whether
    /// any of them timed out (then the timeout is recorded and returned). Every thread calls it.
    #[inline(always)]
    pub fn agree_on_timeout(&self, late: bool) -> Result<(), i32> {
        agree_on_timeout(self.c, self.which, late)
    }
}

/// Ends a wait that some of a CTA's threads did, outside a `Call` too (grid barrier, signal
/// wait): a CTA barrier at which they agree whether any timed out; then `TIMEOUT` is recorded
/// for function `which` and returned. Every thread calls it.
#[inline(always)]
pub fn agree_on_timeout(c: &SymmContext, which: i32, late: bool) -> Result<(), i32> {
    if hw::sync_threads_or(late) {
        context::record_error(c, status::TIMEOUT, which);
        return Err(status::TIMEOUT);
    }
    Ok(())
}

/// `c.signal_base(rank)`, re-read from the context: a barrier runs at both ends of a collective,
/// and a base address the compiler kept from the first barrier would stay live (in two registers)
/// across the whole data loop, pushing ptxas into spills on sm_80.
#[inline(always)]
fn signal_base_fresh(c: &SymmContext, rank: usize) -> usize {
    let field = core::ptr::addr_of!(c.peer_signal[rank & (MAX_RANKS - 1)]);
    // SAFETY: a field of a live context.
    unsafe { core::ptr::read_volatile(field) as usize }
}
