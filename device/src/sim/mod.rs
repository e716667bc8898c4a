//! A simulated node for running the device code on the CPU: N ranks, each with a heap, a signal
//! region and a scratch region in host memory, and a `SymmContext` that maps all of them, as the
//! host crate does on GPUs. Used by the simulator tests and `make demo` on machines without GPUs.

extern crate std;

use crate::abi::{backend, signal, SymmContext, MAX_CTAS, MAX_RANKS, MAX_TILES};
use crate::collectives::choice::with_default_limits;
use crate::hw::{host, sim_net};
use core::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::vec;
use std::vec::Vec;

/// Bytes poisoned around every region a test uses; a stray write shows up there.
pub const GUARD: u8 = 0xA5;

pub struct Node {
    pub world: usize,
    heaps: Vec<Vec<u128>>,
    signals: Vec<Vec<u128>>,
    scratch: Vec<Vec<u128>>,
    ctxs: Vec<SymmContext>,
    pub heap_bytes: usize,
}

impl Node {
    /// A node of `world` ranks with `heap_bytes` of heap and `scratch_bytes` of scratch each.
    pub fn new(world: usize, heap_bytes: usize, scratch_bytes: usize) -> Self {
        assert!(
            world <= MAX_RANKS,
            "one node holds at most {MAX_RANKS} ranks"
        );
        Self::build(world, None, heap_bytes, scratch_bytes)
    }

    /// `world` ranks as simulated nodes of `node_size` consecutive ranks: multi-node contexts
    /// (`backend::NVSHMEM_MULTI_NODE`) whose peer tables hold their own node; other nodes are
    /// reached only through the simulated network (`hw::sim_net`).
    pub fn with_nodes(
        world: usize,
        node_size: usize,
        heap_bytes: usize,
        scratch_bytes: usize,
    ) -> Self {
        Self::build(world, Some(node_size), heap_bytes, scratch_bytes)
    }

    fn build(
        world: usize,
        node_size: Option<usize>,
        heap_bytes: usize,
        scratch_bytes: usize,
    ) -> Self {
        let words = |b: usize| vec![0u128; b.div_ceil(16)];
        let mut n = Node {
            world,
            heaps: (0..world).map(|_| words(heap_bytes)).collect(),
            signals: (0..world).map(|_| words(signal::FULL_BYTES)).collect(),
            scratch: (0..world).map(|_| words(scratch_bytes)).collect(),
            ctxs: Vec::new(),
            heap_bytes,
        };
        let size = node_size.unwrap_or(world).max(1);
        for r in 0..world {
            let mut c = with_default_limits(SymmContext::new(r as i32, world as i32));
            if let Some(s) = node_size {
                c.backend = backend::NVSHMEM_MULTI_NODE;
                c.node_size = s as u32;
            }
            c.heap_size = heap_bytes as u64;
            c.signal_size = signal::FULL_BYTES as u64;
            c.scratch_size = scratch_bytes as u64;
            // Generous: hundreds of OS threads per node share a CI machine's few cores, and the
            // test binaries run at the same time; a real hang still ends in 10 s.
            c.timeout_ns = 10_000_000_000;
            let first = r / size * size;
            for p in first..(first + size).min(world) {
                c.peer_heap[p % MAX_RANKS] = n.heaps[p].as_ptr() as u64;
                c.peer_signal[p % MAX_RANKS] = n.signals[p].as_ptr() as u64;
                c.peer_scratch[p % MAX_RANKS] = n.scratch[p].as_ptr() as u64;
            }
            n.ctxs.push(c);
        }
        for r in 0..world {
            n.heap_mut(r).fill(GUARD);
        }
        let region = |v: &Vec<u128>, bytes: usize| (v.as_ptr() as usize, bytes);
        sim_net::attach(
            (0..world)
                .map(|r| {
                    [
                        region(&n.heaps[r], heap_bytes),
                        region(&n.signals[r], signal::FULL_BYTES),
                        region(&n.scratch[r], scratch_bytes),
                    ]
                })
                .collect(),
        );
        n
    }

    pub fn ctx(&self, rank: usize) -> i64 {
        &self.ctxs[rank] as *const SymmContext as i64
    }

    pub fn context(&self, rank: usize) -> &SymmContext {
        &self.ctxs[rank]
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
        let (epochs, barriers) = (signal::EPOCH_OFFSET, signal::BARRIER_OFFSET);
        self.set_epoch_state(MAX_CTAS, epochs, barriers, epoch);
    }

    /// Puts every rank in the state it would be in after `epoch` calls on every tile index
    /// (tile epoch counters and tile barrier slots; the LL half bit clear), to test wrap-around.
    pub fn set_tile_epochs(&mut self, epoch: u32) {
        let (epochs, barriers) = (signal::TILE_EPOCH_OFFSET, signal::TILE_BARRIER_OFFSET);
        self.set_epoch_state(MAX_TILES, epochs, barriers, epoch);
    }

