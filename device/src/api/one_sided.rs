//! The exported one-sided calls: copies to and from a peer, signals (slots and heap words), and
//! fences.

use super::call_shapes::{code, heap_word, peer_copy, Side};
use crate::abi::status;
use crate::runtime::context as ctx;
use crate::{hw, primitives};

exports! {
    /// CTA-cooperative copy of `nbytes` from local `src_ptr` to `peer`'s copy of the symmetric
    /// `dst_ptr`. Not ordered with the peer: follow with `symm_signal` or `symm_barrier`. A peer
    /// on another node of a multi-node context gives PEER_NOT_MAPPED (no load/store path; put
    /// with `symm_nvshmem_put_signal`).
    fn symm_put(ctx: i64, dst_ptr: i64, src_ptr: i64, nbytes: i64, peer: i32) -> i32 {
        code(peer_copy(ctx, dst_ptr, src_ptr, nbytes, peer, Side::Dst))
    }

    /// CTA-cooperative copy of `nbytes` from `peer`'s copy of the symmetric `src_ptr` to local
    /// `dst_ptr`. A peer on another node of a multi-node context gives PEER_NOT_MAPPED.
    fn symm_get(ctx: i64, dst_ptr: i64, src_ptr: i64, nbytes: i64, peer: i32) -> i32 {
        code(peer_copy(ctx, dst_ptr, src_ptr, nbytes, peer, Side::Src))
    }

    /// Sets (`SIGNAL_OP_SET`) or adds to (`SIGNAL_OP_ADD`) `peer`'s user signal slot `slot`,
    /// after this CTA's earlier writes (e.g. `symm_put`) are visible to that peer. On a
    /// multi-node context a peer on another node is signalled over NVSHMEM after this CTA's puts
    /// have landed (the NVSHMEM bitcode; PEER_NOT_MAPPED in the P2P one).
    fn symm_signal(ctx: i64, slot: i64, value: i64, signal_op: i32, peer: i32) -> i32 {
        match ctx::any_context(ctx) {
            Ok(c) => primitives::signal(c, slot, value, signal_op, peer),
            Err(e) => e,
        }
    }

    /// Waits until this rank's user signal slot `slot` compares (`CMP_*`) true against `value`;
    /// gives TIMEOUT after the context's timeout (and records it).
    fn symm_signal_wait(ctx: i64, slot: i64, cmp_op: i32, value: i64) -> i32 {
        match ctx::any_context(ctx) {
            Ok(c) => primitives::signal_wait(c, slot, cmp_op, value, which!(symm_signal_wait)),
            Err(e) => e,
        }
    }

    /// `symm_signal` at a u64 of the heap instead of a slot: sets (`SIGNAL_OP_SET`) or adds to
    /// (`SIGNAL_OP_ADD`) `peer`'s copy of the word at `flag_ptr` (a local heap address, 8-byte
    /// aligned; `peer` may be this rank) after this CTA's earlier writes are visible to that
    /// peer. For flags that work on streams also writes or waits on (`runtime.stream_flags`: a
    /// copy engine's transfer announced by `cuStreamWriteValue64`). A peer on another node of a
    /// multi-node context gives PEER_NOT_MAPPED.
    fn symm_signal_at(ctx: i64, flag_ptr: i64, value: i64, signal_op: i32, peer: i32) -> i32 {
        match heap_word(ctx, flag_ptr, peer) {
            // SAFETY: `heap_word` translated and checked the word (inside the heap, aligned).
            Ok((_, word)) => unsafe { primitives::signal_at(word, value, signal_op) },
            Err(e) => e,
        }
    }

    /// `symm_signal_wait` on a u64 of this rank's heap (`flag_ptr`, 8-byte aligned) instead of a
    /// slot: waits until it compares (`CMP_*`) true against `value`, then the CTA (its TMA loads
    /// too) sees what was written before the word was set; TIMEOUT after the context's timeout
    /// (recorded).
    fn symm_signal_wait_at(ctx: i64, flag_ptr: i64, cmp_op: i32, value: i64) -> i32 {
        match ctx::any_context(ctx).and_then(|c| heap_word(ctx, flag_ptr, c.rank)) {
            // SAFETY: as in `symm_signal_at`, this rank's own word.
            Ok((c, word)) => unsafe {
                primitives::signal_wait_at(c, word, cmp_op, value, which!(symm_signal_wait_at))
            },
            Err(e) => e,
        }
    }

    /// The current value of this rank's user signal slot `slot` (or a negative status for a bad
    /// context or slot; slot values are the caller's, so reserve negatives if you need both).
    fn symm_signal_read(ctx: i64, slot: i64) -> i64 {
        match ctx::any_context(ctx).and_then(|c| primitives::signal_slot(c, c.rank as usize, slot)) {
            // SAFETY: a checked slot of our own signal region.
            Ok(p) => unsafe { hw::load_acquire_u64(p) as i64 },
            Err(e) => e as i64,
        }
    }

    /// Memory fence at `scope` (`FENCE_SCOPE_CTA` syncs the CTA; GPU and SYSTEM fence each thread).
    fn symm_fence(scope: i32) -> i32 {
        match scope {
            crate::abi::fence_scope::CTA => {
                hw::sync_threads();
                status::OK
            }
            crate::abi::fence_scope::GPU => {
                hw::fence_gpu();
                status::OK
            }
            crate::abi::fence_scope::SYSTEM => {
                hw::fence_system();
                status::OK
            }
            _ => status::INVALID_ARGUMENT,
        }
    }
}
