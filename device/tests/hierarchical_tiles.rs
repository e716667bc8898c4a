//! Tile calls across nodes (`symm_tile_*_hierarchical`) on simulated nodes: ranks grouped into
//! nodes, other nodes reached only through the simulated network (`hw::sim_net`).
//!
//! Tile all-reduce and reduce-scatter: every tile of a strided matrix (edge tiles partial), run
//! by different CTAs on every rank, in tiles large enough for several rounds of boxes; against
//! the f64 reference within the dtype's tolerance, the all-reduce bitwise the same on every
//! rank, row gaps untouched, twice over two launches with new inputs (per-tile epochs and box
//! reuse); reordered and delayed puts; a dropped signal gives TIMEOUT.
//!
//! Tile all-gather: every rank runs tile t on CTA (t + rank) % ctas, so only matching by tile
//! index pairs the calls (across nodes too: a tile's remote signal words are the tile's own, not
//! the CTA's). Each round every rank writes new values into its block right before the call and
//! checks every block right after: a call that returned before a block arrived, from this node
//! or another, reads the previous round's values. Rows strided (a put per row, then the signal)
//! and contiguous (one put); blocks stacked and interleaved; nothing outside the blocks' rows
//! written; reordered puts with data landing late. A dropped remote signal gives TIMEOUT,
//! recorded, never a hang or a wrong block.
//! Every test holds `sim_faults::serial()` (fault plans are process-wide).

mod sim;
use core::sync::atomic::Ordering;
use ironlink_device::hw::sim_faults::{self, Fault, Kind};
use ironlink_device::hw::{cta_rank, sync_threads as hw_sync, thread_rank};
use sim::*;

/// (world, ranks per node; 0: one node, a P2P context): 2 nodes of 1 and of 2, 4 of 1, 3 of 2,
/// 2 of 4, and 16 ranks as 4 of 4 (more than one node's table).
const SHAPES: [(usize, usize); 7] = [(2, 1), (4, 2), (4, 1), (6, 2), (8, 4), (16, 4), (4, 0)];
const HEAP: usize = 1 << 19;
const SCRATCH: usize = 1 << 18;
const BASE: usize = 1024;
/// A word any CTA sets when it saw a stale block.
const FLAG: usize = 64;
const CTAS: u32 = 3;

/// A matrix of u32 blocks: `world` blocks of `rows` x `cols`, rows `stride` apart, block p at
/// `BASE + 4 * p * bstride`, cut into tiles of `tr` x `tc` (edge tiles partial).
#[derive(Clone, Copy, Debug)]
struct Layout {
    rows: usize,
    cols: usize,
    stride: usize,
    bstride: usize,
    tr: usize,
    tc: usize,
}

impl Layout {
    fn at(&self, p: usize, i: usize, j: usize) -> usize {
        BASE + 4 * (p * self.bstride + i * self.stride + j)
    }

    /// (first row, first column, rows, columns) of every tile.
    fn tiles(&self) -> Vec<(usize, usize, usize, usize)> {
        let mut t = Vec::new();
        for i in (0..self.rows).step_by(self.tr) {
            for j in (0..self.cols).step_by(self.tc) {
                t.push((i, j, self.tr.min(self.rows - i), self.tc.min(self.cols - j)));
            }
        }
        t
    }

    /// Whether `world` blocks fit without overlapping (stacked, or interleaved in a row stride).
    fn fits(&self, world: usize) -> bool {
        let one = (self.rows - 1) * self.stride + self.cols;
        self.bstride >= one || (world - 1) * self.bstride + self.cols <= self.stride
    }
}

/// (rows, cols, row stride, block stride, tile rows, tile cols), in 4-byte elements: strided
/// rows, stacked; interleaved; one row (contiguous: a single put); full-width rows (contiguous).
const LAYOUTS: [Layout; 4] = [
    Layout {
        rows: 7,
        cols: 10,
        stride: 12,
        bstride: 84,
        tr: 3,
        tc: 4,
    },
    Layout {
        rows: 5,
        cols: 6,
        stride: 200,
        bstride: 8,
        tr: 2,
        tc: 6,
    },
    Layout {
        rows: 1,
        cols: 33,
        stride: 33,
        bstride: 40,
        tr: 1,
        tc: 16,
    },
    Layout {
        rows: 6,
        cols: 8,
        stride: 8,
        bstride: 48,
        tr: 3,
        tc: 8,
    },
];

/// Puts delivered newest first (with data landing late); data delayed.
const NETWORK_FAULTS: [Fault; 3] = [
    Fault::ReorderRemote,
    Fault::ReorderRemoteLate { max_us: 400 },
    Fault::Delay {
        kind: Kind::RemotePut,
        max_us: 200,
    },
];

