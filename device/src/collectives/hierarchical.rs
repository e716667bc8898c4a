//! Hierarchical all-reduce (`symm_all_reduce_hierarchical`), for a context of several nodes
//! (`SymmContext::node_size`): rank (node n, local index l) owns shard l of the message.
//!
//! 1. Node-local reduce-scatter over loads: rank (n, l) reduces shard l over the ranks of node n
//!    (`bulk::reduce_units_among`), into its own buffer: node n's partial result.
//! 2. Cross-node exchange over the remote transport: rank (n, l) puts its partial shard into the
//!    scratch of rank (m, l) of every other node m, and reduces the partials of all nodes, in
//!    node order, into its buffer.
//! 3. Node-local all-gather over stores: rank (n, l) stores its reduced shard into every rank of
//!    its node (`bulk::push_to`).
//!
//! The exchange moves a CTA's part of the shard in rounds of one box per node in the scratch
//! slice. Per round: put the chunk to every other node with an `Arrive` signal, wait for every
//! other node's chunk, `quiet` (our chunk has landed, so its source may be overwritten), reduce,
//! then tell each sender its box is free (`Ack`) and wait for the same from each receiver before
//! the next round refills its boxes. Two round trips per round: correct first, not yet fast.
//!
//! Results are bitwise equal on every rank (shard l is reduced by the ranks (m, l), each from the
//! same partials in the same order). With nodes of one rank they are bitwise those of the
//! single-node algorithms (the same inputs combined in rank order); with larger nodes the partial
//! sums are rounded to the dtype once more, so results differ from them within rounding.
//! AVG sums on the node and divides once by the world size.

use crate::abi::{reduce_op, status, SymmContext};
use crate::hw;
use crate::runtime::elem::{Acc, Reduction};
use crate::runtime::mem::{div32, div_ceil32, load_unit, rotate, split, store_unit, unit_bytes};
use crate::runtime::nodes::Nodes;
use crate::runtime::region::Region;
use crate::runtime::scratch::{slice_base, slice_bytes};
use crate::runtime::sync::Call;
use crate::transport::bulk::{push_to_all_among, reduce_units_among, Deliver};
use crate::transport::remote::{self, Kind, Place};

/// 16-byte units per box of the exchange (one box per node in a CTA's scratch slice); 0 when the
/// scratch is too small (or absent), and then the hierarchical all-reduce refuses.
#[inline(always)]
pub fn capacity(c: &SymmContext, nodes: usize) -> usize {
    div32(slice_bytes(c) / 16, nodes)
}

/// This CTA's 16-byte units [lo, hi) of this rank's shard. Shard l is the units
/// [l * shard, (l + 1) * shard) (the last ones shorter or empty); every CTA takes the same slice
/// of every shard.
#[inline(always)]
fn units_of(call: &Call, nodes: &Nodes, r: &Region) -> (usize, usize) {
    let units = r.bytes.div_ceil(16);
    let shard = div_ceil32(units, nodes.size);
    let (slo, shi) = split(shard, call.ctas, call.cta);
    let lo = (nodes.local * shard + slo).min(units);
    let hi = (nodes.local * shard + shi).min(units);
    (lo, hi)
}

pub fn all_reduce(call: &Call, r: &Region, red: &Reduction) -> Result<(), i32> {
    let nodes = Nodes::of(call.c);
    if nodes.multi() && !hw::remote::NETWORK {
        return Err(status::PEER_NOT_MAPPED); // this bitcode cannot reach another node
    }
    if nodes.multi() && capacity(call.c, nodes.count) == 0 {
        return Err(status::INVALID_ARGUMENT);
    }
    let (lo, hi) = units_of(call, &nodes, r);
    let node = (nodes.first(), nodes.size);

    // 1. The node's inputs are ready (and the previous call's stores into them have landed).
    call.barrier_among(0, node.0, node.1)?;
    // With several nodes, AVG sums here and divides once, after the exchange.
    let partial = Reduction {
        op: if red.op == reduce_op::AVG && nodes.multi() {
            reduce_op::SUM
        } else {
            red.op
        },
        dtype: red.dtype,
    };
    // One unit per thread per step: two kept too many registers live next to this call's own.
    reduce_units_among::<1>(call, node, r, r, lo, hi, &partial, Deliver::Local);

    // 2. (Only with more than one node; in a build without a network, not at all: its code
    // would only cost the one-node path registers.)
    if hw::remote::NETWORK && nodes.multi() {
        exchange(call, &nodes, r, lo, hi, red)?;
    }

    // 3. Only this CTA of the node's ranks reads or writes units [lo, hi) of shard l anywhere
    // now, so the stores need no barrier before them; the one after says every shard arrived.
    push_to_all_among(call, node, r.offset, r.offset, r.bytes, lo, hi, false);
    call.barrier_among(1, node.0, node.1)
}

/// Step 2 for this CTA's units [lo, hi) of shard `nodes.local`, which this rank's buffer holds as
/// its node's partial result: afterwards it holds the result over every node.
fn exchange(
    call: &Call,
    nodes: &Nodes,
    r: &Region,
    lo: usize,
    hi: usize,
    red: &Reduction,
) -> Result<(), i32> {
    let cap = capacity(call.c, nodes.count);
    let peer = |n: usize| nodes.rank(n, nodes.local);
    // Thread t waits for node t's signal (one thread per other node).
    let others = |t: usize| (t < nodes.count && t != nodes.node).then_some(t);
    let boxes = slice_base(call.c, call.rank, call.cta);
    let mut a = lo;
    let mut round = 0;
    while a < hi {
        let b = (a + cap).min(hi);
        let (from, to) = (16 * a, (16 * b).min(r.bytes));
        let v = remote::value(call, round);
        // Every thread's part of the chunk is written (step 1, or the previous round).
        hw::sync_threads();
        for k in 1..nodes.count {
            let n = rotate(nodes.node, k, nodes.count);
            let into = Place::Scratch(nodes.node * cap * 16); // our box on node n's rank
            let chunk = Place::Heap(r.offset + from);
            remote::put_with_signal(
                call,
                nodes,
                into,
                chunk,
                to - from,
                Kind::Arrive,
                v,
                peer(n),
            )?;
        }
        remote::wait_signals(call, Kind::Arrive, v, others)?;
        remote::quiet(); // our chunk has landed everywhere: it may be overwritten below

        let own = r.at(call.c, call.rank);
        let mut i = a + call.tid;
        while i < b {
            let valid = unit_bytes(i, 16, r.bytes);
            let at = |n: usize| {
                if n == nodes.node {
                    own + 16 * i
                } else {
                    boxes + (n * cap + i - a) * 16
                }
            };
            // SAFETY: unit i lies inside the checked region; box n holds the same unit of node
            // n's partial (`valid` bytes, inside this CTA's scratch slice: i - a < cap).
            unsafe {
                let mut acc = Acc::<4>::first(red, load_unit::<4>(at(0), valid));
                for n in 1..nodes.count {
                    acc.add(red, load_unit::<4>(at(n), valid));
                }
                store_unit::<4>(own + 16 * i, valid, acc.finish(red, call.world));
            }
            i += call.threads;
        }

        // Our boxes are read: each sender may refill them. Theirs, that we fill next round, too.
        hw::sync_threads();
        for k in 1..nodes.count {
            let n = rotate(nodes.node, k, nodes.count);
            let none = Place::Scratch(0);
            remote::put_with_signal(call, nodes, none, none, 0, Kind::Ack, v, peer(n))?;
        }
        remote::wait_signals(call, Kind::Ack, v, others)?;
        a = b;
        round += 1;
    }
    Ok(())
}
