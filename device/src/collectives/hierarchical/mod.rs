//! The hierarchical collectives (`symm_*_hierarchical`), for a context of several nodes
//! (`SymmContext::node_size`): NVLink loads and stores among the ranks of a node, the remote
//! transport (NVSHMEM put-with-signal) between nodes. A rank (node n, local index l) talks across
//! nodes only to its partners, the ranks (m, l) of the other nodes: one partner per node, which
//! is what the remote signal words are indexed by.
//!
//! - all_reduce: node reduce-scatter, exchange of each shard's partials with the partners,
//!   node all-gather;
//! - reduce_scatter: the node's partial of each partner's block, exchanged, reduced by its owner;
//! - all_gather: the input put straight into every partner's output, then node all-gather;
//! - all_to_all: the blocks a node sends to a partner gathered by the rank that pairs with it,
//!   put in one piece per round, copied into place by the receiver;
//! - all_to_all_v: the count matrix exchanged with the partners first, then as all_to_all with
//!   a stream of variable length per partner;
//! - broadcast: the root's buffer put straight into its partners' buffers, then node push;
//! - reduce: each node's partial of shard l goes to rank l of the root's node, which reduces
//!   them and stores into the root's output;
//! - barrier: node barrier, partner signals, node barrier;
//! - tile all_gather (`tile`): as all_gather, for one tile, matched by tile index.
//!
//! On one node each is its node-local part alone. The exchanges that need somewhere to land run
//! in rounds through the scratch (`in_rounds`); all_gather puts into the output directly.

pub mod all_gather;
pub mod all_reduce;
pub mod all_to_all;
pub mod all_to_all_v;
pub mod barrier;
pub mod broadcast;
pub mod reduce;
pub mod reduce_scatter;
pub mod tile;

use crate::abi::{reduce_op, status};
use crate::hw;
use crate::runtime::elem::{Acc, Reduction};
use crate::runtime::mem::{div32, div_ceil32, load_unit, rotate, split, store_unit, unit_bytes};
use crate::runtime::nodes::Nodes;
use crate::runtime::scratch::{slice_base, slice_bytes};
use crate::runtime::sync::Call;
use crate::transport::remote::{self, Kind, Place};

/// This rank's grouping into nodes, after the checks every hierarchical collective makes: a
/// build without a network reaches no other node (PEER_NOT_MAPPED), and a multi-node exchange
/// through the scratch needs room for `boxes` boxes of at least one unit (INVALID_ARGUMENT).
#[inline(always)]
fn nodes_for(call: &Call, boxes: usize) -> Result<Nodes, i32> {
    let nodes = Nodes::of(call.c);
    if nodes.multi() && !hw::remote::NETWORK {
        return Err(status::PEER_NOT_MAPPED);
    }
    if nodes.multi() && boxes > 0 && box_units(call, boxes) == 0 {
        return Err(status::INVALID_ARGUMENT);
    }
    Ok(nodes)
}

/// 16-byte units per box when a CTA's scratch slice holds `boxes` of them.
#[inline(always)]
fn box_units(call: &Call, boxes: usize) -> usize {
    div32(slice_bytes(call.c) / 16, boxes)
}

/// This CTA's 16-byte units [lo, hi) of this rank's shard of a message of `bytes`: shard l is
/// the units [l * shard, (l + 1) * shard) (the last ones shorter or empty), and every CTA takes
/// the same slice of every shard.
#[inline(always)]
fn shard_units(call: &Call, nodes: &Nodes, bytes: usize) -> (usize, usize) {
    let units = bytes.div_ceil(16);
    let shard = div_ceil32(units, nodes.size);
    let (slo, shi) = split(shard, call.ctas, call.cta);
    let lo = (nodes.local * shard + slo).min(units);
    let hi = (nodes.local * shard + shi).min(units);
    (lo, hi)
}

/// The partner of this rank on node `m`.
#[inline(always)]
fn partner(nodes: &Nodes, m: usize) -> usize {
    nodes.rank(m, nodes.local)
}

