//! `ironlink._native`: the Python face of the host library (cargo feature `python`).
//!
//! Thin on purpose: collectives over process groups, tensors and dtypes live in Python
//! (`python/ironlink/runtime/`); this module exposes the heap, the context and DLPack capsules.
//! Every host error becomes `ironlink.runtime.errors.IronlinkError` with the host's message.

mod dlpack;

use crate::context::{encode_with_layout, AlgorithmLimits, ContextOwner, ExternalContext};
use crate::error::Error;
use crate::exchange::GpuSharing;
use crate::external_heap::open_external_heap;
use crate::heap::{self, Layout, LocalHeap, SymmHeap};
use crate::{abi, alloc, driver, exchange};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyType};
use std::sync::{Mutex, MutexGuard};

/// Raises `IronlinkError` (defined in Python so users can import and catch it without the
/// extension); falls back to `RuntimeError`, its base class, if that module cannot be imported.
fn py_err(e: Error) -> PyErr {
    let msg = e.to_string();
    Python::attach(|py| {
        let cls = py
            .import("ironlink.runtime.errors")
            .and_then(|m| m.getattr("IronlinkError"))
            .ok()
            .and_then(|c| c.cast_into::<PyType>().ok());
        match cls {
            Some(cls) => PyErr::from_type(cls, msg),
            None => PyRuntimeError::new_err(msg),
        }
    })
}

