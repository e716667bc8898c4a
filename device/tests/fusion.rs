//! The calls that fuse communication into compute: the grid barrier and tile-scoped all-reduce.
//!
//! Each test is built to fail when the property it names is removed: the grid barrier's ordering
//! (CTAs read what every other CTA wrote just before), tile matching by tile index (every rank runs
//! each tile on a different CTA), and per-tile epochs (every tile is reduced
//! twice per launch, over two launches).

mod sim;
use core::sync::atomic::Ordering;
use ironlink_device::abi::{signal, MAX_TILES};
use ironlink_device::hw::host::SIM_SM_COUNT;
use ironlink_device::hw::{cta_rank, grid_ctas, sync_threads as hw_sync, thread_rank};
use sim::*;

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
        clear_flag(&mut node, FLAG);
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
    // Each shape twice: with the LL receive area (the small tiles go one-shot over LL packets),
    // and on a context whose signal region lacks it (every tile two-shot).
    for (world, signal_bytes) in [2, 3, 4]
        .into_iter()
        .flat_map(|w| [(w, signal::FULL_BYTES), (w, signal::MIN_BYTES)])
    {
        for (k, m) in shapes.iter().enumerate() {
            for dt in Dt::ALL {
                let op = OPS[(k + world) % OPS.len()];
                let mut node = Node::new(world, 1 << 16, 1 << 16);
                for r in 0..world {
                    node.ctx_mut(r).signal_size = signal_bytes as u64;
                }
                let inputs: Vec<Vec<f64>> = (0..world)
                    .map(|r| m.fill(&mut node, r, dt, &mut rng, op))
                    .collect();
                let once = reference(op, &inputs);
                let what = format!(
                    "tile all_reduce world={world} shape={k} {dt:?} op={op} signal={signal_bytes}"
                );
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

/// Writes `v` as the u32 at `offset` of `rank`'s heap, from inside a simulated CTA.
/// What rank `p` contributes to element (i, j) in round `k` of the all-gather test.
fn gathered(p: usize, k: usize, i: usize, j: usize) -> u32 {
    (p * 1_000_000 + k * 10_000 + i * 100 + j) as u32
}

/// Tile all-gather of u32 blocks, stacked (`block_stride` past the block) and interleaved (the
/// blocks' rows side by side). Every round each rank writes new values into its block, right
/// before the call, and checks every block right after it: a call that returned before a peer's
/// block arrived (no tile matching, a stale per-tile epoch) reads the previous round's values.
#[test]
fn tile_all_gather_matches_tiles_by_index_and_keeps_per_tile_epochs() {
    // (rows, cols, row stride, block stride, tile rows, tile cols), in 4-byte elements.
    let layouts = [
        (7, 10, 12, 84, 3, 4),
        (5, 6, 40, 8, 2, 6),
        (1, 33, 33, 40, 1, 16),
    ];
    for world in [2, 3, 4] {
        for (k, &(rows, cols, stride, bstride, tr, tc)) in layouts.iter().enumerate() {
            if (world - 1) * bstride + cols > stride && bstride < (rows - 1) * stride + cols {
                continue; // interleaved blocks that do not fit this world's row stride
            }
            let m = Matrix {
                rows,
                cols,
                stride,
                tr,
                tc,
            };
            let tiles = m.tiles();
            let mut node = Node::new(world, 1 << 16, 1 << 16);
            clear_flag(&mut node, FLAG);
            let at = |p: usize, i: usize, j: usize| BASE + 4 * (p * bstride + i * stride + j);
            let what = format!("tile all_gather world={world} layout={k}");
            let ctas = 3;
            let st = node.run(&what, ctas, 32, |rank, ctx| {
                let cta = cta_rank() as usize;
                for round in 0..3 {
                    for (t, &(i0, j0, r, c)) in tiles.iter().enumerate() {
                        if (t + rank) % ctas as usize != cta {
                            continue;
                        }
                        if thread_rank() == 0 {
                            for (i, j) in
                                (i0..i0 + r).flat_map(|i| (j0..j0 + c).map(move |j| (i, j)))
                            {
                                put_word(&node, rank, at(rank, i, j), gathered(rank, round, i, j));
                            }
                        }
                        let s = api::symm_tile_all_gather(
                            ctx,
                            node.addr(rank, at(0, i0, j0)),
                            r as i64,
                            c as i64,
                            stride as i64,
                            bstride as i64,
                            t as i64,
                            dtype::FLOAT32,
                        );
                        if s != status::OK {
                            return s;
                        }
                        for p in 0..world {
                            for (i, j) in
                                (i0..i0 + r).flat_map(|i| (j0..j0 + c).map(move |j| (i, j)))
                            {
                                if word(&node, rank, at(p, i, j)).load(Ordering::Relaxed)
                                    != gathered(p, round, i, j)
                                {
                                    put_word(&node, rank, FLAG, 1);
                                }
                            }
                        }
                        // Every thread has checked before thread 0 writes the next round.
                        hw_sync();
                    }
                }
                status::OK
            });
            assert_eq!(st, vec![status::OK; world], "{what}");
            assert_flag_clear(&node, FLAG, &what, "saw a stale block");
            // Nothing outside the blocks' rows was written.
            let mut inside = vec![false; 1 << 16];
            for p in 0..world {
                for i in 0..rows {
                    inside[at(p, i, 0)..at(p, i, cols)].fill(true);
                }
            }
            for r in 0..world {
                let heap = node.heap(r);
                for b in BASE..BASE + 4 * (world * bstride + rows * stride) {
                    assert!(
                        inside[b] || heap[b] == sim::GUARD,
                        "{what}: rank {r} wrote heap byte {b}"
                    );
                }
            }
        }
    }
}

/// Tile reduce-scatter: rank p's output tile gets block p of every rank's input, reduced in rank
/// order; in place (the output is the rank's own block) and out of place, run twice.
#[test]
#[allow(clippy::needless_range_loop)] // ranks and blocks index the same tables: clearer by index
fn tile_reduce_scatter_reduces_each_block_into_its_rank() {
    let mut rng = Rng::new(11);
    for world in [2, 3, 4] {
        for in_place in [false, true] {
            for dt in Dt::ALL {
                let (rows, cols, stride) = (6, 21, 24);
                let block = rows * stride; // stacked blocks
                let out_base = BASE + (world + 1) * block * dt.size();
                let m = Matrix {
                    rows,
                    cols,
                    stride,
                    tr: 4,
                    tc: 16,
                };
                let tiles = m.tiles();
                let op = OPS[world % OPS.len()];
                let mut node = Node::new(world, 1 << 16, 1 << 16);
                // inputs[r][p]: rank r's block p, row by row.
                let inputs: Vec<Vec<Vec<f64>>> = (0..world)
                    .map(|r| {
                        (0..world)
                            .map(|p| {
                                let mut all = Vec::new();
                                for i in 0..rows {
                                    let vals: Vec<f32> =
                                        (0..cols).map(|_| rng.uniform(-4.0, 4.0)).collect();
                                    let off = BASE + (p * block + i * stride) * dt.size();
                                    all.extend(fill(&mut node, r, off, dt, &vals));
                                }
                                all
                            })
                            .collect()
                    })
                    .collect();
                let what =
                    format!("tile reduce_scatter world={world} in_place={in_place} {dt:?} op={op}");
                let out_at = |rank: usize, i: usize, j: usize| {
                    if in_place {
                        BASE + (rank * block + i * stride + j) * dt.size()
                    } else {
                        out_base + (i * stride + j) * dt.size()
                    }
                };
                let st = node.run(&what, 2, 32, |rank, ctx| {
                    let cta = cta_rank() as usize;
                    for (t, &(i0, j0, r, c)) in tiles.iter().enumerate() {
                        if (t + rank) % 2 != cta {
                            continue;
                        }
                        let s = api::symm_tile_reduce_scatter(
                            ctx,
                            node.addr(rank, BASE + (i0 * stride + j0) * dt.size()),
                            node.addr(rank, out_at(rank, i0, j0)),
                            r as i64,
                            c as i64,
                            stride as i64,
                            block as i64,
                            t as i64,
                            op,
                            dt.code(),
                        );
                        if s != status::OK {
                            return s;
                        }
                    }
                    status::OK
                });
                assert_eq!(st, vec![status::OK; world], "{what}");
                for r in 0..world {
                    let got: Vec<f64> = (0..rows)
                        .flat_map(|i| read(&node, r, out_at(r, i, 0), dt, cols))
                        .collect();
                    let theirs: Vec<Vec<f64>> = (0..world).map(|p| inputs[p][r].clone()).collect();
                    if op != reduce_op::PROD {
                        assert_close(
                            &format!("{what} rank {r}"),
                            dt,
                            &got,
                            &reference(op, &theirs),
                        );
                    }
                }
                if !in_place {
                    // The inputs are untouched.
                    for r in 0..world {
                        for p in 0..world {
                            let got: Vec<f64> = (0..rows)
                                .flat_map(|i| {
                                    read(
                                        &node,
                                        r,
                                        BASE + (p * block + i * stride) * dt.size(),
                                        dt,
                                        cols,
                                    )
                                })
                                .collect();
                            assert_eq!(
                                got, inputs[r][p],
                                "{what}: rank {r}'s input block {p} changed"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// One rank's side of a call in a test: (rank, context) -> status.
type Call<'a> = dyn Fn(usize, i64) -> i32 + Sync + 'a;

/// Bad blocks and overlaps are rejected before anything is written.
#[test]
fn tile_gather_and_scatter_reject_overlapping_blocks() {
    let node = Node::new(2, 1 << 16, 1 << 16);
    let before: Vec<Vec<u8>> = (0..2).map(|r| node.heap(r).to_vec()).collect();
    let f32 = dtype::FLOAT32;
    let sum = reduce_op::SUM;
    // (what, status of the call on every rank)
    let cases: Vec<(&str, Box<Call>)> = vec![
        (
            "stacked blocks that overlap",
            Box::new(|rank, ctx| {
                api::symm_tile_all_gather(ctx, node.addr(rank, BASE), 4, 8, 8, 16, 0, f32)
            }),
        ),
        (
            "interleaved blocks wider than the row stride",
            Box::new(|rank, ctx| {
                api::symm_tile_all_gather(ctx, node.addr(rank, BASE), 4, 8, 12, 8, 0, f32)
            }),
        ),
        (
            "negative block stride",
            Box::new(|rank, ctx| {
                api::symm_tile_all_gather(ctx, node.addr(rank, BASE), 4, 8, 8, -32, 0, f32)
            }),
        ),
        (
            "reduce_scatter output over another rank's block",
            Box::new(|rank, ctx| {
                let other = node.addr(rank, BASE) + 4 * 32 * (1 - rank as i64);
                api::symm_tile_reduce_scatter(
                    ctx,
                    node.addr(rank, BASE),
                    other,
                    4,
                    8,
                    8,
                    32,
                    0,
                    sum,
                    f32,
                )
            }),
        ),
        (
            "reduce_scatter blocks past the heap",
            Box::new(|rank, ctx| {
                let end = node.addr(rank, 0) + node.heap_bytes as i64 - 4 * 40;
                api::symm_tile_reduce_scatter(
                    ctx,
                    end,
                    node.addr(rank, BASE),
                    4,
                    8,
                    8,
                    32,
                    0,
                    sum,
                    f32,
                )
            }),
        ),
        (
            "put to a peer out of range",
            Box::new(|rank, ctx| {
                api::symm_tile_put(
                    ctx,
                    node.addr(rank, BASE),
                    node.addr(rank, BASE + 512),
                    1,
                    8,
                    8,
                    0,
                    2,
                    f32,
                )
            }),
        ),
        (
            "put with a misaligned source",
            Box::new(|rank, ctx| {
                api::symm_tile_put(
                    ctx,
                    node.addr(rank, BASE),
                    node.addr(rank, BASE + 514),
                    1,
                    8,
                    8,
                    0,
                    1 - rank as i32,
                    f32,
                )
            }),
        ),
        (
            "signal a tile past MAX_TILES",
            Box::new(|rank, ctx| api::symm_tile_signal(ctx, MAX_TILES as i64, 1 - rank as i32)),
        ),
        (
            "wait on a negative peer",
            Box::new(|_, ctx| api::symm_tile_wait(ctx, 0, -1)),
        ),
    ];
    let want = [
        status::INVALID_ARGUMENT,
        status::INVALID_ARGUMENT,
        status::INVALID_ARGUMENT,
        status::INVALID_ARGUMENT,
        status::OUT_OF_BOUNDS,
        status::INVALID_ARGUMENT,
        status::MISALIGNED,
        status::INVALID_ARGUMENT,
        status::INVALID_ARGUMENT,
    ];
    for ((what, call), want) in cases.iter().zip(want) {
        let st = node.run(what, 1, 32, call);
        assert_eq!(st, vec![want; 2], "{what}");
    }
    for (r, was) in before.iter().enumerate() {
        assert!(
            node.heap(r) == &was[..],
            "rank {r}: a rejected call wrote to the heap"
        );
    }
}

/// Push-as-produced around a ring: for each tile and round, rank r puts its tile into rank
/// r+1's inbox and waits for rank r-1's before reading its own inbox; the reader acknowledges
/// with a signal on a second tile index so the writer does not overwrite an unread inbox.
/// Rank r runs tile t on CTA (t + r) % ctas, so only matching by tile index pairs them up, and
/// every round's data differs, so a wait that returned early (a lost count) reads stale values.
#[test]
fn tile_put_and_wait_deliver_each_tile_from_each_peer() {
    const TILES: usize = 5;
    const ROUNDS: u32 = 6;
    let (rows, cols, stride) = (3usize, 10usize, 16usize);
    let tile_bytes = rows * stride * 4;
    let outbox = |t: usize| BASE + t * tile_bytes;
    let inbox = |t: usize| BASE + (TILES + t) * tile_bytes;
    for world in [2, 3, 4] {
        let mut node = Node::new(world, 1 << 16, 1 << 16);
        clear_flag(&mut node, FLAG);
        let what = format!("tile put ring world={world}");
        let ctas = 3;
        let st = node.run(&what, ctas, 32, |rank, ctx| {
            let cta = cta_rank() as usize;
            let (next, prev) = ((rank + 1) % world, (rank + world - 1) % world);
            for round in 0..ROUNDS {
                for t in (0..TILES).filter(|t| (t + rank) % ctas as usize == cta) {
                    if round > 0 {
                        // The next rank has read our previous tile.
                        let s = api::symm_tile_wait(ctx, (TILES + t) as i64, next as i32);
                        if s != status::OK {
                            return s;
                        }
                    }
                    if thread_rank() == 0 {
                        for i in 0..rows {
                            for j in 0..cols {
                                let v = (rank as u32) << 24
                                    | round << 16
                                    | (t * 256 + i * 16 + j) as u32;
                                put_word(&node, rank, outbox(t) + 4 * (i * stride + j), v);
                            }
                        }
                    }
                    hw_sync();
                    let s = api::symm_tile_put(
                        ctx,
                        node.addr(rank, inbox(t)),
                        node.addr(rank, outbox(t)),
                        rows as i64,
                        cols as i64,
                        stride as i64,
                        t as i64,
                        next as i32,
                        dtype::FLOAT32,
                    );
                    if s != status::OK {
                        return s;
                    }
                    let s = api::symm_tile_wait(ctx, t as i64, prev as i32);
                    if s != status::OK {
                        return s;
                    }
                    for i in 0..rows {
                        for j in 0..cols {
                            let want =
                                (prev as u32) << 24 | round << 16 | (t * 256 + i * 16 + j) as u32;
                            if word(&node, rank, inbox(t) + 4 * (i * stride + j))
                                .load(Ordering::Relaxed)
                                != want
                            {
                                put_word(&node, rank, FLAG, 1);
                            }
                        }
                    }
                    if round + 1 < ROUNDS {
                        let s = api::symm_tile_signal(ctx, (TILES + t) as i64, prev as i32);
                        if s != status::OK {
                            return s;
                        }
                    }
                }
            }
            status::OK
        });
        assert_eq!(st, vec![status::OK; world], "{what}");
        assert_flag_clear(&node, FLAG, &what, "read a stale tile");
        // The stride gaps of the inbox stay guard bytes (on every rank: assert_guard checks all).
        for t in 0..TILES {
            for i in 0..rows {
                let gap = inbox(t) + 4 * (i * stride + cols);
                assert_guard(&node, &what, gap, gap + 4 * (stride - cols));
            }
        }
    }
}

/// A wait for a tile nobody signals gives TIMEOUT (recorded), not a hang.
#[test]
fn tile_wait_times_out_without_a_signal() {
    let mut node = Node::new(2, 1 << 16, 1 << 16);
    for r in 0..2 {
        node.ctx_mut(r).timeout_ns = 200_000_000;
    }
    let st = node.run("unsignalled tile", 1, 32, |rank, ctx| {
        api::symm_tile_wait(ctx, 7, 1 - rank as i32)
    });
    assert_eq!(st, vec![status::TIMEOUT; 2]);
    assert_eq!(node.recorded_error(0), status::TIMEOUT);
}

/// `symm_tile_signal_others` / `symm_tile_wait_others`: every rank writes a word into every
/// peer's slot `[tile][rank]`, signals all, waits for all and checks every slot, then signals
/// "read" on a second tile index before the next round overwrites. Tiles sit on different CTAs
/// on different ranks and every round's values differ, so a wait that returned before some peer
/// signalled (or a lost or doubled count) reads a stale word.
#[test]
fn tile_signal_and_wait_others_exchange_with_every_peer() {
    const TILES: usize = 6;
    const ROUNDS: u32 = 8;
    let slot = |t: usize, from: usize| BASE + 4 * (t * 8 + from);
    for world in [2, 3, 4] {
        let mut node = Node::new(world, 1 << 16, 1 << 16);
        clear_flag(&mut node, FLAG);
        let what = format!("tile exchange world={world}");
        let ctas = 4;
        let st = node.run(&what, ctas, 32, |rank, ctx| {
            let cta = cta_rank() as usize;
            for round in 0..ROUNDS {
                for t in (0..TILES).filter(|t| (t + rank) % ctas as usize == cta) {
                    let v = |from: usize| (from as u32) << 24 | round << 16 | t as u32;
                    if thread_rank() == 0 {
                        for p in 0..world {
                            put_word(&node, p, slot(t, rank), v(rank));
                        }
                    }
                    let s = api::symm_tile_signal_others(ctx, t as i64);
                    let s = if s == status::OK {
                        api::symm_tile_wait_others(ctx, t as i64)
                    } else {
                        s
                    };
                    if s != status::OK {
                        return s;
                    }
                    for p in 0..world {
                        if word(&node, rank, slot(t, p)).load(Ordering::Relaxed) != v(p) {
                            put_word(&node, rank, FLAG, 1);
                        }
                    }
                    let s = api::symm_tile_signal_others(ctx, (TILES + t) as i64);
                    let s = if s == status::OK {
                        api::symm_tile_wait_others(ctx, (TILES + t) as i64)
                    } else {
                        s
                    };
                    if s != status::OK {
                        return s;
                    }
                }
            }
            status::OK
        });
        assert_eq!(st, vec![status::OK; world], "{what}");
        assert_flag_clear(&node, FLAG, &what, "read a stale slot");
    }
}

/// A wait for every other rank times out when one of them never signals, and names itself.
#[test]
fn tile_wait_others_times_out_when_one_rank_is_missing() {
    let mut node = Node::new(3, 1 << 16, 1 << 16);
    for r in 0..3 {
        node.ctx_mut(r).timeout_ns = 200_000_000;
    }
    let st = node.run("a rank that never signals", 1, 32, |rank, ctx| {
        if rank != 2 {
            let s = api::symm_tile_signal_others(ctx, 3);
            if s != status::OK {
                return s;
            }
        }
        api::symm_tile_wait_others(ctx, 3)
    });
    assert_eq!(st, vec![status::TIMEOUT, status::TIMEOUT, status::OK]);
    assert_eq!(node.recorded_error(0), status::TIMEOUT);
}