    /// On every rank, `count` epoch counters (a u32 each, at signal byte `epochs`) at `epoch`, and
    /// each counter's `MAX_RANKS` barrier slots (at `barriers`) as `epoch` calls leave them.
    fn set_epoch_state(&mut self, count: usize, epochs: usize, barriers: usize, epoch: u32) {
        for r in 0..self.world {
            let words = self.signal_mut(r);
            for i in 0..count {
                put_u32(words, epochs + i * 4, epoch);
                for p in 0..MAX_RANKS {
                    put_u32(words, barriers + (i * MAX_RANKS + p) * 4, epoch << 2 | 3);
                }
            }
        }
    }

    /// `rank`'s signal region, for tests that check what was written there.
    pub fn signal(&self, rank: usize) -> &[u8] {
        // SAFETY: u128 storage viewed as bytes; no simulated thread runs while tests inspect it.
        unsafe {
            std::slice::from_raw_parts(self.signals[rank].as_ptr() as *const u8, signal::FULL_BYTES)
        }
    }

    /// `rank`'s signal region, for putting it in the state a test starts from.
    fn signal_mut(&mut self, rank: usize) -> &mut [u8] {
        let n = signal::FULL_BYTES;
        // SAFETY: as in `signal`, with exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.signals[rank].as_mut_ptr() as *mut u8, n) }
    }

    /// Puts every rank in the state it would be in after `rounds` rounds of `progress` flags on
    /// every CTA (each CTA's counter and every peer's last posted value), to test wrap-around.
    pub fn set_round_counters(&mut self, rounds: u32) {
        for r in 0..self.world {
            let words = self.signal_mut(r);
            for cta in 0..MAX_CTAS {
                for p in 0..MAX_RANKS {
                    put_u32(
                        words,
                        signal::FLAG_OFFSET + (cta * MAX_RANKS + p) * 4,
                        rounds,
                    );
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
        self.launch(label, ctas, threads, body, |rank, s| {
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

    /// Like `run`, for launches whose CTAs may legitimately disagree (a fault that only one CTA
    /// of a rank notices): each rank's first non-OK status of any thread, else OK.
    pub fn run_worst(
        &self,
        label: &str,
        ctas: u32,
        threads: u32,
        body: impl Fn(usize, i64) -> i32 + Sync,
    ) -> Vec<i32> {
        let results: Vec<AtomicI32> = (0..self.world).map(|_| AtomicI32::new(0)).collect();
        self.launch(label, ctas, threads, body, |rank, s| {
            if s != 0 {
                let _ = results[rank].compare_exchange(0, s, Ordering::SeqCst, Ordering::SeqCst);
            }
        });
        results.iter().map(|a| a.load(Ordering::SeqCst)).collect()
    }

    /// Runs `body(rank, ctx)` on `grids[rank]` CTAs of `threads` threads on each rank (one call
    /// launched with different grids on different ranks); returns the distinct statuses each
    /// rank's threads returned, in increasing order.
    pub fn run_grids(
        &self,
        label: &str,
        grids: &[u32],
        threads: u32,
        body: impl Fn(usize, i64) -> i32 + Sync,
    ) -> Vec<Vec<i32>> {
        assert_eq!(grids.len(), self.world, "{label}: one grid per rank");
        let seen: Vec<std::sync::Mutex<Vec<i32>>> = (0..self.world)
            .map(|_| std::sync::Mutex::new(Vec::new()))
            .collect();
        let ctx: Vec<i64> = (0..self.world).map(|r| self.ctx(r)).collect();
        host::launch_grids(label, grids, threads, |rank| {
            let s = body(rank, ctx[rank]);
            let mut v = seen[rank].lock().unwrap_or_else(|e| e.into_inner());
            if !v.contains(&s) {
                v.push(s);
            }
        });
        seen.into_iter()
            .map(|m| {
                let mut v = m.into_inner().unwrap_or_else(|e| e.into_inner());
                v.sort_unstable();
                v
            })
            .collect()
    }

    /// Runs `body(rank, ctx)` on every simulated thread and hands each thread's status to
    /// `status(rank, s)`.
    fn launch(
        &self,
        label: &str,
        ctas: u32,
        threads: u32,
        body: impl Fn(usize, i64) -> i32 + Sync,
        status: impl Fn(usize, i32) + Sync,
    ) {
        let ctx: Vec<i64> = (0..self.world).map(|r| self.ctx(r)).collect();
        host::launch(label, self.world, ctas, threads, |rank| {
            status(rank, body(rank, ctx[rank]))
        });
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(h) = self.heaps.first() {
            sim_net::detach(h.as_ptr() as usize);
        }
    }
}

/// Writes `value` as the u32 at byte `offset` of `bytes` (a signal region).
fn put_u32(bytes: &mut [u8], offset: usize, value: u32) {
    bytes[offset..offset + 4].copy_from_slice(&value.to_ne_bytes());
}
