//! The tile-scoped all-reduce (`symm_tile_all_reduce`) that fuses communication into compute.
//!
//! Each test is built to fail when the property it names is removed: tile matching by tile index
//! (every rank runs each tile on a different CTA) and per-tile epochs (every tile is reduced
//! twice per launch, over two launches). The one-shot LL path for small tiles: tile_ll.rs.

mod sim;
mod tiles;
use ironlink_device::abi::{signal, MAX_TILES};
use ironlink_device::hw::cta_rank;
use sim::*;
use tiles::*;

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
        first_failure((0..rounds).flat_map(|_| &mine), |&t| {
            let (i, j, r, c) = tiles[t];
            let ptr = node.addr(rank, m.at(dt, i, j));
            api::symm_tile_all_reduce(
                ctx,
                ptr,
                r as i64,
                c as i64,
                m.stride as i64,
                t as i64,
                op,
                dt.code(),
            )
        })
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
