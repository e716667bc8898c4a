//! The protocol of the fused kernels whose data a copy engine carries
//! (python/ironlink/fused/copy_engine.py and the kernels that use it), modelled on simulated
//! nodes with the device functions they call (`symm_signal_at`, `symm_signal_wait_at`). Per
//! rank, the kernel's CTAs and one CTA standing for the side stream, whose copies and flag
//! writes are plain memory operations, as a copy engine's are. Launch after launch, each rank
//! first uses its buffer (writes a sentinel over it: a rank may use its buffer until its launch
//! starts), then the launch runs: CTA 0 tells every peer the launch has started, waits for
//! theirs and gives its stream the go; the stream copies this rank's block into every peer's
//! buffer and sets the peer's ready flag; each kernel CTA waits for every peer's flag and checks
//! that peer's block holds its data of this launch; the last CTA clears the ready flags.
//!
//! Built to fail when a stream may write before the peer's launch has started: with CTA 0's
//! wait for the peers' starts taken out, the check fails (4 runs of 4 when written).

mod sim;
use core::sync::atomic::{AtomicU64, Ordering};
use ironlink_device::abi::{cmp, signal_op};
use ironlink_device::hw::{cta_rank, grid_ctas, sync_threads, thread_rank};
use sim::*;

const GO: usize = 0;
const FREE: usize = 8; // + 8 * p
const CHECK: usize = 1024; // a rank's kernel CTA saw a block that was not its peer's data
const BUFFER: usize = 4096; // world blocks of BLOCK bytes
const BLOCK: usize = 256;
const SENTINEL: u8 = 0xEE;
const MISMATCH: i32 = 99;

fn done(world: usize) -> usize {
    FREE + 8 * world
}

fn ready(world: usize, src: usize) -> usize {
    done(world) + 8 + 8 * src
}

fn u64_at(node: &Node, rank: usize, offset: usize) -> &AtomicU64 {
    // SAFETY: an 8-byte-aligned word inside the rank's heap, which outlives the node's runs.
    unsafe { &*(node.addr(rank, offset) as *const AtomicU64) }
}

/// Sets `len` bytes of `rank`'s heap at `offset` to `byte`, with plain stores (a copy engine's).
fn fill(node: &Node, rank: usize, offset: usize, len: usize, byte: u8) {
    // SAFETY: inside the rank's heap (the test's offsets), which outlives the node's runs.
    unsafe { std::ptr::write_bytes(node.addr(rank, offset) as *mut u8, byte, len) }
}

/// Rank `src`'s data in launch `launch`.
fn pattern(src: usize, launch: usize) -> u8 {
    (src * 16 + launch) as u8
}

#[test]
fn copy_engine_launches_deliver_this_launchs_data() {
    for (world, kernel_ctas) in [(2usize, 3u32), (3, 2)] {
        let launches = 8;
        let mut node = Node::new(world, 1 << 14, 1 << 12);
        for r in 0..world {
            node.heap_mut(r)[..BUFFER].fill(0); // the flags start at zero
        }
        let label = format!("copy-engine protocol world={world}");
        let st = node.run(&label, kernel_ctas + 1, 32, |rank, ctx| {
            let (cta, grid) = (cta_rank(), grid_ctas());
            let stream = cta == grid - 1;
            for launch in 1..=launches {
                // The previous launch and its stream are done (the join), then this rank uses
                // its buffer, then this launch starts.
                let s = api::symm_grid_barrier(ctx);
                if s != status::OK {
                    return s;
                }
                if cta == 0 && thread_rank() == 0 {
                    fill(&node, rank, BUFFER, world * BLOCK, SENTINEL);
                }
                let s = api::symm_grid_barrier(ctx);
                if s != status::OK {
                    return s;
                }
                if stream {
                    if thread_rank() == 0 {
                        let go = u64_at(&node, rank, GO);
                        while go.load(Ordering::Acquire) != 1 {
                            std::thread::yield_now();
                        }
                        go.store(0, Ordering::Relaxed);
                        for i in 1..world {
                            let q = (rank + i) % world;
                            fill(
                                &node,
                                q,
                                BUFFER + rank * BLOCK,
                                BLOCK,
                                pattern(rank, launch),
                            );
                            u64_at(&node, q, ready(world, rank)).store(1, Ordering::Release);
                        }
                        fill(
                            &node,
                            rank,
                            BUFFER + rank * BLOCK,
                            BLOCK,
                            pattern(rank, launch),
                        );
                    }
                    sync_threads();
                    continue;
                }
                // One word of this rank's heap set to 1 at `peer`, or waited for to be 1 here.
                let set = |offset: usize, peer: usize| {
                    api::symm_signal_at(
                        ctx,
                        node.addr(rank, offset),
                        1,
                        signal_op::SET,
                        peer as i32,
                    )
                };
                let wait = |offset: usize| {
                    api::symm_signal_wait_at(ctx, node.addr(rank, offset), cmp::EQ, 1)
                };
                if cta == 0 {
                    for i in 1..world {
                        let s = set(FREE + 8 * rank, (rank + i) % world);
                        if s != status::OK {
                            return s;
                        }
                    }
                    for i in 1..world {
                        let p = (rank + i) % world;
                        let s = wait(FREE + 8 * p);
                        if s != status::OK {
                            return s;
                        }
                        if thread_rank() == 0 {
                            u64_at(&node, rank, FREE + 8 * p).store(0, Ordering::Relaxed);
                        }
                    }
                    let s = set(GO, rank);
                    if s != status::OK {
                        return s;
                    }
                }
                for i in 1..world {
                    let src = (rank + i) % world;
                    let s = wait(ready(world, src));
                    if s != status::OK {
                        return s;
                    }
                    let block = &node.heap(rank)[BUFFER + src * BLOCK..BUFFER + (src + 1) * BLOCK];
                    if thread_rank() == 0 && block.iter().any(|&b| b != pattern(src, launch)) {
                        u64_at(&node, rank, CHECK).store(1, Ordering::Relaxed);
                    }
                }
                // The last kernel CTA clears the ready flags for the next launch.
                sync_threads();
                if thread_rank() == 0 {
                    let count = u64_at(&node, rank, done(world));
                    if count.fetch_add(1, Ordering::AcqRel) == u64::from(kernel_ctas) - 1 {
                        for src in 0..world {
                            u64_at(&node, rank, ready(world, src)).store(0, Ordering::Relaxed);
                        }
                        count.store(0, Ordering::Relaxed);
                    }
                }
                sync_threads();
            }
            let s = api::symm_grid_barrier(ctx);
            if s != status::OK {
                return s;
            }
            if u64_at(&node, rank, CHECK).load(Ordering::Relaxed) != 0 {
                MISMATCH
            } else {
                status::OK
            }
        });
        assert_eq!(st, vec![status::OK; world], "{label}");
    }
}
