//! The exported device functions: the whole C ABI of the bitcode library. Each checks its
//! arguments and hands them to a collective (`crate::collectives`) or primitive.
//!
//! Every function is called by every thread of the CTA (Triton's scalar extern semantics) and is
//! CTA-cooperative: it elects threads and synchronizes by itself. All ranks must launch the same
//! grid and make the same sequence of calls. Status-returning functions give 0 on success and a
//! negative `abi::status` code otherwise; arguments are checked before anything is written.
//! Pointers are device addresses (Triton passes a tensor pointer as i64).
//!
//! The functions by group, each group's table made by `exports!` from the functions themselves:
//! `queries` (rank, world, peer addresses, the recorded error), `collectives` (whole buffers,
//! barriers), `tiles` (tile collectives, push-as-produced), `one_sided` (copies, signals,
//! fences); `EXPORTS` joins their tables. `call_shapes` holds the prologues they share, `checks`
//! the argument checks.

#[macro_use]
mod export_macro;
mod call_shapes;
mod checks;
mod collectives;
/// The NVSHMEM wrappers (functions in the NVSHMEM bitcode only; their table everywhere).
pub mod nvshmem;
mod one_sided;
mod queries;
mod tiles;

pub use collectives::*;
pub use one_sided::*;
pub use queries::*;
pub use tiles::*;

use crate::abi::FnSig;

/// The groups' tables, in the order of `EXPORTS`.
const GROUPS: [&[FnSig]; 4] = [
    queries::EXPORTS,
    collectives::EXPORTS,
    tiles::EXPORTS,
    one_sided::EXPORTS,
];

const EXPORT_COUNT: usize = {
    let (mut n, mut g) = (0, 0);
    while g < GROUPS.len() {
        n += GROUPS[g].len();
        g += 1;
    }
    n
};

/// The groups' tables one after another (const evaluation: no allocation, no_std).
const fn joined<const N: usize>() -> [FnSig; N] {
    let mut out = [GROUPS[0][0]; N];
    let (mut k, mut g) = (0, 0);
    while g < GROUPS.len() {
        let mut i = 0;
        while i < GROUPS[g].len() {
            out[k] = GROUPS[g][i];
            k += 1;
            i += 1;
        }
        g += 1;
    }
    out
}

const ALL_EXPORTS: [FnSig; EXPORT_COUNT] = joined();

/// Every exported device function of the P2P bitcode: the queries, the collectives, the tile
/// calls, the one-sided calls. A function's index here is what errors record (`which!`) and
/// what the host names it by; build.rs generates the Python wrappers from this table.
pub const EXPORTS: &[FnSig] = &ALL_EXPORTS;
