//! The tile-scoped reduce-scatter (`symm_tile_reduce_scatter`).

mod sim;
mod tiles;
use ironlink_device::hw::cta_rank;
use sim::*;
use tiles::*;

/// Tile reduce-scatter: rank p's output tile gets block p of every rank's input, reduced in rank
/// order; in place (the output is the rank's own block) and out of place, run twice.
#[test]
#[allow(clippy::needless_range_loop)] // ranks and blocks index the same tables: clearer by index
fn tile_reduce_scatter_reduces_each_block_into_its_rank() {
    let mut rng = Rng::new(11);
    for world in [2, 3, 4] {
        for in_place in [false, true] {
            for dt in Dt::ALL {
                let (rows, cols, stride) = (6, 21, 24);
                let block = rows * stride; // stacked blocks
                let out_base = BASE + (world + 1) * block * dt.size();
                let m = Matrix {
                    rows,
                    cols,
                    stride,
                    tr: 4,
                    tc: 16,
                };
                let tiles = m.tiles();
                let op = OPS[world % OPS.len()];
                let mut node = Node::new(world, 1 << 16, 1 << 16);
                // inputs[r][p]: rank r's block p, row by row.
                let inputs: Vec<Vec<Vec<f64>>> = (0..world)
                    .map(|r| {
                        (0..world)
                            .map(|p| {
                                let mut all = Vec::new();
                                for i in 0..rows {
                                    let vals: Vec<f32> =
                                        (0..cols).map(|_| rng.uniform(-4.0, 4.0)).collect();
                                    let off = BASE + (p * block + i * stride) * dt.size();
                                    all.extend(fill(&mut node, r, off, dt, &vals));
                                }
                                all
                            })
                            .collect()
                    })
                    .collect();
                let what =
                    format!("tile reduce_scatter world={world} in_place={in_place} {dt:?} op={op}");
                let out_at = |rank: usize, i: usize, j: usize| {
                    if in_place {
                        BASE + (rank * block + i * stride + j) * dt.size()
                    } else {
                        out_base + (i * stride + j) * dt.size()
                    }
                };
                let st = node.run(&what, 2, 32, |rank, ctx| {
                    let cta = cta_rank() as usize;
                    let mine = tiles
                        .iter()
                        .enumerate()
                        .filter(|(t, _)| (t + rank) % 2 == cta);
                    first_failure(mine, |(t, &(i0, j0, r, c))| {
                        api::symm_tile_reduce_scatter(
                            ctx,
                            node.addr(rank, BASE + (i0 * stride + j0) * dt.size()),
                            node.addr(rank, out_at(rank, i0, j0)),
                            r as i64,
                            c as i64,
                            stride as i64,
                            block as i64,
                            t as i64,
                            op,
                            dt.code(),
                        )
                    })
                });
                assert_eq!(st, vec![status::OK; world], "{what}");
                for r in 0..world {
                    let got: Vec<f64> = (0..rows)
                        .flat_map(|i| read(&node, r, out_at(r, i, 0), dt, cols))
                        .collect();
                    let theirs: Vec<Vec<f64>> = (0..world).map(|p| inputs[p][r].clone()).collect();
                    if op != reduce_op::PROD {
                        assert_close(
                            &format!("{what} rank {r}"),
                            dt,
                            &got,
                            &reference(op, &theirs),
                        );
                    }
                }
                if !in_place {
                    // The inputs are untouched.
                    for r in 0..world {
                        for p in 0..world {
                            let got: Vec<f64> = (0..rows)
                                .flat_map(|i| {
                                    read(
                                        &node,
                                        r,
                                        BASE + (p * block + i * stride) * dt.size(),
                                        dt,
                                        cols,
                                    )
                                })
                                .collect();
                            assert_eq!(
                                got, inputs[r][p],
                                "{what}: rank {r}'s input block {p} changed"
                            );
                        }
                    }
                }
            }
        }
    }
}
