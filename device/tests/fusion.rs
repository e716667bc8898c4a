//! The calls that fuse communication into compute: the grid barrier and tile-scoped all-reduce.
//!
//! Each test is built to fail when the property it names is removed: the grid barrier's ordering
//! (CTAs read what every other CTA wrote just before), tile matching by tile index (every rank runs
//! each tile on a different CTA), and per-tile epochs (every tile is reduced
//! twice per launch, over two launches).

mod sim;
use core::sync::atomic::{AtomicU32, Ordering};
use ironlink_device::abi::MAX_TILES;
use ironlink_device::hw::host::SIM_SM_COUNT;
use ironlink_device::hw::{cta_rank, grid_ctas, thread_rank};
use sim::*;

/// The u32 at byte `offset` of `rank`'s heap, for CTAs that talk through it.
fn word(node: &Node, rank: usize, offset: usize) -> &AtomicU32 {
    // SAFETY: a 4-byte aligned word inside the rank's heap, which outlives the launch.
    unsafe { AtomicU32::from_ptr(node.addr(rank, offset) as *mut u32) }
}

const BOARD: usize = 4096;
const MISMATCH: i32 = 99;
/// A word any CTA sets when it saw a stale board (the heap starts as guard bytes: cleared first).
const FLAG: usize = BOARD + 2048;

/// Every CTA writes its word of a board, passes the grid barrier, and checks every CTA's word;
/// a second barrier keeps the next round's writes after everyone's reads. 40 rounds.
#[test]
fn grid_barrier_orders_every_cta_of_the_launch() {
    for (world, ctas, threads) in [(1, 8, 32), (2, SIM_SM_COUNT, 8), (3, 5, 64)] {
        let mut node = Node::new(world, 1 << 16, 1 << 16);
        for r in 0..world {
            node.heap_mut(r)[FLAG..FLAG + 4].fill(0);
        }
        let label = format!("grid barrier world={world} ctas={ctas}");
        let st = node.run(&label, ctas, threads, |rank, ctx| {
            let (cta, n) = (cta_rank() as usize, grid_ctas() as usize);
            let mut bad = false;
            for round in 1..=40u32 {
                if thread_rank() == 0 {
                    word(&node, rank, BOARD + 4 * cta)
                        .store(round * 1000 + cta as u32, Ordering::Relaxed);
                }
                let s = api::symm_grid_barrier(ctx);
                if s != status::OK {
                    return s;
                }
                for other in 0..n {
                    bad |= word(&node, rank, BOARD + 4 * other).load(Ordering::Relaxed)
                        != round * 1000 + other as u32;
                }
                let s = api::symm_grid_barrier(ctx);
                if s != status::OK {
                    return s;
                }
            }
            // Every thread of the CTA must return the same status: agree through the board.
            if bad {
                word(&node, rank, FLAG).store(1, Ordering::Relaxed);
            }
            let s = api::symm_grid_barrier(ctx);
            if s != status::OK {
                return s;
            }
            if word(&node, rank, FLAG).load(Ordering::Relaxed) != 0 {
                MISMATCH
            } else {
                status::OK
            }
        });
        assert_eq!(st, vec![status::OK; world], "{label}");
    }
}

#[test]
fn grid_barrier_rejects_a_grid_larger_than_the_gpu() {
    let node = Node::new(2, 1 << 16, 1 << 16);
    let st = node.run("grid too large", SIM_SM_COUNT + 1, 1, |_, ctx| {
        api::symm_grid_barrier(ctx)
    });
    assert_eq!(st, vec![status::INVALID_ARGUMENT; 2]);
    assert_eq!(
        node.recorded_error(0),
        0,
        "an argument error is returned, not recorded"
    );
}

/// A CTA that never arrives: every other CTA gives TIMEOUT (and records it) instead of hanging.
#[test]
fn grid_barrier_times_out_when_a_cta_never_arrives() {
    let mut node = Node::new(1, 1 << 16, 1 << 16);
    node.ctx_mut(0).timeout_ns = 200_000_000;
    let st = node.run("grid barrier, CTA 0 absent", 4, 8, |_, ctx| {
        if cta_rank() == 0 {
            // Stands for a CTA that cannot become resident; it reports what the others will.
            return status::TIMEOUT;
        }
        api::symm_grid_barrier(ctx)
    });
    assert_eq!(st, vec![status::TIMEOUT]);
    assert_eq!(node.recorded_error(0), status::TIMEOUT);
}

/// A matrix of `rows` x `cols` elements, rows `stride` elements apart, at `BASE`, cut into tiles
/// of `tr` x `tc` (edge tiles partial).
struct Matrix {
    rows: usize,
    cols: usize,
    stride: usize,
    tr: usize,
    tc: usize,
}

