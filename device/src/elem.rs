//! Element types and reduce operations, on 32-bit words.
//!
//! Data moves in words (one f32, or two f16/bf16); arithmetic is in f32, so half types
//! accumulate in f32 and round once at the end. Every rank combines the same values in the same
//! order (rank 0 first), so results are bitwise identical across ranks.

use crate::abi::reduce_op;
use crate::hw;

/// An element type, as the word-level operations the collectives need.
pub trait Elem {
    /// Elements per 32-bit word.
    const PER_WORD: usize;
    /// Bytes per element.
    const SIZE: usize = 4 / Self::PER_WORD;
    /// The word's elements as f32 (lanes past `PER_WORD` are unused).
    fn unpack(w: u32) -> [f32; 2];
    /// Packs `PER_WORD` f32 lanes into a word, rounding to nearest even.
    fn pack(l: [f32; 2]) -> u32;
}

pub struct F32;
pub struct F16;
pub struct Bf16;

impl Elem for F32 {
    const PER_WORD: usize = 1;
    #[inline(always)]
    fn unpack(w: u32) -> [f32; 2] {
        [f32::from_bits(w), 0.0]
    }
    #[inline(always)]
    fn pack(l: [f32; 2]) -> u32 {
        l[0].to_bits()
    }
}

impl Elem for F16 {
    const PER_WORD: usize = 2;
    #[inline(always)]
    fn unpack(w: u32) -> [f32; 2] {
        [hw::f16_to_f32(w as u16), hw::f16_to_f32((w >> 16) as u16)]
    }
    #[inline(always)]
    fn pack(l: [f32; 2]) -> u32 {
        hw::f32_to_f16(l[0]) as u32 | (hw::f32_to_f16(l[1]) as u32) << 16
    }
}

impl Elem for Bf16 {
    const PER_WORD: usize = 2;
    #[inline(always)]
    fn unpack(w: u32) -> [f32; 2] {
        [f32::from_bits(w << 16), f32::from_bits(w & 0xffff_0000)]
    }
    #[inline(always)]
    fn pack(l: [f32; 2]) -> u32 {
        hw::f32_to_bf16(l[0]) as u32 | (hw::f32_to_bf16(l[1]) as u32) << 16
    }
}

/// Whether this build implements `op`.
pub fn op_supported(op: i32) -> bool {
    matches!(
        op,
        reduce_op::SUM | reduce_op::MAX | reduce_op::MIN | reduce_op::PROD | reduce_op::AVG
    )
}

/// `a op b` for one lane (AVG sums here and divides in `finish`).
#[inline(always)]
pub fn combine(op: i32, a: f32, b: f32) -> f32 {
    match op {
        reduce_op::MAX => a.max(b),
        reduce_op::MIN => a.min(b),
        reduce_op::PROD => a * b,
        _ => a + b,
    }
}

/// Final step of a reduction over `n` ranks.
#[inline(always)]
pub fn finish(op: i32, a: f32, n: usize) -> f32 {
    if op == reduce_op::AVG {
        a / n as f32
    } else {
        a
    }
}

/// An f32 accumulator for `W` words of elements of type `E`.
pub struct Acc<const W: usize> {
    lanes: [[f32; 2]; W],
}

impl<const W: usize> Acc<W> {
    #[inline(always)]
    pub fn first<E: Elem>(words: [u32; W]) -> Self {
        let mut lanes = [[0.0; 2]; W];
        let mut i = 0;
        while i < W {
            lanes[i] = E::unpack(words[i]);
            i += 1;
        }
        Acc { lanes }
    }

    #[inline(always)]
    pub fn add<E: Elem>(&mut self, op: i32, words: [u32; W]) {
        let mut i = 0;
        while i < W {
            let l = E::unpack(words[i]);
            self.lanes[i][0] = combine(op, self.lanes[i][0], l[0]);
            if E::PER_WORD == 2 {
                self.lanes[i][1] = combine(op, self.lanes[i][1], l[1]);
            }
            i += 1;
        }
    }

    #[inline(always)]
    pub fn finish<E: Elem>(&self, op: i32, n: usize) -> [u32; W] {
        let mut out = [0u32; W];
        let mut i = 0;
        while i < W {
            let l = self.lanes[i];
            out[i] = E::pack([finish(op, l[0], n), finish(op, l[1], n)]);
            i += 1;
        }
        out
    }
}
