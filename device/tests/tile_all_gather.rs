//! The tile-scoped all-gather (`symm_tile_all_gather`): tiles matched by index, per-tile epochs.

mod sim;
mod tiles;
use core::sync::atomic::Ordering;
use ironlink_device::hw::{cta_rank, sync_threads as hw_sync, thread_rank};
use sim::*;
use tiles::*;

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
