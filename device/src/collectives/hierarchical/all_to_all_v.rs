//! Hierarchical all-to-all with variable splits (`symm_all_to_all_v_hierarchical`): the
//! semantics of `collectives::all_to_all_v` (counts in device memory, rows received in sender
//! rank order, CAPACITY_EXCEEDED on every rank) on a context of several nodes.
//!
//! 1. Counts: rank (n, l) copies its node's count rows into its node's rows of the count matrix
//!    in its scratch slice and puts them into the same rows on each partner (m, l). Every rank
//!    then reads the whole matrix from its own slice, so all agree on every offset, on whether
//!    every output holds what it receives, and on the longest cross-node stream (the rounds).
//! 2. Node-local, over stores: each rank pushes its rows for each rank of its node into that
//!    rank's output.
//! 3. Cross-node, in rounds (`in_rounds`): the rows node n sends to rank (m, l) travel as one
//!    stream through rank (n, l), which gathers them over loads: the rows of each rank (n, l')
//!    for (m, l), in l' order, each piece padded to whole 16-byte units. The receiver copies each
//!    piece into place (senders (n, 0..size) are consecutive ranks, so their rows are adjacent).
//!
//! A rank reads its count matrix until its last Ack to the partners (the last round's, or one of
//! its own when no stream crosses nodes): no partner's next call fills the slice before that.

use super::{in_rounds, nodes_for, other_node, partner, signal_partners, Rounds};
use crate::abi::status;
use crate::collectives::all_to_all_v::{self as one_node, Plan};
use crate::collectives::my_units;
use crate::hw;
use crate::runtime::context;
use crate::runtime::mem::{div32, load_unit, rotate, store_unit, unit_bytes};
use crate::runtime::nodes::Nodes;
use crate::runtime::scratch::{slice_base, slice_bytes};
use crate::runtime::sync::Call;
use crate::transport::bulk::push_to;
use crate::transport::remote::{self, Kind, Place};

