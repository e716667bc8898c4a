//! First-fit allocator for tensors inside a heap's user region.
//!
//! It hands out *offsets*, not addresses: the same sequence of `alloc`/`free` calls gives the same
//! offsets on every rank, which is what makes the heap symmetric (a tensor lives at the same
//! offset in every rank's region). The ops' workspaces (`alloc_top`) are a stack that grows down
//! from the region's end, so their offsets follow from the workspace calls alone: the same on
//! every rank even where the user's own allocations differ between ranks (a misuse the kernels
//! that read peers' workspaces could not otherwise see before their stores land). It is deterministic on purpose: no size classes or caches
//! whose state could differ between ranks. It also folds every event into a digest
//! (`abi::heap_digest`) that kernels compare across ranks, so that a rank whose sequence differs
//! is reported (`HEAP_ASYMMETRIC`) rather than computing on the wrong tensors.

use crate::abi::heap_digest;
use crate::error::{Error, Result};
use std::collections::BTreeMap;

/// Alignment of every allocation, in bytes: enough for any dtype and for 128-bit vector accesses,
/// and a multiple of the 128-byte lines that NVLink stores move.
pub const ALIGN: u64 = 256;

/// Rounds `n` up to a multiple of `align` (a power of two), or `None` on overflow.
pub fn round_up(n: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    Some(n.checked_add(align - 1)? & !(align - 1))
}

#[derive(Clone, Debug)]
pub struct Allocator {
    capacity: u64,
    /// Free blocks: offset -> length. Adjacent blocks are always merged.
    free: BTreeMap<u64, u64>,
    /// Live allocations: offset -> length (rounded up to `ALIGN`).
    used: BTreeMap<u64, u64>,
    /// Every successful alloc and free so far, folded in order (`heap_digest::fold`).
    digest: u64,
    /// Live allocations of `alloc_top`; the lowest is the floor the next one goes under.
    top: std::collections::BTreeSet<u64>,
}

impl Allocator {
    /// An allocator over `[0, capacity)`; `capacity` is rounded down to `ALIGN`.
    pub fn new(capacity: u64) -> Self {
        let capacity = capacity & !(ALIGN - 1);
        let mut free = BTreeMap::new();
        if capacity > 0 {
            free.insert(0, capacity);
        }
        Allocator {
            capacity,
            free,
            used: BTreeMap::new(),
            digest: heap_digest::EMPTY,
            top: std::collections::BTreeSet::new(),
        }
    }