/// For `wait_signals`: thread t waits for the partner on node t if `pick(t)` (another node).
#[inline(always)]
fn nodes_where<'a>(
    nodes: &'a Nodes,
    pick: impl Fn(usize) -> bool + 'a,
) -> impl Fn(usize) -> Option<usize> + 'a {
    move |t| (t < nodes.count && pick(t)).then_some(t)
}

/// `nodes_where` every other node.
#[inline(always)]
fn other_node(nodes: &Nodes) -> impl Fn(usize) -> Option<usize> + '_ {
    nodes_where(nodes, |t| t != nodes.node)
}

/// Sets this rank's `kind` signal to `value` on the partner of every other node m with
/// `pick(m)`, with no data (a signal alone).
#[inline(always)]
fn signal_partners(
    call: &Call,
    nodes: &Nodes,
    kind: Kind,
    value: u64,
    pick: impl Fn(usize) -> bool,
) -> Result<(), i32> {
    let none = Place::Heap(0); // no data: any symmetric address (tile calls have no slice)
    for k in 1..nodes.count {
        let m = rotate(nodes.node, k, nodes.count);
        if pick(m) {
            let to = partner(nodes, m);
            remote::put_with_signal(call, nodes, none, none, 0, kind, value, to)?;
        }
    }
    Ok(())
}

/// What one exchange in rounds sends and does with what it receives; see `in_rounds`.
trait Rounds {
    /// Every thread writes what this round sends for units [a, b) (into the send boxes; nothing
    /// when the data is put from where it lies).
    fn prepare(&self, call: &Call, nodes: &Nodes, a: usize, b: usize);
    /// Where this round's data for node `m` lies, and its length in bytes.
    fn source(&self, nodes: &Nodes, m: usize, a: usize, b: usize) -> (Place, usize);
    /// Every thread consumes this round's boxes (the box from node k at `recv + k * box_bytes`,
    /// this rank's own node's box unused).
    fn consume(&self, call: &Call, nodes: &Nodes, a: usize, b: usize, recv: usize);
    /// Whether this rank sends to the partner on node `m` (another node): by default every one.
    #[inline(always)]
    fn sends_to(&self, nodes: &Nodes, m: usize) -> bool {
        m != nodes.node
    }
    /// Whether this rank receives from the partner on node `k` (another node): by default every
    /// one. Each rank's `sends_to` must match what its partners' `receives_from` expect.
    #[inline(always)]
    fn receives_from(&self, nodes: &Nodes, k: usize) -> bool {
        k != nodes.node
    }
    /// The round whose signal value the first round uses: past those a collective used before
    /// its rounds in the same call.
    #[inline(always)]
    fn first_round(&self) -> usize {
        0
    }
}

/// This CTA's exchange of units [lo, hi) with its partners, in rounds of at most `cap` units.
/// The scratch slice holds one receive box of `box_bytes` per node (box k filled by the partner
/// on node k), then whatever `r` keeps there (its send boxes).
///
/// Per round: prepare, put each partner's data into our box in its scratch with an `Arrive`
/// signal, wait for every partner's, `quiet` (our data has landed, so it may be overwritten),
/// consume, then tell each partner its box is free (`Ack`) and wait for the same from each
/// before the next round refills them. Two network round trips per round: correct first.
///
/// The last round's Acks are owed, not waited for (`remote::owe_acks`): the first put of the
/// next exchange from this CTA slot, whatever its layout, waits for them (`settle_acks`, here
/// and before all_to_all_v's count rows), since every box a partner filled is consumed before
/// it sends its last Ack. A call so returns one network round trip sooner.
fn in_rounds(
    call: &Call,
    nodes: &Nodes,
    (lo, hi): (usize, usize),
    cap: usize,
    box_bytes: usize,
    r: &impl Rounds,
) -> Result<(), i32> {
    let recv = slice_base(call.c, call.rank, call.cta);
    let receivers = nodes_where(nodes, |t| r.sends_to(nodes, t));
    if lo < hi {
        remote::settle_acks(call, &receivers)?; // the boxes we fill are free
    }
    let mut a = lo;
    let mut round = r.first_round();
    while a < hi {
        let b = (a + cap).min(hi);
        let v = remote::value(call, round);
        r.prepare(call, nodes, a, b);
        // Every thread's part of the data is written (above, or before the exchange).
        hw::sync_threads();
        for k in 1..nodes.count {
            let m = rotate(nodes.node, k, nodes.count);
            if r.sends_to(nodes, m) {
                let into = Place::Scratch(nodes.node * box_bytes); // our box on the partner
                let (chunk, bytes) = r.source(nodes, m, a, b);
                let to = partner(nodes, m);
                remote::put_with_signal(call, nodes, into, chunk, bytes, Kind::Arrive, v, to)?;
            }
        }
        let senders = nodes_where(nodes, |t| r.receives_from(nodes, t));
        remote::wait_signals(call, Kind::Arrive, v, senders)?;
        remote::quiet(); // our data has landed everywhere: it may be overwritten below

        r.consume(call, nodes, a, b, recv);

        // Our boxes are read: each partner may refill them. Theirs, that we fill next, too
        // (after the last round: at our next put there).
        hw::sync_threads();
        signal_partners(call, nodes, Kind::Ack, v, |m| r.receives_from(nodes, m))?;
        if b < hi {
            remote::wait_signals(call, Kind::Ack, v, &receivers)?;
        } else {
            remote::owe_acks(call, v, &receivers)?;
        }
        a = b;
        round += 1;
    }
    Ok(())
}

