//! Bad input gets a documented status and changes nothing; a peer that never arrives gives
//! TIMEOUT (recorded in the context) instead of a hang.

mod sim;
use ironlink_device::abi::{SymmContext, CTX_MAGIC};
use sim::*;

const N: i64 = 64;

fn node() -> Node {
    let mut node = Node::new(2, 1 << 16, 1 << 20);
    for r in 0..2 {
        fill(&mut node, r, 1024, Dt::F32, &[1.0; N as usize]);
    }
    node
}

/// Runs one all-reduce with the given arguments on both ranks and returns the statuses.
fn all_reduce(node: &Node, ptr_off: i64, byte_offset: i64, n: i64, op: i32, dt: i32) -> Vec<i32> {
    node.run("errors", 2, 32, |rank, ctx| {
        api::symm_all_reduce(ctx, node.addr(rank, 0) + ptr_off, byte_offset, n, op, dt)
    })
}

#[test]
fn argument_errors_write_nothing() {
    let node = node();
    let before: Vec<Vec<u8>> = (0..2).map(|r| node.heap(r).to_vec()).collect();
    let heap = node.heap_bytes as i64;
    let cases: [(&str, i64, i64, i64, i32, i32, i32); 8] = [
        (
            "unsupported op",
            1024,
            0,
            N,
            99,
            dtype::FLOAT32,
            status::UNSUPPORTED_OP,
        ),
        (
            "unsupported dtype",
            1024,
            0,
            N,
            reduce_op::SUM,
            7,
            status::UNSUPPORTED_DTYPE,
        ),
        (
            "past the heap end",
            heap - 16,
            0,
            N,
            reduce_op::SUM,
            dtype::FLOAT32,
            status::OUT_OF_BOUNDS,
        ),
        (
            "offset past the end",
            1024,
            heap,
            1,
            reduce_op::SUM,
            dtype::FLOAT32,
            status::OUT_OF_BOUNDS,
        ),
        (
            "before the heap",
            -4096,
            0,
            N,
            reduce_op::SUM,
            dtype::FLOAT32,
            status::OUT_OF_BOUNDS,
        ),
        (
            "misaligned f32",
            1026,
            0,
            N,
            reduce_op::SUM,
            dtype::FLOAT32,
            status::MISALIGNED,
        ),
        (
            "negative count",
            1024,
            0,
            -1,
            reduce_op::SUM,
            dtype::FLOAT32,
            status::INVALID_ARGUMENT,
        ),
        (
            "huge count",
            1024,
            0,
            i64::MAX / 2,
            reduce_op::SUM,
            dtype::FLOAT32,
            status::OUT_OF_BOUNDS,
        ),
    ];
    for (what, ptr_off, off, n, op, dt, want) in cases {
        assert_eq!(
            all_reduce(&node, ptr_off, off, n, op, dt),
            vec![want; 2],
            "{what}"
        );
    }
    for (r, before) in before.iter().enumerate() {
        assert!(
            node.heap(r) == &before[..],
            "rank {r}'s heap changed after rejected calls"
        );
        assert_eq!(
            node.recorded_error(r),
            0,
            "argument errors are returned, not recorded"
        );
    }
    // The rejected calls did not advance the epochs: a good call still works afterwards.
    assert_eq!(
        all_reduce(&node, 1024, 0, N, reduce_op::SUM, dtype::FLOAT32),
        vec![status::OK; 2]
    );
    assert_eq!(read(&node, 0, 1024, Dt::F32, 3), vec![2.0; 3]);
}

/// Reduce to a root checks its regions and its root before anything moves, in
/// `symm_reduce` and `symm_reduce_hierarchical` alike (on one node the latter runs the same
/// shape of call).
#[test]
fn reduce_argument_errors_write_nothing() {
    type Reduce = extern "C" fn(i64, i64, i64, i64, i32, i32, i32) -> i32;
    let calls: [(&str, Reduce); 2] = [
        ("symm_reduce", api::symm_reduce),
        ("symm_reduce_hierarchical", api::symm_reduce_hierarchical),
    ];
    let node = node();
    let before: Vec<Vec<u8>> = (0..2).map(|r| node.heap(r).to_vec()).collect();
    // (what, out's byte offset from the input's, root, status)
    let cases = [
        ("root below 0", 4096, -1, status::INVALID_ARGUMENT),
        ("root = world", 4096, 2, status::INVALID_ARGUMENT),
        ("out overlaps in, shifted", 4, 0, status::INVALID_ARGUMENT),
        ("bad root and overlap", 4, 7, status::INVALID_ARGUMENT),
        (
            "past the heap end",
            node.heap_bytes as i64,
            0,
            status::OUT_OF_BOUNDS,
        ),
    ];
    for (name, reduce) in calls {
        for (what, out_off, root, want) in cases {
            let st = node.run("reduce errors", 2, 32, |rank, ctx| {
                let input = node.addr(rank, 1024);
                reduce(
                    ctx,
                    input,
                    input + out_off,
                    N,
                    reduce_op::SUM,
                    dtype::FLOAT32,
                    root,
                )
            });
            assert_eq!(st, vec![want; 2], "{name}: {what}");
        }
    }
    for (r, before) in before.iter().enumerate() {
        assert!(
            node.heap(r) == &before[..],
            "rank {r}'s heap changed after rejected reduces"
        );
        assert_eq!(
            node.recorded_error(r),
            0,
            "argument errors are returned, not recorded"
        );
    }
    // In place and to the last rank: accepted. Root 1 holds 1 + 1 after the first call and
    // 1 (rank 0's, untouched) + 2 after the second.
    for (name, reduce) in calls {
        let st = node.run("reduce", 2, 32, |rank, ctx| {
            let input = node.addr(rank, 1024);
            reduce(ctx, input, input, N, reduce_op::SUM, dtype::FLOAT32, 1)
        });
        assert_eq!(st, vec![status::OK; 2], "{name}");
    }
    assert_eq!(read(&node, 1, 1024, Dt::F32, 3), vec![3.0; 3]);
    assert_eq!(read(&node, 0, 1024, Dt::F32, 3), vec![1.0; 3]);
}

