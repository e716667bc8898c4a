//! A simulated node for the device code: N ranks, each with a heap, a signal region and a scratch
//! region in host memory, and a `SymmContext` that maps all of them, as the host crate would.

#![allow(dead_code)]

use ironlink_device::abi::{signal, SymmContext, MAX_CTAS, MAX_RANKS};
use ironlink_device::hw::host::{self, f16_to_f32, f32_to_bf16, f32_to_f16};
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

pub use ironlink_device::abi::{dtype, reduce_op, status};
pub use ironlink_device::exports;

/// Bytes poisoned around every region a test uses; a stray write shows up there.
pub const GUARD: u8 = 0xA5;

pub struct Node {
    pub world: usize,
    heaps: Vec<Vec<u128>>,
    signals: Vec<Vec<u128>>,
    scratch: Vec<Vec<u128>>,
    ctxs: Vec<Box<SymmContext>>,
    pub heap_bytes: usize,
}

impl Node {
    /// A node of `world` ranks with `heap_bytes` of heap and `scratch_bytes` of scratch each.
    pub fn new(world: usize, heap_bytes: usize, scratch_bytes: usize) -> Self {
        let words = |b: usize| vec![0u128; b.div_ceil(16)];
        let mut n = Node {
            world,
            heaps: (0..world).map(|_| words(heap_bytes)).collect(),
            signals: (0..world).map(|_| words(signal::MIN_BYTES)).collect(),
            scratch: (0..world).map(|_| words(scratch_bytes)).collect(),
            ctxs: Vec::new(),
            heap_bytes,
        };
        for r in 0..world {
            let mut c = SymmContext::new(r as i32, world as i32);
            c.heap_size = heap_bytes as u64;
            c.signal_size = signal::MIN_BYTES as u64;
            c.scratch_size = scratch_bytes as u64;
            c.timeout_ns = 2_000_000_000;
            for p in 0..world {
                c.peer_heap[p] = n.heaps[p].as_ptr() as u64;
                c.peer_signal[p] = n.signals[p].as_ptr() as u64;
                c.peer_scratch[p] = n.scratch[p].as_ptr() as u64;
            }
            n.ctxs.push(Box::new(c));
        }
        for r in 0..world {
            n.heap_mut(r).fill(GUARD);
        }
        n
    }

    pub fn ctx(&self, rank: usize) -> i64 {
        &*self.ctxs[rank] as *const SymmContext as i64
    }

    pub fn ctx_mut(&mut self, rank: usize) -> &mut SymmContext {
        &mut self.ctxs[rank]
    }

    /// The device address of byte `offset` of `rank`'s heap.
    pub fn addr(&self, rank: usize, offset: usize) -> i64 {
        self.heaps[rank].as_ptr() as i64 + offset as i64
    }

    pub fn heap(&self, rank: usize) -> &[u8] {
        // SAFETY: u128 storage viewed as bytes; no simulated thread runs while tests inspect it.
        unsafe {
            std::slice::from_raw_parts(self.heaps[rank].as_ptr() as *const u8, self.heap_bytes)
        }
    }

    pub fn heap_mut(&mut self, rank: usize) -> &mut [u8] {
        let n = self.heap_bytes;
        // SAFETY: as above, exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.heaps[rank].as_mut_ptr() as *mut u8, n) }
    }

    /// Puts every rank in the state it would be in after `epoch` calls on every CTA (epoch
    /// counters and barrier slots), to test wrap-around without running 2^30 calls.
    pub fn set_epochs(&mut self, epoch: u32) {
        for r in 0..self.world {
            let base = self.signals[r].as_mut_ptr() as *mut u8;
            for cta in 0..MAX_CTAS {
                // SAFETY: inside the signal region (EPOCH_OFFSET + MAX_CTAS * 4 <= MIN_BYTES).
                unsafe { *(base.add(signal::EPOCH_OFFSET + cta * 4) as *mut u32) = epoch };
                for p in 0..MAX_RANKS {
                    let slot = signal::BARRIER_OFFSET + (cta * MAX_RANKS + p) * 4;
                    // SAFETY: inside the barrier array.
                    unsafe { *(base.add(slot) as *mut u32) = epoch << 2 | 3 };
                }
            }
        }
    }

    /// The error recorded in `rank`'s context.
    pub fn recorded_error(&self, rank: usize) -> i32 {
        self.ctxs[rank].error
    }

    /// Runs `body(rank, ctx)` on every thread of `ctas` x `threads` per rank; returns each rank's
    /// status, after checking that all threads of a rank returned the same one.
    pub fn run(
        &self,
        label: &str,
        ctas: u32,
        threads: u32,
        body: impl Fn(usize, i64) -> i32 + Sync,
    ) -> Vec<i32> {
        let results: Vec<AtomicI32> = (0..self.world).map(|_| AtomicI32::new(i32::MIN)).collect();
        let disagree = AtomicU32::new(0);
        let ctx: Vec<i64> = (0..self.world).map(|r| self.ctx(r)).collect();
        host::launch(label, self.world, ctas, threads, |rank| {
            let s = body(rank, ctx[rank]);
            let prev = results[rank].swap(s, Ordering::SeqCst);
            if prev != i32::MIN && prev != s {
                disagree.fetch_add(1, Ordering::SeqCst);
            }
        });
        assert_eq!(
            disagree.load(Ordering::SeqCst),
            0,
            "{label}: threads of one rank returned different statuses"
        );
        results.iter().map(|a| a.load(Ordering::SeqCst)).collect()
    }
}