/// What rank `p` contributes to element (i, j) in round `k`.
fn gathered(p: usize, k: usize, i: usize, j: usize) -> u32 {
    (p * 1_000_000 + k * 10_000 + i * 100 + j) as u32
}

fn node(world: usize, size: usize) -> Node {
    if size > 0 {
        Node::with_nodes(world, size, HEAP, SCRATCH)
    } else {
        Node::new(world, HEAP, SCRATCH)
    }
}

/// `rounds` rounds of every tile's all-gather on every rank (see the module docs); the ranks'
/// statuses.
fn run_gathers(nd: &Node, world: usize, m: Layout, rounds: usize, what: &str) -> Vec<i32> {
    let tiles = m.tiles();
    nd.run_worst(what, CTAS, 32, |rank, ctx| {
        let cta = cta_rank() as usize;
        for round in 0..rounds {
            for (t, &(i0, j0, r, c)) in tiles.iter().enumerate() {
                if (t + rank) % CTAS as usize != cta {
                    continue;
                }
                let cells = || (i0..i0 + r).flat_map(|i| (j0..j0 + c).map(move |j| (i, j)));
                if thread_rank() == 0 {
                    for (i, j) in cells() {
                        put_word(nd, rank, m.at(rank, i, j), gathered(rank, round, i, j));
                    }
                }
                let s = api::symm_tile_all_gather_hierarchical(
                    ctx,
                    nd.addr(rank, m.at(0, i0, j0)),
                    r as i64,
                    c as i64,
                    m.stride as i64,
                    m.bstride as i64,
                    t as i64,
                    dtype::FLOAT32,
                );
                if s != status::OK {
                    return s;
                }
                for p in 0..world {
                    for (i, j) in cells() {
                        let got = word(nd, rank, m.at(p, i, j)).load(Ordering::Relaxed);
                        if got != gathered(p, round, i, j) {
                            put_word(nd, rank, FLAG, 1);
                        }
                    }
                }
                // Every thread has checked before thread 0 writes the next round.
                hw_sync();
            }
        }
        status::OK
    })
}

#[test]
fn tile_all_gather_across_nodes_matches_tiles_by_index() {
    let _serial = sim_faults::serial();
    for (world, size) in SHAPES {
        for (k, m) in LAYOUTS.into_iter().enumerate() {
            if !m.fits(world) {
                continue;
            }
            let what = format!("tile all_gather {world} as nodes of {size}, layout {k}");
            let mut nd = node(world, size);
            clear_flag(&mut nd, FLAG);
            // Three rounds in one launch, then two more in a second: per-tile epochs carry over.
            for rounds in [3, 2] {
                let st = run_gathers(&nd, world, m, rounds, &what);
                assert_eq!(st, vec![status::OK; world], "{what}");
            }
            assert_flag_clear(&nd, FLAG, &what, "saw a stale block");
            // Nothing outside the blocks' rows was written.
            let end = BASE + 4 * (world * m.bstride + m.rows * m.stride);
            let inside = |b: usize| {
                (0..world)
                    .any(|p| (0..m.rows).any(|i| b >= m.at(p, i, 0) && b < m.at(p, i, m.cols)))
            };
            for r in 0..world {
                let heap = &nd.heap(r)[..end];
                for (b, &byte) in heap.iter().enumerate().skip(BASE) {
                    assert!(
                        inside(b) || byte == GUARD,
                        "{what}: rank {r} wrote heap byte {b}"
                    );
                }
            }
        }
    }
}

/// Puts delivered newest first (with data landing late) and data delayed: the same blocks.
/// Mutation check: without the `quiet` between strided rows and their signal, the signal
/// overtakes the rows under `ReorderRemoteLate` and a rank sees a stale block (3 runs of 3).
#[test]
fn tile_all_gather_across_nodes_survives_reordered_and_delayed_puts() {
    let _serial = sim_faults::serial();
    for fault in NETWORK_FAULTS {
        for (world, size) in [(4, 2), (4, 1)] {
            for (k, m) in LAYOUTS.into_iter().enumerate() {
                let what =
                    format!("tile all_gather {world} as nodes of {size}, layout {k}, {fault:?}");
                let mut nd = node(world, size);
                clear_flag(&mut nd, FLAG);
                sim_faults::set(Some(fault));
                let st = run_gathers(&nd, world, m, 2, &what);
                sim_faults::set(None);
                assert_eq!(st, vec![status::OK; world], "{what}");
                assert_flag_clear(&nd, FLAG, &what, "saw a stale block");
            }
        }
    }
}