const BASE: usize = 8192;

impl Matrix {
    fn tiles(&self) -> Vec<(usize, usize, usize, usize)> {
        let mut out = Vec::new();
        for i in (0..self.rows).step_by(self.tr) {
            for j in (0..self.cols).step_by(self.tc) {
                out.push((i, j, self.tr.min(self.rows - i), self.tc.min(self.cols - j)));
            }
        }
        out
    }

    fn at(&self, dt: Dt, i: usize, j: usize) -> usize {
        BASE + (i * self.stride + j) * dt.size()
    }

    fn fill(&self, node: &mut Node, rank: usize, dt: Dt, rng: &mut Rng, op: i32) -> Vec<f64> {
        let mut all = Vec::new();
        for i in 0..self.rows {
            let vals: Vec<f32> = (0..self.cols)
                .map(|_| {
                    if op == reduce_op::PROD {
                        rng.uniform(0.5, 1.5)
                    } else {
                        rng.uniform(-4.0, 4.0)
                    }
                })
                .collect();
            all.extend(fill(node, rank, self.at(dt, i, 0), dt, &vals));
        }
        all
    }

    fn read(&self, node: &Node, rank: usize, dt: Dt) -> Vec<f64> {
        (0..self.rows)
            .flat_map(|i| read(node, rank, self.at(dt, i, 0), dt, self.cols))
            .collect()
    }

    /// Every byte of the stride gaps and around the matrix is still a guard byte.
    fn assert_gaps(&self, node: &Node, dt: Dt, what: &str) {
        assert_guard(node, what, BASE - 64, BASE);
        for i in 0..self.rows {
            let end = self.at(dt, i, self.cols);
            let next = if i + 1 < self.rows {
                self.at(dt, i + 1, 0)
            } else {
                end + 64
            };
            assert_guard(node, what, end, next);
        }
    }
}

/// Runs `rounds` tile all-reduces of every tile per launch. Rank r runs tile t on CTA
/// (t + r) % ctas: only matching by tile index pairs them up. Every CTA runs its tiles in
/// increasing order (tile calls are rendezvous: ranks must not order tiles against each other).
fn run_tiles(
    node: &Node,
    m: &Matrix,
    dt: Dt,
    op: i32,
    ctas: u32,
    threads: u32,
    rounds: usize,
) -> Vec<i32> {
    let tiles = m.tiles();
    node.run("tiles", ctas, threads, |rank, ctx| {
        let cta = cta_rank() as usize;
        let mine: Vec<usize> = (0..tiles.len())
            .filter(|t| (t + rank) % ctas as usize == cta)
            .collect();
        for _ in 0..rounds {
            for &t in &mine {
                let (i, j, r, c) = tiles[t];
                let ptr = node.addr(rank, m.at(dt, i, j));
                let s = api::symm_tile_all_reduce(
                    ctx,
                    ptr,
                    r as i64,
                    c as i64,
                    m.stride as i64,
                    t as i64,
                    op,
                    dt.code(),
                );
                if s != status::OK {
                    return s;
                }
            }
        }
        status::OK
    })
}

fn apply(op: i32, world: usize, v: f64, rounds: usize) -> f64 {
    // Reducing `world` equal copies of v again: what a second round produces.
    let mut x = v;
    for _ in 1..rounds {
        x = reference(op, &vec![vec![x]; world])[0];
    }
    x
}

#[test]
fn tile_all_reduce_matches_tiles_by_index_and_keeps_per_tile_epochs() {
    let shapes = [
        Matrix {
            rows: 13,
            cols: 37,
            stride: 40,
            tr: 4,
            tc: 16,
        },
        Matrix {
            rows: 9,
            cols: 64,
            stride: 64,
            tr: 8,
            tc: 64,
        },
        Matrix {
            rows: 1,
            cols: 301,
            stride: 301,
            tr: 1,
            tc: 128,
        },
    ];
    let mut rng = Rng::new(7);
    for world in [2, 3, 4] {
        for (k, m) in shapes.iter().enumerate() {
            for dt in Dt::ALL {
                let op = OPS[(k + world) % OPS.len()];
                let mut node = Node::new(world, 1 << 16, 1 << 16);
                let inputs: Vec<Vec<f64>> = (0..world)
                    .map(|r| m.fill(&mut node, r, dt, &mut rng, op))
                    .collect();
                let once = reference(op, &inputs);
                let what = format!("tile all_reduce world={world} shape={k} {dt:?} op={op}");
                // Two rounds in one launch, then two more in a second launch: per-tile epochs
                // carry over calls and launches.
                let (ctas, threads) = (3, 32);
                assert_eq!(
                    run_tiles(&node, m, dt, op, ctas, threads, 2),
                    vec![status::OK; world],
                    "{what}"
                );
                let got = m.read(&node, 0, dt);
                for r in 1..world {
                    assert_eq!(
                        m.read(&node, r, dt),
                        got,
                        "{what}: rank {r} differs from rank 0"
                    );
                }
                if op != reduce_op::PROD {
                    let want: Vec<f64> = once.iter().map(|v| apply(op, world, *v, 2)).collect();
                    assert_close(&what, dt, &got, &want);
                }
                assert_eq!(
                    run_tiles(&node, m, dt, op, ctas, threads, 2),
                    vec![status::OK; world],
                    "{what} (2nd launch)"
                );
                for r in 1..world {
                    assert_eq!(
                        m.read(&node, r, dt),
                        m.read(&node, 0, dt),
                        "{what}: 2nd launch, rank {r} differs"
                    );
                }
                m.assert_gaps(&node, dt, &what);
            }
        }
    }
}