/// Element codec for test data: write values of a dtype, read them back as f64.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Dt {
    F32,
    F16,
    Bf16,
}

impl Dt {
    pub const ALL: [Dt; 3] = [Dt::F32, Dt::F16, Dt::Bf16];
    pub fn code(self) -> i32 {
        match self {
            Dt::F32 => dtype::FLOAT32,
            Dt::F16 => dtype::FLOAT16,
            Dt::Bf16 => dtype::BFLOAT16,
        }
    }
    pub fn size(self) -> usize {
        if self == Dt::F32 {
            4
        } else {
            2
        }
    }
    /// `v` rounded to this dtype, and its bytes.
    pub fn encode(self, v: f32) -> (f64, Vec<u8>) {
        match self {
            Dt::F32 => (v as f64, v.to_le_bytes().to_vec()),
            Dt::F16 => {
                let h = f32_to_f16(v);
                (f16_to_f32(h) as f64, h.to_le_bytes().to_vec())
            }
            Dt::Bf16 => {
                let h = f32_to_bf16(v);
                (
                    f32::from_bits((h as u32) << 16) as f64,
                    h.to_le_bytes().to_vec(),
                )
            }
        }
    }
    pub fn decode(self, b: &[u8]) -> f64 {
        match self {
            Dt::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
            Dt::F16 => f16_to_f32(u16::from_le_bytes([b[0], b[1]])) as f64,
            Dt::Bf16 => f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16) as f64,
        }
    }
    /// Relative tolerance of a reduction's result against an f64 reference.
    pub fn tolerance(self) -> f64 {
        match self {
            Dt::F32 => 1e-5,
            Dt::F16 => 2e-3,
            Dt::Bf16 => 1.6e-2,
        }
    }
}

/// A small deterministic generator (tests must not depend on a crate registry).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next() >> 40) as f32 / (1u64 << 24) as f32)
    }
}

/// Writes `values` (already rounded) as `dt` at `offset` of `rank`'s heap; returns the f64 values.
pub fn fill(node: &mut Node, rank: usize, offset: usize, dt: Dt, values: &[f32]) -> Vec<f64> {
    let heap = node.heap_mut(rank);
    let mut out = Vec::with_capacity(values.len());
    for (i, v) in values.iter().enumerate() {
        let (x, bytes) = dt.encode(*v);
        heap[offset + i * dt.size()..][..dt.size()].copy_from_slice(&bytes);
        out.push(x);
    }
    out
}

pub fn read(node: &Node, rank: usize, offset: usize, dt: Dt, n: usize) -> Vec<f64> {
    let heap = node.heap(rank);
    (0..n)
        .map(|i| dt.decode(&heap[offset + i * dt.size()..]))
        .collect()
}

/// The f64 reference of reducing `inputs[rank][i]` over ranks.
pub fn reference(op: i32, inputs: &[Vec<f64>]) -> Vec<f64> {
    let n = inputs[0].len();
    (0..n)
        .map(|i| {
            let col = inputs.iter().map(|v| v[i]);
            match op {
                reduce_op::SUM => col.sum(),
                reduce_op::AVG => col.sum::<f64>() / inputs.len() as f64,
                reduce_op::PROD => col.product(),
                reduce_op::MAX => col.fold(f64::MIN, f64::max),
                _ => col.fold(f64::MAX, f64::min),
            }
        })
        .collect()
}

/// Checks `got` against `want` within the dtype's tolerance (relative to the largest magnitude).
pub fn assert_close(what: &str, dt: Dt, got: &[f64], want: &[f64]) {
    let scale = want.iter().fold(1e-30f64, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs() / scale;
        assert!(
            err <= dt.tolerance() && !g.is_nan(),
            "{what}: element {i}: got {g}, want {w} (rel err {err:.3e})"
        );
    }
}

/// Asserts that the bytes of `[lo, hi)` of every rank's heap are untouched guard bytes.
pub fn assert_guard(node: &Node, what: &str, lo: usize, hi: usize) {
    for r in 0..node.world {
        if let Some(i) = node.heap(r)[lo..hi].iter().position(|b| *b != GUARD) {
            panic!(
                "{what}: rank {r} wrote outside its region at heap byte {}",
                lo + i
            );
        }
    }
}

pub const OPS: [i32; 5] = [
    reduce_op::SUM,
    reduce_op::MAX,
    reduce_op::MIN,
    reduce_op::PROD,
    reduce_op::AVG,
];
