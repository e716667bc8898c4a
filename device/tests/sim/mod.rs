//! Test helpers over the simulated node (`ironlink_device::sim`): test data in every dtype, a
//! deterministic generator, the f64 reference and the checks.

#![allow(dead_code)]

use ironlink_device::hw::host::{f16_to_f32, f32_to_bf16, f32_to_f16};

pub use ironlink_device::abi::{dtype, reduce_op, status};
#[allow(unused_imports)] // Not every test binary uses them.
pub use ironlink_device::api;
#[allow(unused_imports)] // Not every test binary uses them.
pub use ironlink_device::collectives::choice::{
    choose, two_shot_variant, use_ll, Algorithm, TwoShot, PUSH_MIN_BYTES, SEPARATE_PHASES_MIN_BYTES,
};
#[allow(unused_imports)]
pub use ironlink_device::runtime::region::Region;

pub use ironlink_device::sim::{Node, GUARD};

use core::sync::atomic::{AtomicU32, Ordering};

/// The u32 at byte `offset` of `rank`'s heap, for simulated threads that talk through it.
pub fn word(node: &Node, rank: usize, offset: usize) -> &AtomicU32 {
    // SAFETY: a 4-byte aligned word inside the rank's heap, which outlives the launch.
    unsafe { AtomicU32::from_ptr(node.addr(rank, offset) as *mut u32) }
}

pub fn put_word(node: &Node, rank: usize, offset: usize, v: u32) {
    word(node, rank, offset).store(v, Ordering::Relaxed);
}

/// A device call's status as a Result, so a simulated kernel can stop at its first failure with `?`.
pub fn ok(s: i32) -> Result<(), i32> {
    if s == status::OK {
        Ok(())
    } else {
        Err(s)
    }
}

/// Sets context limits that give every algorithm a size below: one-shot LL all-reduce up to 64 B,
/// two-shot LL up to 1 KiB, two-shot above; all_gather / reduce_scatter over LL up to 4 KiB.
pub fn small_algorithm_limits(node: &mut Node) {
    for r in 0..node.world {
        let c = node.ctx_mut(r);
        (
            c.ar_one_shot_max_bytes,
            c.ar_ll_max_bytes,
            c.gather_ll_max_bytes,
        ) = (64, 1024, 4096);
    }
}

/// One rank's body of a launch that makes its calls back to back: `call` on each item in turn
/// until a status is not OK (the calls after it are not made); that status, else OK.
pub fn first_failure<T>(items: impl IntoIterator<Item = T>, mut call: impl FnMut(T) -> i32) -> i32 {
    for item in items {
        let s = call(item);
        if s != status::OK {
            return s;
        }
    }
    status::OK
}

/// Zeroes the u32 at `offset` of every rank's heap (which starts as guard bytes): a flag that a
/// test's threads set when they see a wrong value.
pub fn clear_flag(node: &mut Node, offset: usize) {
    for r in 0..node.world {
        node.heap_mut(r)[offset..offset + 4].fill(0);
    }
}

/// Asserts that no rank set the flag at `offset`; `saw` says what setting it means.
pub fn assert_flag_clear(node: &Node, offset: usize, what: &str, saw: &str) {
    for r in 0..node.world {
        assert_eq!(
            word(node, r, offset).load(Ordering::Relaxed),
            0,
            "{what}: rank {r} {saw}"
        );
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

/// Runs `run` on `nd` (its waits shortened to 100 ms) with the `nth` (0-based) remote signal of
/// the process dropped: some rank must return TIMEOUT, and every rank that did not succeed must
/// have recorded it. Which signal is the nth depends on how the CTAs' threads interleave: where
/// it was the last Ack of an exchange, which a call owes rather than waits for
/// (`transport::remote`), every rank returns OK and the next call from that slot must time out,
/// so `run` runs again without the fault. The caller holds `sim_faults::serial()`.
pub fn assert_dropped_signal_times_out(
    nd: &mut Node,
    nth: u64,
    what: &str,
    run: impl Fn(&mut Node) -> Vec<i32>,
) {
    use ironlink_device::hw::sim_faults::{self, Fault, Kind};
    for r in 0..nd.world {
        nd.ctx_mut(r).timeout_ns = 100_000_000;
    }
    sim_faults::set(Some(Fault::Drop {
        kind: Kind::RemoteSignal,
        nth,
    }));
    let mut st = run(nd);
    sim_faults::set(None);
    if st.iter().all(|s| *s == status::OK) {
        st = run(nd); // an owed Ack was dropped: this call waits for it
    }
    assert!(st.contains(&status::TIMEOUT), "{what}, drop {nth}: {st:?}");
    for (r, s) in st.iter().enumerate() {
        if *s != status::OK {
            assert_eq!(nd.recorded_error(r), status::TIMEOUT, "{what}: rank {r}");
        }
    }
}
