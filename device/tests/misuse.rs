//! Misuse that would otherwise corrupt silently or time out without a cause: ranks whose heaps
//! saw different allocations (`HEAP_ASYMMETRIC`) and one call launched with different grids on
//! different ranks (`GRID_MISMATCH`). Each is reported on every rank, recorded in every rank's
//! context, before the call moves any data (the heaps are left as they were). And a rank that
//! stops making calls: its peer's later calls give up at once instead of each waiting out the
//! timeout.

mod sim;
use ironlink_device::abi::heap_digest::{fold, ALLOC, EMPTY, FREE};
use sim::*;

const HEAP: usize = 1 << 20;
const N: usize = 4096; // f32 elements: 16 KiB, two-shot under `small_algorithm_limits`
const IN: usize = 0;
const OUT: usize = 64 << 10;

/// A node whose heaps hold the same inputs on every rank, with digests `digests[rank]`.
fn node(world: usize, digests: &[u64]) -> Node {
    let mut node = Node::new(world, HEAP, 1 << 20);
    small_algorithm_limits(&mut node);
    let mut rng = Rng::new(40);
    for (r, &digest) in digests.iter().enumerate() {
        let v: Vec<f32> = (0..N * world).map(|_| rng.uniform(-4.0, 4.0)).collect();
        fill(&mut node, r, IN, Dt::F32, &v);
        node.ctx_mut(r).heap_digest = digest;
    }
    node
}

/// Every rank's heap, to compare after a call that must not have moved any data.
fn heaps(node: &Node) -> Vec<Vec<u8>> {
    (0..node.world).map(|r| node.heap(r).to_vec()).collect()
}

/// Every rank recorded `error` and its heap is still `before[rank]`.
fn assert_reported_before_any_data_moved(node: &Node, before: &[Vec<u8>], error: i32, label: &str) {
    for (r, heap) in before.iter().enumerate() {
        assert_eq!(node.recorded_error(r), error, "{label}: rank {r} recorded");
        assert!(
            node.heap(r) == heap.as_slice(),
            "{label}: rank {r}'s heap was written"
        );
    }
}

/// Waits of `node` time out after 300 ms: CTAs beyond a peer's grid have no partner.
fn short_timeouts(node: &mut Node) {
    for r in 0..node.world {
        node.ctx_mut(r).timeout_ns = 300_000_000;
    }
}

/// The f32 SUM all-reduce of the first `n` elements at `IN`, on `rank`.
fn all_reduce_sum(node: &Node, rank: usize, ctx: i64, n: usize) -> i32 {
    let at = node.addr(rank, IN);
    api::symm_all_reduce(ctx, at, 0, n as i64, reduce_op::SUM, dtype::FLOAT32)
}

/// Runs `all_reduce_sum` of `n` elements on both ranks of `node` (labelled `label`) and checks
/// the sum (`what`) on each.
fn assert_all_reduce_sums(node: &Node, n: usize, label: &str, what: &str) {
    let inputs: Vec<Vec<f64>> = (0..2).map(|r| read(node, r, IN, Dt::F32, n)).collect();
    let st = node.run(label, 2, 32, |r, ctx| all_reduce_sum(node, r, ctx, n));
    assert_eq!(st, vec![status::OK; 2]);
    let want = reference(reduce_op::SUM, &inputs);
    for r in 0..2 {
        assert_close(what, Dt::F32, &read(node, r, IN, Dt::F32, n), &want);
    }
}

/// One rank's part of a call: (node, rank, ctx) -> status.
type RankCall = Box<dyn Fn(&Node, usize, i64) -> i32 + Sync>;

