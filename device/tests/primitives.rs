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
