//! Simulated nodes and the hierarchical all-reduce (`symm_all_reduce_hierarchical`): a
//! multi-node context (ranks grouped into nodes of `node_size`, peer tables for its own node
//! only) reaches other nodes only through the simulated network (`hw::sim_net`), and its
//! all-reduce is a node-local reduce-scatter, a cross-node exchange and a node-local all-gather.
//!
//! Results are checked against the single-node two-shot all-reduce of the same inputs: bitwise
//! with nodes of one rank (the same values combined in the same order), and with larger nodes
//! bitwise on integer-valued data (every partial sum exact) and within the dtype's tolerance of
//! the f64 reference on random data (partials are rounded to the dtype once more). Every test
//! holds `sim_faults::serial()`: some install fault plans, which are process-wide.

mod sim;
use ironlink_device::hw::sim_faults::{self, Fault, Kind};
use sim::*;

/// (world, ranks per node): 2 nodes of 2, 4 of 1, 3 of 2, 2 of 4, 4 of 2.
const SHAPES: [(usize, u32); 5] = [(4, 2), (4, 1), (6, 2), (8, 4), (8, 2)];
const HEAP: usize = 1 << 16;
/// 1 KiB per CTA slice: boxes of 512 B with 2 nodes, so the larger messages take several rounds.
const SCRATCH: usize = 1 << 18;
const CTAS: u32 = 2;
const THREADS: u32 = 32;
/// (elements, heap byte offset): tiny, one round, several rounds, unaligned length and offset.
const CASES: [(usize, usize); 4] = [(5, 0), (96, 1024), (2500, 4096), (1237, 16388)];

/// `world` ranks as nodes of `node_size` (0: one node, a P2P context).
fn node(world: usize, node_size: u32) -> Node {
    if node_size > 0 {
        return Node::with_nodes(world, node_size as usize, HEAP, SCRATCH);
    }
    let mut n = Node::new(world, HEAP, SCRATCH);
    // The single-node reference runs two-shot over the buffers at every size (rank order).
    for r in 0..world {
        let c = n.ctx_mut(r);
        (c.ar_one_shot_max_bytes, c.ar_ll_max_bytes) = (0, 0);
    }
    n
}

/// The hierarchical all-reduce on a multi-node context, `symm_all_reduce` on one node.
fn all_reduce_call(node_size: u32) -> extern "C" fn(i64, i64, i64, i64, i32, i32) -> i32 {
    if node_size > 0 {
        api::symm_all_reduce_hierarchical
    } else {
        api::symm_all_reduce
    }
}

/// Values for every rank: integers in [-4, 4] (`exact`: every partial sum and product is exact
/// in every dtype) or uniform in [-2, 2).
fn inputs(world: usize, len: usize, seed: u64, exact: bool) -> Vec<Vec<f32>> {
    let mut rng = Rng::new(seed);
    (0..world)
        .map(|_| {
            (0..len)
                .map(|_| {
                    if exact {
                        (rng.next() % 9) as f32 - 4.0
                    } else {
                        rng.uniform(-2.0, 2.0)
                    }
                })
                .collect()
        })
        .collect()
}

/// Runs one all-reduce of `vals` on a node of `world` ranks as `node_size` per node; returns
/// each rank's status and result bytes.
fn all_reduce(
    world: usize,
    node_size: u32,
    (len, off): (usize, usize),
    dt: Dt,
    op: i32,
    vals: &[Vec<f32>],
) -> (Vec<i32>, Vec<Vec<u8>>) {
    let mut n = node(world, node_size);
    for (r, v) in vals.iter().enumerate() {
        fill(&mut n, r, off, dt, v);
    }
    let call = all_reduce_call(node_size);
    let st = n.run("hierarchical all_reduce", CTAS, THREADS, |r, c| {
        call(c, n.addr(r, off), 0, len as i64, op, dt.code())
    });
    assert_guard(&n, "all_reduce", 0, off);
    assert_guard(&n, "all_reduce", off + len * dt.size(), HEAP);
    let bytes = (0..world)
        .map(|r| n.heap(r)[off..off + len * dt.size()].to_vec())
        .collect();
    (st, bytes)
}