trait IntoPy<T> {
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for crate::error::Result<T> {
    fn py(self) -> PyResult<T> {
        self.map_err(py_err)
    }
}

/// Locks ignoring poison: a panic inside one call must not make the heap unusable for close().
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Emits the `#[pymethods]` of a class over a `Mutex` of a [`ContextOwner`] (an open heap, an
/// external context): the calls they share, written once, then the class's own (`impl` body).
macro_rules! context_owner_methods {
    (impl $ty:ident { $($own:tt)* }) => {
        #[pymethods]
        impl $ty {
            /// Device address of the `SymmContext` (pass it to kernels as `ctx`).
            #[getter]
            fn ctx(&self) -> PyResult<u64> {
                lock(&self.inner).ctx_ptr().py()
            }

            #[getter]
            fn rank(&self) -> i32 {
                lock(&self.inner).rank()
            }

            #[getter]
            fn world(&self) -> i32 {
                lock(&self.inner).world()
            }

            #[getter]
            fn closed(&self) -> bool {
                lock(&self.inner).is_closed()
            }

            /// (status, detail) of the first device-side error, (0, 0) if none. Synchronizes
            /// the device.
            fn read_error(&self, py: Python<'_>) -> PyResult<(i32, i32)> {
                py.detach(|| lock(&self.inner).context()?.read_error()).py()
            }

            /// Records (status, detail) unless an error stands; returns the one that stands.
            /// Synchronizes the device.
            fn record_error(&self, py: Python<'_>, code: i32, detail: i32) -> PyResult<i32> {
                py.detach(|| lock(&self.inner).context()?.record_error(code, detail)).py()
            }

            fn clear_error(&self, py: Python<'_>) -> PyResult<()> {
                py.detach(|| lock(&self.inner).context()?.clear_error()).py()
            }

            fn set_timeout_ns(&self, py: Python<'_>, ns: u64) -> PyResult<()> {
                py.detach(|| lock(&self.inner).context()?.set_timeout_ns(ns)).py()
            }

            fn set_algorithm_limits(
                &self,
                py: Python<'_>,
                ar_one_shot_max_bytes: u64,
                ar_ll_max_bytes: u64,
                gather_ll_max_bytes: u64,
            ) -> PyResult<()> {
                let limits = AlgorithmLimits {
                    ar_one_shot_max_bytes,
                    ar_ll_max_bytes,
                    gather_ll_max_bytes,
                };
                py.detach(|| lock(&self.inner).context()?.set_algorithm_limits(limits)).py()
            }

            /// Releases what the object owns (a heap: unmaps peers, frees memory). Idempotent.
            fn close(&self, py: Python<'_>) -> PyResult<()> {
                py.detach(|| lock(&self.inner).close()).py()
            }

            $($own)*
        }
    };
}

/// This rank's heap before the exchange (see `LocalHeap` in the Rust docs).
#[pyclass(name = "LocalHeap", module = "ironlink._native")]
struct PyLocalHeap {
    inner: Mutex<Option<LocalHeap>>,
}

#[pymethods]
impl PyLocalHeap {
    #[staticmethod]
    #[pyo3(signature = (device, heap_bytes, scratch_bytes, rank, world))]
    fn create(
        py: Python<'_>,
        device: i32,
        heap_bytes: u64,
        scratch_bytes: u64,
        rank: i32,
        world: i32,
    ) -> PyResult<Self> {
        let h = py
            .detach(|| LocalHeap::create(device, heap_bytes, scratch_bytes, rank, world))
            .py()?;
        Ok(PyLocalHeap {
            inner: Mutex::new(Some(h)),
        })
    }

    /// The bytes every other rank needs (send them with any transport).
    fn handle_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let g = lock(&self.inner);
        let h = g
            .as_ref()
            .ok_or_else(|| py_err(Error::Closed("this LocalHeap (already opened)")))?;
        Ok(PyBytes::new(py, &h.handle_bytes()))
    }

    /// Maps every peer (`handles`: the bytes of all ranks) and returns the open `Heap`.
    /// `shared_gpu`: ranks may share a GPU (multi-rank tests on fewer GPUs, under CUDA MPS).
    /// Consumes this object; on error its memory is freed.
    #[pyo3(signature = (handles, shared_gpu=false))]
    fn open_peers(
        &self,
        py: Python<'_>,
        handles: Vec<Vec<u8>>,
        shared_gpu: bool,
    ) -> PyResult<PyHeap> {
        let h = lock(&self.inner)
            .take()
            .ok_or_else(|| py_err(Error::Closed("this LocalHeap (already opened)")))?;
        let sharing = if shared_gpu {
            GpuSharing::Shared
        } else {
            GpuSharing::OnePerRank
        };
        let heap = py.detach(|| h.open_peers(&handles, sharing)).py()?;
        Ok(PyHeap {
            inner: Mutex::new(heap),
        })
    }

    /// Frees the memory without opening (e.g. when another rank failed). Idempotent.
    fn close(&self) {
        lock(&self.inner).take();
    }
}

/// An open symmetric heap.
#[pyclass(name = "Heap", module = "ironlink._native")]
struct PyHeap {
    inner: Mutex<SymmHeap>,
}

impl PyHeap {
    fn with<T>(&self, f: impl FnOnce(&mut SymmHeap) -> crate::error::Result<T>) -> PyResult<T> {
        f(&mut lock(&self.inner)).py()
    }
}

context_owner_methods! {
impl PyHeap {
    /// A heap over a buffer someone else allocated (PyTorch NVSHMEM symmetric memory) of
    /// `heap_layout(heap_bytes, scratch_bytes)` total bytes, at `bases[r]` for rank `r` as mapped
    /// here; `backend` is the context's backend kind; `node_size` groups the ranks into nodes
    /// (0: one node; else a multi-node context whose own node's bases must be non-null).
    /// Zeroes this rank's buffer. Every rank must wait for all others to get here before any
    /// launch (the signal regions must be zero).
    #[staticmethod]
    #[pyo3(signature = (device, heap_bytes, scratch_bytes, rank, world, backend, bases, node_size=0))]
    #[allow(clippy::too_many_arguments)]
    fn over_external(
        py: Python<'_>,
        device: i32,
        heap_bytes: u64,
        scratch_bytes: u64,
        rank: i32,
        world: i32,
        backend: u32,
        bases: Vec<u64>,
        node_size: i32,
    ) -> PyResult<Self> {
        let heap = py
            .detach(|| {
                let layout = Layout::new(heap_bytes, scratch_bytes)?;
                open_external_heap(device, rank, world, backend, node_size, layout, &bases)
            })
            .py()?;
        Ok(PyHeap {
            inner: Mutex::new(heap),
        })
    }

    #[getter]
    fn device(&self) -> i32 {
        lock(&self.inner).device()
    }

    #[getter]
    fn heap_size(&self) -> u64 {
        lock(&self.inner).layout().heap
    }

    #[getter]
    fn signal_size(&self) -> u64 {
        lock(&self.inner).layout().signal
    }

    #[getter]
    fn scratch_size(&self) -> u64 {
        lock(&self.inner).layout().scratch
    }

    /// Free bytes in the user region.
    #[getter]
    fn free_bytes(&self) -> u64 {
        lock(&self.inner).allocator().free_bytes()
    }

    #[getter]
    fn live_allocations(&self) -> usize {
        lock(&self.inner).allocator().live_allocations()
    }

    /// The running digest of this heap's allocations and frees (`abi::heap_digest`), which the
    /// context's `heap_digest` field must hold for the next kernel (written by the caller, in
    /// its stream's order).
    #[getter]
    fn digest(&self) -> u64 {
        lock(&self.inner).digest()
    }

    /// Base address of `rank`'s user region as mapped in this process.
    fn peer_base(&self, rank: i32) -> PyResult<u64> {
        self.with(|h| h.peer_base(rank))
    }

    /// Allocates `nbytes` (256-byte aligned); returns the offset in the user region.
    fn alloc(&self, nbytes: u64) -> PyResult<u64> {
        self.with(|h| h.alloc(nbytes))
    }

    /// Allocates an op's workspace of `nbytes` at the end of the user region, at an offset
    /// that follows from the workspace calls alone (`Allocator::alloc_top`).
    fn alloc_top(&self, nbytes: u64) -> PyResult<u64> {
        self.with(|h| h.alloc_top(nbytes))
    }

    fn free(&self, offset: u64) -> PyResult<()> {
        self.with(|h| h.free(offset))
    }

    /// The live allocation containing `offset`, as (start, length), or None.
    fn find(&self, offset: u64) -> Option<(u64, u64)> {
        lock(&self.inner).find(offset)
    }

    /// The context bytes as the device holds them.
    fn read_context<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let b = py.detach(|| lock(&self.inner).context()?.read()).py()?;
        Ok(PyBytes::new(py, &b))
    }

}
}

