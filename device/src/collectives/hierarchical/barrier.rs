//! Hierarchical barrier (`symm_barrier_hierarchical`): CTA c of every rank of every node.
//!
//! 1. A node barrier: every rank of node n has arrived (and its earlier stores are visible to the
//!    node).
//! 2. `quiet` (this CTA's earlier puts have landed), then each rank signals its partners and
//!    waits for theirs: rank (n, l) learns that every rank of each other node has arrived.
//! 3. A second node barrier passes that on to every rank of node n.
//!
//! Memory a CTA wrote before the barrier, by stores on its node or puts to other nodes, is
//! visible to the same-index CTA of every rank after it: its node barrier releases it to the
//! partner's side, whose signal releases it across, whose node barrier hands it on.

use super::{nodes_for, other_node, signal_partners};
use crate::hw;
use crate::runtime::sync::Call;
use crate::transport::remote::{self, Kind};

pub fn barrier(call: &Call) -> Result<(), i32> {
    let nodes = nodes_for(call, 0)?;
    let node = (nodes.first(), nodes.size);
    call.barrier_among(0, node.0, node.1)?;
    if hw::remote::NETWORK && nodes.multi() {
        remote::quiet();
        let v = remote::value(call, 0);
        signal_partners(call, &nodes, Kind::Arrive, v, |_| true)?;
        remote::wait_signals(call, Kind::Arrive, v, other_node(&nodes))?;
        call.barrier_among(1, node.0, node.1)?;
    }
    Ok(())
}
