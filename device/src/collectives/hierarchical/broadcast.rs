//! Hierarchical broadcast (`symm_broadcast_hierarchical`): every rank's buffer gets the root's.
//!
//! The root (node r, local index l) puts its buffer straight into the buffer of each partner
//! (m, l), once that partner has said it is in the call (an `Ack` signal alone); on every node
//! the rank with local index l (the root, or its partner there) then pushes the buffer into the
//! rest of its node over stores. No scratch, no rounds.

use super::{nodes_for, nodes_where, other_node, partner, signal_partners};
use crate::collectives::my_units;
use crate::hw;
use crate::runtime::mem::{div32, rotate};
use crate::runtime::region::Region;
use crate::runtime::sync::Call;
use crate::transport::bulk::push_to_all_among;
use crate::transport::remote::{self, Kind, Place};

/// `buf = buf@root` on every rank.
pub fn broadcast(call: &Call, buf: &Region, root: usize) -> Result<(), i32> {
    let nodes = nodes_for(call, 0)?;
    let (lo, hi) = my_units(call, buf.bytes);
    let node = (nodes.first(), nodes.size);
    let root_node = div32(root, nodes.size);
    let root_local = root - root_node * nodes.size;
    let network = hw::remote::NETWORK && nodes.multi();

    // The root's buffer reaches the rank with its local index on every node.
    if network && nodes.local == root_local {
        let v = remote::value(call, 0);
        if call.rank == root {
            remote::wait_signals(call, Kind::Ack, v, other_node(&nodes))?;
            // A CTA with no units (lo = hi = the unit count) sends only the signal.
            let (from, to) = ((16 * lo).min(buf.bytes), (16 * hi).min(buf.bytes));
            let part = Place::Heap(buf.offset + from);
            for k in 1..nodes.count {
                let m = rotate(nodes.node, k, nodes.count);
                let p = partner(&nodes, m);
                remote::put_with_signal(call, &nodes, part, part, to - from, Kind::Arrive, v, p)?;
            }
        } else {
            // The root is our partner on its node.
            signal_partners(call, &nodes, Kind::Ack, v, |m| m == root_node)?;
            let from_root = nodes_where(&nodes, |t| t == root_node);
            remote::wait_signals(call, Kind::Arrive, v, from_root)?;
        }
    }

    // The node's buffers are free, and its source (above) holds the data.
    call.barrier_among(0, node.0, node.1)?;
    if nodes.local == root_local {
        push_to_all_among(call, node, buf.offset, buf.offset, buf.bytes, lo, hi, false);
    }
    if network && call.rank == root {
        remote::quiet(); // the root's buffer has landed everywhere: the caller may change it
    }
    call.barrier_among(1, node.0, node.1)
}