/// A context over memory allocated by someone else (PyTorch symmetric memory).
#[pyclass(name = "ExternalContext", module = "ironlink._native")]
struct PyExternalContext {
    inner: Mutex<ExternalContext>,
}

context_owner_methods! {
impl PyExternalContext {
    #[new]
    #[pyo3(signature = (device, rank, world, buffer_ptrs, buffer_size, signal_pad_ptrs, signal_pad_size))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        device: i32,
        rank: i32,
        world: i32,
        buffer_ptrs: Vec<u64>,
        buffer_size: u64,
        signal_pad_ptrs: Vec<u64>,
        signal_pad_size: u64,
    ) -> PyResult<Self> {
        let c = py
            .detach(|| {
                ExternalContext::create(
                    device,
                    rank,
                    world,
                    &buffer_ptrs,
                    buffer_size,
                    &signal_pad_ptrs,
                    signal_pad_size,
                )
            })
            .py()?;
        Ok(PyExternalContext {
            inner: Mutex::new(c),
        })
    }
}
}

/// Whether the CUDA driver library can be loaded in this process.
#[pyfunction]
fn driver_available() -> bool {
    driver::available()
}

/// Runs NVSHMEM's `nvshmemx_cumodule_init` on the loaded `module` (a `CUmodule` handle, e.g.
/// Triton's `CompiledKernel.module`) if it holds NVSHMEM device code, before its first launch;
/// returns whether it did. `library` is where to find libnvshmem_host.so.3 when the process has
/// not loaded it yet. Call it where the module's context is current.
#[pyfunction]
#[pyo3(signature = (module, library=None))]
fn nvshmem_cumodule_init(py: Python<'_>, module: u64, library: Option<String>) -> PyResult<bool> {
    py.detach(|| crate::nvshmem_host::cumodule_init(module, library.as_deref()))
        .py()
}

/// NVSHMEM's `nvshmemx_init_status()` (0 not initialized, 1 bootstrapped, 2+ initialized), from
/// the libnvshmem_host.so.3 the module init uses (`library` as in `nvshmem_cumodule_init`).
#[pyfunction]
#[pyo3(signature = (library=None))]
fn nvshmem_init_status(library: Option<String>) -> PyResult<i32> {
    crate::nvshmem_host::init_status(library.as_deref()).py()
}

/// Device `device`'s `stream` (a `CUstream` handle, e.g. `torch.cuda.Stream.cuda_stream`)
/// writes `value` to the u64 at `addr` after its earlier work (`Device::stream_write_u64`).
#[pyfunction]
fn stream_write_u64(device: i32, stream: u64, addr: u64, value: u64) -> PyResult<()> {
    driver::Device::open(device)
        .and_then(|d| d.stream_write_u64(stream, addr, value))
        .py()
}

