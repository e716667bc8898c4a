//! The simulator with random yields at every memory operation and barrier (`IRONLINK_SIM_YIELD`),
//! which shakes out interleavings the OS scheduler rarely produces. Its own test binary, so the
//! setting (read once per process) does not slow the other suites.

mod sim;
use sim::*;

#[test]
fn all_reduce_under_random_yields() {
    std::env::set_var("IRONLINK_SIM_YIELD", "1");
    let world = 3;
    let mut node = Node::new(world, 1 << 16, 1 << 16);
    let mut rng = Rng::new(99);
    // One size for each algorithm: the one-shot LL path and the two-shot path.
    let cases = [(24usize, 256usize), (3000, 16384)];
    let mut wants = Vec::new();
    for (n, offset) in cases {
        let inputs: Vec<Vec<f64>> = (0..world)
            .map(|r| {
                fill(
                    &mut node,
                    r,
                    offset,
                    Dt::Bf16,
                    &(0..n).map(|_| rng.uniform(-2.0, 2.0)).collect::<Vec<_>>(),
                )
            })
            .collect();
        wants.push(reference(reduce_op::SUM, &inputs));
    }
    let st = node.run("random yields", 2, 16, |rank, ctx| {
        for (n, offset) in cases {
            let s = exports::symm_all_reduce(
                ctx,
                node.addr(rank, offset),
                0,
                n as i64,
                reduce_op::SUM,
                dtype::BFLOAT16,
            );
            if s != status::OK {
                return s;
            }
        }
        status::OK
    });
    assert_eq!(st, vec![status::OK; world]);
    for ((n, offset), want) in cases.iter().zip(&wants) {
        for r in 0..world {
            assert_close(
                &format!("rank {r} n={n}"),
                Dt::Bf16,
                &read(&node, r, *offset, Dt::Bf16, *n),
                want,
            );
        }
    }
}