/// Every barrier-bearing call a rank can make on these buffers, by name.
fn calls() -> Vec<(&'static str, RankCall)> {
    let f32 = dtype::FLOAT32;
    let sum = reduce_op::SUM;
    let n = N as i64;
    vec![
        (
            "all_reduce",
            Box::new(move |node: &Node, r, ctx| all_reduce_sum(node, r, ctx, N)),
        ),
        (
            "all_gather",
            Box::new(move |node: &Node, r, ctx| {
                api::symm_all_gather(ctx, node.addr(r, IN), node.addr(r, OUT), n, f32)
            }),
        ),
        (
            "reduce_scatter",
            Box::new(move |node: &Node, r, ctx| {
                api::symm_reduce_scatter(ctx, node.addr(r, IN), node.addr(r, OUT), n, sum, f32)
            }),
        ),
        (
            "broadcast",
            Box::new(move |node: &Node, r, ctx| {
                api::symm_broadcast(ctx, node.addr(r, IN), n, f32, 0)
            }),
        ),
        (
            "all_to_all",
            Box::new(move |node: &Node, r, ctx| {
                api::symm_all_to_all(ctx, node.addr(r, IN), node.addr(r, OUT), n, f32)
            }),
        ),
        (
            // A kernel's own barrier (MoeExchange's direct and relay paths reach the peers'
            // buffers after it): the check alone, no data of its own.
            "barrier",
            Box::new(move |_: &Node, _, ctx| api::symm_barrier(ctx)),
        ),
        (
            // 64 x 128 f32 = 32 KiB: past the LL tile limit, a two-shot tile call; CTA c
            // reduces tile c.
            "tile_all_reduce",
            Box::new(move |node: &Node, r, ctx| {
                let tile = ironlink_device::hw::cta_rank() as usize;
                let at = node.addr(r, IN + tile * (32 << 10));
                api::symm_tile_all_reduce(ctx, at, 64, 128, 128, tile as i64, sum, f32)
            }),
        ),
        (
            // `world` blocks of 8 x 128 f32 (4 KiB each) a tile, CTA c reducing tile c's block
            // `rank` into 4 KiB at OUT.
            "tile_reduce_scatter",
            Box::new(move |node: &Node, r, ctx| {
                let tile = ironlink_device::hw::cta_rank() as usize;
                let input = node.addr(r, IN + tile * (32 << 10));
                let out = node.addr(r, OUT + tile * (4 << 10));
                api::symm_tile_reduce_scatter(
                    ctx,
                    input,
                    out,
                    8,
                    128,
                    128,
                    8 * 128,
                    tile as i64,
                    sum,
                    f32,
                )
            }),
        ),
    ]
}

/// The digest after allocating `sizes` in turn from an empty heap (as the host's first-fit
/// allocator places them: back to back, 256-byte aligned).
fn allocated(sizes: &[u64]) -> u64 {
    let mut d = EMPTY;
    let mut at = 0;
    for &s in sizes {
        d = fold(d, ALLOC, at, s);
        at += s.div_ceil(256) * 256;
    }
    d
}

#[test]
fn asymmetric_heaps_are_reported_on_every_rank_before_any_data_moves() {
    let same = allocated(&[4096, 512]);
    // One rank allocated another size; one allocated an extra tensor; one freed one the others
    // kept.
    let cases: [(&str, u64); 3] = [
        ("another size", allocated(&[4096, 768])),
        ("an extra allocation", allocated(&[4096, 512, 256])),
        ("an extra free", fold(same, FREE, 4096, 512)),
    ];
    for world in [2, 3, 4] {
        for (what, odd) in cases {
            for (name, call) in calls() {
                let mut digests = vec![same; world];
                digests[world - 1] = odd;
                let node = node(world, &digests);
                let before = heaps(&node);
                let label = format!("{name}, world {world}, {what}");
                let st = node.run(&label, 2, 32, |r, ctx| call(&node, r, ctx));
                assert_eq!(st, vec![status::HEAP_ASYMMETRIC; world], "{label}");
                assert_reported_before_any_data_moved(
                    &node,
                    &before,
                    status::HEAP_ASYMMETRIC,
                    &label,
                );
            }
        }
    }
}

#[test]
fn symmetric_heaps_pass_and_compute() {
    let d = allocated(&[4096, 512]);
    for (name, call) in calls() {
        let node = node(2, &[d, d]);
        let st = node.run(name, 2, 32, |r, ctx| call(&node, r, ctx));
        assert_eq!(st, vec![status::OK; 2], "{name}");
        assert_eq!(
            (node.recorded_error(0), node.recorded_error(1)),
            (0, 0),
            "{name}"
        );
    }
    // And the answer is right (the check changes nothing on a good call).
    assert_all_reduce_sums(&node(2, &[d, d]), N, "all_reduce values", "all_reduce");
}

