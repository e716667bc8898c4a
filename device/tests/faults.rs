//! Fault injection (`hw::sim_faults`): what the interconnect could do to the stores that carry
//! synchronization. A dropped flag store, flag add or LL packet gives TIMEOUT (recorded) on some
//! rank and never a wrong answer on a rank that returns OK; delayed ones, and LL packets that
//! overtake each other, change nothing.
//!
//! Each case runs the all-reduce algorithms (one-shot LL, two-shot LL, two-shot over the
//! buffers), an LL all_gather, a grid barrier, tile signals to every peer and a barrier on a fresh
//! node, then checks every rank that returned OK against the reference.

mod sim;
use ironlink_device::hw::sim_faults::{self, Fault, Kind};
use sim::*;

const WORLD: usize = 3;
const CTAS: u32 = 2;
/// (elements, heap offset, algorithm) of the all-reduces, in call order.
const ALL_REDUCES: [(usize, usize, Algorithm); 3] = [
    (24, 256, Algorithm::OneShotLl),
    (200, 1024, Algorithm::TwoShotLl),
    (3000, 16384, Algorithm::TwoShot),
];
/// Waits give up after this when an operation was dropped (delays get far longer).
const DROP_TIMEOUT_NS: u64 = 100_000_000;
const GATHER: (usize, usize, usize) = (100, 30720, 32768); // elements per rank, input, output

struct Outcome {
    statuses: Vec<i32>,
    /// Per rank: whether every result it has is right.
    right: Vec<bool>,
}

fn run_case(what: &str, timeout_ns: u64) -> Outcome {
    let mut node = Node::new(WORLD, 1 << 16, 1 << 20);
    small_algorithm_limits(&mut node);
    for r in 0..WORLD {
        node.ctx_mut(r).timeout_ns = timeout_ns;
    }
    let mut rng = Rng::new(5);
    let mut values = |n: usize| (0..n).map(|_| rng.uniform(-2.0, 2.0)).collect::<Vec<f32>>();
    let mut want = Vec::new();
    for (n, offset, alg) in ALL_REDUCES {
        assert_eq!(choose(node.context(0), CTAS as usize, 2 * n), alg, "n={n}");
        let inputs: Vec<Vec<f64>> = (0..WORLD)
            .map(|r| fill(&mut node, r, offset, Dt::Bf16, &values(n)))
            .collect();
        want.push(reference(reduce_op::SUM, &inputs));
    }
    let (gn, gin, gout) = GATHER;
    let gathered: Vec<f64> = (0..WORLD)
        .flat_map(|r| fill(&mut node, r, gin, Dt::Bf16, &values(gn)))
        .collect();
    let statuses = node.run_worst(what, CTAS, 16, |rank, ctx| {
        for (n, offset, _) in ALL_REDUCES {
            let s = api::symm_all_reduce(
                ctx,
                node.addr(rank, offset),
                0,
                n as i64,
                reduce_op::SUM,
                dtype::BFLOAT16,
            );
            if s != status::OK {
                return s;
            }
        }
        let s = api::symm_all_gather(
            ctx,
            node.addr(rank, gin),
            node.addr(rank, gout),
            gn as i64,
            dtype::BFLOAT16,
        );
        if s != status::OK {
            return s;
        }
        // Flag adds: the grid barrier's arrivals and tile signals to every peer.
        let s = api::symm_grid_barrier(ctx);
        if s != status::OK {
            return s;
        }
        let tile = ironlink_device::hw::cta_rank() as i64;
        let s = api::symm_tile_signal_others(ctx, tile);
        if s != status::OK {
            return s;
        }
        let s = api::symm_tile_wait_others(ctx, tile);
        if s != status::OK {
            return s;
        }
        api::symm_barrier(ctx)
    });
    let right = (0..WORLD)
        .map(|r| {
            ALL_REDUCES.iter().zip(&want).all(|((n, offset, _), w)| {
                let got = read(&node, r, *offset, Dt::Bf16, *n);
                got.iter()
                    .zip(w)
                    .all(|(g, w)| (g - w).abs() <= Dt::Bf16.tolerance() * w.abs().max(1.0))
            }) && read(&node, r, gout, Dt::Bf16, WORLD * gn) == gathered
        })
        .collect();
    for (r, s) in statuses.iter().enumerate() {
        if *s == status::TIMEOUT {
            assert_eq!(
                node.recorded_error(r),
                status::TIMEOUT,
                "{what}: rank {r} returned TIMEOUT unrecorded"
            );
        }
    }
    Outcome { statuses, right }
}