#[test]
fn tile_all_reduce_rejects_bad_tiles_and_writes_nothing() {
    let mut node = Node::new(2, 1 << 16, 1 << 16);
    let m = Matrix {
        rows: 4,
        cols: 8,
        stride: 8,
        tr: 4,
        tc: 8,
    };
    let mut rng = Rng::new(3);
    for r in 0..2 {
        m.fill(&mut node, r, Dt::F32, &mut rng, reduce_op::SUM);
    }
    let before: Vec<Vec<u8>> = (0..2).map(|r| node.heap(r).to_vec()).collect();
    let heap = node.heap_bytes as i64;
    // (what, byte offset of ptr, rows, cols, stride, tile, op, dtype, want)
    #[allow(clippy::type_complexity)]
    let cases: [(&str, i64, i64, i64, i64, i64, i32, i32, i32); 7] = [
        (
            "tile index past MAX_TILES",
            BASE as i64,
            4,
            8,
            8,
            MAX_TILES as i64,
            reduce_op::SUM,
            dtype::FLOAT32,
            status::INVALID_ARGUMENT,
        ),
        (
            "negative tile",
            BASE as i64,
            4,
            8,
            8,
            -1,
            reduce_op::SUM,
            dtype::FLOAT32,
            status::INVALID_ARGUMENT,
        ),
        (
            "stride shorter than a row",
            BASE as i64,
            4,
            8,
            7,
            0,
            reduce_op::SUM,
            dtype::FLOAT32,
            status::INVALID_ARGUMENT,
        ),
        (
            "negative rows",
            BASE as i64,
            -1,
            8,
            8,
            0,
            reduce_op::SUM,
            dtype::FLOAT32,
            status::INVALID_ARGUMENT,
        ),
        (
            "last row past the heap",
            heap - 64,
            4,
            8,
            8,
            0,
            reduce_op::SUM,
            dtype::FLOAT32,
            status::OUT_OF_BOUNDS,
        ),
        (
            "misaligned",
            BASE as i64 + 2,
            4,
            8,
            8,
            0,
            reduce_op::SUM,
            dtype::FLOAT32,
            status::MISALIGNED,
        ),
        (
            "unknown op",
            BASE as i64,
            4,
            8,
            8,
            0,
            42,
            dtype::FLOAT32,
            status::UNSUPPORTED_OP,
        ),
    ];
    for (what, off, rows, cols, stride, tile, op, dt, want) in cases {
        let st = node.run(what, 2, 32, |rank, ctx| {
            api::symm_tile_all_reduce(
                ctx,
                node.addr(rank, 0) + off,
                rows,
                cols,
                stride,
                tile,
                op,
                dt,
            )
        });
        assert_eq!(st, vec![want; 2], "{what}");
    }
    for (r, was) in before.iter().enumerate() {
        assert!(
            node.heap(r) == &was[..],
            "rank {r}: a rejected call wrote to the heap"
        );
    }
}

/// A rank that never calls a tile: its peer gives TIMEOUT, recorded, instead of hanging.
#[test]
fn tile_all_reduce_times_out_when_a_peer_skips_the_tile() {
    let mut node = Node::new(2, 1 << 16, 1 << 16);
    for r in 0..2 {
        node.ctx_mut(r).timeout_ns = 200_000_000;
    }
    let st = node.run("tile skipped by rank 1", 1, 32, |rank, ctx| {
        if rank == 1 {
            return status::OK;
        }
        api::symm_tile_all_reduce(
            ctx,
            node.addr(rank, BASE),
            2,
            8,
            8,
            5,
            reduce_op::SUM,
            dtype::FLOAT32,
        )
    });
    assert_eq!(st, vec![status::TIMEOUT, status::OK]);
    assert_eq!(node.recorded_error(0), status::TIMEOUT);
}