/// Unit `i` (`valid` bytes) of this node's partial of the region at heap offset `offset`: the
/// unit on every rank of the node, reduced with `red` (a partial op: see `partial_op`) and
/// rounded to the dtype.
///
/// # Safety
/// `valid` bytes of unit i at `offset` lie inside a checked region (the same on every rank).
#[inline(always)]
unsafe fn node_partial(
    call: &Call,
    nodes: &Nodes,
    offset: usize,
    i: usize,
    valid: usize,
    red: &Reduction,
) -> [u32; 4] {
    let from = |p: usize| call.c.heap_base(nodes.first() + p) + offset + 16 * i;
    let mut acc = Acc::<4>::first(red, load_unit::<4>(from(0), valid));
    for p in 1..nodes.size {
        acc.add(red, load_unit::<4>(from(p), valid));
    }
    acc.finish(red, nodes.size)
}

/// The reduction each node's partial is made with: with several nodes AVG sums there and
/// divides once, after the exchange (`reduce_partials`).
#[inline(always)]
fn partial_op(red: &Reduction, nodes: &Nodes) -> Reduction {
    Reduction {
        op: if red.op == reduce_op::AVG && nodes.multi() {
            reduce_op::SUM
        } else {
            red.op
        },
        dtype: red.dtype,
    }
}

/// Units [a, b) of a message of `bytes` at `dst` (this rank's address of unit 0, holding this
/// node's partial) become the reduction over nodes, in node order, of every node's partial:
/// node k's unit i lies at `recv + k * box_bytes + 16 * (i - a)` (its receive box). AVG
/// divides by the world size here.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn reduce_partials(
    call: &Call,
    nodes: &Nodes,
    (a, b): (usize, usize),
    dst: usize,
    bytes: usize,
    recv: usize,
    box_bytes: usize,
    red: &Reduction,
) {
    // Worlds of several nodes pass one node's table of reciprocals (`elem::reciprocal`).
    let inv = 1.0 / call.world as f32;
    let mut i = a + call.tid;
    while i < b {
        let valid = unit_bytes(i, 16, bytes);
        let at = |k: usize| {
            if k == nodes.node {
                dst + 16 * i
            } else {
                recv + k * box_bytes + 16 * (i - a)
            }
        };
        // SAFETY: unit i lies inside the caller's checked region at `dst`; box k holds the same
        // unit of node k's partial (`valid` bytes, inside this CTA's scratch slice: the
        // caller's rounds keep i - a below the box's units).
        unsafe {
            let mut acc = Acc::<4>::first(red, load_unit::<4>(at(0), valid));
            for k in 1..nodes.count {
                acc.add(red, load_unit::<4>(at(k), valid));
            }
            store_unit::<4>(dst + 16 * i, valid, acc.finish_scaled(red, inv));
        }
        i += call.threads;
    }
}
