//! The simulator with random yields at every memory operation and barrier (`IRONLINK_SIM_YIELD`),
//! which shakes out interleavings the OS scheduler rarely produces. Its own test binary, so the
//! setting (read once per process) does not slow the other suites.

mod sim;
use sim::*;

#[test]
fn collectives_under_random_yields() {
    std::env::set_var("IRONLINK_SIM_YIELD", "1");
    let (world, ctas) = (3, 2);
    let mut node = Node::new(world, 1 << 16, 1 << 20);
    small_algorithm_limits(&mut node);
    let mut rng = Rng::new(99);
    let mut values = |n: usize| (0..n).map(|_| rng.uniform(-2.0, 2.0)).collect::<Vec<f32>>();
    // All-reduce cases (elements, offset, algorithm), in call order; n = 1 leaves a CTA idle.
    let ar = [
        (24usize, 256usize, Algorithm::OneShotLl),
        (1, 512, Algorithm::OneShotLl),
        (200, 1024, Algorithm::TwoShotLl),
        (3000, 16384, Algorithm::TwoShot),
        (20, 2048, Algorithm::OneShotLl),
    ];
    let mut ar_want = Vec::new();
    for (n, offset, alg) in ar {
        assert_eq!(choose(node.context(0), ctas, 2 * n), alg, "n={n}");
        let inputs: Vec<Vec<f64>> = (0..world)
            .map(|r| fill(&mut node, r, offset, Dt::Bf16, &values(n)))
            .collect();
        ar_want.push(reference(reduce_op::SUM, &inputs));
    }
    // all_gather of 100 bf16 per rank into 32768.., reduce_scatter of 3 x 100 at 40960 into 49152.
    let (n, ag_in, ag_out, rs_in, rs_out) =
        (100usize, 30720usize, 32768usize, 40960usize, 49152usize);
    assert!(use_ll(node.context(0), ctas, world * 2 * n, 2 * n));
    let ag_inputs: Vec<Vec<f64>> = (0..world)
        .map(|r| fill(&mut node, r, ag_in, Dt::Bf16, &values(n)))
        .collect();
    let rs_inputs: Vec<Vec<f64>> = (0..world)
        .map(|r| fill(&mut node, r, rs_in, Dt::Bf16, &values(world * n)))
        .collect();
    // Two-shot by stores in rounds (`two_shot_by_stores`, called directly: the dispatcher takes it only
    // from `PUSH_MIN_BYTES`): 4000 bf16 at 53248 take 6 rounds of 16 units per box here, reusing
    // buffers.
    // The round counters start 3 short of wrapping around u32, so the flags wrap mid-call.
    let (push_n, push_at) = (4000usize, 53248usize);
    node.set_round_counters(u32::MAX - 2);
    let push_inputs: Vec<Vec<f64>> = (0..world)
        .map(|r| fill(&mut node, r, push_at, Dt::Bf16, &values(push_n)))
        .collect();
    let push_want = reference(reduce_op::SUM, &push_inputs);
    let st = node.run("random yields", ctas as u32, 16, |rank, ctx| {
        use ironlink_device::collectives::all_reduce::two_shot_by_stores;
        use ironlink_device::runtime::{context::context, elem::Reduction, sync::Call};
        let push = context(ctx).and_then(|c| {
            let r = Region::new(c, node.addr(rank, push_at), 0, push_n as i64, 2)?;
            let call = Call::begin(c, 0)?;
            let red = Reduction {
                op: reduce_op::SUM,
                dtype: dtype::BFLOAT16,
            };
            two_shot_by_stores(&call, &r, &red)
        });
        if let Err(s) = push {
            return s;
        }
        for (n, offset, _) in ar {
            let at = node.addr(rank, offset);
            let s = api::symm_all_reduce(ctx, at, 0, n as i64, reduce_op::SUM, dtype::BFLOAT16);
            if s != status::OK {
                return s;
            }
        }
        let (agi, ago) = (node.addr(rank, ag_in), node.addr(rank, ag_out));
        let s = api::symm_all_gather(ctx, agi, ago, n as i64, dtype::BFLOAT16);
        if s != status::OK {
            return s;
        }
        let (rsi, rso) = (node.addr(rank, rs_in), node.addr(rank, rs_out));
        api::symm_reduce_scatter(ctx, rsi, rso, n as i64, reduce_op::SUM, dtype::BFLOAT16)
    });
    assert_eq!(st, vec![status::OK; world]);
    for ((n, offset, alg), want) in ar.iter().zip(&ar_want) {
        for r in 0..world {
            let got = read(&node, r, *offset, Dt::Bf16, *n);
            assert_close(
                &format!("all_reduce {alg:?} rank {r} n={n}"),
                Dt::Bf16,
                &got,
                want,
            );
        }
    }
    for r in 0..world {
        let got = read(&node, r, push_at, Dt::Bf16, push_n);
        assert_close(
            &format!("two_shot_by_stores rank {r}"),
            Dt::Bf16,
            &got,
            &push_want,
        );
    }
    let gathered: Vec<f64> = ag_inputs.concat();
    for r in 0..world {
        let got = read(&node, r, ag_out, Dt::Bf16, world * n);
        assert_close(&format!("all_gather rank {r}"), Dt::Bf16, &got, &gathered);
        let blocks: Vec<Vec<f64>> = rs_inputs
            .iter()
            .map(|v| v[r * n..(r + 1) * n].to_vec())
            .collect();
        let got = read(&node, r, rs_out, Dt::Bf16, n);
        assert_close(
            &format!("reduce_scatter rank {r}"),
            Dt::Bf16,
            &got,
            &reference(reduce_op::SUM, &blocks),
        );
    }
}

