//! The NVSHMEM backend kind on one node: a context whose every peer is mapped runs the same
//! algorithms as P2P (bit for bit the same results). The host refuses to build one with an
//! unmapped peer (tests/cpu/test_nvshmem_backend.py); the device does not check the addresses again
//! (doing so in every function made two of them spill on sm_100).

mod sim;
use ironlink_device::abi::backend;
use sim::*;

const WORLD: usize = 4;
const HEAP: usize = 1 << 16;
const SCRATCH: usize = 1 << 20;

/// A node whose contexts carry `kind`, with the small algorithm limits (every algorithm is
/// reached below 8 KiB) and the same deterministic data on every call.
fn node(kind: u32) -> Node {
    let mut node = Node::new(WORLD, HEAP, SCRATCH);
    small_algorithm_limits(&mut node);
    for r in 0..WORLD {
        node.ctx_mut(r).backend = kind;
    }
    let mut rng = Rng::new(19);
    for r in 0..WORLD {
        let values: Vec<f32> = (0..HEAP / 4).map(|_| rng.uniform(-2.0, 2.0)).collect();
        fill(&mut node, r, 0, Dt::F32, &values);
    }
    node
}

/// One collective call on every rank: (name, body(rank, ctx, node) -> status).
type Call = (&'static str, fn(usize, i64, &Node) -> i32);

/// Byte offsets of the inputs and outputs below (disjoint, inside `HEAP`).
const IN: usize = 0;
const OUT: usize = 1 << 15;

fn calls() -> Vec<Call> {
    vec![
        // 8, 128 and 2048 floats: one-shot LL, two-shot LL, two-shot over the buffers.
        ("all_reduce one-shot", |r, c, n| {
            api::symm_all_reduce(c, n.addr(r, IN), 0, 8, reduce_op::SUM, dtype::FLOAT32)
        }),
        ("all_reduce two-shot LL", |r, c, n| {
            api::symm_all_reduce(c, n.addr(r, IN), 0, 128, reduce_op::MAX, dtype::FLOAT32)
        }),
        ("all_reduce two-shot", |r, c, n| {
            api::symm_all_reduce(c, n.addr(r, IN), 0, 2048, reduce_op::SUM, dtype::BFLOAT16)
        }),
        ("all_gather LL", |r, c, n| {
            api::symm_all_gather(c, n.addr(r, IN), n.addr(r, OUT), 64, dtype::FLOAT32)
        }),
        ("all_gather bulk", |r, c, n| {
            api::symm_all_gather(c, n.addr(r, IN), n.addr(r, OUT), 1024, dtype::FLOAT32)
        }),
        ("reduce_scatter LL", |r, c, n| {
            api::symm_reduce_scatter(c, n.addr(r, IN), n.addr(r, OUT), 64, reduce_op::SUM, 0)
        }),
        ("reduce_scatter bulk", |r, c, n| {
            api::symm_reduce_scatter(c, n.addr(r, IN), n.addr(r, OUT), 1024, reduce_op::SUM, 0)
        }),
        ("broadcast", |r, c, n| {
            api::symm_broadcast(c, n.addr(r, IN), 1000, dtype::FLOAT16, 2)
        }),
        ("all_to_all", |r, c, n| {
            api::symm_all_to_all(c, n.addr(r, IN), n.addr(r, OUT), 256, dtype::FLOAT32)
        }),
    ]
}

/// Every collective runs over NVSHMEM-kind contexts exactly as over P2P ones: OK on every rank and
/// every rank's heap the same bytes afterwards.
#[test]
fn nvshmem_context_runs_every_collective_like_p2p() {
    for (name, body) in calls() {
        let p2p = node(backend::P2P);
        let nvshmem = node(backend::NVSHMEM);
        for (n, kind) in [(&p2p, "p2p"), (&nvshmem, "nvshmem")] {
            let st = n.run(name, 2, 64, |r, c| body(r, c, n));
            assert_eq!(st, vec![status::OK; WORLD], "{name} over {kind}");
        }
        for r in 0..WORLD {
            assert!(
                p2p.heap(r) == nvshmem.heap(r),
                "{name}: rank {r}'s heap differs between the P2P and NVSHMEM contexts"
            );
        }
    }
    // And the results are right, not only equal: an all-reduce against the reference.
    let mut n = node(backend::NVSHMEM);
    let ins: Vec<Vec<f64>> = (0..WORLD)
        .map(|r| fill(&mut n, r, IN, Dt::F32, &[r as f32 + 0.5; 300]))
        .collect();
    let st = n.run("all_reduce", 2, 64, |r, c| {
        api::symm_all_reduce(c, n.addr(r, IN), 0, 300, reduce_op::SUM, dtype::FLOAT32)
    });
    assert_eq!(st, vec![status::OK; WORLD]);
    let want = reference(reduce_op::SUM, &ins);
    for r in 0..WORLD {
        assert_close("all_reduce", Dt::F32, &read(&n, r, IN, Dt::F32, 300), &want);
    }
}

/// The same hole in a P2P context is not looked at (the host maps every peer or fails), and an
/// NVSHMEM context without a scratch region (PyTorch's tensors) needs no scratch addresses.
#[test]
fn only_nvshmem_contexts_are_checked_and_scratch_only_when_present() {
    let mut p2p = node(backend::P2P);
    p2p.ctx_mut(0).peer_scratch[1] = 0;
    let st = p2p.run("world_size", 1, 32, |_, c| api::symm_world_size(c));
    assert_eq!(st, vec![WORLD as i32; WORLD]);

    let mut no_scratch = node(backend::NVSHMEM);
    for r in 0..WORLD {
        let c = no_scratch.ctx_mut(r);
        c.scratch_size = 0;
        c.peer_scratch = [0; ironlink_device::abi::MAX_RANKS];
    }
    let st = no_scratch.run("world_size", 1, 32, |_, c| api::symm_world_size(c));
    assert_eq!(st, vec![WORLD as i32; WORLD]);
    // Entries past the world size are 0 in every context and are not peers.
    assert_eq!(no_scratch.context(0).peer_heap[WORLD], 0);
}
