//! The remote transport: one-sided put-with-signal to a rank on another node, the wait for such
//! signals, and quiet, over `hw::remote` (the simulator's network, NVSHMEM, or none).
//!
//! Signals live in the receiver's signal region, one u64 per (call slot, sender's node) and kind
//! (a rank exchanges with one rank of each other node: the one with its local index; the slot is
//! the CTA index, or the tile index for a tile call, which has words of its own):
//! `Arrive` ("my data is in your scratch") and `Ack` ("I have consumed what you put in mine").
//! Like the barrier flags they are never cleared: a value is the call's epoch and a round,
//! `(epoch << 2) << 32 | round + 1`, so values only grow within a call and from call to call
//! (the high word runs through all of u32 as the 30-bit epoch wraps, as barrier values do), and a
//! wait compares in wrapping arithmetic. A sender sets (not adds) the value, so a lost signal is
//! never made up by a later one and the waiting rank times out.
//!
//! The last Ack of an exchange is not waited for in the call that earned it: the slot records it
//! as owed (`owe_acks`, rank-local words) and waits for it before its next put into that rank's
//! scratch (`settle_acks`), so a call returns one network round trip sooner and a lost final Ack
//! times out the next call that needs it.

use crate::abi::{signal, MAX_NODES};
use crate::hw;
use crate::runtime::nodes::Nodes;
use crate::runtime::scratch::slice_base;
use crate::runtime::sync::{wait_until, Call};

/// Which of a rank's remote signal words.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Arrive,
    Ack,
}

/// Where in this rank's symmetric memory (the same place on the target) data is put: a byte
/// offset into the user heap, or into this CTA's slice of the scratch (whole-tensor calls only:
/// a tile call's slot is a tile index, which has no slice).
#[derive(Clone, Copy)]
pub enum Place {
    Heap(usize),
    Scratch(usize),
    /// A byte offset into the signal region (the tile calls' landing boxes).
    Signal(usize),
}

impl Place {
    /// This rank's address of the place.
    #[inline(always)]
    fn local(self, call: &Call) -> usize {
        match self {
            Place::Heap(off) => call.c.heap_base(call.rank) + off,
            Place::Scratch(off) => {
                debug_assert!(!call.is_tile(), "a tile call has no scratch slice");
                slice_base(call.c, call.rank, call.cta) + off
            }
            Place::Signal(off) => call.c.signal_base(call.rank) + off,
        }
    }
}

/// The signal value of `round` in this call (see the module docs).
#[inline(always)]
pub fn value(call: &Call, round: usize) -> u64 {
    ((call.epoch << 2) as u64) << 32 | (round as u64 + 1)
}

/// This rank's signal word of `kind` that the rank of node `node` sets for this call's slot.
#[inline(always)]
fn word(call: &Call, kind: Kind, node: usize) -> usize {
    let base = call.remote_words(kind == Kind::Arrive);
    call.c.signal_base(call.rank) + base + (call.cta * MAX_NODES + (node & (MAX_NODES - 1))) * 8
}

/// Puts `bytes` from `src` here to `dst` on rank `pe`, then sets `pe`'s `kind` word for this
/// rank to `value` (release: `pe` sees the data once it sees the value). Non-blocking: `src`
/// must not change until `quiet`. Every thread calls it, after a CTA barrier that follows the
/// last write of the data. `bytes` may be 0 (a signal alone).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn put_with_signal(
    call: &Call,
    nodes: &Nodes,
    dst: Place,
    src: Place,
    bytes: usize,
    kind: Kind,
    value: u64,
    pe: usize,
) -> Result<(), i32> {
    // The signal word is the one `pe` waits on for this rank: at our node's index in its
    // array, which is the same symmetric address as our word for our own node.
    put_signal(
        call,
        dst,
        src,
        bytes,
        word(call, kind, nodes.node),
        (value, false),
        pe,
    )
}

/// Puts `bytes` from `src` here to `dst` on rank `pe` with no signal (`put_with_signal`'s add of
/// 0 to its Arrive word for this rank: no change). Only `quiet` orders it before a later signal.
#[inline(always)]
pub fn put(
    call: &Call,
    nodes: &Nodes,
    dst: Place,
    src: Place,
    bytes: usize,
    pe: usize,
) -> Result<(), i32> {
    put_signal(
        call,
        dst,
        src,
        bytes,
        word(call, Kind::Arrive, nodes.node),
        (0, true),
        pe,
    )
}

