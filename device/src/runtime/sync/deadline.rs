//! Bounded waits: a deadline that starts its clock late, and the spin that honours it.

use crate::abi::SymmContext;
use crate::hw;
use crate::runtime::context;

/// When a wait gives up: `timeout` ns after the clock was first read. A wait that begins after
/// this rank recorded a failure among ranks gets no time at all (`context::wait_timeout_ns` is 0
/// then): after a lost peer, the calls that follow (a CUDA graph of many) end in one timeout, not
/// one each. The timeout is read once, when the wait is set up, so the spin loop keeps its
/// registers (a check in the loop pushed the split all_reduce_rmsnorm and the copy-engine
/// reduce-scatter into spills on sm_90). The clock is read only once a wait has spun for a while,
/// so waits that succeed quickly (the common case) never pay for a `%globaltimer` read on their
/// critical path.
pub struct Deadline {
    timeout: u64,
    /// 0 until started.
    at: u64,
}

impl Deadline {
    #[inline(always)]
    pub fn new(c: &SymmContext) -> Self {
        Deadline {
            timeout: context::wait_timeout_ns(c),
            at: 0,
        }
    }

    /// Starts the clock on first use; true once it has run out.
    #[inline(always)]
    fn passed(&mut self) -> bool {
        let now = hw::now_ns();
        if self.at == 0 {
            self.at = now.saturating_add(self.timeout).max(1);
            return false;
        }
        now > self.at
    }
}

/// Spins until `ready()` or the deadline; false on timeout. Checks the clock only every few
/// iterations: `%globaltimer` reads are not free.
#[inline(always)]
pub fn wait_until(deadline: &mut Deadline, mut ready: impl FnMut() -> bool) -> bool {
    let mut spins: u32 = 0;
    loop {
        if ready() {
            return true;
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(64) {
            if deadline.passed() {
                return false;
            }
            hw::spin_pause();
        }
    }
}