/// The collective (see the module docs). On one node, the one-node algorithm.
pub fn all_to_all_v(call: &Call, plan: &Plan) -> Result<(), i32> {
    let nodes = nodes_for(call, 0)?;
    if !nodes.multi() {
        return one_node::all_to_all_v(call, plan);
    }
    // The slice: a receive and a send box per node, then the count matrix.
    let world = call.world;
    let matrix_bytes = world * world * 8;
    let boxes = 2 * nodes.count;
    let cap = div32(slice_bytes(call.c).saturating_sub(matrix_bytes) / 16, boxes);
    if cap == 0 {
        return Err(status::INVALID_ARGUMENT);
    }
    let box_bytes = 16 * cap;
    let matrix_at = boxes * box_bytes;
    let node = (nodes.first(), nodes.size);

    // The node's counts and inputs are ready, its outputs free.
    call.barrier_among(0, node.0, node.1)?;

    // 1.
    let counts = Matrix {
        base: slice_base(call.c, call.rank, call.cta) + matrix_at,
        world,
    };
    let ours = node.0 * world; // our node's first entry
    let mut i = call.tid;
    while i < node.1 * world {
        let (l, p) = (div32(i, world), i - div32(i, world) * world);
        // SAFETY: entry p of rank (n, l)'s checked `[world]` count array (regions are the same
        // on every rank); entry ours + i of the matrix, inside this CTA's slice (checked above).
        // Relaxed: the node barrier ordered the counts before it.
        unsafe {
            let from = plan.send_counts.at(call.c, node.0 + l) as *const u64;
            let v = hw::load_relaxed_u64(from.add(p));
            core::ptr::write_volatile((counts.base as *mut u64).add(ours + i), v);
        }
        i += call.threads;
    }
    hw::sync_threads();
    // The partners have consumed what this slot last put into their scratch.
    remote::settle_acks(call, other_node(&nodes))?;
    let v0 = remote::value(call, 0);
    let rows = Place::Scratch(matrix_at + ours * 8);
    for k in 1..nodes.count {
        let m = rotate(nodes.node, k, nodes.count);
        let to = partner(&nodes, m);
        remote::put_with_signal(
            call,
            &nodes,
            rows,
            rows,
            node.1 * world * 8,
            Kind::Arrive,
            v0,
            to,
        )?;
    }
    remote::wait_signals(call, Kind::Arrive, v0, other_node(&nodes))?;
    remote::quiet();

    let me = call.rank;
    if call.cta == 0 {
        let mut q = call.tid;
        while q < world {
            // SAFETY: entry q of this rank's checked `[world]` i64 arrays.
            unsafe {
                let n = (plan.recv_counts.at(call.c, me) as *mut u64).add(q);
                core::ptr::write_volatile(n, counts.get(q, me) as u64);
                let o = (plan.recv_offsets.at(call.c, me) as *mut u64).add(q);
                core::ptr::write_volatile(o, counts.recv_offset(q, me) as u64);
            }
            q += call.threads;
        }
    }
    let fits = (0..world).all(|p| counts.received(p) <= plan.capacity);
    let rb = plan.row_bytes;

    // 2.
    if fits {
        for j in 0..node.1 {
            let p = node.0 + rotate(nodes.local, j, node.1);
            let bytes = counts.get(me, p) * rb;
            let (lo, hi) = my_units(call, bytes);
            let src = plan.input.offset + counts.first(me, p) * rb;
            let dst = plan.out.offset + counts.recv_offset(me, p) * rb;
            push_to(call, p, src, dst, bytes, lo, hi);
        }
    }

    // 3. Every CTA of every rank takes the same share of the longest stream, so partners agree
    // on the rounds.
    let longest = if fits {
        counts.longest_stream(&nodes, rb)
    } else {
        0
    };
    let (lo, hi) = my_units(call, 16 * longest);
    let streams = Streams {
        plan,
        counts: &counts,
        box_bytes,
        row_bytes: rb,
    };
    if lo < hi {
        in_rounds(call, &nodes, (lo, hi), cap, box_bytes, &streams)?;
    } else {
        // No round ended with an Ack: tell the partners we have read the matrix (their Acks
        // are owed, as after a last round).
        let done = remote::value(call, Streams::FIRST_ROUND);
        signal_partners(call, &nodes, Kind::Ack, done, |_| true)?;
        remote::owe_acks(call, done, other_node(&nodes))?;
    }

    // The node's ranks have read our input and stored into our output.
    call.barrier_among(1, node.0, node.1)?;
    if fits {
        return Ok(());
    }
    context::record_error(call.c, status::CAPACITY_EXCEEDED, call.which);
    Err(status::CAPACITY_EXCEEDED)
}

/// The count matrix in this CTA's scratch slice: `get(q, p)` = rows rank q sends to rank p.
struct Matrix {
    base: usize,
    world: usize,
}

impl Matrix {
    #[inline(always)]
    fn get(&self, q: usize, p: usize) -> usize {
        // SAFETY: entry (q, p) of the matrix inside this CTA's slice, written (ours) or put
        // (the partners', seen after their signals) before any read.
        unsafe {
            core::ptr::read_volatile((self.base as *const u64).add(q * self.world + p)) as usize
        }
    }

    /// Rows rank `p` receives in all.
    fn received(&self, p: usize) -> usize {
        (0..self.world).map(|q| self.get(q, p)).sum()
    }

    /// First row, in rank `p`'s output, of the rows from rank `q`.
    fn recv_offset(&self, q: usize, p: usize) -> usize {
        (0..q).map(|s| self.get(s, p)).sum()
    }

    /// First row, in rank `q`'s input, of its rows for rank `p`.
    fn first(&self, q: usize, p: usize) -> usize {
        (0..p).map(|s| self.get(q, s)).sum()
    }

    /// 16-byte units of the stream node `n` sends to rank `p`: one padded piece per rank of `n`.
    fn stream_units(&self, nodes: &Nodes, n: usize, p: usize, row_bytes: usize) -> usize {
        (0..nodes.size)
            .map(|l| (self.get(nodes.rank(n, l), p) * row_bytes).div_ceil(16))
            .sum()
    }