    /// The digest of every successful alloc and free so far, as (kind, offset, rounded length)
    /// in order: equal on ranks that made the same calls with the same sizes.
    pub fn digest(&self) -> u64 {
        self.digest
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn free_bytes(&self) -> u64 {
        self.free.values().sum()
    }

    pub fn largest_free(&self) -> u64 {
        self.free.values().copied().max().unwrap_or(0)
    }

    pub fn live_allocations(&self) -> usize {
        self.used.len()
    }

    /// Allocates `bytes` (0 counts as 1, so every allocation has its own address) and returns
    /// its offset, `ALIGN`-aligned.
    pub fn alloc(&mut self, bytes: u64) -> Result<u64> {
        let oom = |requested| Error::OutOfMemory {
            requested,
            free: self.free_bytes(),
            largest_free: self.largest_free(),
            capacity: self.capacity,
        };
        let need = round_up(bytes.max(1), ALIGN).ok_or_else(|| oom(bytes))?;
        let (&off, &len) = self
            .free
            .iter()
            .find(|(_, &len)| len >= need)
            .ok_or_else(|| oom(bytes))?;
        self.free.remove(&off);
        if len > need {
            self.free.insert(off + need, len - need);
        }
        self.used.insert(off, need);
        self.digest = heap_digest::fold(self.digest, heap_digest::ALLOC, off, need);
        Ok(off)
    }

    /// Allocates `bytes` (as `alloc` rounds them) directly under the lowest live `alloc_top`
    /// allocation, or at the region's end if there is none, and returns its offset. The offset
    /// depends only on the `alloc_top` calls, never on `alloc`'s: where an `alloc` block already
    /// lies there, this fails (`WorkspaceRegionTaken`) rather than go elsewhere.
    pub fn alloc_top(&mut self, bytes: u64) -> Result<u64> {
        let floor = self.top.first().copied().unwrap_or(self.capacity);
        let need = round_up(bytes.max(1), ALIGN);
        let start = need.and_then(|n| floor.checked_sub(n));
        let (Some(need), Some(start)) = (need, start) else {
            return Err(self.workspace_taken(bytes, floor, floor));
        };
        // The free block holding [start, floor), if all of it is free.
        let Some((&off, &len)) = self
            .free
            .range(..=start)
            .next_back()
            .filter(|(&o, &l)| o + l >= floor)
        else {
            return Err(self.workspace_taken(bytes, floor, start));
        };
        self.free.remove(&off);
        if start > off {
            self.free.insert(off, start - off);
        }
        if off + len > floor {
            self.free.insert(floor, off + len - floor);
        }
        self.used.insert(start, need);
        self.top.insert(start);
        self.digest = heap_digest::fold(self.digest, heap_digest::ALLOC, start, need);
        Ok(start)
    }

    fn workspace_taken(&self, requested: u64, floor: u64, start: u64) -> Error {
        // The live `alloc` block nearest under the floor, if it reaches into [start, floor).
        let blocking = self
            .used
            .range(..floor)
            .next_back()
            .filter(|(o, l)| !self.top.contains(o) && *o + *l > start)
            .map(|(&o, &l)| (o, l));
        Error::WorkspaceRegionTaken {
            requested,
            floor,
            blocking,
            capacity: self.capacity,
        }
    }

    /// Frees the allocation that starts at `offset`; returns its (rounded) length.
    pub fn free(&mut self, offset: u64) -> Result<u64> {
        let len = self
            .used
            .remove(&offset)
            .ok_or(Error::NotAllocated(offset))?;
        self.top.remove(&offset);
        let (mut start, mut end) = (offset, offset + len);
        // Merge with the free block just before, if it ends where we start.
        if let Some((&p_off, &p_len)) = self.free.range(..start).next_back() {
            if p_off + p_len == start {
                self.free.remove(&p_off);
                start = p_off;
            }
        }
        // Merge with the free block starting where we end.
        if let Some(n_len) = self.free.remove(&end) {
            end += n_len;
        }
        self.free.insert(start, end - start);
        self.digest = heap_digest::fold(self.digest, heap_digest::FREE, offset, len);
        Ok(len)
    }

    /// The live allocation containing byte `offset`, as (start, length).
    pub fn find(&self, offset: u64) -> Option<(u64, u64)> {
        let (&s, &l) = self.used.range(..=offset).next_back()?;
        (offset < s + l).then_some((s, l))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_follows_the_calls_not_the_state() {
        let mut a = Allocator::new(1 << 20);
        let mut b = Allocator::new(1 << 20);
        assert_eq!(a.digest(), heap_digest::EMPTY);
        let (x, y) = (a.alloc(1000).unwrap(), b.alloc(1000).unwrap());
        assert_eq!(a.digest(), b.digest(), "same calls, same digest");
        assert_eq!(
            a.digest(),
            heap_digest::fold(heap_digest::EMPTY, heap_digest::ALLOC, 0, 1024)
        );
        // Another size rounds to another length: the digests part.
        let (a2, b2) = (a.alloc(256).unwrap(), b.alloc(512).unwrap());
        assert_ne!(a.digest(), b.digest());
        // Back to the same live allocations by other calls: still apart (the history differs).
        a.free(a2).unwrap();
        b.free(b2).unwrap();
        assert_eq!((a.live_allocations(), b.live_allocations()), (1, 1));
        assert_ne!(a.digest(), b.digest());
        // A failed call changes nothing.
        let before = a.digest();
        assert!(a.alloc(1 << 30).is_err() && a.free(12345).is_err());
        assert_eq!(a.digest(), before);
        let _ = (x, y);
    }

    #[test]
    fn aligned_first_fit() {
        let mut a = Allocator::new(4096);
        assert_eq!(a.alloc(1).unwrap(), 0);
        assert_eq!(a.alloc(0).unwrap(), 256);
        assert_eq!(a.alloc(257).unwrap(), 512);
        assert_eq!(a.alloc(256).unwrap(), 1024);
        assert_eq!(a.free_bytes(), 4096 - 1280);
        // Free a hole in the middle: first fit reuses it for a small request.
        a.free(256).unwrap();
        assert_eq!(a.alloc(100).unwrap(), 256);
    }

    #[test]
    fn coalescing_restores_one_block() {
        let mut a = Allocator::new(1 << 20);
        let offs: Vec<u64> = (0..64).map(|i| a.alloc(1000 + i * 37).unwrap()).collect();
        // Free in an interleaved order so that both neighbour merges are exercised.
        for o in offs.iter().step_by(2) {
            a.free(*o).unwrap();
        }
        for o in offs.iter().skip(1).step_by(2) {
            a.free(*o).unwrap();
        }
        assert_eq!(a.free_bytes(), 1 << 20);
        assert_eq!(a.largest_free(), 1 << 20);
        assert_eq!(a.free.len(), 1);
        assert_eq!(a.live_allocations(), 0);
    }

    #[test]
    fn out_of_memory_names_requested_and_free() {
        let mut a = Allocator::new(1024);
        a.alloc(512).unwrap();
        let e = a.alloc(1000).unwrap_err();
        assert_eq!(
            e,
            Error::OutOfMemory {
                requested: 1000,
                free: 512,
                largest_free: 512,
                capacity: 1024
            }
        );
        let msg = e.to_string();
        assert!(msg.contains("1000") && msg.contains("512"), "{msg}");
        assert!(a.alloc(u64::MAX).is_err());
    }

    #[test]
    fn double_free_and_interior_free_are_errors() {
        let mut a = Allocator::new(4096);
        let o = a.alloc(600).unwrap();
        assert_eq!(a.find(o + 599), Some((o, 768)));
        assert_eq!(a.find(o + 768), None);
        assert_eq!(a.free(o + 256), Err(Error::NotAllocated(o + 256)));
        a.free(o).unwrap();
        assert_eq!(a.free(o), Err(Error::NotAllocated(o)));
    }

    #[test]
    fn many_cycles_are_deterministic_and_leak_free() {
        let mut a = Allocator::new(1 << 24);
        let mut b = Allocator::new(1 << 24);
        let mut live = Vec::new();
        // A fixed pseudo-random pattern (LCG): two allocators fed the same calls agree.
        let mut x: u64 = 12345;
        for _ in 0..1000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if live.len() < 20 && !x.is_multiple_of(3) {
                let n = (x >> 33) % 100_000;
                let oa = a.alloc(n).unwrap();
                assert_eq!(oa, b.alloc(n).unwrap());
                assert_eq!(oa % ALIGN, 0);
                live.push(oa);
            } else if !live.is_empty() {
                let o = live.swap_remove((x >> 40) as usize % live.len());
                a.free(o).unwrap();
                b.free(o).unwrap();
            }
        }
        for o in live {
            a.free(o).unwrap();
        }
        assert_eq!(a.free_bytes(), 1 << 24);
        assert_eq!(a.free.len(), 1);
    }

    #[test]
    fn workspaces_sit_at_the_same_offsets_whatever_the_user_allocated() {
        // Rank a allocates 1000 fp32 first, rank b 2000 (the misuse of issue 62): their user
        // tensors part, their workspaces do not.
        let (mut a, mut b) = (Allocator::new(1 << 20), Allocator::new(1 << 20));
        a.alloc(4000).unwrap();
        b.alloc(8000).unwrap();
        let (xa, xb) = (a.alloc(8192).unwrap(), b.alloc(8192).unwrap());
        assert_ne!(xa, xb);
        for n in [100_000, 3000, 65536] {
            assert_eq!(a.alloc_top(n).unwrap(), b.alloc_top(n).unwrap());
        }
        assert_eq!(
            a.alloc_top(256).unwrap(),
            (1 << 20) - 100_096 - 3072 - 65536 - 256
        );
        // Under the workspaces the user region stays first-fit from the bottom.
        assert_eq!(a.alloc(100).unwrap(), xa + 8192);
    }

    #[test]
    fn a_workspace_never_goes_elsewhere_than_under_the_last() {
        let mut a = Allocator::new(4096);
        let top = a.alloc_top(1000).unwrap();
        assert_eq!(top, 3072);
        // The user fills [0, 2048); then [2048, 3072) holds a tensor: the next workspace may not
        // go past it.
        a.alloc(2048).unwrap();
        let user = a.alloc(1024).unwrap();
        assert_eq!(user, 2048);
        let e = a.alloc_top(256).unwrap_err();
        assert_eq!(
            e,
            Error::WorkspaceRegionTaken {
                requested: 256,
                floor: 3072,
                blocking: Some((2048, 1024)),
                capacity: 4096
            }
        );
        assert!(e.to_string().contains("heap_bytes()"), "{e}");
        a.free(user).unwrap();
        assert_eq!(a.alloc_top(256).unwrap(), 2816);
        // Too large for what is left under the floor: no block named.
        match a.alloc_top(1 << 20).unwrap_err() {
            Error::WorkspaceRegionTaken { blocking, .. } => assert_eq!(blocking, None),
            e => panic!("{e}"),
        }
        // Freeing the workspaces (the heap's close) gives every byte back in one block.
        a.free(2816).unwrap();
        a.free(top).unwrap();
        a.free(0).unwrap();
        assert_eq!((a.free_bytes(), a.free.len()), (4096, 1));
        assert_eq!(a.alloc_top(4096).unwrap(), 0);
    }
}
