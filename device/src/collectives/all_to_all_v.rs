//! all_to_all with variable splits whose counts live in device memory: no host involvement.
//!
//! Rank q sends `counts@q[p]` rows to rank p, taken from its input in rank order (rows for rank
//! 0 first). Rank p receives them in rank order of the sender: the rows from q start at row
//! `sum_{s<q} counts@s[p]` of its output. After a barrier every rank reads the whole count
//! matrix from the peers (`world`^2 values, a few microseconds), so all ranks agree on every
//! offset and on whether every output holds what it would receive; then each pushes its rows
//! straight into the receivers' outputs (stores are posted), and a second barrier makes the
//! results complete.

use super::my_units;
use crate::abi::{status, MAX_RANKS};
use crate::hw;
use crate::runtime::context;
use crate::runtime::region::Region;
use crate::runtime::sync::Call;
use crate::transport::bulk::{copy_between, Copy, Direction};

/// Where a variable all-to-all reads and writes. Counts are `i64` rows per rank.
pub struct Plan {
    pub input: Region,
    /// This rank's `[world]` send counts (peers read it).
    pub send_counts: Region,
    pub out: Region,
    /// Rows `out` holds.
    pub capacity: usize,
    /// This rank's `[world]` receive counts and offsets (written).
    pub recv_counts: Region,
    pub recv_offsets: Region,
    pub row_bytes: usize,
}

/// The count matrix: `m[q][p]` = rows rank q sends to rank p.
struct Counts {
    m: [[usize; MAX_RANKS]; MAX_RANKS],
}

impl Counts {
    /// Reads every rank's send counts (after the barrier that made them visible). The senders
    /// checked their own counts before the call; a peer's are trusted as it checked them.
    fn read(call: &Call, send_counts: &Region) -> Self {
        let mut m = [[0usize; MAX_RANKS]; MAX_RANKS];
        for (q, row) in m.iter_mut().enumerate().take(call.world) {
            let at = send_counts.at(call.c, q) as *const u64;
            for (p, v) in row.iter_mut().enumerate().take(call.world) {
                // SAFETY: entry p of rank q's count array, inside its heap (the region was
                // checked on this rank; the heaps are symmetric). Relaxed: the barrier ordered it.
                *v = unsafe { hw::load_relaxed_u64(at.add(p)) } as usize;
            }
        }
        Counts { m }
    }

    /// Rows rank `p` receives in all.
    fn received(&self, p: usize, world: usize) -> usize {
        (0..world).map(|q| self.m[q][p]).sum()
    }

    /// First row, in rank `p`'s output, of the rows from rank `q`.
    fn recv_offset(&self, q: usize, p: usize) -> usize {
        (0..q).map(|s| self.m[s][p]).sum()
    }

    /// First row, in rank `q`'s input, of the rows for rank `p`.
    fn send_offset(&self, q: usize, p: usize) -> usize {
        self.m[q][..p].iter().sum()
    }
}

/// The collective (see the module docs). `CAPACITY_EXCEEDED` on every rank when some rank would
/// receive more rows than `capacity`; then only the receive counts and offsets are written.
pub fn all_to_all_v(call: &Call, plan: &Plan) -> Result<(), i32> {
    call.barrier(0)?;
    let (c, me, world) = (call.c, call.rank, call.world);
    let counts = Counts::read(call, &plan.send_counts);
    if call.cta == 0 && call.tid < world {
        let q = call.tid;
        // SAFETY: entry q of this rank's checked `[world]` i64 arrays.
        unsafe {
            let n = (plan.recv_counts.at(c, me) as *mut u64).add(q);
            core::ptr::write_volatile(n, counts.m[q][me] as u64);
            let o = (plan.recv_offsets.at(c, me) as *mut u64).add(q);
            core::ptr::write_volatile(o, counts.recv_offset(q, me) as u64);
        }
    }
    let fits = (0..world).all(|p| counts.received(p, world) <= plan.capacity);
    if fits {
        let rb = plan.row_bytes;
        copy_between(call, Direction::Push, |p| {
            let bytes = counts.m[me][p] * rb;
            let (lo, hi) = my_units(call, bytes);
            Some(Copy {
                src: plan.input.offset + counts.send_offset(me, p) * rb,
                dst: plan.out.offset + counts.recv_offset(me, p) * rb,
                bytes,
                lo,
                hi,
            })
        });
    }
    call.barrier(1)?;
    if fits {
        return Ok(());
    }
    // Recorded too, so the host raises after a CUDA graph or without reading statuses.
    context::record_error(c, status::CAPACITY_EXCEEDED, call.which);
    Err(status::CAPACITY_EXCEEDED)
}
