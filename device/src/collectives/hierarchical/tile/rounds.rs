//! The exchange of tile reductions across nodes in rounds of a landing box (see `tile`'s
//! module docs): each round a rank frees its boxes with an `Ack` naming its CTA, fills its send
//! boxes, puts them into the boxes its partners named, and reduces what landed in node order.

use crate::abi::{signal, status, MAX_CTAS};
use crate::collectives::hierarchical::{other_node, partner, signal_partners};
use crate::hw;
use crate::runtime::elem::{Acc, Reduction};
use crate::runtime::mem::{div32, load_unit, rotate};
use crate::runtime::nodes::Nodes;
use crate::runtime::sync::Call;
use crate::transport::remote::{self, Kind, Place};

const _: () = assert!(
    MAX_CTAS <= 256,
    "a CTA index travels in the low byte of an Ack"
);

/// Whether every CTA of the launch has a box area: INVALID_ARGUMENT for a grid of more than
/// MAX_CTAS, on every CTA of every rank alike (all launch the same grid), before any wait.
#[inline(always)]
pub(super) fn boxes_for_the_grid() -> Result<(), i32> {
    if hw::grid_ctas() as usize > MAX_CTAS {
        return Err(status::INVALID_ARGUMENT);
    }
    Ok(())
}

/// One CTA's landing boxes for a tile reduction across `count` nodes, in its area of the signal
/// region: receive box k (filled by the partner on node k), then send box m (for node m; a
/// rank's own node's holds its node's partial). `units` 16-byte units each.
pub(super) struct Boxes {
    area: usize,
    units: usize,
    count: usize,
}

impl Boxes {
    #[inline(always)]
    pub(super) fn of(cta: usize, nodes: &Nodes) -> Self {
        Boxes {
            area: signal::TILE_BOX_OFFSET + cta * signal::TILE_BOX_AREA,
            units: div32(signal::TILE_BOX_AREA / 16, 2 * nodes.count),
            count: nodes.count,
        }
    }

    /// Offsets in the signal region.
    #[inline(always)]
    pub(super) fn recv(&self, k: usize) -> usize {
        self.area + k * self.units * 16
    }

    #[inline(always)]
    pub(super) fn send(&self, m: usize) -> usize {
        self.area + (self.count + m) * self.units * 16
    }
}

/// A round's signal value: the call's epoch and the round as in `remote::value`, moved up a byte
/// for the CTA index an `Ack` carries (0 in arrivals and in the values waited for).
#[inline(always)]
fn round_value(call: &Call, round: usize, cta: usize) -> u64 {
    ((call.epoch << 2) as u64) << 32 | (round as u64 + 1) << 8 | cta as u64
}

/// What a tile reduction sends in a round and what it makes of what it receives.
pub(super) trait TileRounds {
    /// Every thread writes node partials of units [a, b) into the send boxes.
    fn prepare(&self, call: &Call, nodes: &Nodes, boxes: &Boxes, a: usize, b: usize);
    /// The send box whose content goes to node m.
    fn send_box(&self, boxes: &Boxes, nodes: &Nodes, m: usize) -> usize;
    /// Every thread finishes units [a, b) from the boxes.
    fn consume(&self, call: &Call, nodes: &Nodes, boxes: &Boxes, a: usize, b: usize);
}

/// The exchange of units [lo, hi) with the partners (the same range on each), in rounds of a
/// box (see the module docs).
pub(super) fn in_rounds(
    call: &Call,
    nodes: &Nodes,
    (lo, hi): (usize, usize),
    r: &impl TileRounds,
) -> Result<(), i32> {
    let cta = hw::cta_rank() as usize; // < MAX_CTAS: `boxes_for_the_grid`
    let mine = Boxes::of(cta, nodes);
    let (mut a, mut round) = (lo, 0);
    while a < hi {
        let b = (a + mine.units).min(hi);
        let v = round_value(call, round, 0);
        // Our boxes are free (the last round's consumed, or the last call's): where they are.
        signal_partners(
            call,
            nodes,
            Kind::Ack,
            round_value(call, round, cta),
            |_| true,
        )?;
        r.prepare(call, nodes, &mine, a, b);
        hw::sync_threads();
        remote::wait_signals(call, Kind::Ack, v, other_node(nodes))?;
        for k in 1..nodes.count {
            let m = rotate(nodes.node, k, nodes.count);
            let theirs = Boxes::of(
                (remote::read_signal(call, Kind::Ack, m) & 0xff) as usize,
                nodes,
            );
            let (into, from) = (theirs.recv(nodes.node), r.send_box(&mine, nodes, m));
            let to = partner(nodes, m);
            let bytes = 16 * (b - a);
            remote::put_with_signal(
                call,
                nodes,
                Place::Signal(into),
                Place::Signal(from),
                bytes,
                Kind::Arrive,
                v,
                to,
            )?;
        }
        remote::wait_signals(call, Kind::Arrive, v, other_node(nodes))?;
        remote::quiet(); // our send boxes have landed: the next round may refill them
        r.consume(call, nodes, &mine, a, b);
        hw::sync_threads(); // every thread has read the boxes before the next Ack frees them
        a = b;
        round += 1;
    }
    Ok(())
}

/// Units [a, b) of the reduction over nodes, in node order, of the partials in `boxes` (node
/// k's in receive box k, this node's in its send box): `f(u, valid, result)` for each of this
/// thread's units.
#[inline(always)]
pub(super) fn reduce_boxes(
    call: &Call,
    nodes: &Nodes,
    boxes: &Boxes,
    (a, b): (usize, usize),
    valid: impl Fn(usize) -> usize,
    red: &Reduction,
    mut f: impl FnMut(usize, [u32; 4]),
) {
    let signals = call.c.signal_base(call.rank);
    let box_of = |k: usize| {
        signals
            + if k == nodes.node {
                boxes.send(k)
            } else {
                boxes.recv(k)
            }
    };
    let inv = 1.0 / call.world as f32;
    let mut u = a + call.tid;
    while u < b {
        let (at, n) = (16 * (u - a), valid(u));
        // SAFETY: unit u - a of every box lies inside this CTA's area of the signal region
        // (b - a <= boxes.units), written by this thread's `prepare` or by a partner's put.
        unsafe {
            let mut acc = Acc::<4>::first(red, load_unit::<4>(box_of(0) + at, n));
            for k in 1..nodes.count {
                acc.add(red, load_unit::<4>(box_of(k) + at, n));
            }
            f(u, acc.finish_scaled(red, inv));
        }
        u += call.threads;
    }
}