/// The LL tile all-reduce under random yields: 3 ranks, 2 CTAs, 12 tiles (tile t on CTA
/// (t + rank) % 2), each called with data and then empty, four times over in one launch, against
/// the f64 reference, bitwise equal across ranks. (The ranks stay too close in step here for a
/// wrong choice of LL half to show; `tile_ll.rs` makes them drift apart.)
#[test]
fn ll_tile_all_reduce_under_random_yields() {
    use ironlink_device::collectives::choice::{tile_all_reduce, TileAlgorithm};
    std::env::set_var("IRONLINK_SIM_YIELD", "1");
    let (world, ctas, tiles, cols, rounds) = (3, 2usize, 12usize, 70usize, 4usize);
    let mut node = Node::new(world, 1 << 16, 0);
    let mut rng = Rng::new(5);
    let at = |t: usize, k: usize| 4096 + (t * rounds + k) * 256;
    let mut want = Vec::new();
    for t in 0..tiles {
        assert_eq!(
            tile_all_reduce(node.context(0), t, 2 * cols, (2 * cols).div_ceil(8)),
            TileAlgorithm::OneShotLl
        );
        for k in 0..rounds {
            let inputs: Vec<Vec<f64>> = (0..world)
                .map(|r| {
                    let v: Vec<f32> = (0..cols).map(|_| rng.uniform(-2.0, 2.0)).collect();
                    fill(&mut node, r, at(t, k), Dt::Bf16, &v)
                })
                .collect();
            want.push(reference(reduce_op::SUM, &inputs));
        }
    }
    let st = node.run("ll tiles, random yields", ctas as u32, 16, |rank, ctx| {
        let cta = ironlink_device::hw::cta_rank() as usize;
        for k in 0..rounds {
            for t in (0..tiles).filter(|t| (t + rank) % ctas == cta) {
                for rows in [1, 0] {
                    let ptr = node.addr(rank, at(t, k));
                    let (c, sum, bf16) = (cols as i64, reduce_op::SUM, dtype::BFLOAT16);
                    let s = api::symm_tile_all_reduce(ctx, ptr, rows, c, c, t as i64, sum, bf16);
                    if s != status::OK {
                        return s;
                    }
                }
            }
        }
        status::OK
    });
    assert_eq!(st, vec![status::OK; world]);
    for t in 0..tiles {
        for k in 0..rounds {
            let got = read(&node, 0, at(t, k), Dt::Bf16, cols);
            assert_close(
                &format!("tile {t} call {k}"),
                Dt::Bf16,
                &got,
                &want[t * rounds + k],
            );
            for r in 1..world {
                assert_eq!(
                    read(&node, r, at(t, k), Dt::Bf16, cols),
                    got,
                    "tile {t} rank {r}"
                );
            }
        }
    }
}
