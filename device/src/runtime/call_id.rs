//! What a rank announces with its arrival at a call's first barrier, so that every peer can tell
//! whether both run the same call the same way: one u64 per (slot, rank), stored just before the
//! barrier flag (whose release store carries it), read after the flag (whose acquire load orders
//! the read). A local load and a posted store per peer, on a barrier that exists anyway.
//!
//! Layout: bits 63..48 the low 16 bits of the call's epoch (the tag), 47..40 the grid minus one
//! (a tile call announces 1: its CTA works alone), 39..0 the low bits of the heap digest.

use crate::abi::{heap_digest, SymmContext};

/// A peer ran this call on a grid of another size.
pub const GRID_DIFFERS: u32 = 1;
/// A peer's heap digest differs from this rank's.
pub const HEAP_DIFFERS: u32 = 2;

const TAG_SHIFT: u32 = 48;
const GRID_SHIFT: u32 = heap_digest::BITS;
const DIGEST_MASK: u64 = (1 << heap_digest::BITS) - 1;
const GRID_MASK: u64 = 0xff;
const _: () = assert!(crate::abi::MAX_CTAS as u64 - 1 <= GRID_MASK);
const _: () = assert!(GRID_SHIFT + 8 == TAG_SHIFT);

/// This rank's word for the call of `epoch` on `ctas` CTAs (1 to MAX_CTAS).
#[inline(always)]
pub fn of(c: &SymmContext, epoch: u32, ctas: usize) -> u64 {
    // Read where it is used: a digest loaded at the call's start would stay live (in registers)
    // across the call. The host writes it between kernels, never during one.
    // SAFETY: a field of a live context.
    let digest = unsafe { core::ptr::read_volatile(core::ptr::addr_of!(c.heap_digest)) };
    ((epoch as u64) << TAG_SHIFT)
        | (((ctas as u64).wrapping_sub(1) & GRID_MASK) << GRID_SHIFT)
        | (digest & DIGEST_MASK)
}

/// How a peer's word `seen` differs from this rank's `mine` (`GRID_DIFFERS | HEAP_DIFFERS`), or 0.
/// A word of another call (the peer has already passed this barrier and announced its next
/// call) says nothing about this one: 0.
#[inline(always)]
pub fn differences(mine: u64, seen: u64) -> u32 {
    let d = mine ^ seen;
    if d >> TAG_SHIFT != 0 {
        return 0;
    }
    let grid = ((d >> GRID_SHIFT) & GRID_MASK != 0) as u32;
    let heap = (d & DIGEST_MASK != 0) as u32;
    (grid * GRID_DIFFERS) | (heap * HEAP_DIFFERS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(digest: u64) -> SymmContext {
        let mut c = SymmContext::new(0, 2);
        c.heap_digest = digest;
        c
    }

    #[test]
    fn same_call_same_word() {
        let c = ctx(heap_digest::fold(0, heap_digest::ALLOC, 0, 4096));
        assert_eq!(differences(of(&c, 7, 4), of(&c, 7, 4)), 0);
    }

    #[test]
    fn grid_and_digest_differences_are_named() {
        let a = ctx(heap_digest::fold(0, heap_digest::ALLOC, 0, 4096));
        let b = ctx(heap_digest::fold(0, heap_digest::ALLOC, 0, 8192));
        assert_eq!(differences(of(&a, 7, 4), of(&a, 7, 8)), GRID_DIFFERS);
        assert_eq!(differences(of(&a, 7, 4), of(&b, 7, 4)), HEAP_DIFFERS);
        assert_eq!(
            differences(of(&a, 7, 256), of(&b, 7, 1)),
            GRID_DIFFERS | HEAP_DIFFERS
        );
    }

    #[test]
    fn another_calls_word_says_nothing() {
        let (a, b) = (ctx(1), ctx(2));
        assert_eq!(differences(of(&a, 7, 4), of(&b, 8, 8)), 0);
        // The tag is the epoch's low 16 bits: epochs 2^16 apart alias (the peer is at most a
        // few calls ahead).
        assert_eq!(
            differences(of(&a, 7, 4), of(&b, 7 + (1 << 16), 4)),
            HEAP_DIFFERS
        );
    }

    #[test]
    fn fold_depends_on_order_and_every_field() {
        use heap_digest::{fold, ALLOC, EMPTY, FREE};
        let ab = fold(fold(EMPTY, ALLOC, 0, 4096), ALLOC, 4096, 512);
        let ba = fold(fold(EMPTY, ALLOC, 4096, 512), ALLOC, 0, 4096);
        assert_ne!(ab, ba);
        let base = fold(EMPTY, ALLOC, 0, 4096);
        for other in [
            fold(EMPTY, FREE, 0, 4096),
            fold(EMPTY, ALLOC, 512, 4096),
            fold(EMPTY, ALLOC, 0, 4608),
        ] {
            assert_ne!(base & DIGEST_MASK, other & DIGEST_MASK);
        }
    }
}
