//! The layout of one rank's heap allocation.
//!
//! Each rank makes ONE `cuMemAlloc` allocation holding three regions, each 4 KiB aligned:
//!
//! ```text
//! [ user heap (tensors) | signal region (abi::signal::FULL_BYTES, zeroed) | scratch region ]
//! ```
//!
//! The regions sit at the same offsets on every rank, so an address in my heap translates to a
//! peer's by adding the difference of the two bases (what `symm_peer_ptr` does on the device).

use crate::abi;
use crate::alloc::round_up;
use crate::context::Regions;
use crate::error::{Error, Result};

/// Alignment of each region inside the allocation.
pub const REGION_ALIGN: u64 = 4096;
/// Scratch bytes when the caller does not choose (a tuning number: see its measurements there).
pub const DEFAULT_SCRATCH_BYTES: u64 =
    ironlink_device::collectives::choice::DEFAULT_SCRATCH_BYTES as u64;
/// Bytes of the signal region: the ABI's full layout (with the LL receive area of small tile
/// all-reduces; a context of only `MIN_BYTES` runs those two-shot), page aligned.
pub const SIGNAL_BYTES: u64 =
    (abi::signal::FULL_BYTES as u64).div_ceil(REGION_ALIGN) * REGION_ALIGN;

/// Sizes of the three regions (each a multiple of `REGION_ALIGN`), equal on every rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub heap: u64,
    pub signal: u64,
    pub scratch: u64,
}

impl Layout {
    /// Rounds the requested sizes up to `REGION_ALIGN`. The user heap must not be empty.
    pub fn new(heap_bytes: u64, scratch_bytes: u64) -> Result<Layout> {
        if heap_bytes == 0 {
            return Err(Error::InvalidArgument(
                "the heap needs at least 1 byte for tensors".into(),
            ));
        }
        let too_big = || Error::InvalidArgument("heap or scratch size overflows".into());
        let l = Layout {
            heap: round_up(heap_bytes, REGION_ALIGN).ok_or_else(too_big)?,
            signal: SIGNAL_BYTES,
            scratch: round_up(scratch_bytes, REGION_ALIGN).ok_or_else(too_big)?,
        };
        l.heap
            .checked_add(l.signal)
            .and_then(|x| x.checked_add(l.scratch))
            .filter(|&t| usize::try_from(t).is_ok())
            .ok_or_else(too_big)?;
        Ok(l)
    }

    pub fn signal_offset(&self) -> u64 {
        self.heap
    }

    pub fn scratch_offset(&self) -> u64 {
        self.heap + self.signal
    }

    /// The sizes of the three regions.
    pub fn sizes(&self) -> Regions {
        Regions {
            heap: self.heap,
            signal: self.signal,
            scratch: self.scratch,
        }
    }

    /// The regions of a buffer of this layout at `base`.
    pub fn regions_at(&self, base: u64) -> Regions {
        Regions {
            heap: base,
            signal: base + self.signal_offset(),
            scratch: base + self.scratch_offset(),
        }
    }

    pub fn total(&self) -> u64 {
        self.heap + self.signal + self.scratch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_rounds_and_aligns() {
        let l = Layout::new(1000, 5000).unwrap();
        assert_eq!((l.heap, l.scratch), (4096, 8192));
        assert!(l.signal >= abi::signal::FULL_BYTES as u64);
        assert_eq!(l.signal % REGION_ALIGN, 0);
        assert_eq!(l.signal_offset() % REGION_ALIGN, 0);
        assert_eq!(l.scratch_offset() % REGION_ALIGN, 0);
        assert_eq!(l.total(), 4096 + l.signal + 8192);
        assert!(Layout::new(0, 0).is_err());
        assert!(Layout::new(u64::MAX - 10, 0).is_err());
        assert_eq!(Layout::new(1, 0).unwrap().scratch, 0);
    }
}