    /// The longest stream between two nodes, in units.
    fn longest_stream(&self, nodes: &Nodes, row_bytes: usize) -> usize {
        let mut most = 0;
        for p in 0..self.world {
            let to = div32(p, nodes.size);
            // A plain `if`, not `.filter()`: LLVM 21 (Triton 3.9) vectorizes the filter's
            // early-exit search with a stack array, 64 bytes of local memory.
            for n in 0..nodes.count {
                if n != to {
                    most = most.max(self.stream_units(nodes, n, p, row_bytes));
                }
            }
        }
        most
    }
}

/// Step 3's rounds: send box m holds units [a, b) of the stream to partner (m, l), receive box
/// k those of the stream from partner (k, l).
struct Streams<'a> {
    plan: &'a Plan,
    counts: &'a Matrix,
    box_bytes: usize,
    row_bytes: usize,
}

impl Streams<'_> {
    /// Round 0's signals carried the counts.
    const FIRST_ROUND: usize = 1;

    /// Copies units [a, b) of the stream node `n` sends to rank `p` between a box (unit i at
    /// `boxed + 16 * (i - a)`) and the pieces where they lie (rank (n, l)'s rows for `p` at
    /// `piece_at(l)`): into the box when `into_box`, out of it otherwise. Piece l starts at the
    /// stream unit after the whole units of the pieces before it.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn copy_stream(
        &self,
        call: &Call,
        nodes: &Nodes,
        (n, p): (usize, usize),
        (a, b): (usize, usize),
        boxed: usize,
        piece_at: impl Fn(usize) -> usize,
        into_box: bool,
    ) {
        let mut first = 0;
        for l in 0..nodes.size {
            let bytes = self.counts.get(nodes.rank(n, l), p) * self.row_bytes;
            let units = bytes.div_ceil(16);
            if first < b && first + units > a {
                let piece = piece_at(l);
                let mut i = first.max(a) + call.tid;
                while i < (first + units).min(b) {
                    let valid = unit_bytes(i - first, 16, bytes);
                    let (in_box, in_piece) = (boxed + 16 * (i - a), piece + 16 * (i - first));
                    let (src, dst) = if into_box {
                        (in_piece, in_box)
                    } else {
                        (in_box, in_piece)
                    };
                    // SAFETY: unit i - a < cap of the box, inside this CTA's slice; `valid` bytes
                    // of the piece's unit inside the checked region `piece_at` names: a sender's
                    // input (its counts sum to at most its rows) or this rank's output (the rows
                    // fit: checked on every rank before any round).
                    unsafe { store_unit::<4>(dst, valid, load_unit::<4>(src, valid)) };
                    i += call.threads;
                }
            }
            first += units;
        }
    }
}

impl Rounds for Streams<'_> {
    fn first_round(&self) -> usize {
        Self::FIRST_ROUND
    }

    fn prepare(&self, call: &Call, nodes: &Nodes, a: usize, b: usize) {
        let (c, rb) = (call.c, self.row_bytes);
        let slice = slice_base(c, call.rank, call.cta);
        for k in 1..nodes.count {
            let m = rotate(nodes.node, k, nodes.count);
            let to = partner(nodes, m);
            let send = slice + (nodes.count + m) * self.box_bytes;
            let input = |l: usize| {
                let q = nodes.rank(nodes.node, l);
                c.heap_base(q) + self.plan.input.offset + self.counts.first(q, to) * rb
            };
            self.copy_stream(call, nodes, (nodes.node, to), (a, b), send, input, true);
        }
    }

    fn source(&self, nodes: &Nodes, m: usize, a: usize, b: usize) -> (Place, usize) {
        let units = self
            .counts
            .stream_units(nodes, nodes.node, partner(nodes, m), self.row_bytes);
        let at = (nodes.count + m) * self.box_bytes;
        (Place::Scratch(at), 16 * (b.min(units).saturating_sub(a)))
    }

    fn consume(&self, call: &Call, nodes: &Nodes, a: usize, b: usize, recv: usize) {
        let (me, rb) = (call.rank, self.row_bytes);
        let out = self.plan.out.at(call.c, me);
        for k in 1..nodes.count {
            let m = rotate(nodes.node, k, nodes.count);
            let rows = |l: usize| out + self.counts.recv_offset(nodes.rank(m, l), me) * rb;
            let boxed = recv + m * self.box_bytes;
            self.copy_stream(call, nodes, (m, me), (a, b), boxed, rows, false);
        }
    }
}
