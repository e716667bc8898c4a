//! Hierarchical all-gather (`symm_all_gather_hierarchical`): block p of `out` on every rank gets
//! rank p's input.
//!
//! 1. Rank (n, l) tells each partner (m, l) that its output is free (it is in this call: an
//!    `Ack` signal alone), waits for the same from each, and puts its input straight into block
//!    (n, l) of each partner's output with an `Arrive` signal: no scratch, no rounds.
//! 2. Meanwhile, over stores, it pushes its input into its block of every output of its node.
//! 3. Once the partners' blocks have arrived, it pushes each of them (blocks (m, l)) into every
//!    output of its node: a rank of node n receives block (m, l) from rank (n, l).
//!
//! In place when the input is this rank's block of `out`.

use super::{nodes_for, other_node, partner, signal_partners};
use crate::collectives::my_units;
use crate::hw;
use crate::runtime::mem::rotate;
use crate::runtime::region::Region;
use crate::runtime::sync::Call;
use crate::transport::bulk::push_to_all_among;
use crate::transport::remote::{self, Kind, Place};

/// `out[p * n ..][.. n] = input@p` for every rank p (`n = input.bytes`).
pub fn all_gather(call: &Call, input: &Region, out: &Region) -> Result<(), i32> {
    let nodes = nodes_for(call, 0)?;
    let n = input.bytes;
    let (lo, hi) = my_units(call, n);
    let node = (nodes.first(), nodes.size);
    let mine = out.offset + call.rank * n;
    let network = hw::remote::NETWORK && nodes.multi();
    let v = remote::value(call, 0);

    // 1. (Only with more than one node.)
    if network {
        signal_partners(call, &nodes, Kind::Ack, v, |_| true)?;
        remote::wait_signals(call, Kind::Ack, v, other_node(&nodes))?;
        // A CTA with no units (lo = hi = the unit count) sends only the signal.
        let (from, to) = ((16 * lo).min(n), (16 * hi).min(n));
        for k in 1..nodes.count {
            let m = rotate(nodes.node, k, nodes.count);
            let (dst, src) = (Place::Heap(mine + from), Place::Heap(input.offset + from));
            let p = partner(&nodes, m);
            remote::put_with_signal(call, &nodes, dst, src, to - from, Kind::Arrive, v, p)?;
        }
    }

    // 2. The node's outputs are free.
    call.barrier_among(0, node.0, node.1)?;
    let in_place = input.offset == mine;
    push_to_all_among(call, node, input.offset, mine, n, lo, hi, !in_place);

    // 3.
    if network {
        remote::wait_signals(call, Kind::Arrive, v, other_node(&nodes))?;
        for k in 1..nodes.count {
            let m = rotate(nodes.node, k, nodes.count);
            let block = out.offset + partner(&nodes, m) * n;
            push_to_all_among(call, node, block, block, n, lo, hi, false);
        }
        // Our input has landed everywhere: the caller may overwrite it once we return.
        remote::quiet();
    }
    call.barrier_among(1, node.0, node.1)
}