#[test]
fn hierarchical_all_reduce_matches_one_node() {
    let _serial = sim_faults::serial();
    for (world, size) in SHAPES {
        for dt in Dt::ALL {
            for (k, case) in CASES.into_iter().enumerate() {
                // Every op on the multi-round case; sums and averages on the others.
                let ops: &[i32] = if k == 2 {
                    &OPS
                } else {
                    &[reduce_op::SUM, reduce_op::AVG]
                };
                for &op in ops {
                    // Products of many values leave the integers every dtype holds exactly.
                    let exact =
                        size == 1 || matches!(op, reduce_op::SUM | reduce_op::MAX | reduce_op::MIN);
                    let what =
                        format!("{world} ranks as nodes of {size}, {dt:?}, op {op}, {case:?}");
                    let vals = inputs(world, case.0, 7 + k as u64, exact && size > 1);
                    let (st, got) = all_reduce(world, size, case, dt, op, &vals);
                    assert_eq!(st, vec![status::OK; world], "{what}");
                    for r in 1..world {
                        assert!(got[r] == got[0], "{what}: rank {r} differs from rank 0");
                    }
                    let (st, want) = all_reduce(world, 0, case, dt, op, &vals);
                    assert_eq!(st, vec![status::OK; world], "{what}: one node");
                    if exact {
                        assert!(got[0] == want[0], "{what}: not bitwise the one-node result");
                    } else {
                        let decode = |b: &[u8]| -> Vec<f64> {
                            b.chunks(dt.size()).map(|e| dt.decode(e)).collect()
                        };
                        let f64s: Vec<Vec<f64>> = vals
                            .iter()
                            .map(|v| v.iter().map(|x| dt.encode(*x).0).collect())
                            .collect();
                        assert_close(&what, dt, &decode(&got[0]), &reference(op, &f64s));
                    }
                }
            }
        }
    }
}

/// Random data, sums: within the dtype's tolerance of the f64 reference at every shape.
#[test]
fn hierarchical_sums_of_random_data_are_close() {
    let _serial = sim_faults::serial();
    for (world, size) in SHAPES {
        for dt in Dt::ALL {
            let case = CASES[2];
            let vals = inputs(world, case.0, 3, false);
            let (st, got) = all_reduce(world, size, case, dt, reduce_op::SUM, &vals);
            assert_eq!(st, vec![status::OK; world]);
            let f64s: Vec<Vec<f64>> = vals
                .iter()
                .map(|v| v.iter().map(|x| dt.encode(*x).0).collect())
                .collect();
            let got: Vec<f64> = got[0].chunks(dt.size()).map(|e| dt.decode(e)).collect();
            let what = format!("{world} as nodes of {size}, {dt:?}");
            assert_close(&what, dt, &got, &reference(reduce_op::SUM, &f64s));
        }
    }
}

/// Calls back to back in one launch (epochs, signal values and scratch boxes reused), each
/// checked: sizes and ops alternate, and one buffer is reduced twice.
#[test]
fn back_to_back_calls() {
    let _serial = sim_faults::serial();
    for (world, size) in [(4, 2), (8, 2)] {
        let mut n = node(world, size);
        let calls = [
            (2500, 0, reduce_op::SUM),
            (96, 12288, reduce_op::MAX),
            (2500, 0, reduce_op::SUM),
        ];
        let vals0 = inputs(world, 2500, 11, true);
        let vals1 = inputs(world, 96, 12, true);
        for r in 0..world {
            fill(&mut n, r, 0, Dt::F32, &vals0[r]);
            fill(&mut n, r, 12288, Dt::F32, &vals1[r]);
        }
        let st = n.run("back to back", CTAS, THREADS, |r, c| {
            for (len, off, op) in calls {
                let s = api::symm_all_reduce_hierarchical(
                    c,
                    n.addr(r, off),
                    0,
                    len as i64,
                    op,
                    dtype::FLOAT32,
                );
                if s != status::OK {
                    return s;
                }
            }
            status::OK
        });
        assert_eq!(st, vec![status::OK; world]);
        let f = |v: &Vec<Vec<f32>>| {
            v.iter()
                .map(|x| x.iter().map(|y| *y as f64).collect())
                .collect::<Vec<Vec<f64>>>()
        };
        let sum = reference(reduce_op::SUM, &f(&vals0));
        let twice: Vec<f64> = sum.iter().map(|x| x * world as f64).collect();
        let max = reference(reduce_op::MAX, &f(&vals1));
        for r in 0..world {
            assert_eq!(
                read(&n, r, 0, Dt::F32, 2500),
                twice,
                "{world}/{size}: rank {r}, the buffer reduced twice"
            );
            assert_eq!(
                read(&n, r, 12288, Dt::F32, 96),
                max,
                "{world}/{size}: rank {r}, max"
            );
        }
    }
}

