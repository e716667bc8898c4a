//! Hierarchical reduce-scatter (`symm_reduce_scatter_hierarchical`): `out` on rank (n, l) is the
//! reduction over every rank of that rank's block of `input`.
//!
//! 1. Node-local, over loads: rank (n, l) reduces its own block over the ranks of its node, into
//!    `out`: node n's partial of it.
//! 2. Cross-node exchange (`in_rounds`): each round, rank (n, l) reduces over its node the block
//!    of each partner (m, l) into a send box (node n's partial of it), puts the box into the
//!    partner's scratch, and reduces the partials it received with its own, in node order, into
//!    `out` (`reduce_partials`).
//!
//! Every rank's result is reduced by that rank alone; it is within rounding of the one-node
//! algorithms' (each node's partial is rounded to the dtype), bitwise with nodes of one rank.
//! AVG sums and divides once by the world size.

use super::{
    box_units, in_rounds, node_partial, nodes_for, partial_op, partner, reduce_partials, Rounds,
};
use crate::collectives::my_units;
use crate::hw;
use crate::runtime::elem::Reduction;
use crate::runtime::mem::{rotate, store_unit, unit_bytes};
use crate::runtime::nodes::Nodes;
use crate::runtime::region::Region;
use crate::runtime::scratch::slice_base;
use crate::runtime::sync::Call;
use crate::transport::bulk::{reduce_units_among, Deliver};
use crate::transport::remote::Place;

/// `out = reduce over p of input@p[rank * n ..][.. n]` (`n = out.bytes`); `out` may be this
/// rank's block of `input`.
pub fn reduce_scatter(
    call: &Call,
    input: &Region,
    out: &Region,
    red: &Reduction,
) -> Result<(), i32> {
    let count = Nodes::of(call.c).count;
    // A receive box and a send box per node.
    let nodes = nodes_for(call, 2 * count)?;
    let n = out.bytes;
    let (lo, hi) = my_units(call, n);
    let node = (nodes.first(), nodes.size);

    // 1. The node's inputs are ready.
    call.barrier_among(0, node.0, node.1)?;
    let partial = partial_op(red, &nodes);
    let mine = input.sub(call.rank * n, n);
    reduce_units_among::<1>(call, node, &mine, out, lo, hi, &partial, Deliver::Local);

    // 2.
    if hw::remote::NETWORK && nodes.multi() {
        let cap = box_units(call, 2 * count);
        let partials = Partials {
            input,
            out,
            red: *red,
            partial,
            box_bytes: cap * 16,
        };
        in_rounds(call, &nodes, (lo, hi), cap, cap * 16, &partials)?;
    }
    // The node's ranks have read our input.
    call.barrier_among(1, node.0, node.1)
}

/// Step 2's rounds: send box m (after the receive boxes) holds this node's partial of the block
/// of the partner on node m.
struct Partials<'a> {
    input: &'a Region,
    out: &'a Region,
    red: Reduction,
    partial: Reduction,
    box_bytes: usize,
}

impl Partials<'_> {
    /// Where send box `m` starts in this CTA's scratch slice (offset).
    #[inline(always)]
    fn send_box(&self, nodes: &Nodes, m: usize) -> usize {
        (nodes.count + m) * self.box_bytes
    }
}

impl Rounds for Partials<'_> {
    fn prepare(&self, call: &Call, nodes: &Nodes, a: usize, b: usize) {
        let n = self.out.bytes;
        let slice = slice_base(call.c, call.rank, call.cta);
        let mut i = a + call.tid;
        while i < b {
            let valid = unit_bytes(i, 16, n);
            for k in 1..nodes.count {
                let m = rotate(nodes.node, k, nodes.count);
                let block = self.input.offset + partner(nodes, m) * n;
                // SAFETY: unit i of the partner's block lies inside the checked input on every
                // rank of the node; the box unit inside this CTA's slice (i - a < cap).
                unsafe {
                    let d = node_partial(call, nodes, block, i, valid, &self.partial);
                    store_unit::<4>(slice + self.send_box(nodes, m) + 16 * (i - a), valid, d);
                }
            }
            i += call.threads;
        }
    }

    fn source(&self, nodes: &Nodes, m: usize, a: usize, b: usize) -> (Place, usize) {
        // Whole units: the box's tail past the block's last byte is never read.
        (Place::Scratch(self.send_box(nodes, m)), 16 * (b - a))
    }

    fn consume(&self, call: &Call, nodes: &Nodes, a: usize, b: usize, recv: usize) {
        let dst = self.out.at(call.c, call.rank);
        let (n, box_bytes) = (self.out.bytes, self.box_bytes);
        reduce_partials(call, nodes, (a, b), dst, n, recv, box_bytes, &self.red);
    }
}
