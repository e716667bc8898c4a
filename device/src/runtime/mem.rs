//! Moving data in units of words: 16-byte vectors for bulk transfers, 8-byte units for LL
//! packets, with exact handling of a partial last unit and of regions that are not aligned to
//! the unit (such regions take the narrow path; nothing outside the region is read or written).

use crate::hw;
use core::num::NonZeroU32;

/// Loads `valid` bytes (a multiple of 2, at most `4 * W`) at `addr` into `W` words, zero-padded.
///
/// # Safety
/// `[addr, addr + valid)` is mapped and readable, `addr` is 2-byte aligned.
#[inline(always)]
pub unsafe fn load_unit<const W: usize>(addr: usize, valid: usize) -> [u32; W] {
    let mut out = [0u32; W];
    if valid == 4 * W && addr.is_multiple_of(4 * W) {
        if W == 4 {
            let v = hw::load_v4(addr as *const [u32; 4]);
            let mut i = 0;
            while i < W {
                out[i] = v[i];
                i += 1;
            }
        } else {
            let mut i = 0;
            while i < W {
                out[i] = hw::load_u32((addr + 4 * i) as *const u32);
                i += 1;
            }
        }
        return out;
    }
    let mut i = 0;
    while i < W {
        let at = addr + 4 * i;
        let left = valid.saturating_sub(4 * i);
        if left >= 4 && at.is_multiple_of(4) {
            out[i] = hw::load_u32(at as *const u32);
        } else if left >= 2 {
            let lo = hw::load_u16(at as *const u16) as u32;
            let hi = if left >= 4 {
                hw::load_u16((at + 2) as *const u16) as u32
            } else {
                0
            };
            out[i] = lo | hi << 16;
        }
        i += 1;
    }
    out
}

/// Stores the first `valid` bytes of `words` at `addr`; the counterpart of `load_unit`.
///
/// # Safety
/// `[addr, addr + valid)` is mapped and writable, `addr` is 2-byte aligned.
#[inline(always)]
pub unsafe fn store_unit<const W: usize>(addr: usize, valid: usize, words: [u32; W]) {
    if valid == 4 * W && addr.is_multiple_of(4 * W) {
        if W == 4 {
            hw::store_v4(
                addr as *mut [u32; 4],
                [words[0], words[1 % W], words[2 % W], words[3 % W]],
            );
        } else {
            let mut i = 0;
            while i < W {
                hw::store_u32((addr + 4 * i) as *mut u32, words[i]);
                i += 1;
            }
        }
        return;
    }
    let mut i = 0;
    while i < W {
        let at = addr + 4 * i;
        let left = valid.saturating_sub(4 * i);
        if left >= 4 && at.is_multiple_of(4) {
            hw::store_u32(at as *mut u32, words[i]);
        } else if left >= 2 {
            hw::store_u16(at as *mut u16, words[i] as u16);
            if left >= 4 {
                hw::store_u16((at + 2) as *mut u16, (words[i] >> 16) as u16);
            }
        }
        i += 1;
    }
}

/// Bytes of unit `i` (of `unit` bytes) that lie inside a region of `bytes` bytes.
#[inline(always)]
pub fn unit_bytes(i: usize, unit: usize, bytes: usize) -> usize {
    let start = i * unit;
    if start + unit <= bytes {
        unit
    } else {
        bytes - start
    }
}

// Division here is 32-bit on purpose: a 64-bit division is a subroutine call in SASS, and a call
// makes ptxas spill the live registers around it. Counts are < 2^32 (`Region::MAX_BYTES`).

// Divisors are never 0 (CTA counts, world sizes); `nonzero` says so to the compiler, which then
// emits no divide-by-zero panic (another call).
#[inline(always)]
fn nonzero(b: usize) -> NonZeroU32 {
    NonZeroU32::new(b as u32).unwrap_or(NonZeroU32::MIN)
}

/// `a / b` for `a < 2^32`, `0 < b < 2^32`.
#[inline(always)]
pub fn div32(a: usize, b: usize) -> usize {
    (a as u32 / nonzero(b)) as usize
}

/// `ceil(a / b)` for `a < 2^32`, `0 < b < 2^32`.
#[inline(always)]
pub fn div_ceil32(a: usize, b: usize) -> usize {
    let q = div32(a, b);
    q + (q * b < a) as usize
}

/// The part `[lo, hi)` of `0..n` that worker `k` of `parts` gets (contiguous, balanced: the
/// first `n % parts` workers get one more).
#[inline(always)]
pub fn split(n: usize, parts: usize, k: usize) -> (usize, usize) {
    let (n, p, k) = (n as u32, nonzero(parts), k as u32);
    let (base, extra) = (n / p, n % p);
    let lo = k * base + k.min(extra);
    let hi = lo + base + (k < extra) as u32;
    (lo as usize, hi as usize)
}

/// The rank `k` places after `rank` (for `k <= world`), without a division.
#[inline(always)]
pub fn rotate(rank: usize, k: usize, world: usize) -> usize {
    let s = rank + k;
    if s >= world {
        s - world
    } else {
        s
    }
}

/// Copies `n` bytes from `src` to `dst`, spread over `threads` threads (this is thread `tid`).
/// Uses 16-byte vectors when both ends are 16-byte aligned, words when both are 4-byte aligned,
/// bytes otherwise.
///
/// # Safety
/// Both ranges are mapped, `dst` writable, and they do not overlap.
#[inline(always)]
pub unsafe fn copy_bytes(dst: usize, src: usize, n: usize, tid: usize, threads: usize) {
    let (head, width) = if dst.is_multiple_of(16) && src.is_multiple_of(16) {
        (n / 16 * 16, 16)
    } else if dst.is_multiple_of(4) && src.is_multiple_of(4) {
        (n / 4 * 4, 4)
    } else {
        (0, 1)
    };
    let mut i = tid;
    if width == 16 {
        while i < head / 16 {
            let v = hw::load_v4((src + 16 * i) as *const [u32; 4]);
            hw::store_v4((dst + 16 * i) as *mut [u32; 4], v);
            i += threads;
        }
    } else if width == 4 {
        while i < head / 4 {
            hw::store_u32(
                (dst + 4 * i) as *mut u32,
                hw::load_u32((src + 4 * i) as *const u32),
            );
            i += threads;
        }
    }
    let mut j = head + tid;
    while j < n {
        hw::store_u8((dst + j) as *mut u8, hw::load_u8((src + j) as *const u8));
        j += threads;
    }
}
