//! Element types and reduce operations, on 32-bit words.
//!
//! Data moves in words (one f32, or two f16/bf16); arithmetic is in f32, so half types
//! accumulate in f32 and round once at the end. Every rank combines the same values in the same
//! order (rank 0 first), so results are bitwise identical across ranks.
//!
//! The dtype is a run-time value, not a type parameter: one copy of each collective serves all
//! dtypes. Three monomorphized copies of the all-reduce made the inlined kernel large enough for
//! ptxas to start spilling; a per-word `match` on a CTA-uniform value costs a few predicated
//! instructions in a memory-bound loop.

use crate::abi::{dtype, reduce_op};
use crate::hw;

/// Whether this build implements `op`.
pub fn op_supported(op: i32) -> bool {
    matches!(
        op,
        reduce_op::SUM | reduce_op::MAX | reduce_op::MIN | reduce_op::PROD | reduce_op::AVG
    )
}

/// A reduction: which op, over which dtype (both checked by the caller).
#[derive(Clone, Copy)]
pub struct Reduction {
    pub op: i32,
    pub dtype: i32,
}

impl Reduction {
    /// The word's elements as f32 (the second lane is unused for f32).
    #[inline(always)]
    fn unpack(&self, w: u32) -> [f32; 2] {
        match self.dtype {
            dtype::FLOAT16 => [hw::f16_to_f32(w as u16), hw::f16_to_f32((w >> 16) as u16)],
            dtype::BFLOAT16 => [f32::from_bits(w << 16), f32::from_bits(w & 0xffff_0000)],
            _ => [f32::from_bits(w), 0.0],
        }
    }

    /// Packs f32 lanes into a word, rounding to nearest even.
    #[inline(always)]
    fn pack(&self, l: [f32; 2]) -> u32 {
        match self.dtype {
            dtype::FLOAT16 => hw::f32_to_f16(l[0]) as u32 | (hw::f32_to_f16(l[1]) as u32) << 16,
            dtype::BFLOAT16 => hw::f32_to_bf16(l[0]) as u32 | (hw::f32_to_bf16(l[1]) as u32) << 16,
            _ => l[0].to_bits(),
        }
    }

    /// `a op b` for one lane (AVG sums here and scales in `finish`).
    #[inline(always)]
    fn combine(&self, a: f32, b: f32) -> f32 {
        match self.op {
            reduce_op::MAX => a.max(b),
            reduce_op::MIN => a.min(b),
            reduce_op::PROD => a * b,
            _ => a + b,
        }
    }

    /// Final step of a reduction over `n` ranks.
    #[inline(always)]
    fn finish(&self, a: f32, n: usize) -> f32 {
        if self.op == reduce_op::AVG {
            a * reciprocal(n)
        } else {
            a
        }
    }
}

/// `1 / n` for the ranks of one node (n <= MAX_RANKS), as a constant: an f32 division is a
/// subroutine call in SASS (see `mem::div32`). Exact for powers of two; otherwise the nearest
/// f32, the same on every rank. Larger worlds (several nodes) use `Acc::finish_scaled`.
#[inline(always)]
fn reciprocal(n: usize) -> f32 {
    match n {
        1 => 1.0,
        2 => 0.5,
        3 => 1.0 / 3.0,
        4 => 0.25,
        5 => 0.2,
        6 => 1.0 / 6.0,
        7 => 1.0 / 7.0,
        _ => 0.125,
    }
}

/// An f32 accumulator for `W` words of elements.
pub struct Acc<const W: usize> {
    lanes: [[f32; 2]; W],
}

impl<const W: usize> Acc<W> {
    /// An accumulator to overwrite with `first` (a placeholder for arrays of them).
    #[inline(always)]
    pub const fn zero() -> Self {
        Acc {
            lanes: [[0.0; 2]; W],
        }
    }

    #[inline(always)]
    pub fn first(red: &Reduction, words: [u32; W]) -> Self {
        let mut lanes = [[0.0; 2]; W];
        let mut i = 0;
        while i < W {
            lanes[i] = red.unpack(words[i]);
            i += 1;
        }
        Acc { lanes }
    }

    #[inline(always)]
    pub fn add(&mut self, red: &Reduction, words: [u32; W]) {
        let mut i = 0;
        while i < W {
            let l = red.unpack(words[i]);
            self.lanes[i][0] = red.combine(self.lanes[i][0], l[0]);
            self.lanes[i][1] = red.combine(self.lanes[i][1], l[1]);
            i += 1;
        }
    }

    #[inline(always)]
    pub fn finish(&self, red: &Reduction, n: usize) -> [u32; W] {
        let mut out = [0u32; W];
        let mut i = 0;
        while i < W {
            let l = self.lanes[i];
            out[i] = red.pack([red.finish(l[0], n), red.finish(l[1], n)]);
            i += 1;
        }
        out
    }

    /// `finish` over any number of ranks: AVG multiplies by `inv`, which the caller computed
    /// once as `1.0 / n` (the same f32 as `reciprocal(n)` where both exist: each is `1 / n`
    /// correctly rounded).
    #[inline(always)]
    pub fn finish_scaled(&self, red: &Reduction, inv: f32) -> [u32; W] {
        let mut out = [0u32; W];
        let mut i = 0;
        while i < W {
            let l = self.lanes[i];
            let scale = |a: f32| if red.op == reduce_op::AVG { a * inv } else { a };
            out[i] = red.pack([scale(l[0]), scale(l[1])]);
            i += 1;
        }
        out
    }
}
