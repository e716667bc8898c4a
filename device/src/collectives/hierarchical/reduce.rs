//! Hierarchical reduce to a root (`symm_reduce_hierarchical`): the root's `out` gets the
//! reduction over every rank of `input`; no other rank's `out` is written.
//!
//! Rank (node n, local index l) owns shard l of the message. On the root's node r, rank (r, l)
//! reduces shard l and stores it into the root's `out` over NVLink. With several nodes, each
//! round every rank (n, l) of another node reduces its node's partial of shard l into a send box
//! and puts it to its partner (r, l) (`in_rounds`, many to one), which reduces its own node's
//! partial (computed there, from its node's inputs) and the received ones in node order.
//! AVG sums and divides once by the world size.

use super::{box_units, in_rounds, node_partial, nodes_for, partial_op, shard_units, Rounds};
use crate::hw;
use crate::runtime::elem::{Acc, Reduction};
use crate::runtime::mem::{div32, load_unit, store_unit, unit_bytes};
use crate::runtime::nodes::Nodes;
use crate::runtime::region::Region;
use crate::runtime::scratch::slice_base;
use crate::runtime::sync::Call;
use crate::transport::remote::Place;

/// On `root`, `out` = reduction over ranks of `input` (`out` may be `input`).
pub fn reduce(
    call: &Call,
    input: &Region,
    out: &Region,
    red: &Reduction,
    root: usize,
) -> Result<(), i32> {
    let count = Nodes::of(call.c).count;
    // A receive box per node, and one send box.
    let nodes = nodes_for(call, count + 1)?;
    let (lo, hi) = shard_units(call, &nodes, input.bytes);
    let node = (nodes.first(), nodes.size);
    let to_root = ToRoot {
        input,
        root_out: out.at(call.c, root),
        red: *red,
        partial: partial_op(red, &nodes),
        root_node: div32(root, nodes.size),
        box_bytes: 16 * box_units(call, count + 1),
    };

    // The node's inputs are ready, and the root's output free.
    call.barrier_among(0, node.0, node.1)?;
    if hw::remote::NETWORK && nodes.multi() {
        let cap = to_root.box_bytes / 16;
        in_rounds(call, &nodes, (lo, hi), cap, to_root.box_bytes, &to_root)?;
    } else {
        to_root.store(call, &nodes, (lo, hi), 0);
    }
    // The node's ranks have read our input, and stored into the root's output.
    call.barrier_among(1, node.0, node.1)
}

/// The rounds to the root's node: senders put their node's partial of shard l from the send box
/// (after the receive boxes); rank (root's node, l) receives from every other node and stores.
struct ToRoot<'a> {
    input: &'a Region,
    /// The root's `out`, as mapped here (on the root's node only).
    root_out: usize,
    red: Reduction,
    partial: Reduction,
    root_node: usize,
    box_bytes: usize,
}

impl ToRoot<'_> {
    /// On the root's node: the root's `out` units [a, b) = the reduction, in node order, of the
    /// partials of every node: this node's computed here, the others' from receive box k (unit
    /// i at `recv + k * box_bytes + 16 * (i - a)`; unused with one node).
    fn store(&self, call: &Call, nodes: &Nodes, (a, b): (usize, usize), recv: usize) {
        let inv = 1.0 / call.world as f32; // past one node's table of reciprocals
        let mut i = a + call.tid;
        while i < b {
            let valid = unit_bytes(i, 16, self.input.bytes);
            // SAFETY: unit i lies inside the checked input on every rank of the node, and in the
            // root's checked `out` (the same size); box k's unit inside this CTA's slice.
            unsafe {
                if !nodes.multi() {
                    // One node: the node's reduction is the result (AVG divided there).
                    let d = node_partial(call, nodes, self.input.offset, i, valid, &self.red);
                    store_unit::<4>(self.root_out + 16 * i, valid, d);
                    i += call.threads;
                    continue;
                }
                let part = |k: usize| {
                    if k == nodes.node {
                        node_partial(call, nodes, self.input.offset, i, valid, &self.partial)
                    } else {
                        load_unit::<4>(recv + k * self.box_bytes + 16 * (i - a), valid)
                    }
                };
                let mut acc = Acc::<4>::first(&self.red, part(0));
                for k in 1..nodes.count {
                    acc.add(&self.red, part(k));
                }
                store_unit::<4>(
                    self.root_out + 16 * i,
                    valid,
                    acc.finish_scaled(&self.red, inv),
                );
            }
            i += call.threads;
        }
    }

    fn send_box(&self, nodes: &Nodes) -> usize {
        nodes.count * self.box_bytes
    }
}

impl Rounds for ToRoot<'_> {
    fn prepare(&self, call: &Call, nodes: &Nodes, a: usize, b: usize) {
        if nodes.node == self.root_node {
            return;
        }
        let send = slice_base(call.c, call.rank, call.cta) + self.send_box(nodes);
        let mut i = a + call.tid;
        while i < b {
            let valid = unit_bytes(i, 16, self.input.bytes);
            // SAFETY: unit i inside the checked input on every rank of the node; the box unit
            // inside this CTA's slice (i - a < cap).
            unsafe {
                let d = node_partial(call, nodes, self.input.offset, i, valid, &self.partial);
                store_unit::<4>(send + 16 * (i - a), valid, d);
            }
            i += call.threads;
        }
    }

    fn source(&self, nodes: &Nodes, _: usize, a: usize, b: usize) -> (Place, usize) {
        (Place::Scratch(self.send_box(nodes)), 16 * (b - a))
    }

    fn consume(&self, call: &Call, nodes: &Nodes, a: usize, b: usize, recv: usize) {
        if nodes.node == self.root_node {
            self.store(call, nodes, (a, b), recv);
        }
    }

    fn sends_to(&self, nodes: &Nodes, m: usize) -> bool {
        nodes.node != self.root_node && m == self.root_node
    }

    fn receives_from(&self, nodes: &Nodes, k: usize) -> bool {
        nodes.node == self.root_node && k != nodes.node
    }
}
