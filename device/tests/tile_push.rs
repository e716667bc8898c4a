//! Push-as-produced: `symm_tile_put`, `symm_tile_signal` / `symm_tile_wait` and
//! `symm_tile_signal_others` / `symm_tile_wait_others`, tiles matched by index.

mod sim;
mod tiles;
use core::sync::atomic::Ordering;
use ironlink_device::hw::{cta_rank, sync_threads as hw_sync, thread_rank};
use sim::*;
use tiles::*;

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

/// `symm_tile_signal_batch`: each CTA walks tiles grid-stride from a rank-dependent start
/// (wrapping around the tile count, as matmul_all_reduce's two-shot kernel does), writes one word
/// per tile into the next rank, and signals its tiles in batches of up to `batch` (the last batch
/// shorter); the next rank waits for every tile one by one and checks its word. Every round's
/// values differ, so a tile left out of a batch (a hang: TIMEOUT) or a wait that returned early
/// (a stale word) fails; the reader acknowledges each round on a second range of tile indices.
#[test]
fn tile_signal_batch_covers_each_tile_of_a_strided_walk() {
    const TILES: usize = 23;
    const ROUNDS: u32 = 4;
    let slot = |t: usize| BASE + 4 * t;
    for (world, batch) in [(2, 1), (2, 3), (2, 32), (3, 4)] {
        let mut node = Node::new(world, 1 << 16, 1 << 16);
        clear_flag(&mut node, FLAG);
        let what = format!("tile signal batch world={world} batch={batch}");
        let ctas = 4usize;
        let st = node.run(&what, ctas as u32, 32, |rank, ctx| {
            let cta = cta_rank() as usize;
            let (next, prev) = ((rank + 1) % world, (rank + world - 1) % world);
            let start = |r: usize| (7 * r) % TILES; // each rank's walk starts elsewhere
            let mine: Vec<usize> = (cta..TILES).step_by(ctas).collect();
            for round in 0..ROUNDS {
                let v = |from: usize, t: usize| (from as u32) << 24 | round << 16 | t as u32;
                for (i, j) in mine.iter().enumerate() {
                    let t = (j + start(rank)) % TILES;
                    if thread_rank() == 0 {
                        put_word(&node, next, slot(t), v(rank, t));
                    }
                    let last = i + 1 == mine.len();
                    if (i + 1) % batch == 0 || last {
                        let count = if last && (i + 1) % batch != 0 {
                            (i + 1) % batch
                        } else {
                            batch
                        };
                        let first = mine[i + 1 - count];
                        let s = api::symm_tile_signal_batch(
                            ctx,
                            ((first + start(rank)) % TILES) as i64,
                            ctas as i64,
                            count as i32,
                            TILES as i64,
                            next as i32,
                        );
                        if s != status::OK {
                            return s;
                        }
                    }
                }
                // Read what the previous rank wrote into this one: the tiles its same CTA walked.
                for j in mine.iter() {
                    let t = (j + start(prev)) % TILES;
                    let s = api::symm_tile_wait(ctx, t as i64, prev as i32);
                    if s != status::OK {
                        return s;
                    }
                    if word(&node, rank, slot(t)).load(Ordering::Relaxed) != v(prev, t) {
                        put_word(&node, rank, FLAG, 1);
                    }
                    let s = api::symm_tile_signal(ctx, (TILES + t) as i64, prev as i32);
                    if s != status::OK {
                        return s;
                    }
                }
                for j in mine.iter() {
                    let t = (j + start(rank)) % TILES;
                    let s = api::symm_tile_wait(ctx, (TILES + t) as i64, next as i32);
                    if s != status::OK {
                        return s;
                    }
                }
            }
            status::OK
        });
        assert_eq!(st, vec![status::OK; world], "{what}");
        assert_flag_clear(&node, FLAG, &what, "read a stale tile");
    }
}

/// Bad batches change nothing and say so: INVALID_ARGUMENT for a first tile outside the walk, a
/// wrap over MAX_TILES, a negative stride or a count outside 1..=32; a bad peer as every call.
#[test]
fn tile_signal_batch_rejects_bad_ranges() {
    let mut node = Node::new(2, 1 << 16, 1 << 16);
    let st = node.run("bad batches", 1, 32, |rank, ctx| {
        let peer = 1 - rank as i32;
        let max = ironlink_device::abi::MAX_TILES as i64;
        let bad = [
            api::symm_tile_signal_batch(ctx, 5, 1, 2, 5, peer),
            api::symm_tile_signal_batch(ctx, -1, 1, 2, 5, peer),
            api::symm_tile_signal_batch(ctx, 0, 1, 2, max + 1, peer),
            api::symm_tile_signal_batch(ctx, 0, 1, 2, 0, peer),
            api::symm_tile_signal_batch(ctx, 0, -1, 2, 5, peer),
            api::symm_tile_signal_batch(ctx, 0, 1, 0, 5, peer),
            api::symm_tile_signal_batch(ctx, 0, 1, 33, 5, peer),
            api::symm_tile_signal_batch(ctx, 0, 1, 2, 5, 2),
        ];
        if bad.iter().all(|&s| s == status::INVALID_ARGUMENT) {
            status::OK
        } else {
            bad.iter()
                .copied()
                .find(|&s| s != status::INVALID_ARGUMENT)
                .unwrap()
        }
    });
    assert_eq!(st, vec![status::OK; 2]);
    // Nothing was signalled: a wait for any tile of the range times out.
    for r in 0..2 {
        node.ctx_mut(r).timeout_ns = 100_000_000;
    }
    let st = node.run("after bad batches", 1, 32, |rank, ctx| {
        api::symm_tile_wait(ctx, 0, 1 - rank as i32)
    });
    assert_eq!(st, vec![status::TIMEOUT; 2]);
}