/// The network delays every delivery, or delivers each outbox newest first: same results.
#[test]
fn delayed_and_reordered_deliveries_change_nothing() {
    let _serial = sim_faults::serial();
    for plan in [
        Fault::Delay {
            kind: Kind::RemotePut,
            max_us: 300,
        },
        Fault::ReorderRemote,
    ] {
        for (world, size) in [(4, 2), (4, 1)] {
            let vals = inputs(world, 2500, 5, true);
            let (_, want) = all_reduce(world, 0, CASES[2], Dt::Bf16, reduce_op::SUM, &vals);
            sim_faults::set(Some(plan));
            let (st, got) = all_reduce(world, size, CASES[2], Dt::Bf16, reduce_op::SUM, &vals);
            let puts = sim_faults::count(Kind::RemotePut);
            sim_faults::set(None);
            assert_eq!(st, vec![status::OK; world], "{plan:?}");
            assert!(puts > 0, "{plan:?}: the network carried nothing");
            for (r, got) in got.iter().enumerate() {
                assert!(
                    *got == want[0],
                    "{plan:?}, {world} as nodes of {size}: rank {r} is wrong"
                );
            }
        }
    }
}

/// A lost remote signal gives TIMEOUT (recorded), never a hang and never a wrong result on a
/// rank that returns OK.
#[test]
fn dropped_remote_signal_gives_timeout() {
    let _serial = sim_faults::serial();
    for nth in [0, 5] {
        let (world, size) = (4, 2);
        let mut n = node(world, size);
        for r in 0..world {
            n.ctx_mut(r).timeout_ns = 100_000_000;
        }
        let vals = inputs(world, 2500, 9, true);
        for (r, v) in vals.iter().enumerate() {
            fill(&mut n, r, 4096, Dt::F32, v);
        }
        sim_faults::set(Some(Fault::Drop {
            kind: Kind::RemoteSignal,
            nth,
        }));
        let st = n.run_worst("dropped signal", CTAS, THREADS, |r, c| {
            let at = n.addr(r, 4096);
            api::symm_all_reduce_hierarchical(c, at, 0, 2500, reduce_op::SUM, dtype::FLOAT32)
        });
        let signals = sim_faults::count(Kind::RemoteSignal);
        sim_faults::set(None);
        assert!(signals > nth, "signal {nth} was never sent");
        assert!(st.contains(&status::TIMEOUT), "drop {nth}: {st:?}");
        let f64s: Vec<Vec<f64>> = vals
            .iter()
            .map(|v| v.iter().map(|x| *x as f64).collect())
            .collect();
        let want = reference(reduce_op::SUM, &f64s);
        for (r, &s) in st.iter().enumerate() {
            match s {
                status::OK => assert_eq!(
                    read(&n, r, 4096, Dt::F32, 2500),
                    want,
                    "rank {r} OK but wrong"
                ),
                s => {
                    assert_eq!(s, status::TIMEOUT, "rank {r}");
                    assert_eq!(
                        n.recorded_error(r),
                        status::TIMEOUT,
                        "rank {r} did not record it"
                    );
                }
            }
        }
    }
}

/// A multi-node context is served by the queries, the peer pointers, puts and gets of its own
/// node, the signals, the grid barrier and the hierarchical collectives; every other function refuses it with
/// UNSUPPORTED_OP (rather than run a one-node algorithm over peers it cannot reach); a node size
/// that does not divide the world, or is larger than a node's table, is not a context
/// (UNKNOWN_CONTEXT).
#[test]
fn multi_node_contexts_refuse_what_has_no_cross_node_path() {
    let _serial = sim_faults::serial();
    let mut n = node(4, 2);
    type Body = fn(usize, i64, &Node) -> i32;
    type Want = fn(usize) -> i32;
    // Rank r's peer r ^ 2 is on the other node, r ^ 1 on its own.
    let cases: [(&str, Body, Want); 10] = [
        ("world_size", |_, c, _| api::symm_world_size(c), |_| 4),
        ("rank", |_, c, _| api::symm_rank(c), |r| r as i32),
        (
            "peer pointer on the node (1: the peer's address)",
            |r, c, n| {
                (api::symm_peer_ptr(c, n.addr(r, 64), (r ^ 1) as i32) == n.addr(r ^ 1, 64)) as i32
            },
            |_| 1,
        ),
        (
            "peer pointer to another node",
            |r, c, n| api::symm_peer_ptr_checked(c, n.addr(r, 64), 8, (r ^ 2) as i32) as i32,
            |_| status::PEER_NOT_MAPPED,
        ),
        (
            "all_reduce (one-node algorithm)",
            |r, c, n| api::symm_all_reduce(c, n.addr(r, 0), 0, 16, reduce_op::SUM, dtype::FLOAT32),
            |_| status::UNSUPPORTED_OP,
        ),
        (
            "put to a peer of the node",
            |r, c, n| api::symm_put(c, n.addr(r, 0), n.addr(r, 256), 64, (r ^ 1) as i32),
            |_| status::OK,
        ),
        (
            "put to another node (no load/store path)",
            |r, c, n| api::symm_put(c, n.addr(r, 0), n.addr(r, 256), 64, (r ^ 2) as i32),
            |_| status::PEER_NOT_MAPPED,
        ),
        (
            "barrier",
            |_, c, _| api::symm_barrier(c),
            |_| status::UNSUPPORTED_OP,
        ),
        (
            "tile_signal",
            |_, c, _| api::symm_tile_signal(c, 0, 0),
            |_| status::UNSUPPORTED_OP,
        ),
        (
            "grid barrier (rank-local: served)",
            |_, c, _| api::symm_grid_barrier(c),
            |_| status::OK,
        ),
    ];
    for (name, body, want) in cases {
        let st = n.run(name, 1, THREADS, |r, c| body(r, c, &n));
        assert_eq!(st, (0..4).map(want).collect::<Vec<_>>(), "{name}");
    }
    for bad in [3, 0, 16] {
        for r in 0..4 {
            n.ctx_mut(r).node_size = bad;
        }
        let st = n.run("all_reduce with a bad node size", 1, THREADS, |r, c| {
            let at = n.addr(r, 0);
            api::symm_all_reduce_hierarchical(c, at, 0, 16, reduce_op::SUM, dtype::FLOAT32)
        });
        assert_eq!(st, vec![status::UNKNOWN_CONTEXT; 4], "node size {bad}");
    }
}

