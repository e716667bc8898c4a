//! The hierarchical reduce_scatter, all_gather, all_to_all, broadcast, reduce and barrier
//! (`symm_*_hierarchical`) on simulated nodes: ranks grouped into nodes of `node_size`, other
//! nodes reached only through the simulated network (`hw::sim_net`). (The all-reduce has its own
//! file, `hierarchical.rs`.)
//!
//! all_gather and all_to_all move bytes: every output byte is checked against the inputs, and
//! the bytes around the output against the heap's guard. reduce_scatter is checked against the
//! one-node `symm_reduce_scatter` of the same inputs: bitwise on integer-valued data (every
//! partial sum exact), within the dtype's tolerance of the f64 reference on random data.
//! Every test holds `sim_faults::serial()` (fault plans are process-wide).

mod sim;
use ironlink_device::hw::sim_faults::{self, Fault, Kind};
use sim::*;

/// (world, ranks per node): 2 nodes of 2, 4 of 1, 3 of 2, 2 of 4, 4 of 2, and worlds larger
/// than one node's table: 16 as 2 of 8 and 4 of 4, 12 as 3 of 4.
const SHAPES: [(usize, u32); 8] = [
    (4, 2),
    (4, 1),
    (6, 2),
    (8, 4),
    (8, 2),
    (16, 8),
    (16, 4),
    (12, 4),
];
const HEAP: usize = 1 << 17;
/// 1 KiB per CTA slice: boxes of a few units, so most messages take many rounds.
const SCRATCH: usize = 1 << 18;
const CTAS: u32 = 3;
const THREADS: u32 = 32;
/// Where inputs and outputs start: 16-byte aligned, and not (4 bytes past).
const IN_AT: [usize; 2] = [0, 4];
const OUT_AT: usize = 1 << 16;
/// Elements per block: tiny, one unit short of a multiple of 16 bytes, several rounds.
const COUNTS: [usize; 3] = [3, 37, 301];