#[test]
fn bad_contexts() {
    let node = node();
    let st = node.run("null", 1, 32, |rank, _| {
        api::symm_all_reduce(0, node.addr(rank, 1024), 0, N, 0, 0)
    });
    assert_eq!(st, vec![status::NULL_CONTEXT; 2]);
    let st = node.run("rank", 1, 32, |_, _| api::symm_rank(0));
    assert_eq!(st, vec![status::NULL_CONTEXT; 2]);

    let mut foreign = SymmContext::new(0, 2);
    foreign.magic = 0x1234_5678;
    let fp = &foreign as *const SymmContext as i64;
    let st = node.run("foreign", 1, 32, |rank, _| {
        api::symm_all_reduce(fp, node.addr(rank, 1024), 0, N, 0, 0)
    });
    assert_eq!(st, vec![status::UNKNOWN_CONTEXT; 2]);

    // Backend kinds this build does not serve (NVSHMEM is served: tests/nvshmem_backend.rs).
    for kind in [ironlink_device::abi::backend::NCCL, 0, 99] {
        let mut other_backend = SymmContext::new(0, 2);
        other_backend.backend = kind;
        let ob = &other_backend as *const SymmContext as i64;
        assert_eq!(
            node.run("other backend", 1, 32, |_, _| api::symm_world_size(ob)),
            vec![status::UNKNOWN_CONTEXT; 2],
            "backend kind {kind}"
        );
    }

    let mut old = SymmContext::new(0, 2);
    old.version = 0;
    assert_eq!(old.magic, CTX_MAGIC);
    let op = &old as *const SymmContext as i64;
    assert_eq!(
        node.run("old", 1, 32, |_, _| api::symm_rank(op)),
        vec![status::ABI_MISMATCH; 2]
    );
}

#[test]
fn peer_that_never_arrives_times_out() {
    for (what, n) in [("one-shot", 8i64), ("two-shot", 4096)] {
        let mut node = Node::new(2, 1 << 16, 1 << 20);
        for r in 0..2 {
            node.ctx_mut(r).timeout_ns = 100_000_000;
        }
        let t = std::time::Instant::now();
        let st = node.run(what, 2, 32, |rank, ctx| {
            if rank == 1 {
                return status::OK; // rank 1 never calls
            }
            api::symm_all_reduce(
                ctx,
                node.addr(rank, 1024),
                0,
                n,
                reduce_op::SUM,
                dtype::FLOAT32,
            )
        });
        assert_eq!(st, vec![status::TIMEOUT, status::OK], "{what}");
        assert_eq!(
            node.recorded_error(0),
            status::TIMEOUT,
            "{what}: the timeout is recorded for the host"
        );
        assert!(t.elapsed().as_secs() < 10, "{what}: took {:?}", t.elapsed());
    }
}

#[test]
fn peer_pointer_translation() {
    let node = node();
    let st = node.run("peer_ptr", 1, 32, |rank, ctx| {
        let local = node.addr(rank, 100);
        let ok = (0..2).all(|p| api::symm_peer_ptr(ctx, local, p) == node.addr(p as usize, 100));
        let outside = api::symm_peer_ptr(ctx, node.addr(rank, 0) + node.heap_bytes as i64 + 1, 1);
        let bad_peer = api::symm_peer_ptr(ctx, local, 2);
        let checked = api::symm_peer_ptr_checked(ctx, local, node.heap_bytes as i64, 1);
        (ok && outside == 0 && bad_peer == 0 && checked == status::OUT_OF_BOUNDS as i64) as i32
    });
    assert_eq!(st, vec![1, 1]);
}