/// LL all-reduces read only this rank's buffer and the scratch region: they need no entry
/// barrier, compare no digests, and compute the right answer on asymmetric heaps too.
#[test]
fn ll_all_reduce_does_not_depend_on_the_heaps() {
    let node = node(2, &[allocated(&[4096]), allocated(&[8192])]);
    assert_all_reduce_sums(&node, 8, "one-shot LL", "one-shot LL");
}

#[test]
fn different_grids_are_reported_on_every_rank() {
    // The last rank launches the call on more CTAs than the others, then on fewer.
    let grids_of = |world: usize, odd: u32| {
        let mut g = vec![2u32; world];
        g[world - 1] = odd;
        g
    };
    for world in [2, 3] {
        for odd in [4u32, 1] {
            for (name, call) in calls() {
                if name.starts_with("tile_") {
                    continue; // a tile call runs on whichever CTA: grids may differ
                }
                let grids = grids_of(world, odd);
                let mut node = node(world, &vec![allocated(&[4096]); world]);
                short_timeouts(&mut node);
                let before = heaps(&node);
                let label = format!("{name}, grids {grids:?}");
                let t = std::time::Instant::now();
                let st = node.run_grids(&label, &grids, 32, |r, ctx| call(&node, r, ctx));
                assert_eq!(st, vec![vec![status::GRID_MISMATCH]; world], "{label}");
                assert_reported_before_any_data_moved(
                    &node,
                    &before,
                    status::GRID_MISMATCH,
                    &label,
                );
                assert!(t.elapsed().as_secs() < 8, "{label}: took {:?}", t.elapsed());
            }
        }
    }
}

/// The LL paths have no entry barrier: their packets carry the sender's grid instead
/// (`ll_packet::Flags`), so a packet from a peer on another grid is never taken, and when the wait
/// times out it is told apart from one never written; a rank whose grid took a barrier path for
/// the same bytes finds the LL rank's announced call word (`Call::announce`). Every rank records
/// GRID_MISMATCH after the timeout, its CTAs with a partner return it, and no input is written
/// (issue 62).
#[test]
fn different_grids_on_the_ll_paths_are_reported_on_every_rank() {
    let (f32, sum) = (dtype::FLOAT32, reduce_op::SUM);
    // Sizes under `small_algorithm_limits`: one-shot LL up to 64 bytes, two-shot LL to 1 KiB,
    // all_gather / reduce_scatter LL to 4 KiB of output.
    let cases: Vec<(&str, RankCall)> = vec![
        (
            "one-shot LL all_reduce",
            Box::new(|node: &Node, r, ctx| all_reduce_sum(node, r, ctx, 16)),
        ),
        (
            // 120 units (960 bytes): whole shards at worlds 2 and 3. With a shorter last shard, a thread of the
            // last rank with no unit of its own to reduce waits in the gather and, timed out,
            // stores what its slots held (all_reduce::two_shot_ll; docs/reliability.md).
            "two-shot LL all_reduce",
            Box::new(|node: &Node, r, ctx| all_reduce_sum(node, r, ctx, 240)),
        ),
        (
            "LL all_gather",
            Box::new(move |node: &Node, r, ctx| {
                api::symm_all_gather(ctx, node.addr(r, IN), node.addr(r, OUT), 64, f32)
            }),
        ),
        (
            "LL reduce_scatter",
            Box::new(move |node: &Node, r, ctx| {
                api::symm_reduce_scatter(ctx, node.addr(r, IN), node.addr(r, OUT), 64, sum, f32)
            }),
        ),
    ];
    for world in [2, 3] {
        for odd in [4u32, 1] {
            for (name, call) in &cases {
                let mut grids = vec![2u32; world];
                grids[world - 1] = odd;
                let mut node = node(world, &vec![allocated(&[4096]); world]);
                short_timeouts(&mut node);
                let inputs: Vec<Vec<u8>> =
                    (0..world).map(|r| node.heap(r)[IN..OUT].to_vec()).collect();
                let label = format!("{name}, grids {grids:?}");
                let t = std::time::Instant::now();
                let st = node.run_grids(&label, &grids, 32, |r, ctx| call(&node, r, ctx));
                // A CTA with no partner on the other grid times out beside its siblings that find
                // the mismatch: it may return TIMEOUT; what the rank records is the mismatch.
                for (r, seen) in st.iter().enumerate() {
                    assert!(
                        seen.contains(&status::GRID_MISMATCH),
                        "{label}: rank {r} returned {seen:?}"
                    );
                    assert!(
                        seen.iter()
                            .all(|&s| s == status::GRID_MISMATCH || s == status::TIMEOUT),
                        "{label}: rank {r} returned {seen:?}"
                    );
                }
                for (r, input) in inputs.iter().enumerate() {
                    assert_eq!(
                        node.recorded_error(r),
                        status::GRID_MISMATCH,
                        "{label}: rank {r} recorded"
                    );
                    // all_gather copies its own block to its output first; the inputs stay as they were.
                    assert!(
                        node.heap(r)[IN..OUT] == input[..],
                        "{label}: rank {r}'s input was written"
                    );
                }
                assert!(t.elapsed().as_secs() < 8, "{label}: took {:?}", t.elapsed());
            }
        }
    }
}

