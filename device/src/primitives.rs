//! Building blocks for users who write their own algorithms in Triton: bulk put/get to and from
//! a peer, signals and waits on signal slots, fences. Barriers are in `runtime::sync`.

use crate::abi::{cmp, signal, signal_op, status, SymmContext, MAX_RANKS};
use crate::hw;
use crate::runtime::mem::copy_bytes;
use crate::runtime::nodes::Nodes;
use crate::runtime::sync::{agree_on_timeout, wait_until, Deadline};

/// Address of user signal slot `slot` in `rank`'s signal region, or INVALID_ARGUMENT.
pub fn signal_slot(c: &SymmContext, rank: usize, slot: i64) -> Result<*mut u64, i32> {
    if slot < 0 || slot as usize >= signal::USER_SLOTS {
        return Err(status::INVALID_ARGUMENT);
    }
    Ok((c.signal_base(rank) + signal::USER_OFFSET + slot as usize * 8) as *mut u64)
}

/// CTA-cooperative copy of `n` bytes; every thread takes a strided share, then the CTA syncs.
///
/// # Safety
/// Both ranges are mapped in this process and do not overlap.
pub unsafe fn cta_copy(dst: usize, src: usize, n: usize) {
    copy_bytes(
        dst,
        src,
        n,
        hw::thread_rank() as usize,
        hw::cta_threads() as usize,
    );
    hw::sync_threads();
}

/// Sets or adds `value` into `peer`'s slot after making this CTA's earlier writes visible there.
/// A peer on another node of a multi-node context is signalled over the network, after this
/// CTA's puts to other nodes have landed (`PEER_NOT_MAPPED` in a build without one).
pub fn signal(c: &SymmContext, slot: i64, value: i64, op: i32, peer: i32) -> i32 {
    if peer < 0 || peer >= c.world_size {
        return status::INVALID_ARGUMENT;
    }
    // Our own slot: the symmetric address the network translates for a peer on another node
    // (and the check of `slot`).
    let own = match signal_slot(c, c.rank as usize, slot) {
        Ok(p) => p as usize,
        Err(e) => return e,
    };
    if op != signal_op::SET && op != signal_op::ADD {
        return status::UNSUPPORTED_OP;
    }
    if !Nodes::of(c).same_node(peer as usize) {
        if !hw::remote::NETWORK {
            return status::PEER_NOT_MAPPED;
        }
        hw::remote::quiet(); // our earlier puts have landed
        hw::sync_threads();
        let add = op == signal_op::ADD;
        // SAFETY: `own` is an aligned word of this rank's signal region (a 0-byte put: no data);
        // `peer` is a rank of the context.
        let s = unsafe {
            hw::remote::put_signal_nbi(c, own, own, 0, own, value as u64, add, peer as usize)
        };
        return s;
    }
    match signal_slot(c, peer as usize, slot) {
        // SAFETY: `p` is a user slot of a mapped peer signal region (checked above).
        Ok(p) => unsafe { publish(p, value, op) },
        Err(e) => e,
    }
}

/// Sets or adds `value` at `word` (thread 0, release at system scope) after this CTA's earlier
/// writes are visible wherever `word` is read. Every thread calls it.
///
/// # Safety
/// `word` is an aligned u64 of this rank's or a mapped peer's memory; `op` is SET or ADD.
unsafe fn publish(word: *mut u64, value: i64, op: i32) -> i32 {
    hw::sync_threads();
    if hw::thread_rank() == 0 {
        hw::fence_system();
        if op == signal_op::SET {
            hw::store_release_u64(word, value as u64);
        } else {
            hw::atomic_add_release_u64(word, value as u64);
        }
    }
    hw::sync_threads();
    status::OK
}

/// `signal` at a u64 of the heap instead of a slot, e.g. a flag that a copy engine also writes
/// (`cuStreamWriteValue64`) or waits on.
///
/// # Safety
/// `peer_word` is `peer`'s copy of a word of the caller's heap: translated and bounds-checked,
/// 8-byte aligned.
pub unsafe fn signal_at(peer_word: *mut u64, value: i64, op: i32) -> i32 {
    if op != signal_op::SET && op != signal_op::ADD {
        return status::UNSUPPORTED_OP;
    }
    publish(peer_word, value, op)
}

/// Whether `v cmp target` holds (values compared as signed 64-bit integers).
fn holds(op: i32, v: i64, target: i64) -> bool {
    match op {
        cmp::EQ => v == target,
        cmp::NE => v != target,
        cmp::GT => v > target,
        cmp::GE => v >= target,
        cmp::LT => v < target,
        _ => v <= target,
    }
}

/// Waits until this rank's slot satisfies `slot cmp value`; TIMEOUT (recorded) after the
/// context's timeout. Thread 0 polls; the CTA learns the outcome through the barrier.
pub fn signal_wait(c: &SymmContext, slot: i64, op: i32, value: i64, which: i32) -> i32 {
    match signal_slot(c, c.rank as usize, slot) {
        // SAFETY: our own user slot (checked by `signal_slot`).
        Ok(p) => unsafe { signal_wait_at(c, p, op, value, which) },
        Err(e) => e,
    }
}