/// The ops tried on case `k` of `COUNTS`: every op on the multi-round case, sums and averages on
/// the others.
fn ops_for(k: usize) -> &'static [i32] {
    if k == 2 {
        &OPS
    } else {
        &[reduce_op::SUM, reduce_op::AVG]
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Coll {
    ReduceScatter,
    AllGather,
    AllToAll,
}

/// Elements of a rank's input and output for `n` per block.
fn sizes(coll: Coll, world: usize, n: usize) -> (usize, usize) {
    match coll {
        Coll::ReduceScatter => (world * n, n),
        Coll::AllGather => (n, world * n),
        Coll::AllToAll => (world * n, world * n),
    }
}

/// One call of `coll` (`hierarchical` or the one-node function) on every rank.
#[allow(clippy::too_many_arguments)]
fn call(
    coll: Coll,
    hierarchical: bool,
    c: i64,
    inp: i64,
    out: i64,
    n: usize,
    dt: Dt,
    op: i32,
) -> i32 {
    let n = n as i64;
    match (coll, hierarchical) {
        (Coll::ReduceScatter, true) => {
            api::symm_reduce_scatter_hierarchical(c, inp, out, n, op, dt.code())
        }
        (Coll::ReduceScatter, false) => api::symm_reduce_scatter(c, inp, out, n, op, dt.code()),
        (Coll::AllGather, true) => api::symm_all_gather_hierarchical(c, inp, out, n, dt.code()),
        (Coll::AllGather, false) => api::symm_all_gather(c, inp, out, n, dt.code()),
        (Coll::AllToAll, true) => api::symm_all_to_all_hierarchical(c, inp, out, n, dt.code()),
        (Coll::AllToAll, false) => api::symm_all_to_all(c, inp, out, n, dt.code()),
    }
}

/// `world` ranks as nodes of `node_size` (0: one node, a P2P context).
fn node(world: usize, node_size: u32) -> Node {
    if node_size > 0 {
        Node::with_nodes(world, node_size as usize, HEAP, SCRATCH)
    } else {
        Node::new(world, HEAP, SCRATCH)
    }
}

/// Values for every rank: integers in [-4, 4] (`exact`) or uniform in [-2, 2).
fn inputs(world: usize, len: usize, seed: u64, exact: bool) -> Vec<Vec<f32>> {
    let mut rng = Rng::new(seed);
    let mut one = || {
        if exact {
            (rng.next() % 9) as f32 - 4.0
        } else {
            rng.uniform(-2.0, 2.0)
        }
    };
    (0..world)
        .map(|_| (0..len).map(|_| one()).collect())
        .collect()
}

/// Runs `coll` on `world` ranks as nodes of `node_size` over `vals` (input at `in_at`, output at
/// `OUT_AT`); returns each rank's status and output bytes, after checking the guard bytes around
/// the output.
#[allow(clippy::too_many_arguments)]
fn run(
    coll: Coll,
    world: usize,
    node_size: u32,
    n: usize,
    in_at: usize,
    dt: Dt,
    op: i32,
    vals: &[Vec<f32>],
) -> (Vec<i32>, Vec<Vec<u8>>) {
    let mut nd = node(world, node_size);
    for (r, v) in vals.iter().enumerate() {
        fill(&mut nd, r, in_at, dt, v);
    }
    let out_len = sizes(coll, world, n).1 * dt.size();
    let st = nd.run("hierarchical", CTAS, THREADS, |r, c| {
        let (i, o) = (nd.addr(r, in_at), nd.addr(r, OUT_AT));
        call(coll, node_size > 0, c, i, o, n, dt, op)
    });
    let what = format!("{coll:?} {world}/{node_size}");
    assert_guard(&nd, &what, OUT_AT - 64, OUT_AT);
    assert_guard(&nd, &what, OUT_AT + out_len, OUT_AT + out_len + 64);
    let outs = (0..world)
        .map(|r| nd.heap(r)[OUT_AT..OUT_AT + out_len].to_vec())
        .collect();
    (st, outs)
}

/// What a data-moving collective must leave on rank `q`, from the ranks' input bytes.
fn moved(coll: Coll, q: usize, ins: &[Vec<u8>], block: usize) -> Vec<u8> {
    let world = ins.len();
    match coll {
        Coll::AllGather => ins.concat(),
        _ => (0..world)
            .flat_map(|p| ins[p][q * block..(q + 1) * block].to_vec())
            .collect(),
    }
}

#[test]
fn all_gather_and_all_to_all_move_every_byte() {
    let _serial = sim_faults::serial();
    for coll in [Coll::AllGather, Coll::AllToAll] {
        for (world, size) in SHAPES {
            for dt in [Dt::F32, Dt::Bf16] {
                for (k, n) in COUNTS.into_iter().enumerate() {
                    let in_at = IN_AT[k % 2];
                    let what = format!("{coll:?}, {world} as nodes of {size}, {dt:?}, n={n}");
                    let in_len = sizes(coll, world, n).0;
                    let vals = inputs(world, in_len, 3 + k as u64, false);
                    let (st, got) = run(coll, world, size, n, in_at, dt, 0, &vals);
                    assert_eq!(st, vec![status::OK; world], "{what}");
                    let ins: Vec<Vec<u8>> = vals
                        .iter()
                        .map(|v| v.iter().flat_map(|x| dt.encode(*x).1).collect())
                        .collect();
                    for (q, got) in got.iter().enumerate() {
                        assert!(
                            *got == moved(coll, q, &ins, n * dt.size()),
                            "{what}: rank {q}"
                        );
                    }
                }
            }
        }
    }
}

/// In place: the input is this rank's block of the output.
#[test]
fn all_gather_in_place() {
    let _serial = sim_faults::serial();
    for (world, size) in [(4, 2), (12, 4)] {
        let n = 37;
        let mut nd = node(world, size);
        let vals = inputs(world, n, 5, false);
        let block = n * 4;
        for (r, v) in vals.iter().enumerate() {
            fill(&mut nd, r, OUT_AT + r * block, Dt::F32, v);
        }
        let st = nd.run("in place", CTAS, THREADS, |r, c| {
            let (i, o) = (nd.addr(r, OUT_AT + r * block), nd.addr(r, OUT_AT));
            api::symm_all_gather_hierarchical(c, i, o, n as i64, dtype::FLOAT32)
        });
        assert_eq!(st, vec![status::OK; world]);
        let want: Vec<f64> = vals.concat().iter().map(|x| *x as f64).collect();
        for r in 0..world {
            assert_eq!(read(&nd, r, OUT_AT, Dt::F32, world * n), want, "rank {r}");
        }
    }
}

#[test]
fn reduce_scatter_matches_one_node() {
    let _serial = sim_faults::serial();
    // Worlds of one node's table at most: the larger ones have no one-node reference (compared
    // in `reduce_scatter_of_worlds_larger_than_a_node`, against f64).
    for (world, size) in SHAPES.into_iter().filter(|&(world, _)| world <= 8) {
        for dt in Dt::ALL {
            for (k, n) in COUNTS.into_iter().enumerate() {
                for &op in ops_for(k) {
                    let exact =
                        size == 1 || matches!(op, reduce_op::SUM | reduce_op::MAX | reduce_op::MIN);
                    let what = format!("{world} as nodes of {size}, {dt:?}, op {op}, n={n}");
                    let vals = inputs(world, world * n, 7 + k as u64, exact && size > 1);
                    let in_at = IN_AT[k % 2];
                    let rs = Coll::ReduceScatter;
                    let (st, got) = run(rs, world, size, n, in_at, dt, op, &vals);
                    assert_eq!(st, vec![status::OK; world], "{what}");
                    let (st, want) = run(rs, world, 0, n, in_at, dt, op, &vals);
                    assert_eq!(st, vec![status::OK; world], "{what}: one node");
                    for q in 0..world {
                        if exact {
                            assert!(got[q] == want[q], "{what}: rank {q} not bitwise one node's");
                        } else {
                            let decode = |b: &[u8]| -> Vec<f64> {
                                b.chunks(dt.size()).map(|e| dt.decode(e)).collect()
                            };
                            assert_close(&what, dt, &decode(&got[q]), &decode(&want[q]));
                        }
                    }
                }
            }
        }
    }
}

/// Worlds without a one-node reference: integer data, so every sum is exact (in the 16-bit
/// types too: |sum| <= 64) and each rank's result is the f64 reference of its block, bitwise.
/// f32 with three ops, the 16-bit types with sums.
#[test]
fn reduce_scatter_of_worlds_larger_than_a_node() {
    let _serial = sim_faults::serial();
    let cases = [reduce_op::SUM, reduce_op::MAX, reduce_op::AVG]
        .map(|op| (Dt::F32, op))
        .into_iter()
        .chain([(Dt::F16, reduce_op::SUM), (Dt::Bf16, reduce_op::SUM)]);
    for (dt, op) in cases {
        for (world, size) in [(16, 8), (16, 4), (12, 4)] {
            let n = COUNTS[2];
            let vals = inputs(world, world * n, 21, true);
            let (st, got) = run(Coll::ReduceScatter, world, size, n, 0, dt, op, &vals);
            let what = format!("{world}/{size} {dt:?} op {op}");
            assert_eq!(st, vec![status::OK; world], "{what}");
            for (q, got) in got.iter().enumerate() {
                let blocks: Vec<Vec<f64>> = vals
                    .iter()
                    .map(|v| v[q * n..(q + 1) * n].iter().map(|x| *x as f64).collect())
                    .collect();
                let want = reference(op, &blocks);
                let got: Vec<f64> = got.chunks(dt.size()).map(|e| dt.decode(e)).collect();
                if op == reduce_op::AVG {
                    assert_close(&format!("{what}: rank {q}"), dt, &got, &want);
                } else {
                    assert_eq!(got, want, "{what}: rank {q}");
                }
            }
        }
    }
}

/// On a one-node context each hierarchical entry point is its node-local part: bitwise the
/// one-node function's result.
#[test]
fn on_one_node_they_are_the_one_node_collectives() {
    let _serial = sim_faults::serial();
    let world = 4;
    for coll in [Coll::ReduceScatter, Coll::AllGather, Coll::AllToAll] {
        for n in COUNTS {
            let vals = inputs(world, sizes(coll, world, n).0, 13, true);
            let mut outs = Vec::new();
            for hierarchical in [true, false] {
                let mut nd = node(world, 0);
                for (r, v) in vals.iter().enumerate() {
                    fill(&mut nd, r, 0, Dt::Bf16, v);
                }
                let st = nd.run("one node", CTAS, THREADS, |r, c| {
                    let (i, o) = (nd.addr(r, 0), nd.addr(r, OUT_AT));
                    call(coll, hierarchical, c, i, o, n, Dt::Bf16, reduce_op::SUM)
                });
                assert_eq!(st, vec![status::OK; world], "{coll:?} n={n}");
                let len = sizes(coll, world, n).1 * 2;
                outs.push(
                    (0..world)
                        .map(|r| nd.heap(r)[OUT_AT..][..len].to_vec())
                        .collect::<Vec<_>>(),
                );
            }
            assert!(outs[0] == outs[1], "{coll:?} n={n}");
        }
    }
}

/// Every hierarchical collective in one launch, twice over (epochs, signal values and scratch
/// boxes reused across collectives of different box layouts), each result checked.
#[test]
fn back_to_back_different_collectives() {
    let _serial = sim_faults::serial();
    let (world, size, n) = (8, 2, 37);
    let mut nd = node(world, size);
    let vals = inputs(world, world * n, 17, true);
    let f = |v: &[f32]| v.iter().map(|x| *x as f64).collect::<Vec<f64>>();
    for (r, v) in vals.iter().enumerate() {
        fill(&mut nd, r, 0, Dt::F32, v); // the all_to_all and reduce_scatter input
        fill(&mut nd, r, 8192, Dt::F32, &v[..n]); // the all_gather input
        fill(&mut nd, r, 12288, Dt::F32, &v[..n]); // the all_reduce buffer (twice reduced)
    }
    let (a2a, ag, rs) = (OUT_AT, OUT_AT + 8192, OUT_AT + 16384);
    let st = nd.run("back to back", CTAS, THREADS, |r, c| {
        let at = |o: usize| nd.addr(r, o);
        for _ in 0..2 {
            let f32 = dtype::FLOAT32;
            let sum = reduce_op::SUM;
            for s in [
                api::symm_all_to_all_hierarchical(c, at(0), at(a2a), n as i64, f32),
                api::symm_reduce_scatter_hierarchical(c, at(0), at(rs), n as i64, sum, f32),
                api::symm_all_gather_hierarchical(c, at(8192), at(ag), n as i64, f32),
                api::symm_all_reduce_hierarchical(c, at(12288), 0, n as i64, sum, f32),
            ] {
                if s != status::OK {
                    return s;
                }
            }
        }
        status::OK
    });
    assert_eq!(st, vec![status::OK; world]);
    let firsts: Vec<Vec<f64>> = vals.iter().map(|v| f(&v[..n])).collect();
    let twice: Vec<f64> = reference(reduce_op::SUM, &firsts)
        .iter()
        .map(|x| x * world as f64)
        .collect();
    for q in 0..world {
        let blocks: Vec<Vec<f64>> = vals.iter().map(|v| f(&v[q * n..(q + 1) * n])).collect();
        let to_q: Vec<f64> = blocks.concat();
        assert_eq!(
            read(&nd, q, a2a, Dt::F32, world * n),
            to_q,
            "all_to_all, rank {q}"
        );
        let rs_want = reference(reduce_op::SUM, &blocks);
        assert_eq!(
            read(&nd, q, rs, Dt::F32, n),
            rs_want,
            "reduce_scatter, rank {q}"
        );
        assert_eq!(
            read(&nd, q, ag, Dt::F32, world * n),
            firsts.concat(),
            "all_gather, rank {q}"
        );
        assert_eq!(
            read(&nd, q, 12288, Dt::F32, n),
            twice,
            "all_reduce, rank {q}"
        );
    }
}

/// The network delays every delivery, or delivers each outbox newest first: same bytes.
#[test]
fn delayed_and_reordered_deliveries_change_nothing() {
    let _serial = sim_faults::serial();
    let plans = [
        Fault::Delay {
            kind: Kind::RemotePut,
            max_us: 300,
        },
        Fault::ReorderRemote,
    ];
    for plan in plans {
        for coll in [Coll::ReduceScatter, Coll::AllGather, Coll::AllToAll] {
            let (world, size, n) = (4, 2, 301);
            let vals = inputs(world, sizes(coll, world, n).0, 5, true);
            let (_, want) = run(coll, world, size, n, 0, Dt::Bf16, reduce_op::SUM, &vals);
            sim_faults::set(Some(plan));
            let (st, got) = run(coll, world, size, n, 0, Dt::Bf16, reduce_op::SUM, &vals);
            let puts = sim_faults::count(Kind::RemotePut);
            sim_faults::set(None);
            assert_eq!(st, vec![status::OK; world], "{plan:?} {coll:?}");
            assert!(puts > 0, "{plan:?} {coll:?}: the network carried nothing");
            assert!(got == want, "{plan:?} {coll:?}");
        }
    }
}

/// A lost remote signal gives TIMEOUT (recorded), never a hang; a rank that returns OK has the
/// right result.
#[test]
fn dropped_remote_signal_gives_timeout() {
    let _serial = sim_faults::serial();
    for coll in [Coll::ReduceScatter, Coll::AllGather, Coll::AllToAll] {
        for nth in [0, 3] {
            let (world, size, n) = (4, 2, 301);
            let vals = inputs(world, sizes(coll, world, n).0, 9, true);
            let (_, want) = run(coll, world, size, n, 0, Dt::F32, reduce_op::SUM, &vals);
            let mut nd = node(world, size);
            for (r, v) in vals.iter().enumerate() {
                nd.ctx_mut(r).timeout_ns = 100_000_000;
                fill(&mut nd, r, 0, Dt::F32, v);
            }
            sim_faults::set(Some(Fault::Drop {
                kind: Kind::RemoteSignal,
                nth,
            }));
            let st = nd.run_worst("dropped signal", CTAS, THREADS, |r, c| {
                let (i, o) = (nd.addr(r, 0), nd.addr(r, OUT_AT));
                call(coll, true, c, i, o, n, Dt::F32, reduce_op::SUM)
            });
            let signals = sim_faults::count(Kind::RemoteSignal);
            sim_faults::set(None);
            let what = format!("{coll:?}, drop {nth}");
            assert!(signals > nth, "{what}: signal never sent");
            assert!(st.contains(&status::TIMEOUT), "{what}: {st:?}");
            for (r, &s) in st.iter().enumerate() {
                if s == status::OK {
                    assert!(
                        nd.heap(r)[OUT_AT..][..want[r].len()] == want[r],
                        "{what}: rank {r}"
                    );
                } else {
                    assert_eq!(s, status::TIMEOUT, "{what}: rank {r}");
                    assert_eq!(nd.recorded_error(r), status::TIMEOUT, "{what}: rank {r}");
                }
            }
        }
    }
}

/// Bad arguments get the one-node functions' codes before anything is written; a multi-node
/// exchange through the scratch refuses a context without one (all_gather needs none).
#[test]
fn bad_arguments_and_missing_scratch() {
    let _serial = sim_faults::serial();
    let (world, n) = (4, 16i64);
    let mut nd = node(world, 2);
    type Case = (&'static str, Coll, usize, usize, i64);
    // (what, collective, input offset, output offset, count)
    let cases: [(Case, i32); 5] = [
        (
            ("all_to_all overlapping", Coll::AllToAll, 0, 64, n),
            status::INVALID_ARGUMENT,
        ),
        (
            ("all_gather overlapping", Coll::AllGather, 4, 0, n),
            status::INVALID_ARGUMENT,
        ),
        (
            ("reduce_scatter overlapping", Coll::ReduceScatter, 0, 68, n),
            status::INVALID_ARGUMENT,
        ),
        (
            ("all_gather past the heap", Coll::AllGather, 0, HEAP - 64, n),
            status::OUT_OF_BOUNDS,
        ),
        (
            (
                "reduce_scatter negative count",
                Coll::ReduceScatter,
                0,
                OUT_AT,
                -1,
            ),
            status::INVALID_ARGUMENT,
        ),
    ];
    for ((what, coll, i, o, count), want) in cases {
        let st = nd.run(what, CTAS, THREADS, |r, c| {
            let (i, o) = (nd.addr(r, i), nd.addr(r, o));
            match coll {
                Coll::ReduceScatter => {
                    api::symm_reduce_scatter_hierarchical(c, i, o, count, 0, dtype::FLOAT32)
                }
                Coll::AllGather => {
                    api::symm_all_gather_hierarchical(c, i, o, count, dtype::FLOAT32)
                }
                Coll::AllToAll => api::symm_all_to_all_hierarchical(c, i, o, count, dtype::FLOAT32),
            }
        });
        assert_eq!(st, vec![want; world], "{what}");
        assert_guard(&nd, what, 0, HEAP);
    }
    for r in 0..world {
        nd.ctx_mut(r).scratch_size = 0;
    }
    for (coll, want) in [
        (Coll::ReduceScatter, status::INVALID_ARGUMENT),
        (Coll::AllToAll, status::INVALID_ARGUMENT),
        (Coll::AllGather, status::OK),
    ] {
        let st = nd.run("no scratch", CTAS, THREADS, |r, c| {
            call(
                coll,
                true,
                c,
                nd.addr(r, 0),
                nd.addr(r, OUT_AT),
                4,
                Dt::F32,
                0,
            )
        });
        assert_eq!(st, vec![want; world], "{coll:?} without a scratch region");
    }
}

/// The hierarchical barrier: no thread leaves barrier k before every thread of every rank (of
/// every node) has reached it, with ranks arriving late in turn; on one node it is a barrier too.
#[test]
fn barrier_waits_for_every_rank_of_every_node() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    let _serial = sim_faults::serial();
    const ROUNDS: usize = 4;
    for (world, size) in [(4, 2), (8, 2), (12, 4), (4, 0)] {
        let nd = node(world, size);
        let arrived = AtomicUsize::new(0);
        let early = AtomicUsize::new(0);
        let everyone = world * THREADS as usize;
        let st = nd.run("barrier", 1, THREADS, |r, c| {
            for k in 0..ROUNDS {
                if r == k % world {
                    std::thread::sleep(Duration::from_millis(20)); // this round's late rank
                }
                arrived.fetch_add(1, Ordering::SeqCst);
                let s = if size > 0 {
                    api::symm_barrier_hierarchical(c)
                } else {
                    api::symm_barrier(c)
                };
                if s != status::OK {
                    return s;
                }
                if arrived.load(Ordering::SeqCst) < (k + 1) * everyone {
                    early.fetch_add(1, Ordering::SeqCst);
                }
            }
            status::OK
        });
        assert_eq!(st, vec![status::OK; world], "{world}/{size}");
        assert_eq!(
            early.load(Ordering::SeqCst),
            0,
            "{world}/{size}: left a barrier early"
        );
    }
}

/// A lost partner signal: the barrier gives TIMEOUT (recorded), never a hang.
#[test]
fn barrier_with_a_dropped_signal_times_out() {
    times_out_when_a_signal_is_dropped("barrier", 1, |_, _, c| api::symm_barrier_hierarchical(c));
}

/// Runs `body(node, rank, ctx)` on 4 ranks as 2 nodes of 2 (timeout 100 ms) with the `nth`
/// remote signal lost: some rank returns TIMEOUT, and each rank that does not return OK recorded
/// it; nothing hangs.
fn times_out_when_a_signal_is_dropped(
    what: &str,
    nth: u64,
    body: impl Fn(&Node, usize, i64) -> i32 + Sync,
) {
    let _serial = sim_faults::serial();
    let mut nd = node(4, 2);
    assert_dropped_signal_times_out(&mut nd, nth, what, |nd| {
        nd.run_worst(what, CTAS, THREADS, |r, c| body(nd, r, c))
    });
}

/// Broadcast from roots on every node and local index: every rank's buffer ends as the root's,
/// bytes exact, the guard bytes around it intact; on one node as `symm_broadcast`.
#[test]
fn broadcast_from_any_root() {
    let _serial = sim_faults::serial();
    for (world, size) in SHAPES.into_iter().chain([(4, 0)]) {
        for (k, n) in COUNTS.into_iter().enumerate() {
            for root in [0, world - 1, world / 2 + 1] {
                let at = IN_AT[k % 2] + OUT_AT;
                let mut nd = node(world, size);
                let vals = inputs(world, n, 31 + root as u64, false);
                for (r, v) in vals.iter().enumerate() {
                    fill(&mut nd, r, at, Dt::Bf16, v);
                }
                let st = nd.run("broadcast", CTAS, THREADS, |r, c| {
                    let (p, n, bf16) = (nd.addr(r, at), n as i64, dtype::BFLOAT16);
                    if size > 0 {
                        api::symm_broadcast_hierarchical(c, p, n, bf16, root as i32)
                    } else {
                        api::symm_broadcast(c, p, n, bf16, root as i32)
                    }
                });
                let what = format!("{world}/{size} root {root} n={n}");
                assert_eq!(st, vec![status::OK; world], "{what}");
                let want = &nd.heap(root)[at..at + 2 * n].to_vec();
                for r in 0..world {
                    assert!(nd.heap(r)[at..at + 2 * n] == want[..], "{what}: rank {r}");
                }
                assert_guard(&nd, &what, OUT_AT - 64, at);
                assert_guard(&nd, &what, at + 2 * n, at + 2 * n + 64);
            }
        }
    }
}

/// A lost signal in a broadcast: TIMEOUT (recorded), never a hang.
#[test]
fn broadcast_with_a_dropped_signal_times_out() {
    for nth in [0, 1] {
        times_out_when_a_signal_is_dropped("broadcast", nth, |nd, r, c| {
            api::symm_broadcast_hierarchical(c, nd.addr(r, 0), 301, dtype::FLOAT32, 1)
        });
    }
}

/// Reduce to roots on every node: the root's `out` against the one-node `symm_reduce` (bitwise
/// on integer data, within tolerance on random data; every op) or, past 8 ranks, the f64
/// reference; out of place and in place; no other rank's `out` written.
#[test]
fn reduce_to_any_root() {
    let _serial = sim_faults::serial();
    for (world, size) in SHAPES {
        for (k, n) in COUNTS.into_iter().enumerate() {
            for &op in ops_for(k) {
                for (root, in_place) in [(0, false), (world - 1, true), (world / 2 + 1, false)] {
                    let exact = matches!(op, reduce_op::SUM | reduce_op::MAX | reduce_op::MIN);
                    let what =
                        format!("{world}/{size} op {op} n={n} root {root} in place {in_place}");
                    let vals = inputs(world, n, 41 + k as u64, exact);
                    let in_at = IN_AT[k % 2];
                    let out_at = if in_place { in_at } else { OUT_AT };
                    let run = |node_size: u32| {
                        let mut nd = node(world, node_size);
                        for (r, v) in vals.iter().enumerate() {
                            fill(&mut nd, r, in_at, Dt::F32, v);
                        }
                        let st = nd.run("reduce", CTAS, THREADS, |r, c| {
                            let (i, o, n) = (nd.addr(r, in_at), nd.addr(r, out_at), n as i64);
                            let (f32, root) = (dtype::FLOAT32, root as i32);
                            if node_size > 0 {
                                api::symm_reduce_hierarchical(c, i, o, n, op, f32, root)
                            } else {
                                api::symm_reduce(c, i, o, n, op, f32, root)
                            }
                        });
                        assert_eq!(st, vec![status::OK; world], "{what} ({node_size})");
                        if !in_place {
                            for r in (0..world).filter(|r| *r != root) {
                                let untouched =
                                    nd.heap(r)[OUT_AT..][..4 * n].iter().all(|b| *b == GUARD);
                                assert!(untouched, "{what}: rank {r}'s out was written");
                            }
                        }
                        read(&nd, root, out_at, Dt::F32, n)
                    };
                    let got = run(size);
                    if world <= 8 && (exact || size == 1) {
                        assert_eq!(got, run(0), "{what}: not bitwise one node's");
                    } else {
                        let f64s: Vec<Vec<f64>> = vals
                            .iter()
                            .map(|v| v.iter().map(|x| *x as f64).collect())
                            .collect();
                        assert_close(&what, Dt::F32, &got, &reference(op, &f64s));
                    }
                }
            }
        }
    }
}

/// A lost signal in a reduce: TIMEOUT (recorded), never a hang.
#[test]
fn reduce_with_a_dropped_signal_times_out() {
    for nth in [0, 2] {
        times_out_when_a_signal_is_dropped("reduce", nth, |nd, r, c| {
            let (i, o) = (nd.addr(r, 0), nd.addr(r, OUT_AT));
            api::symm_reduce_hierarchical(c, i, o, 301, reduce_op::SUM, dtype::FLOAT32, 3)
        });
    }
}

/// Signals on a multi-node context: adds and sets into every other rank's user slot (over the
/// network for peers on another node), waits with the context's timeout, reads; a put to a peer
/// of the node followed by a signal delivers its data; a slot nobody signals times out.
#[test]
fn signals_reach_every_node() {
    use ironlink_device::abi::{cmp, signal_op};
    const WRONG: i32 = -1000; // a status no function returns: this test's own check failed
    let _serial = sim_faults::serial();
    let (world, size) = (8, 2);
    let mut nd = node(world, size);
    for r in 0..world {
        nd.ctx_mut(r).timeout_ns = 100_000_000;
        fill(&mut nd, r, 0, Dt::F32, &[r as f32 + 0.5; 16]);
    }
    let (add_slot, set_slot, idle_slot) = (5, 6, 7);
    let st = nd.run("signals", 1, THREADS, |r, c| {
        let w = world as i32;
        for k in 1..w {
            let peer = (r as i32 + k) % w;
            let s = api::symm_signal(c, add_slot, 1, signal_op::ADD, peer);
            if s != status::OK {
                return s;
            }
        }
        // A set to the rank half a world away (another node), and data to the node's other rank.
        let far = (r + world / 2) % world;
        let s = api::symm_signal(c, set_slot, 100 + r as i64, signal_op::SET, far as i32);
        let mate = r ^ 1;
        let put = api::symm_put(c, nd.addr(r, 1024), nd.addr(r, 0), 64, mate as i32);
        let told = api::symm_signal(c, 8, 1, signal_op::SET, mate as i32);
        if (s, put, told) != (status::OK, status::OK, status::OK) {
            return WRONG;
        }
        let from = (r + world / 2) % world; // who set our slot
        let waits = [
            api::symm_signal_wait(c, add_slot, cmp::GE, w as i64 - 1),
            api::symm_signal_wait(c, set_slot, cmp::EQ, 100 + from as i64),
            api::symm_signal_wait(c, 8, cmp::EQ, 1),
        ];
        if waits != [status::OK; 3] {
            return WRONG;
        }
        let read = api::symm_signal_read(c, add_slot);
        if read != w as i64 - 1 {
            return WRONG;
        }
        api::symm_signal_wait(c, idle_slot, cmp::EQ, 1)
    });
    assert_eq!(
        st,
        vec![status::TIMEOUT; world],
        "only the idle slot times out"
    );
    for r in 0..world {
        let got = read(&nd, r, 1024, Dt::F32, 16);
        assert_eq!(
            got,
            vec![(r ^ 1) as f64 + 0.5; 16],
            "rank {r}: the mate's put"
        );
    }
}