/// `hw::remote::put_signal_nbi` between places, signalling the word at `sig` (set, or add).
#[inline(always)]
fn put_signal(
    call: &Call,
    dst: Place,
    src: Place,
    bytes: usize,
    sig: usize,
    (value, add): (u64, bool),
    pe: usize,
) -> Result<(), i32> {
    // SAFETY: `dst` and `src` lie inside this rank's heap, this CTA's scratch slice or the signal
    // region (callers stay inside their regions), `sig` is an aligned word of this rank's signal
    // region, and `pe` is a rank of the context.
    let s = unsafe {
        hw::remote::put_signal_nbi(
            call.c,
            dst.local(call),
            src.local(call),
            bytes,
            sig,
            value,
            add,
            pe,
        )
    };
    if s == 0 {
        Ok(())
    } else {
        Err(s)
    }
}

/// Waits until the `kind` word set by the rank of each node `from(t)` (for threads t that get Some) has
/// reached `value`; TIMEOUT (recorded) after the context's timeout, never a hang. Every thread
/// calls it; afterwards the whole CTA sees what those ranks put before their signals.
#[inline(always)]
pub fn wait_signals(
    call: &Call,
    kind: Kind,
    value: u64,
    from: impl Fn(usize) -> Option<usize>,
) -> Result<(), i32> {
    let mut late = false;
    if let Some(p) = from(hw::thread_rank_fresh() as usize) {
        late = !reached(call, word(call, kind, p), value);
    }
    // The CTA barrier inside passes the acquired data on to every thread.
    call.agree_on_timeout(late)
}

/// Polls this rank's signal word at `at` (acquire) until it reaches `value` in wrapping
/// arithmetic; false after the context's timeout.
#[inline(always)]
fn reached(call: &Call, at: usize, value: u64) -> bool {
    wait_until(&mut call.deadline(), || {
        // SAFETY: an aligned word of this rank's signal region.
        let seen = unsafe { hw::load_acquire_u64(at as *const u64) };
        seen.wrapping_sub(value) as i64 >= 0
    })
}

/// The `kind` word the rank of node `node` last set for this call's slot (acquire: what it
/// put before is visible). Every thread may call it.
#[inline(always)]
pub fn read_signal(call: &Call, kind: Kind, node: usize) -> u64 {
    // SAFETY: an aligned word of this rank's signal region.
    unsafe { hw::load_acquire_u64(word(call, kind, node) as *const u64) }
}

/// This rank's word of the Ack value the rank of node `node` owes this call's slot.
#[inline(always)]
fn owed_word(call: &Call, node: usize) -> *mut u64 {
    debug_assert!(!call.is_tile(), "tile calls keep no owed acknowledgements");
    let at = signal::REMOTE_OWED_OFFSET + (call.cta * MAX_NODES + (node & (MAX_NODES - 1))) * 8;
    (call.c.signal_base(call.rank) + at) as *mut u64
}

/// The last Acks of an exchange, `value` from the rank of each node `to(t)` (threads t that get
/// Some): recorded as owed to this slot instead of waited for, so the call returns, and the
/// next put into that rank's scratch from this slot waits for them (`settle_acks`). The
/// measurement build `--cfg ironlink_diag="final_ack_wait"` still waits here. Every thread calls it.
#[inline(always)]
pub fn owe_acks(call: &Call, value: u64, to: impl Fn(usize) -> Option<usize>) -> Result<(), i32> {
    if cfg!(ironlink_diag = "final_ack_wait") {
        return wait_signals(call, Kind::Ack, value, to);
    }
    if let Some(m) = to(hw::thread_rank_fresh() as usize) {
        // SAFETY: an aligned word of this rank's signal region that only this slot's thread
        // for node m reads and writes (here and in `settle_acks`), in call order.
        unsafe { core::ptr::write_volatile(owed_word(call, m), value) };
    }
    Ok(())
}

/// Waits until the rank of each node `to(t)` has sent the Ack this slot is owed from it (if
/// any), then forgets it: after this, what this slot put into those ranks' scratch has been
/// consumed and it may be overwritten. TIMEOUT (recorded) as `wait_signals`. Every thread calls it.
#[inline(always)]
pub fn settle_acks(call: &Call, to: impl Fn(usize) -> Option<usize>) -> Result<(), i32> {
    let mut late = false;
    if let Some(m) = to(hw::thread_rank_fresh() as usize) {
        let owed = owed_word(call, m);
        // SAFETY: as in `owe_acks`.
        let value = unsafe { core::ptr::read_volatile(owed) };
        if value != 0 {
            late = !reached(call, word(call, Kind::Ack, m), value);
            if !late {
                // SAFETY: as in `owe_acks`.
                unsafe { core::ptr::write_volatile(owed, 0) };
            }
        }
    }
    call.agree_on_timeout(late)
}

/// Waits until every put this CTA issued has landed: their sources may be overwritten after.
/// Every thread calls it.
#[inline(always)]
pub fn quiet() {
    hw::remote::quiet();
    hw::sync_threads();
}