/// `signal_wait` on a u64 of this rank's memory instead of a slot: thread 0 polls `word` until
/// `word cmp value`; TIMEOUT (recorded) after the context's timeout. On sm_90+ the wait then
/// orders the bulk (TMA) loads after it too: a copy engine or a peer may have written what they
/// read.
///
/// # Safety
/// `word` is an aligned u64 of this rank's memory (for `symm_signal_wait_at`: bounds-checked in
/// the heap).
pub unsafe fn signal_wait_at(
    c: &SymmContext,
    word: *const u64,
    op: i32,
    value: i64,
    which: i32,
) -> i32 {
    if !(cmp::EQ..=cmp::LE).contains(&op) {
        return status::UNSUPPORTED_OP;
    }
    let mut late = false;
    if hw::thread_rank() == 0 {
        let mut deadline = Deadline::new(c);
        late = !wait_until(&mut deadline, || {
            holds(op, hw::load_acquire_u64(word) as i64, value)
        });
        hw::fence_system();
        hw::fence_proxy_async();
    }
    match agree_on_timeout(c, which, late) {
        Ok(()) => status::OK,
        Err(e) => e,
    }
}

/// Semaphore `[tile][from]` in `rank`'s signal region (see `abi::signal::TILE_SIGNAL_OFFSET`).
fn tile_semaphore(c: &SymmContext, rank: usize, tile: usize, from: usize) -> *mut u32 {
    let index = tile * MAX_RANKS + from;
    (c.signal_base(rank) + signal::TILE_SIGNAL_OFFSET + index * 4) as *mut u32
}

/// Tells `peer` that this CTA's earlier writes for `tile` (e.g. `tile::put`, or stores through
/// peer pointers) are visible to it: adds one to the peer's semaphore `[tile][rank]`.
/// The caller checked `tile < MAX_TILES` and `peer < world`. Every thread calls it.
pub fn tile_signal(c: &SymmContext, tile: usize, peer: usize) {
    let me = c.rank as usize;
    release_adds(|p| {
        (p < c.world_size as usize && p == peer).then(|| tile_semaphore(c, p, tile, me))
    });
}

/// `tile_signal` to every other rank at once (thread p signals rank p).
pub fn tile_signal_others(c: &SymmContext, tile: usize) {
    let me = c.rank as usize;
    release_adds(|p| {
        (p < c.world_size as usize && p != me).then(|| tile_semaphore(c, p, tile, me))
    });
}

/// `tile_signal` to `peer` of `count` tiles at once: tiles `(first + i * stride) % wrap` for
/// i < count (a CTA's grid-stride walk over `wrap` tiles), with one release for all of them:
/// a signal's cost is its system-scope release (MEMBAR.SYS, one per warp), not its adds. The
/// caller checked `count <= 32` (thread i of the first warp adds tile i's count), every tile
/// index < MAX_TILES and `peer < world`. Every thread calls it.
pub fn tile_signal_batch(
    c: &SymmContext,
    first: usize,
    stride: usize,
    count: usize,
    wrap: usize,
    peer: usize,
) {
    let me = c.rank as usize;
    release_adds(|i| (i < count).then(|| tile_semaphore(c, peer, (first + i * stride) % wrap, me)));
}

/// The tile signals' protocol: after every thread's earlier writes of the CTA (TMA stores
/// included), thread t adds one to the semaphore `semaphore(t)` gives it (none: nothing), with a
/// posted release. Every thread calls it; `semaphore` must name mapped semaphores only.
fn release_adds(semaphore: impl Fn(usize) -> Option<*mut u32>) {
    // TMA stores (e.g. a Triton tensor descriptor's `store` to a peer) are asynchronous: their
    // writes must be complete before the release below announces them.
    hw::bulk_stores_complete();
    hw::sync_threads();
    if let Some(sem) = semaphore(hw::thread_rank_fresh() as usize) {
        // No separate fence (as in `Call::barrier`): the release half of the add is cumulative
        // over the CTA's earlier writes, which the CTA barrier above ordered before it. A `red`
        // is posted: the CTA does not wait for the round trip to the peer; one MEMBAR.SYS per
        // warp however many of its threads add.
        // SAFETY: the caller's semaphores are words of mapped signal regions.
        unsafe { hw::red_add_release_u32(sem, 1) };
    }
    hw::sync_threads();
}

/// Waits until `peer` has signalled `tile` once more than this rank has waited for, and takes
/// that signal: the peer's writes before it are visible to the whole CTA after. TIMEOUT
/// (recorded) after the context's timeout. The caller checked `tile` and `peer`. The acquire
/// load and the CTA barrier after it order the CTA's later reads after the peer's writes.
pub fn tile_wait(c: &SymmContext, tile: usize, peer: usize, which: i32) -> Result<(), i32> {
    tile_wait_where(c, tile, |p| p == peer, which)
}

/// `tile_wait` for every other rank at once (thread p waits for rank p).
pub fn tile_wait_others(c: &SymmContext, tile: usize, which: i32) -> Result<(), i32> {
    let me = c.rank as usize;
    tile_wait_where(c, tile, |p| p != me, which)
}

/// Thread p (< world) takes one signal of `tile` from rank p if `from(p)`.
fn tile_wait_where(
    c: &SymmContext,
    tile: usize,
    from: impl Fn(usize) -> bool,
    which: i32,
) -> Result<(), i32> {
    let mut late = false;
    let p = hw::thread_rank_fresh() as usize;
    if p < c.world_size as usize && from(p) {
        let sem = tile_semaphore(c, c.rank as usize, tile, p);
        let mut deadline = Deadline::new(c);
        // SAFETY: a semaphore of our own signal region; only this thread decrements it.
        late = !wait_until(&mut deadline, || unsafe { hw::load_acquire_u32(sem) } != 0);
        if !late {
            // One consumer per semaphore: what we saw non-zero stays so until we take it. The
            // acquire load above already ordered our later reads; the take needs no ordering.
            unsafe { hw::red_add_relaxed_u32(sem, u32::MAX) };
        }
    }
    agree_on_timeout(c, which, late)
}
