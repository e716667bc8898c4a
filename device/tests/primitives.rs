//! Put, get, signal, wait and barrier on the simulator: a ring exchange where every rank puts a
//! block into its right neighbour, signals it, waits for its left neighbour's signal, then gets
//! a block back from its left neighbour.

mod sim;
use ironlink_device::abi::{cmp, signal_op};
use sim::*;

#[test]
fn ring_put_signal_wait_get() {
    for world in [2usize, 3, 8] {
        let n = 1000usize; // bytes, not a multiple of 16
        let mut node = Node::new(world, 1 << 16, 1 << 16);
        for r in 0..world {
            let data: Vec<u8> = (0..n).map(|i| (i * 7 + r * 31) as u8).collect();
            node.heap_mut(r)[0..n].copy_from_slice(&data);
        }
        let st = node.run("ring", 2, 32, |rank, ctx| {
            let right = ((rank + 1) % world) as i32;
            let left = (rank + world - 1) % world;
            // Every CTA does the exchange once, into its own area (offset by CTA so they don't race).
            let cta = ironlink_device::hw::cta_rank() as usize;
            let area = 4096 + cta * 4096;
            let s = api::symm_put(
                ctx,
                node.addr(rank, area),
                node.addr(rank, 0),
                n as i64,
                right,
            );
            if s != 0 {
                return s;
            }
            let s = api::symm_signal(ctx, cta as i64, 1, signal_op::ADD, right);
            if s != 0 {
                return s;
            }
            let s = api::symm_signal_wait(ctx, cta as i64, cmp::GE, 1);
            if s != 0 {
                return s;
            }
            // The left neighbour's data has arrived here; fetch its source block too.
            let s = api::symm_get(
                ctx,
                node.addr(rank, area + 2048),
                node.addr(rank, 0),
                n as i64,
                left as i32,
            );
            if s != 0 {
                return s;
            }
            api::symm_barrier(ctx)
        });
        assert_eq!(st, vec![status::OK; world], "world {world}");
        for r in 0..world {
            let left = (r + world - 1) % world;
            let want: Vec<u8> = (0..n).map(|i| (i * 7 + left * 31) as u8).collect();
            for cta in 0..2 {
                let area = 4096 + cta * 4096;
                assert_eq!(
                    &node.heap(r)[area..area + n],
                    &want[..],
                    "world {world} rank {r} cta {cta}: put"
                );
                assert_eq!(
                    &node.heap(r)[area + 2048..area + 2048 + n],
                    &want[..],
                    "world {world} rank {r}: get"
                );
            }
        }
    }
}

#[test]
fn signal_wait_times_out() {
    let mut node = Node::new(2, 1 << 12, 1 << 12);
    node.ctx_mut(0).timeout_ns = 50_000_000;
    let st = node.run("wait", 1, 32, |rank, ctx| {
        if rank == 0 {
            api::symm_signal_wait(ctx, 3, cmp::EQ, 42)
        } else {
            status::OK
        }
    });
    assert_eq!(st, vec![status::TIMEOUT, status::OK]);
    assert_eq!(node.recorded_error(0), status::TIMEOUT);
    let bad = node.run("slot", 1, 32, |_, ctx| {
        api::symm_signal(ctx, 1 << 20, 1, signal_op::SET, 0)
    });
    assert_eq!(bad, vec![status::INVALID_ARGUMENT; 2]);
}