/// Device `device`'s `stream` waits until the u64 at `addr` equals `value`
/// (`Device::stream_wait_u64`).
#[pyfunction]
fn stream_wait_u64(device: i32, stream: u64, addr: u64, value: u64) -> PyResult<()> {
    driver::Device::open(device)
        .and_then(|d| d.stream_wait_u64(stream, addr, value))
        .py()
}

/// A new stream of device `device` (a `CUstream` handle for `torch.cuda.ExternalStream`) that
/// only its caller uses, kept for the life of the process (`Device::stream_create`).
#[pyfunction]
fn stream_create(device: i32) -> PyResult<u64> {
    driver::Device::open(device)
        .and_then(|d| d.stream_create())
        .py()
}

/// Number of CUDA devices visible to this process (raises without a driver).
#[pyfunction]
fn device_count() -> PyResult<i32> {
    driver::device_count().py()
}

/// A DLPack capsule over `nbytes` bytes at `ptr` (1-D uint8) on (`device_type`, `device_id`);
/// `owner` stays alive while any consumer tensor does. 2 = kDLCUDA, 1 = kDLCPU.
#[pyfunction]
#[pyo3(signature = (ptr, nbytes, device_type, device_id, owner))]
fn dlpack_capsule<'py>(
    py: Python<'py>,
    ptr: u64,
    nbytes: u64,
    device_type: i32,
    device_id: i32,
    owner: Py<PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    dlpack::capsule(py, ptr, nbytes, device_type, device_id, owner)
}

/// (user heap, signal, scratch) bytes of a heap asked for with `heap_bytes` and `scratch_bytes`
/// (each rounded up to 4 KiB); one rank's buffer is their sum.
#[pyfunction]
fn heap_layout(heap_bytes: u64, scratch_bytes: u64) -> PyResult<(u64, u64, u64)> {
    let l = Layout::new(heap_bytes, scratch_bytes).py()?;
    Ok((l.heap, l.signal, l.scratch))
}

/// The context layout as the host writes it: [(field, offset, size)], for the Python ABI test.
#[pyfunction]
fn context_layout() -> Vec<(&'static str, usize, usize)> {
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
fn all_reduce_algorithm(
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
fn gather_algorithm(
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
fn tile_all_reduce_algorithm(
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

#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyLocalHeap>()?;
    m.add_class::<PyHeap>()?;
    m.add_class::<PyExternalContext>()?;
    m.add_function(wrap_pyfunction!(driver_available, m)?)?;
    m.add_function(wrap_pyfunction!(device_count, m)?)?;
    m.add_function(wrap_pyfunction!(stream_create, m)?)?;
    m.add_function(wrap_pyfunction!(stream_write_u64, m)?)?;
    m.add_function(wrap_pyfunction!(stream_wait_u64, m)?)?;
    m.add_function(wrap_pyfunction!(nvshmem_cumodule_init, m)?)?;
    m.add_function(wrap_pyfunction!(nvshmem_init_status, m)?)?;
    m.add_function(wrap_pyfunction!(dlpack_capsule, m)?)?;
    m.add_function(wrap_pyfunction!(context_layout, m)?)?;
    m.add_function(wrap_pyfunction!(heap_layout, m)?)?;
    m.add_function(wrap_pyfunction!(all_reduce_algorithm, m)?)?;
    m.add_function(wrap_pyfunction!(gather_algorithm, m)?)?;
    m.add_function(wrap_pyfunction!(tile_all_reduce_algorithm, m)?)?;
    m.add("ABI_VERSION", abi::ABI_VERSION)?;
    m.add("CONTEXT_SIZE", abi::CONTEXT_SIZE)?;
    m.add("HANDLE_BYTES", exchange::HANDLE_BYTES)?;
    m.add("SIGNAL_BYTES", heap::SIGNAL_BYTES)?;
    m.add("REGION_ALIGN", heap::REGION_ALIGN)?;
    m.add("ALLOC_ALIGN", alloc::ALIGN)?;
    m.add("MIN_SIGNAL_BYTES", abi::signal::MIN_BYTES)?;
    m.add("FULL_SIGNAL_BYTES", abi::signal::FULL_BYTES)?;
    Ok(())
}
