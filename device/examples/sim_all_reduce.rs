//! `make demo` on a machine without GPUs: an all-reduce across 8 simulated ranks (4 CTAs of 64
//! threads each), running the very device code that the bitcode holds. It says what it computes,
//! what every rank should get and which algorithm the device code chose, then checks every rank.

use ironlink_device::abi::{dtype, reduce_op, status};
use ironlink_device::api::symm_all_reduce;
use ironlink_device::collectives::choice::choose;
use ironlink_device::hw::host::f32_to_bf16;
use ironlink_device::sim::Node;

fn main() {
    let (world, n, ctas, threads) = (8usize, 1000usize, 4u32, 64u32);
    let mut node = Node::new(world, 1 << 16, 1 << 20);
    let algorithm = choose(node.context(0), ctas as usize, 2 * n);
    println!(
        "ironlink demo on the CPU: {world} simulated GPUs (one OS thread per GPU thread), each \
         running the device code of the bitcode.\n  \
         input:     rank r holds x[i] = r + 1 + i/1000 for i < {n} (bf16)\n  \
         call:      symm_all_reduce(SUM, bf16) on every rank, {ctas} CTAs x {threads} threads\n  \
         expected:  x[i] = (1 + ... + {world}) + {world} i/1000 = 36 + 8 i/1000 on every rank, \
         rounded to bf16, the same bits everywhere\n  \
         algorithm: {algorithm:?} (chosen from the message size, {} bytes, the grid, the \
         scratch size and the context's limits)",
        2 * n
    );
    // Rank r contributes r + 1 + i/1000 at element i (bf16): every rank should end up with
    // 36 + 8*i/1000, rounded to bf16.
    for r in 0..world {
        let heap = node.heap_mut(r);
        for i in 0..n {
            let v = f32_to_bf16((r + 1) as f32 + i as f32 / 1000.0);
            heap[2 * i..2 * i + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    let t = std::time::Instant::now();
    let statuses = node.run("demo", ctas, threads, |rank, ctx| {
        symm_all_reduce(
            ctx,
            node.addr(rank, 0),
            0,
            n as i64,
            reduce_op::SUM,
            dtype::BFLOAT16,
        )
    });
    let elapsed = t.elapsed();
    let mut ok = statuses.iter().all(|s| *s == status::OK);
    for (r, st) in statuses.iter().enumerate() {
        let h = node.heap(r);
        let v: Vec<f32> = (0..n)
            .map(|i| f32::from_bits((u16::from_le_bytes([h[2 * i], h[2 * i + 1]]) as u32) << 16))
            .collect();
        let bad = (0..n)
            .filter(|&i| (v[i] - (36.0 + 8.0 * i as f32 / 1000.0)).abs() > 0.25)
            .count();
        ok &= bad == 0 && h[..2 * n] == node.heap(0)[..2 * n];
        println!(
            "rank {r}: status {:>2}  x[0..4] = {:?}  x[999] = {}  wrong: {bad}",
            st,
            &v[..4],
            v[n - 1]
        );
    }
    println!(
        "result: all_reduce(SUM, bf16, {n} elements) over {world} simulated ranks in {elapsed:.2?}: {}",
        if ok { "OK, bitwise identical on every rank" } else { "MISMATCH" }
    );
    std::process::exit(if ok { 0 } else { 1 });
}