/// `symm_signal_at` / `symm_signal_wait_at`: flags at heap words, the protocol of a transfer that
/// a copy engine makes (the host writes the word; here a CTA of the sender does): every rank
/// writes a block into its right neighbour's heap, adds one to the neighbour's flag word, waits
/// for its own flag from the left, checks the data, then sets the left neighbour's
/// "free" word (a SET) and waits for its own.
#[test]
fn flags_at_heap_words() {
    for world in [2usize, 3] {
        let n = 512usize;
        let (flag, free, data) = (64usize, 128usize, 1024usize);
        let mut node = Node::new(world, 1 << 14, 1 << 12);
        for r in 0..world {
            node.heap_mut(r)[..256].fill(0); // the flags start at zero (the heap at the guard)
        }
        let st = node.run("flags", 1, 32, |rank, ctx| {
            let right = (rank + 1) % world;
            let left = ((rank + world - 1) % world) as i32;
            let mine: Vec<u8> = (0..n).map(|i| (i * 5 + rank * 17) as u8).collect();
            if ironlink_device::hw::thread_rank() == 0 {
                let dst = api::symm_peer_ptr(ctx, node.addr(rank, data), right as i32);
                // SAFETY: `dst` is the right neighbour's heap at `data`, n bytes inside it.
                unsafe { std::ptr::copy_nonoverlapping(mine.as_ptr(), dst as *mut u8, n) };
            }
            for s in [
                api::symm_signal_at(ctx, node.addr(rank, flag), 1, signal_op::ADD, right as i32),
                api::symm_signal_wait_at(ctx, node.addr(rank, flag), cmp::GE, 1),
            ] {
                if s != status::OK {
                    return s;
                }
            }
            let want: Vec<u8> = (0..n).map(|i| (i * 5 + left as usize * 17) as u8).collect();
            if node.heap(rank)[data..data + n] != want[..] {
                return -100;
            }
            let s = api::symm_signal_at(ctx, node.addr(rank, free), 7, signal_op::SET, left);
            if s != status::OK {
                return s;
            }
            api::symm_signal_wait_at(ctx, node.addr(rank, free), cmp::EQ, 7)
        });
        assert_eq!(st, vec![status::OK; world], "world {world}");
        for r in 0..world {
            let word = |at: usize| u64::from_le_bytes(node.heap(r)[at..at + 8].try_into().unwrap());
            assert_eq!((word(flag), word(free)), (1, 7), "world {world} rank {r}");
        }
    }
}

#[test]
fn flags_at_heap_words_reject_misuse_and_time_out() {
    let mut node = Node::new(2, 1 << 12, 1 << 12);
    node.ctx_mut(0).timeout_ns = 50_000_000;
    for r in 0..2 {
        node.heap_mut(r)[..16].fill(0);
    }
    let st = node.run("wait", 1, 32, |rank, ctx| {
        if rank == 0 {
            api::symm_signal_wait_at(ctx, node.addr(0, 8), cmp::EQ, 42)
        } else {
            status::OK
        }
    });
    assert_eq!(st, vec![status::TIMEOUT, status::OK]);
    assert_eq!(node.recorded_error(0), status::TIMEOUT);
    let bad = node.run("misuse", 1, 32, |rank, ctx| {
        let codes = [
            api::symm_signal_at(ctx, node.addr(rank, 4), 1, signal_op::SET, 0),
            api::symm_signal_at(ctx, node.addr(rank, 1 << 12), 1, signal_op::SET, 0),
            api::symm_signal_at(ctx, node.addr(rank, 0), 1, signal_op::SET, 2),
            api::symm_signal_at(ctx, node.addr(rank, 0), 1, 9, 0),
            api::symm_signal_wait_at(ctx, node.addr(rank, 0), 99, 0),
            api::symm_signal_wait_at(ctx, node.addr(rank, 1 << 12), cmp::EQ, 0),
        ];
        let want = [
            status::MISALIGNED,
            status::OUT_OF_BOUNDS,
            status::INVALID_ARGUMENT,
            status::UNSUPPORTED_OP,
            status::UNSUPPORTED_OP,
            status::OUT_OF_BOUNDS,
        ];
        match codes.iter().zip(want).position(|(c, w)| *c != w) {
            None => status::OK,
            Some(i) => -100 * (i as i32 + 1) + codes[i], // which check, and what it gave
        }
    });
    assert_eq!(bad, vec![status::OK; 2]);
    for r in 0..2 {
        assert!(
            node.heap(r)[..16].iter().all(|&b| b == 0),
            "rank {r}: misuse wrote"
        );
    }
}
