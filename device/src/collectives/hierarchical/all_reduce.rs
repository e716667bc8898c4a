//! Hierarchical all-reduce (`symm_all_reduce_hierarchical`): rank (node n, local index l) owns
//! shard l of the message.
//!
//! 1. Node-local reduce-scatter over loads: rank (n, l) reduces shard l over the ranks of node n
//!    (`bulk::reduce_units_among`), into its own buffer: node n's partial result.
//! 2. Cross-node exchange (`in_rounds`): rank (n, l) puts its partial shard, from where it lies,
//!    into its box in the scratch of each partner (m, l), and reduces the partials of all nodes,
//!    in node order, into its buffer (`reduce_partials`).
//! 3. Node-local all-gather over stores: rank (n, l) stores its reduced shard into every rank of
//!    its node (`bulk::push_to_all_among`).
//!
//! Results are bitwise equal on every rank (shard l is reduced by the ranks (m, l), each from the
//! same partials in the same order). With nodes of one rank they are bitwise those of the
//! single-node algorithms (the same inputs combined in rank order); with larger nodes the partial
//! sums are rounded to the dtype once more, so results differ from them within rounding.
//! AVG sums on the node and divides once by the world size.

use super::{box_units, in_rounds, nodes_for, partial_op, reduce_partials, shard_units, Rounds};
use crate::hw;
use crate::runtime::elem::Reduction;
use crate::runtime::nodes::Nodes;
use crate::runtime::region::Region;
use crate::runtime::sync::Call;
use crate::transport::bulk::{push_to_all_among, reduce_units_among, Deliver};
use crate::transport::remote::Place;

pub fn all_reduce(call: &Call, r: &Region, red: &Reduction) -> Result<(), i32> {
    let nodes = nodes_for(call, Nodes::of(call.c).count)?;
    let (lo, hi) = shard_units(call, &nodes, r.bytes);
    let node = (nodes.first(), nodes.size);

    // 1. The node's inputs are ready (and the previous call's stores into them have landed).
    call.barrier_among(0, node.0, node.1)?;
    let partial = partial_op(red, &nodes);
    // One unit per thread per step: two kept too many registers live next to this call's own.
    reduce_units_among::<1>(call, node, r, r, lo, hi, &partial, Deliver::Local);

    // 2. (Only with more than one node; in a build without a network, not at all: its code
    // would only cost the one-node path registers.)
    if hw::remote::NETWORK && nodes.multi() {
        let cap = box_units(call, nodes.count);
        let shards = Shards {
            r,
            red: *red,
            box_bytes: cap * 16,
        };
        in_rounds(call, &nodes, (lo, hi), cap, cap * 16, &shards)?;
    }

    // 3. Only this CTA of the node's ranks reads or writes units [lo, hi) of shard l anywhere
    // now, so the stores need no barrier before them; the one after says every shard arrived.
    push_to_all_among(call, node, r.offset, r.offset, r.bytes, lo, hi, false);
    call.barrier_among(1, node.0, node.1)
}

/// Step 2's rounds: the partial shard is put from the buffer itself, and reduced there.
struct Shards<'a> {
    r: &'a Region,
    red: Reduction,
    box_bytes: usize,
}

impl Rounds for Shards<'_> {
    fn prepare(&self, _: &Call, _: &Nodes, _: usize, _: usize) {}

    fn source(&self, _: &Nodes, _: usize, a: usize, b: usize) -> (Place, usize) {
        let (from, to) = (16 * a, (16 * b).min(self.r.bytes));
        (Place::Heap(self.r.offset + from), to - from)
    }

    fn consume(&self, call: &Call, nodes: &Nodes, a: usize, b: usize, recv: usize) {
        let own = self.r.at(call.c, call.rank);
        let (bytes, box_bytes) = (self.r.bytes, self.box_bytes);
        reduce_partials(call, nodes, (a, b), own, bytes, recv, box_bytes, &self.red);
    }
}
