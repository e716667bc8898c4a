//! What the tile-call test binaries share (tile_all_reduce, tile_all_gather, tile_reduce_scatter,
//! tile_push, tile_arguments, grid_barrier): where their data sits in the heap and a matrix cut
//! into tiles, over the simulated node's helpers (`sim`).

#![allow(dead_code)] // Not every test binary uses every helper.

use crate::sim::*;

/// The grid barrier test's board: one u32 per CTA.
pub const BOARD: usize = 4096;
/// A word any CTA sets when it saw a stale board (the heap starts as guard bytes: cleared first).
pub const FLAG: usize = BOARD + 2048;

/// A matrix of `rows` x `cols` elements, rows `stride` elements apart, at `BASE`, cut into tiles
/// of `tr` x `tc` (edge tiles partial).
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    pub stride: usize,
    pub tr: usize,
    pub tc: usize,
}

pub const BASE: usize = 8192;

impl Matrix {
    pub fn tiles(&self) -> Vec<(usize, usize, usize, usize)> {
        let mut out = Vec::new();
        for i in (0..self.rows).step_by(self.tr) {
            for j in (0..self.cols).step_by(self.tc) {
                out.push((i, j, self.tr.min(self.rows - i), self.tc.min(self.cols - j)));
            }
        }
        out
    }

    pub fn at(&self, dt: Dt, i: usize, j: usize) -> usize {
        BASE + (i * self.stride + j) * dt.size()
    }

    pub fn fill(&self, node: &mut Node, rank: usize, dt: Dt, rng: &mut Rng, op: i32) -> Vec<f64> {
        let mut all = Vec::new();
        for i in 0..self.rows {
            let vals: Vec<f32> = (0..self.cols)
                .map(|_| {
                    if op == reduce_op::PROD {
                        rng.uniform(0.5, 1.5)
                    } else {
                        rng.uniform(-4.0, 4.0)
                    }
                })
                .collect();
            all.extend(fill(node, rank, self.at(dt, i, 0), dt, &vals));
        }
        all
    }

    pub fn read(&self, node: &Node, rank: usize, dt: Dt) -> Vec<f64> {
        (0..self.rows)
            .flat_map(|i| read(node, rank, self.at(dt, i, 0), dt, self.cols))
            .collect()
    }

    /// Every byte of the stride gaps and around the matrix is still a guard byte.
    pub fn assert_gaps(&self, node: &Node, dt: Dt, what: &str) {
        assert_guard(node, what, BASE - 64, BASE);
        for i in 0..self.rows {
            let end = self.at(dt, i, self.cols);
            let next = if i + 1 < self.rows {
                self.at(dt, i + 1, 0)
            } else {
                end + 64
            };
            assert_guard(node, what, end, next);
        }
    }
}
