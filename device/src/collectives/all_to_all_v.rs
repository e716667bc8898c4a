//! all_to_all with variable splits whose counts live in device memory: no host involvement.
//!
//! Rank q sends `counts@q[p]` rows to rank p, taken from its input in rank order (rows for rank
//! 0 first). Rank p receives them in rank order of the sender: the rows from q start at row
//! `sum_{s<q} counts@s[p]` of its output. After a barrier every rank reads the count matrix
//! from the peers (`world`^2 values, a few microseconds), so all ranks agree on every offset and
//! on whether every output holds what it would receive; then each pushes its rows straight into
//! the receivers' outputs (stores are posted), receivers in rotated order, and a second barrier
//! makes the results complete.

use super::my_units;
use crate::abi::status;
use crate::hw;
use crate::runtime::context;
use crate::runtime::mem::rotate;
use crate::runtime::region::Region;
use crate::runtime::sync::Call;
use crate::transport::bulk::push_to;

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

/// The count matrix, read from the ranks' send counts when needed: `get(q, p)` = rows rank q
/// sends to rank p. Read on demand, not kept in an array: an array indexed by a rank the compiler
/// cannot unroll would live in local memory.
struct Counts<'a> {
    call: &'a Call<'a>,
    send_counts: &'a Region,
}

impl Counts<'_> {
    fn get(&self, q: usize, p: usize) -> usize {
        let at = self.send_counts.at(self.call.c, q) as *const u64;
        // SAFETY: entry p < world of rank q's count array, inside its heap (the region was
        // checked on this rank; the heaps are symmetric). Relaxed: the barrier ordered it. The
        // senders checked their own counts before the call.
        unsafe { hw::load_relaxed_u64(at.add(p)) as usize }
    }

    /// Rows rank `p` receives in all.
    fn received(&self, p: usize) -> usize {
        (0..self.call.world).map(|q| self.get(q, p)).sum()
    }

    /// First row, in rank `p`'s output, of the rows from rank `q`.
    fn recv_offset(&self, q: usize, p: usize) -> usize {
        (0..q).map(|s| self.get(s, p)).sum()
    }
}

/// The collective (see the module docs). `CAPACITY_EXCEEDED` on every rank when some rank would
/// receive more rows than `capacity`; then only the receive counts and offsets are written.
pub fn all_to_all_v(call: &Call, plan: &Plan) -> Result<(), i32> {
    call.barrier(0)?;
    let (c, me, world) = (call.c, call.rank, call.world);
    let counts = Counts {
        call,
        send_counts: &plan.send_counts,
    };
    if call.cta == 0 && call.tid < world {
        let q = call.tid;
        // SAFETY: entry q of this rank's checked `[world]` i64 arrays.
        unsafe {
            let n = (plan.recv_counts.at(c, me) as *mut u64).add(q);
            core::ptr::write_volatile(n, counts.get(q, me) as u64);
            let o = (plan.recv_offsets.at(c, me) as *mut u64).add(q);
            core::ptr::write_volatile(o, counts.recv_offset(q, me) as u64);
        }
    }
    let fits = (0..world).all(|p| counts.received(p) <= plan.capacity);
    if fits {
        // Receivers in rotated order (rank me + i in step i): every step's senders and receivers
        // form a permutation, so no rank's links take every sender at once.
        let rb = plan.row_bytes;
        for i in 0..world {
            let p = rotate(me, i, world);
            let first = (0..p).map(|s| counts.get(me, s)).sum::<usize>(); // rows for the ranks before p
            let bytes = counts.get(me, p) * rb;
            let (lo, hi) = my_units(call, bytes);
            let dst = plan.out.offset + counts.recv_offset(me, p) * rb;
            push_to(call, p, plan.input.offset + first * rb, dst, bytes, lo, hi);
        }
    }
    call.barrier(1)?;
    if fits {
        return Ok(());
    }
    // Recorded too, so the host raises after a CUDA graph or without reading statuses.
    context::record_error(c, status::CAPACITY_EXCEEDED, call.which);
    Err(status::CAPACITY_EXCEEDED)
}