/// Drops the n-th operation of each kind for n over the whole run: every rank returns OK with
/// the right results or TIMEOUT; and dropping does bite (some case times out for each kind).
/// Not every drop bites (of a clean run's 108 flag stores, dropping #0, #18 or #72 changed
/// nothing), and which operation is the n-th depends on how the ranks interleave (under load all
/// six first drops once missed), so past the first six the drops go on, at points between them,
/// until one bites (at most `MAX_DROPS`).
#[test]
fn a_dropped_flag_or_packet_gives_timeout_never_a_wrong_answer() {
    let _one_at_a_time = sim_faults::serial();
    sim_faults::set(None);
    let clean = run_case("no fault", DROP_TIMEOUT_NS);
    assert_eq!(clean.statuses, vec![status::OK; WORLD]);
    assert!(
        clean.right.iter().all(|r| *r),
        "the fault-free run is wrong"
    );
    for kind in [Kind::FlagStore, Kind::FlagAdd, Kind::Packet] {
        // How many operations of the kind a clean run makes, to spread the drops over them.
        sim_faults::set(Some(Fault::Delay { kind, max_us: 0 }));
        run_case("count", DROP_TIMEOUT_NS);
        let total = sim_faults::count(kind);
        assert!(total > 0, "{kind:?}: the run makes no such operation");
        let mut timeouts = 0;
        for i in 0..MAX_DROPS {
            if i >= 6 && timeouts > 0 {
                break;
            }
            // The first six spread over the run, then the points between them, and so on.
            let nth = drop_point(i, total);
            sim_faults::set(Some(Fault::Drop { kind, nth }));
            let what = format!("drop {kind:?} #{nth} of {total}");
            let o = run_case(&what, DROP_TIMEOUT_NS);
            for r in 0..WORLD {
                match o.statuses[r] {
                    status::OK => assert!(
                        o.right[r],
                        "{what}: rank {r} returned OK with a wrong result"
                    ),
                    status::TIMEOUT => timeouts += 1,
                    s => panic!("{what}: rank {r} returned {s}"),
                }
            }
        }
        assert!(timeouts > 0, "{kind:?}: no drop was noticed");
    }
    sim_faults::set(None);
}

/// At most this many runs with one dropped operation per kind.
const MAX_DROPS: u64 = 48;

/// The i-th drop of `total` operations: 0, 1/6, .., 5/6 of the run first (i < 6), then the
/// midpoints between those, then the quarter points, ... (a van der Corput order within each
/// sixth).
fn drop_point(i: u64, total: u64) -> u64 {
    let (sixth, mut round) = (i % 6, i / 6);
    // Bit-reversed round: 0, 1/2, 1/4, 3/4, 1/8, ... of one sixth.
    let (mut frac, mut scale) = (0.0f64, 0.5f64);
    while round > 0 {
        if round & 1 == 1 {
            frac += scale;
        }
        round >>= 1;
        scale /= 2.0;
    }
    (((sixth as f64 + frac) * total as f64 / 6.0) as u64).min(total.saturating_sub(1))
}

/// Delays of every flag store, flag add and packet, and LL packets overtaking each other: all
/// ranks OK with the right results.
#[test]
fn delayed_and_reordered_flags_and_packets_change_nothing() {
    let _one_at_a_time = sim_faults::serial();
    for plan in [
        Fault::Delay {
            kind: Kind::FlagStore,
            max_us: 200,
        },
        Fault::Delay {
            kind: Kind::FlagAdd,
            max_us: 200,
        },
        Fault::Delay {
            kind: Kind::Packet,
            max_us: 50,
        },
        Fault::ReorderPackets,
    ] {
        sim_faults::set(Some(plan));
        let o = run_case(&format!("{plan:?}"), 10_000_000_000);
        if plan == Fault::ReorderPackets {
            assert!(sim_faults::overtaken() > 0, "no packet was overtaken");
        }
        sim_faults::set(None);
        assert_eq!(o.statuses, vec![status::OK; WORLD], "{plan:?}");
        assert!(o.right.iter().all(|r| *r), "{plan:?}: a wrong result");
    }
}