#[test]
fn tile_all_gather_across_nodes_times_out_on_a_dropped_signal() {
    let _serial = sim_faults::serial();
    // Contiguous rows: every remote signal is an Ack or an Arrive (strided rows add dummy
    // signals to their row puts, whose loss changes nothing). The first (an Ack), then later ones.
    for nth in [0, 5, 11] {
        let what = "tile all_gather";
        let mut nd = node(4, 2);
        assert_dropped_signal_times_out(&mut nd, nth, what, |nd| {
            run_gathers(nd, 4, LAYOUTS[3], 1, what)
        });
    }
}

#[test]
fn tile_calls_without_a_multi_node_version_refuse_multi_node_contexts() {
    let _serial = sim_faults::serial();
    let nd = node(4, 2);
    let st = nd.run("one-node tile calls on nodes", 1, 32, |rank, ctx| {
        let at = nd.addr(rank, BASE);
        let gather = api::symm_tile_all_gather(ctx, at, 1, 4, 4, 4, 0, dtype::FLOAT32);
        let reduce = api::symm_tile_all_reduce(ctx, at, 1, 4, 4, 0, reduce_op::SUM, dtype::FLOAT32);
        if gather == status::UNSUPPORTED_OP && reduce == status::UNSUPPORTED_OP {
            status::OK
        } else {
            status::INVALID_ARGUMENT
        }
    });
    assert_eq!(st, vec![status::OK; 4]);
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Reduce {
    AllReduce,
    ReduceScatter,
}

/// The reductions' matrix: `rows` x `cols` of the dtype, rows `stride` apart, at BASE (the
/// all-reduce's tile, or each of the `world` stacked input blocks of the reduce-scatter, whose
/// output goes to `out_base()`), tiles of `tr` x `tc`.
const RED: Layout = Layout {
    rows: 20,
    cols: 100,
    stride: 104,
    bstride: 20 * 104,
    tr: 16,
    tc: 64,
};

fn out_base(world: usize, dt: Dt) -> usize {
    BASE + (world + 1) * RED.bstride * dt.size()
}

/// Runs `coll` twice (two launches, new inputs each) on `world` ranks as nodes of `size` and
/// checks every result (see the module docs); the statuses of the last launch.
fn run_reductions(nd: &mut Node, coll: Reduce, dt: Dt, op: i32, seed: u64, what: &str) -> Vec<i32> {
    let world = nd.world;
    let es = dt.size();
    let blocks = if coll == Reduce::AllReduce { 1 } else { world };
    let row_at = |p: usize, i: usize| BASE + es * (p * RED.bstride + i * RED.stride);
    let tiles = RED.tiles();
    let mut rng = Rng::new(seed);
    let mut st = Vec::new();
    for launch in 0..2 {
        // inputs[r][p]: rank r's block p, row after row.
        let mut inputs = vec![vec![Vec::new(); blocks]; world];
        for (r, blocks_of_r) in inputs.iter_mut().enumerate() {
            for (p, block) in blocks_of_r.iter_mut().enumerate() {
                for i in 0..RED.rows {
                    let v: Vec<f32> = (0..RED.cols).map(|_| rng.uniform(-2.0, 2.0)).collect();
                    block.extend(fill(nd, r, row_at(p, i), dt, &v));
                }
            }
        }
        let nd = &*nd;
        st = nd.run_worst(what, CTAS, 32, |rank, ctx| {
            let cta = cta_rank() as usize;
            let mine = tiles
                .iter()
                .enumerate()
                .filter(|(t, _)| (t + rank) % CTAS as usize == cta);
            first_failure(mine, |(t, &(i0, j0, r, c))| {
                let at = |base: usize| nd.addr(rank, base + es * (i0 * RED.stride + j0));
                let (r, c, stride) = (r as i64, c as i64, RED.stride as i64);
                match coll {
                    Reduce::AllReduce => api::symm_tile_all_reduce_hierarchical(
                        ctx,
                        at(BASE),
                        r,
                        c,
                        stride,
                        t as i64,
                        op,
                        dt.code(),
                    ),
                    Reduce::ReduceScatter => api::symm_tile_reduce_scatter_hierarchical(
                        ctx,
                        at(BASE),
                        at(out_base(world, dt)),
                        r,
                        c,
                        stride,
                        RED.bstride as i64,
                        t as i64,
                        op,
                        dt.code(),
                    ),
                }
            })
        });
        if st != vec![status::OK; world] {
            return st;
        }
        let what = format!("{what}, launch {launch}");
        for q in 0..world {
            let block = if coll == Reduce::AllReduce { 0 } else { q };
            let ins: Vec<Vec<f64>> = (0..world).map(|r| inputs[r][block].clone()).collect();
            let want = reference(op, &ins);
            let base = if coll == Reduce::AllReduce {
                BASE
            } else {
                out_base(world, dt)
            };
            let got: Vec<f64> = (0..RED.rows)
                .flat_map(|i| read(nd, q, base + es * i * RED.stride, dt, RED.cols))
                .collect();
            assert_close(&format!("{what}: rank {q}"), dt, &got, &want);
            for i in 0..RED.rows {
                // Row gaps untouched.
                let gap = base + es * (i * RED.stride + RED.cols);
                assert_guard(nd, &what, gap, gap + es * (RED.stride - RED.cols));
            }
        }
        if coll == Reduce::AllReduce {
            let span = BASE..BASE + es * RED.rows * RED.stride;
            for q in 1..world {
                assert!(
                    nd.heap(q)[span.clone()] == nd.heap(0)[span.clone()],
                    "{what}: rank {q} differs from rank 0"
                );
            }
        }
    }
    st
}

const REDUCTIONS: [(Reduce, Dt, i32); 6] = [
    (Reduce::AllReduce, Dt::F32, reduce_op::SUM),
    (Reduce::AllReduce, Dt::Bf16, reduce_op::AVG),
    (Reduce::AllReduce, Dt::F16, reduce_op::PROD),
    (Reduce::ReduceScatter, Dt::F32, reduce_op::SUM),
    (Reduce::ReduceScatter, Dt::Bf16, reduce_op::MAX),
    (Reduce::ReduceScatter, Dt::F16, reduce_op::AVG),
];

#[test]
fn tile_reductions_across_nodes_match_the_reference() {
    let _serial = sim_faults::serial();
    for (world, size) in SHAPES {
        for (k, (coll, dt, op)) in REDUCTIONS.into_iter().enumerate() {
            let what = format!("tile {coll:?} {dt:?} op {op}, {world} as nodes of {size}");
            let mut nd = node(world, size);
            let st = run_reductions(&mut nd, coll, dt, op, 40 + k as u64, &what);
            assert_eq!(st, vec![status::OK; world], "{what}");
        }
    }
}

#[test]
fn tile_reductions_across_nodes_survive_reordered_and_delayed_puts() {
    let _serial = sim_faults::serial();
    for fault in NETWORK_FAULTS {
        for (coll, dt, op) in [REDUCTIONS[0], REDUCTIONS[3]] {
            let what = format!("tile {coll:?} {dt:?}, 4 as nodes of 2, {fault:?}");
            let mut nd = node(4, 2);
            sim_faults::set(Some(fault));
            let st = run_reductions(&mut nd, coll, dt, op, 7, &what);
            sim_faults::set(None);
            assert_eq!(st, vec![status::OK; 4], "{what}");
        }
    }
}

#[test]
fn tile_reductions_across_nodes_time_out_on_a_dropped_signal() {
    let _serial = sim_faults::serial();
    for (coll, dt, op) in [REDUCTIONS[0], REDUCTIONS[3]] {
        for nth in [0, 9] {
            let what = format!("tile {coll:?}");
            let mut nd = node(4, 2);
            assert_dropped_signal_times_out(&mut nd, nth, &what, |nd| {
                run_reductions(nd, coll, dt, op, 3, &what)
            });
        }
    }
}

/// A grid of more CTAs than there are box areas: INVALID_ARGUMENT on every CTA of every rank
/// (before any wait), nothing recorded.
#[test]
fn tile_reductions_across_nodes_refuse_a_grid_past_max_ctas() {
    let _serial = sim_faults::serial();
    let nd = node(2, 1);
    let ctas = ironlink_device::abi::MAX_CTAS as u32 + 1;
    let st = nd.run("grid past MAX_CTAS", ctas, 1, |rank, ctx| {
        let (at, out) = (nd.addr(rank, BASE), nd.addr(rank, BASE + 1024));
        let (sum, f32) = (reduce_op::SUM, dtype::FLOAT32);
        let t = cta_rank() as i64;
        let reduce = api::symm_tile_all_reduce_hierarchical(ctx, at, 1, 4, 4, t, sum, f32);
        let scatter =
            api::symm_tile_reduce_scatter_hierarchical(ctx, at, out, 1, 4, 4, 4, t, sum, f32);
        if reduce == status::INVALID_ARGUMENT && scatter == status::INVALID_ARGUMENT {
            status::OK
        } else {
            status::UNSUPPORTED_OP // anything else: not the refusal
        }
    });
    assert_eq!(st, vec![status::OK; 2]);
    assert_eq!(
        nd.recorded_error(0),
        0,
        "an argument error is returned, not recorded"
    );
}
