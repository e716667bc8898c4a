//! Round flags between same-index CTAs: "my data for round r has landed in your scratch".
//!
//! A pipelined collective moves a large message in rounds through the receivers' scratch. After
//! pushing its data for round r to every peer, a CTA posts round r to them (one release store per
//! peer into the peer's `signal::FLAG` slot `[cta][me]`); before consuming round r it waits until
//! every peer has posted it.
//!
//! Flag values are a per-CTA round counter that runs across calls: round r of a call is
//! `base + r + 1`, where `base` counts every round this CTA posted in earlier calls. The count is
//! the same on every rank (all ranks make the same calls with the same grid, and a CTA's number
//! of rounds depends only on those), so same-index CTAs agree on the value without talking, the
//! values a peer writes only ever grow by one, and a wait compares in wrapping arithmetic: no
//! flag is ever cleared, and no number of calls without rounds in between can make an old value
//! look new. The counter lives in this rank's own slot `[cta][rank]`, which no peer writes.

use crate::abi::{signal, MAX_RANKS};
use crate::hw;
use crate::runtime::sync::Call;

fn slot(signal_base: usize, cta: usize, from: usize) -> *mut u32 {
    (signal_base + signal::FLAG_OFFSET + (cta * MAX_RANKS + from) * 4) as *mut u32
}

/// This CTA's round flags for one call.
pub struct Progress {
    base: u32,
}

impl Progress {
    /// Reads the CTA's round counter. Every thread calls it.
    pub fn open(call: &Call) -> Self {
        let own = slot(call.c.signal_base(call.rank), call.cta, call.rank);
        // SAFETY: slot [cta][rank] of this rank's signal region (cta < MAX_CTAS, rank < MAX_RANKS);
        // only this CTA writes it (in `close`), and `Call::begin`'s CTA barriers order that
        // write of the previous call before this read.
        let base = unsafe { hw::load_relaxed_u32(own) };
        Progress { base }
    }

    fn value(&self, round: usize) -> u32 {
        self.base.wrapping_add(round as u32 + 1)
    }

    /// Tells every peer that this CTA's data for `round` is in its scratch. Every thread calls
    /// it, right after a CTA barrier that follows every thread's last store of the round (`wait`
    /// ends with one; `sync_and_post` places one). Only the posting threads wait for their
    /// release to complete; the others go on.
    pub fn post(&self, call: &Call, round: usize) {
        let p = hw::thread_rank_fresh() as usize;
        if p < call.world && p != call.rank {
            // The release store is cumulative over the CTA's stores that the CTA barrier before
            // it ordered first (as in `Call::barrier`).
            // SAFETY: peer p's signal region is mapped; slot index < MAX_CTAS * MAX_RANKS.
            unsafe {
                hw::store_release_u32(
                    slot(call.c.signal_base(p), call.cta, call.rank),
                    self.value(round),
                )
            };
        }
    }

    /// `post` after a CTA barrier of its own.
    pub fn sync_and_post(&self, call: &Call, round: usize) {
        hw::sync_threads();
        self.post(call, round);
    }

    /// Waits until every peer has posted `round` (or a later one); their data for it is then
    /// visible to every thread of the CTA. Every thread calls it; it ends with a CTA barrier.
    /// Err(TIMEOUT) after the context's timeout.
    pub fn wait(&self, call: &Call, round: usize) -> Result<(), i32> {
        let want = self.value(round);
        let p = hw::thread_rank_fresh() as usize;
        let mut late = false;
        if p < call.world && p != call.rank {
            let mine = slot(call.c.signal_base(call.rank), call.cta, p);
            // SAFETY: our own signal region, same bounds as above.
            late = !unsafe { call.wait_reached(mine, want) };
        }
        call.agree_on_timeout(late)
    }

    /// Records that this call posted `rounds` rounds. Every thread calls it, at the end of the
    /// call, after its last `wait`.
    pub fn close(self, call: &Call, rounds: usize) {
        if hw::thread_rank_fresh() == 0 && rounds > 0 {
            let own = slot(call.c.signal_base(call.rank), call.cta, call.rank);
            // SAFETY: as in `open`; the next call's `open` reads it after `Call::begin`'s barriers.
            unsafe { hw::store_relaxed_u32(own, self.base.wrapping_add(rounds as u32)) };
        }
    }
}
