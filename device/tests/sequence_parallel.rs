//! The communication patterns of the sequence-parallel fused ops (`ironlink.fused`:
//! `matmul_reduce_scatter`, `all_gather_matmul`), written with the device API the Triton kernels
//! call, over several back-to-back launches (a grid barrier stands for a launch boundary: a rank's
//! next launch starts when all its CTAs are done). Each tile's "compute" is a word pattern that
//! changes every launch, so a slot overwritten too early, a wait that returned before its data, or
//! a count that drifted shows as a wrong word. Random yields are on in this binary: dropping the
//! free-slot waits or the arrival handshake fails these tests (checked).

mod sim;
use core::sync::atomic::Ordering;
use ironlink_device::hw::{cta_rank, grid_ctas, thread_rank};
use sim::*;

const WORDS: usize = 8; // words per tile
const LAUNCHES: usize = 5;
const FLAG: usize = 0; // set to 1 by a rank that saw a wrong word
const DATA: usize = 4096;

/// Rank `src`'s partial of word `w` of tile `t` for destination `dest` in launch `k`.
fn partial(src: usize, dest: usize, t: usize, w: usize, k: usize) -> u32 {
    (src * 7 + dest * 1000 + t * 100_000 + w * 13 + k * 3_000_000) as u32
}

/// matmul_reduce_scatter: each tile (dest, t) is stored into slot [t][src] of dest's workspace
/// and signalled (tile index t); dest sums its slots into its output once every rank's copy is in
/// and frees the slots (tile index T + t); a launch ends once the slots it wrote are freed.
#[test]
fn reduce_scatter_through_owner_slots_over_back_to_back_launches() {
    std::env::set_var("IRONLINK_SIM_YIELD", "1"); // this binary only: reorders that catch early overwrites
    for (world, ctas, tiles) in [(2, 3, 5), (3, 4, 7), (4, 2, 9)] {
        let ws = DATA;
        let out = ws + 4 * WORDS * tiles * world;
        let mut node = Node::new(world, 1 << 18, 1 << 16);
        clear_flag(&mut node, FLAG);
        let what = format!("reduce-scatter pattern world={world} ctas={ctas} tiles={tiles}");
        let st = node.run(&what, ctas, 32, |rank, ctx| {
            let run = || -> Result<(), i32> {
                let (pid, grid) = (cta_rank() as usize, grid_ctas() as usize);
                for k in 0..LAUNCHES {
                    let mut o = pid;
                    while o < world * tiles {
                        let (dest, t) = ((rank + 1 + o / tiles) % world, o % tiles);
                        if thread_rank() == 0 {
                            for w in 0..WORDS {
                                let at = ws + 4 * ((t * world + rank) * WORDS + w);
                                word(&node, dest, at)
                                    .store(partial(rank, dest, t, w, k), Ordering::Relaxed);
                            }
                        }
                        ok(api::symm_tile_signal(ctx, t as i64, dest as i32))?;
                        o += grid;
                    }
                    let mut t = pid;
                    while t < tiles {
                        ok(api::symm_tile_wait(ctx, t as i64, rank as i32))?;
                        ok(api::symm_tile_wait_others(ctx, t as i64))?;
                        if thread_rank() == 0 {
                            for w in 0..WORDS {
                                let sum = (0..world)
                                    .map(|s| {
                                        word(&node, rank, ws + 4 * ((t * world + s) * WORDS + w))
                                            .load(Ordering::Relaxed)
                                    })
                                    .fold(0u32, u32::wrapping_add);
                                let want = (0..world)
                                    .map(|s| partial(s, rank, t, w, k))
                                    .fold(0u32, u32::wrapping_add);
                                word(&node, rank, out + 4 * (t * WORDS + w))
                                    .store(sum, Ordering::Relaxed);
                                if sum != want {
                                    word(&node, rank, FLAG).store(1, Ordering::Relaxed);
                                }
                            }
                        }
                        ok(api::symm_tile_signal_others(ctx, (tiles + t) as i64))?;
                        t += grid;
                    }
                    let mut o = pid;
                    while o < world * tiles {
                        let dest = (rank + 1 + o / tiles) % world;
                        if dest != rank {
                            ok(api::symm_tile_wait(
                                ctx,
                                (tiles + o % tiles) as i64,
                                dest as i32,
                            ))?;
                        }
                        o += grid;
                    }
                    ok(api::symm_grid_barrier(ctx))?; // the launch ends
                }
                Ok(())
            };
            run().err().unwrap_or(status::OK)
        });
        assert_eq!(st, vec![status::OK; world], "{what}");
        assert_flag_clear(&node, FLAG, &what, "summed a wrong slot");
    }
}

/// all_gather_matmul: each CTA meets the same CTA of every other rank (tile index pid), stores its
/// share of the shard's rows into every rank's gathered buffer, then signals "pushed" pairwise
/// (tile index grid + pid) and passes a grid barrier; after it every rank's rows must be there.
#[test]
fn all_gather_by_pieces_pairwise_signals_and_a_grid_barrier() {
    std::env::set_var("IRONLINK_SIM_YIELD", "1");
    for (world, ctas, rows) in [(2, 3, 10), (3, 4, 6), (4, 2, 13)] {
        let full = DATA;
        let mut node = Node::new(world, 1 << 18, 1 << 16);
        clear_flag(&mut node, FLAG);
        let what = format!("all-gather pattern world={world} ctas={ctas} rows={rows}");
        let st = node.run(&what, ctas, 32, |rank, ctx| {
            let run = || -> Result<(), i32> {
                let (pid, grid) = (cta_rank() as usize, grid_ctas() as usize);
                for k in 0..LAUNCHES {
                    ok(api::symm_tile_signal_others(ctx, pid as i64))?;
                    ok(api::symm_tile_wait_others(ctx, pid as i64))?;
                    let mut row = pid;
                    while row < rows {
                        if thread_rank() == 0 {
                            for p in 0..world {
                                for w in 0..WORDS {
                                    let at = full + 4 * ((rank * rows + row) * WORDS + w);
                                    word(&node, p, at)
                                        .store(partial(rank, 0, row, w, k), Ordering::Relaxed);
                                }
                            }
                        }
                        row += grid;
                    }
                    ok(api::symm_tile_signal_others(ctx, (grid + pid) as i64))?;
                    ok(api::symm_tile_wait_others(ctx, (grid + pid) as i64))?;
                    ok(api::symm_grid_barrier(ctx))?;
                    // Every CTA reads rows pushed by every CTA of every rank.
                    if thread_rank() == 0 {
                        for src in 0..world {
                            for row in (pid..rows).step_by(1) {
                                for w in 0..WORDS {
                                    let at = full + 4 * ((src * rows + row) * WORDS + w);
                                    if word(&node, rank, at).load(Ordering::Relaxed)
                                        != partial(src, 0, row, w, k)
                                    {
                                        word(&node, rank, FLAG).store(1, Ordering::Relaxed);
                                    }
                                }
                            }
                        }
                    }
                    ok(api::symm_grid_barrier(ctx))?; // the launch ends
                }
                Ok(())
            };
            run().err().unwrap_or(status::OK)
        });
        assert_eq!(st, vec![status::OK; world], "{what}");
        assert_flag_clear(&node, FLAG, &what, "read a row not yet pushed");
    }
}