#[test]
fn grid_mismatch_wins_over_an_asymmetric_heap() {
    let mut node = node(2, &[allocated(&[4096]), allocated(&[512])]);
    short_timeouts(&mut node);
    let st = node.run_grids("both", &[2, 3], 32, |r, ctx| {
        all_reduce_sum(&node, r, ctx, N)
    });
    assert_eq!(st, vec![vec![status::GRID_MISMATCH]; 2]);
}

/// A rank that stops making calls: the calls its peer makes after the first failure (as a CUDA
/// graph of many calls replays them) give up at once instead of each waiting out the timeout,
/// on every kind of call, so the host can raise after about one timeout.
#[test]
fn calls_after_a_lost_peer_end_in_one_timeout_not_one_each() {
    const CALLS: usize = 5;
    for (name, call) in calls() {
        let mut node = node(2, &[allocated(&[4096]); 2]);
        for r in 0..2 {
            node.ctx_mut(r).timeout_ns = 1_000_000_000;
        }
        let label = format!("{CALLS} x {name}, rank 1 absent");
        let t = std::time::Instant::now();
        let st = node.run_worst(&label, 2, 32, |r, ctx| {
            if r == 1 {
                return status::OK; // the lost rank
            }
            let got: Vec<i32> = (0..CALLS).map(|_| call(&node, r, ctx)).collect();
            assert!(
                got.iter().all(|&s| s == status::TIMEOUT),
                "{label}: {got:?}"
            );
            status::TIMEOUT
        });
        assert_eq!(st, vec![status::TIMEOUT, status::OK], "{label}");
        assert_eq!(node.recorded_error(0), status::TIMEOUT, "{label}");
        // What makes the later waits give up: the recorded failure set rank 0's wait timeout
        // to 0 (the host puts it back when it clears the error); rank 1 recorded nothing.
        assert_eq!(node.ctx_mut(0).timeout_ns, 0, "{label}");
        assert_eq!(node.ctx_mut(1).timeout_ns, 1_000_000_000, "{label}");
        // One timeout each would be 5 s; one in all is 1 s and the launch.
        assert!(
            t.elapsed().as_millis() < 3000,
            "{label}: took {:?}",
            t.elapsed()
        );
    }
}

/// A recorded error that is not a failure among ranks (here `CAPACITY_EXCEEDED`, which an
/// all_to_all_v over its capacity records) leaves the next calls' waits alone: they compute.
#[test]
fn an_error_on_one_rank_alone_does_not_stop_the_next_calls() {
    let mut node = node(2, &[allocated(&[4096]); 2]);
    node.ctx_mut(0).error = status::CAPACITY_EXCEEDED;
    assert_all_reduce_sums(&node, N, "after CAPACITY_EXCEEDED", "sum");
    assert_eq!(node.recorded_error(0), status::CAPACITY_EXCEEDED);
    assert_ne!(
        node.ctx_mut(0).timeout_ns,
        0,
        "a rank's own error keeps its wait timeout"
    );
}
