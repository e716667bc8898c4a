//! The grid barrier (`symm_grid_barrier`) that fused kernels pass between phases.
//!
//! Each test is built to fail when the property it names is removed: the grid barrier's ordering
//! (CTAs read what every other CTA wrote just before).

mod sim;
mod tiles;
use core::sync::atomic::Ordering;
use ironlink_device::hw::host::SIM_SM_COUNT;
use ironlink_device::hw::{cta_rank, grid_ctas, thread_rank};
use sim::*;
use tiles::*;

const MISMATCH: i32 = 99;

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
