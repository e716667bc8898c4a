//! Hierarchical all-to-all with equal splits (`symm_all_to_all_hierarchical`): block p of `out`
//! on rank q gets block q of rank p's input.
//!
//! 1. Node-local, over stores: rank (n, l) pushes its block for each rank of its node into that
//!    rank's output.
//! 2. Cross-node exchange (`in_rounds`): the blocks node n sends to rank (m, l) travel together,
//!    through rank (n, l): each round it gathers, over loads, that part of block (m, l) of the
//!    input of every rank (n, l') into send box m (piece l'), puts the box into the scratch of
//!    partner (m, l), and copies each piece of the boxes it received, from partner (k, l), into
//!    its output block (k, l').
//!
//! One put per partner per round, `node_size` blocks' worth, rather than one per rank of the
//! other node: the network sees fewer, larger messages, and the signal words stay one per node.

use super::{box_units, in_rounds, nodes_for, partner, Rounds};
use crate::collectives::my_units;
use crate::hw;
use crate::runtime::mem::{load_unit, rotate, store_unit, unit_bytes};
use crate::runtime::nodes::Nodes;
use crate::runtime::region::Region;
use crate::runtime::scratch::slice_base;
use crate::runtime::sync::Call;
use crate::transport::bulk::push_to;
use crate::transport::remote::Place;

/// `out[p * n ..][.. n] = input@p[rank * n ..][.. n]` for every rank p (blocks of `n` bytes).
pub fn all_to_all(call: &Call, input: &Region, out: &Region, n: usize) -> Result<(), i32> {
    let nodes = Nodes::of(call.c);
    // A receive box and a send box per node, each `node_size` pieces.
    let boxes = 2 * nodes.count * nodes.size;
    let nodes = nodes_for(call, boxes)?;
    let (lo, hi) = my_units(call, n);
    let node = (nodes.first(), nodes.size);

    // 1. The node's inputs are ready and its outputs free.
    call.barrier_among(0, node.0, node.1)?;
    for k in 0..nodes.size {
        let q = nodes.first() + rotate(nodes.local, k, nodes.size);
        push_to(
            call,
            q,
            input.offset + q * n,
            out.offset + call.rank * n,
            n,
            lo,
            hi,
        );
    }

    // 2.
    if hw::remote::NETWORK && nodes.multi() {
        let cap = box_units(call, boxes);
        let pieces = Pieces {
            input,
            out,
            n,
            box_bytes: 16 * cap * nodes.size,
        };
        in_rounds(call, &nodes, (lo, hi), cap, pieces.box_bytes, &pieces)?;
    }
    // The node's ranks have read our input, and stored into our output.
    call.barrier_among(1, node.0, node.1)
}

/// Step 2's rounds: a box holds `node_size` pieces of `b - a` units, piece l' at unit
/// `l' * (b - a)`: send box m (after the receive boxes) the parts of block (m, l) of each rank
/// (n, l'); receive box k those of our own block from each rank (k, l').
struct Pieces<'a> {
    input: &'a Region,
    out: &'a Region,
    n: usize,
    box_bytes: usize,
}

impl Rounds for Pieces<'_> {
    fn prepare(&self, call: &Call, nodes: &Nodes, a: usize, b: usize) {
        let c = call.c;
        let slice = slice_base(c, call.rank, call.cta);
        for k in 1..nodes.count {
            let m = rotate(nodes.node, k, nodes.count);
            let block = self.input.offset + partner(nodes, m) * self.n;
            let send = slice + (nodes.count + m) * self.box_bytes;
            for l in 0..nodes.size {
                let from = c.heap_base(nodes.first() + l) + block;
                let piece = send + 16 * l * (b - a);
                let mut i = a + call.tid;
                while i < b {
                    let valid = unit_bytes(i, 16, self.n);
                    // SAFETY: unit i of block (m, l) lies inside the checked input on every
                    // rank of the node; the piece's unit inside send box m (i - a < cap).
                    unsafe {
                        let d = load_unit::<4>(from + 16 * i, valid);
                        store_unit::<4>(piece + 16 * (i - a), valid, d);
                    }
                    i += call.threads;
                }
            }
        }
    }

    fn source(&self, nodes: &Nodes, m: usize, a: usize, b: usize) -> (Place, usize) {
        let at = (nodes.count + m) * self.box_bytes;
        (Place::Scratch(at), 16 * nodes.size * (b - a))
    }

    fn consume(&self, call: &Call, nodes: &Nodes, a: usize, b: usize, recv: usize) {
        let dst = self.out.at(call.c, call.rank);
        for k in 1..nodes.count {
            let m = rotate(nodes.node, k, nodes.count);
            for l in 0..nodes.size {
                let piece = recv + m * self.box_bytes + 16 * l * (b - a);
                let block = dst + nodes.rank(m, l) * self.n;
                let mut i = a + call.tid;
                while i < b {
                    let valid = unit_bytes(i, 16, self.n);
                    // SAFETY: the piece's unit lies in receive box m of this CTA's slice; unit
                    // i of block (m, l) inside the checked output.
                    unsafe {
                        let d = load_unit::<4>(piece + 16 * (i - a), valid);
                        store_unit::<4>(block + 16 * i, valid, d);
                    }
                    i += call.threads;
                }
            }
        }
    }
}