/// More ranks than one node's table (MAX_RANKS): 16 as 2 nodes of 8 and 4 of 4, 12 as 3 of 4;
/// integer data, so every sum is exact and the result is the f64 reference bitwise (averages:
/// within the dtype's tolerance).
#[test]
fn worlds_larger_than_a_node() {
    let _serial = sim_faults::serial();
    for (world, size) in [(16, 8), (16, 4), (12, 4)] {
        for dt in [Dt::F32, Dt::Bf16] {
            for op in [reduce_op::SUM, reduce_op::MAX, reduce_op::AVG] {
                let case = CASES[2];
                let what = format!("{world} as nodes of {size}, {dt:?}, op {op}");
                let vals = inputs(world, case.0, 21, true);
                let (st, got) = all_reduce(world, size, case, dt, op, &vals);
                assert_eq!(st, vec![status::OK; world], "{what}");
                let f64s: Vec<Vec<f64>> = vals
                    .iter()
                    .map(|v| v.iter().map(|x| *x as f64).collect())
                    .collect();
                let reference = reference(op, &f64s);
                let want: Vec<u8> = reference
                    .iter()
                    .flat_map(|x| dt.encode(*x as f32).1)
                    .collect();
                for (r, g) in got.iter().enumerate() {
                    if op == reduce_op::AVG {
                        // Divided by a world past one node's table of reciprocals (found wrong
                        // once: 16 ranks averaged as 8).
                        let g: Vec<f64> = g.chunks(dt.size()).map(|e| dt.decode(e)).collect();
                        assert_close(&format!("{what}: rank {r}"), dt, &g, &reference);
                    } else {
                        assert!(*g == want, "{what}: rank {r}");
                    }
                }
            }
        }
    }
}

/// On a one-node context the hierarchical entry point is a two-shot all-reduce: bitwise
/// `symm_all_reduce`'s result (two-shot over the buffers, rank order).
#[test]
fn hierarchical_on_one_node_is_two_shot() {
    let _serial = sim_faults::serial();
    let world = 4;
    for dt in Dt::ALL {
        for (case, op) in CASES.into_iter().zip(OPS.into_iter().cycle()) {
            let vals = inputs(world, case.0, 17, false);
            let (st, want) = all_reduce(world, 0, case, dt, op, &vals);
            assert_eq!(st, vec![status::OK; world]);
            let mut n = node(world, 0);
            for (r, v) in vals.iter().enumerate() {
                fill(&mut n, r, case.1, dt, v);
            }
            let st = n.run("hierarchical on one node", CTAS, THREADS, |r, c| {
                let at = n.addr(r, case.1);
                api::symm_all_reduce_hierarchical(c, at, 0, case.0 as i64, op, dt.code())
            });
            assert_eq!(st, vec![status::OK; world]);
            for r in 0..world {
                let got = &n.heap(r)[case.1..case.1 + case.0 * dt.size()];
                assert!(
                    got == want[0].as_slice(),
                    "{dt:?} {case:?} op {op}: rank {r}"
                );
            }
        }
    }
}
