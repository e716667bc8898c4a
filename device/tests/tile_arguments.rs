//! The argument checks of the tile calls that move blocks between ranks (`symm_tile_all_gather`,
//! `symm_tile_reduce_scatter`, `symm_tile_put`, `symm_tile_signal`, `symm_tile_wait`): a bad call
//! is rejected before anything is written. The all-reduce's own: tile_all_reduce.rs.

mod sim;
mod tiles;
use ironlink_device::abi::MAX_TILES;
use sim::*;
use tiles::*;

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
