//! The signalling of all_reduce_rmsnorm's "push_two_shot" mode (`ironlink.fused`,
//! `all_reduce_rmsnorm_two_shot.push_two_shot`), written with the device API its Triton kernel
//! calls, over back-to-back launches of different row counts (a grid barrier stands for a launch
//! boundary). Each CTA walks its block of rows in steps: step i scatters chunk i's peer-owned
//! columns into their owners' slots, waits for the peers' step i - 1 (one `symm_tile_wait_others`
//! on the CTA's tile), sums this rank's columns of chunk i - 1 and stores the sum into every
//! peer's gathered rows, reads chunk i - 2's rows whole, then signals step i once
//! (`symm_tile_signal_others`): one signal covers both stores of the step. Every launch's values
//! differ, the launches alternate the halves of the workspace, and random yields are on in this
//! binary, so a wait that covered too little, a half reused too early or a count that drifted
//! shows as a wrong word. Reading chunk i - 1's gathered rows in step i instead of chunk i - 2's,
//! or one half for every launch, fails this test (checked).

mod sim;
use core::sync::atomic::Ordering;
use ironlink_device::hw::{cta_rank, grid_ctas, thread_rank};
use sim::*;

const FLAG: usize = 0; // set to 1 by a rank that read a wrong word
const X: usize = 4096; // this rank's rows: [T, H] words
const WS: usize = 16384; // the workspace: two halves
const H: usize = 10; // words a row: ragged chunks at every world
const MAX_ROWS: usize = 9;
const ROW_COUNTS: [usize; 6] = [7, 9, 3, 8, 1, 9]; // one launch each, in turn

/// Rank `rank`'s word `h` of row `t` in launch `k`.
fn value(rank: usize, t: usize, h: usize, k: usize) -> u32 {
    (rank * 1_000_003 + t * 1009 + h * 31 + k * 7_000_001) as u32
}

#[test]
fn push_two_shot_steps_one_signal_covers_scatter_and_gather() {
    std::env::set_var("IRONLINK_SIM_YIELD", "1"); // this binary only: reorders that catch early reads
    for (world, ctas, rows_a_step) in [(2, 3, 2), (3, 2, 1), (4, 3, 2), (4, 2, 1)] {
        let c = H.div_ceil(world); // a rank's chunk of a row (the last ones narrower)
        let half = 4 * ((world - 1) * MAX_ROWS * c + MAX_ROWS * H); // bytes of a half
        let slot_of = |sender: usize, receiver: usize| (sender + world - receiver - 1) % world;
        let mut node = Node::new(world, 1 << 18, 1 << 16);
        clear_flag(&mut node, FLAG);
        let what = format!("push_two_shot world={world} ctas={ctas} rows a step={rows_a_step}");
        let st = node.run(&what, ctas, 32, |rank, ctx| {
            let run = || -> Result<(), i32> {
                let (pid, grid) = (cta_rank() as usize, grid_ctas() as usize);
                let x = |t: usize, h: usize| X + 4 * (t * H + h);
                for (k, &rows) in ROW_COUNTS.iter().enumerate() {
                    let slots = WS + (k % 2) * half; // this launch's half, at every rank's same offset
                    let scattered = |from: usize, t: usize, j: usize| {
                        slots + 4 * (slot_of(from, rank) * rows * c + t * c + j)
                    };
                    let gathered =
                        |t: usize, h: usize| slots + 4 * ((world - 1) * rows * c + t * H + h);
                    let per = rows.div_ceil(grid);
                    let (r0, r1) = ((pid * per).min(rows), ((pid + 1) * per).min(rows));
                    let chunk =
                        |i: usize| (r0 + i * rows_a_step)..(r0 + (i + 1) * rows_a_step).min(r1);
                    let cols = |owner: usize| (owner * c).min(H)..((owner + 1) * c).min(H);
                    if thread_rank() == 0 {
                        for t in r0..r1 {
                            for h in 0..H {
                                put_word(&node, rank, x(t, h), value(rank, t, h, k));
                            }
                        }
                    }
                    let chunks = (r1 - r0).div_ceil(rows_a_step);
                    let steps = if chunks > 0 { chunks + 2 } else { 0 };
                    for i in 0..steps {
                        if i < chunks && thread_rank() == 0 {
                            // 1. chunk i's peer-owned columns into their owners' slots
                            for t in chunk(i) {
                                for dest in (1..world).map(|d| (rank + d) % world) {
                                    for h in cols(dest) {
                                        let v = word(&node, rank, x(t, h)).load(Ordering::Relaxed);
                                        let at = slots
                                            + 4 * (slot_of(rank, dest) * rows * c + t * c + h
                                                - dest * c);
                                        put_word(&node, dest, at, v);
                                    }
                                }
                            }
                        }
                        if i > 0 {
                            ok(api::symm_tile_wait_others(ctx, pid as i64))?;
                        }
                        if i > 0 && i <= chunks && thread_rank() == 0 {
                            // 2. this rank's columns of chunk i - 1: summed, into every peer's gathered rows
                            for t in chunk(i - 1) {
                                for h in cols(rank) {
                                    let sum = (0..world)
                                        .map(|q| {
                                            let at = if q == rank {
                                                x(t, h)
                                            } else {
                                                scattered(q, t, h - rank * c)
                                            };
                                            word(&node, rank, at).load(Ordering::Relaxed)
                                        })
                                        .fold(0u32, u32::wrapping_add);
                                    put_word(&node, rank, x(t, h), sum);
                                    for dest in (1..world).map(|d| (rank + d) % world) {
                                        let at = slots + 4 * ((world - 1) * rows * c + t * H + h);
                                        put_word(&node, dest, at, sum);
                                    }
                                }
                            }
                        }
                        if i > 1 && thread_rank() == 0 {
                            // 3. chunk i - 2 whole: the owners' sums, this rank's own in x
                            for t in chunk(i - 2) {
                                for h in 0..H {
                                    let at = if cols(rank).contains(&h) {
                                        x(t, h)
                                    } else {
                                        gathered(t, h)
                                    };
                                    let got = word(&node, rank, at).load(Ordering::Relaxed);
                                    let want = (0..world)
                                        .map(|q| value(q, t, h, k))
                                        .fold(0u32, u32::wrapping_add);
                                    if got != want {
                                        put_word(&node, rank, FLAG, 1);
                                    }
                                }
                            }
                        }
                        if i <= chunks {
                            ok(api::symm_tile_signal_others(ctx, pid as i64))?;
                        }
                    }
                    ok(api::symm_grid_barrier(ctx))?; // the launch ends
                }
                Ok(())
            };
            run().err().unwrap_or(status::OK)
        });
        assert_eq!(st, vec![status::OK; world], "{what}");
        assert_flag_clear(
            &node,
            FLAG,
            &what,
            "read a row before its step's signal covered it",
        );
    }
}
