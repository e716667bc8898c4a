//! What the host and the device library would do, asked without a GPU: the heap's and the
//! context's layouts, and the device's own algorithm rules (so Python's launch planning and the
//! benchmarks' labels follow them).

use super::IntoPy;
use crate::abi;
use crate::context::encode_with_layout;
use crate::heap::Layout;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// (user heap, signal, scratch) bytes of a heap asked for with `heap_bytes` and `scratch_bytes`
/// (each rounded up to 4 KiB); one rank's buffer is their sum.
#[pyfunction]
pub(super) fn heap_layout(heap_bytes: u64, scratch_bytes: u64) -> PyResult<(u64, u64, u64)> {
    let l = Layout::new(heap_bytes, scratch_bytes).py()?;
    Ok((l.heap, l.signal, l.scratch))
}

/// The context layout as the host writes it: [(field, offset, size)], for the Python ABI test.
#[pyfunction]
pub(super) fn context_layout() -> Vec<(&'static str, usize, usize)> {
    encode_with_layout(&abi::SymmContext::new(0, 1)).1
}

/// A context with `world` ranks and `scratch_bytes` of scratch, for asking the device's own
/// algorithm rules what a launch of `ctas` CTAs would do (nothing is mapped).
fn choice_context(world: i32, scratch_bytes: u64, ctas: usize) -> PyResult<abi::SymmContext> {
    crate::context::check_rank(0, world).py()?;
    if ctas == 0 || ctas > abi::MAX_CTAS {
        return Err(PyRuntimeError::new_err(format!(
            "ctas {ctas} is outside 1..={}",
            abi::MAX_CTAS
        )));
    }
    let mut c =
        ironlink_device::collectives::choice::with_default_limits(abi::SymmContext::new(0, world));
    c.scratch_size = scratch_bytes;
    Ok(c)
}

/// The all-reduce algorithm the device picks ("one_shot_ll", "two_shot_ll" or "two_shot") for a
/// message of `nbytes` on `ctas` CTAs of `world` ranks, with the given scratch size and limits:
/// the device's own `choose`, so the benchmark can label what it measured.
#[pyfunction]
pub(super) fn all_reduce_algorithm(
    world: i32,
    scratch_bytes: u64,
    ar_one_shot_max_bytes: u64,
    ar_ll_max_bytes: u64,
    ctas: usize,
    nbytes: usize,
) -> PyResult<&'static str> {
    let mut c = choice_context(world, scratch_bytes, ctas)?;
    c.ar_one_shot_max_bytes = ar_one_shot_max_bytes;
    c.ar_ll_max_bytes = ar_ll_max_bytes;
    use ironlink_device::collectives::choice::{choose, Algorithm};
    Ok(match choose(&c, ctas, nbytes) {
        Algorithm::OneShotLl => "one_shot_ll",
        Algorithm::TwoShotLl => "two_shot_ll",
        Algorithm::TwoShot => "two_shot",
    })
}

/// Whether an all_gather / reduce_scatter over a buffer of `total_bytes` (blocks of
/// `block_bytes`) on `ctas` CTAs goes over LL packets ("ll") or the buffers ("bulk"): the
/// device's own rule.
#[pyfunction]
pub(super) fn gather_algorithm(
    world: i32,
    scratch_bytes: u64,
    gather_ll_max_bytes: u64,
    ctas: usize,
    total_bytes: usize,
    block_bytes: usize,
) -> PyResult<&'static str> {
    let mut c = choice_context(world, scratch_bytes, ctas)?;
    c.gather_ll_max_bytes = gather_ll_max_bytes;
    let ll = ironlink_device::collectives::choice::use_ll(&c, ctas, total_bytes, block_bytes);
    Ok(if ll { "ll" } else { "bulk" })
}

/// The algorithm of a tile all-reduce ("one_shot_ll" or "two_shot") on tile index `tile` of
/// `rows` rows of `row_bytes` bytes, on a context of `world` ranks with a signal region of
/// `signal_bytes`: the device's own rule (`ironlink.tuning.tile_all_reduce_takes_ll` mirrors it
/// for the launch planning of the fused ops, and is tested against this).
#[pyfunction]
pub(super) fn tile_all_reduce_algorithm(
    world: i32,
    signal_bytes: u64,
    tile: usize,
    rows: usize,
    row_bytes: usize,
) -> PyResult<&'static str> {
    let mut c = choice_context(world, 0, 1)?;
    c.signal_size = signal_bytes;
    use ironlink_device::collectives::choice::{tile_all_reduce, TileAlgorithm};
    let packets = rows.saturating_mul(row_bytes.div_ceil(8));
    Ok(
        match tile_all_reduce(&c, tile, rows.saturating_mul(row_bytes), packets) {
            TileAlgorithm::OneShotLl => "one_shot_ll",
            TileAlgorithm::TwoShot => "two_shot",
        },
    )
}
