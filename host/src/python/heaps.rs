//! The heap and context classes: `LocalHeap` (this rank's heap before the exchange), `Heap` (an
//! open symmetric heap) and `ExternalContext` (a context over PyTorch's symmetric memory).

use super::{lock, py_err, IntoPy};
use crate::context::{ContextOwner, ExternalContext};
use crate::error::Error;
use crate::exchange::GpuSharing;
use crate::external_heap::open_external_heap;
use crate::heap::{Layout, LocalHeap, SymmHeap};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::Mutex;

/// This rank's heap before the exchange (see `LocalHeap` in the Rust docs).
#[pyclass(name = "LocalHeap", module = "ironlink._native")]
pub(super) struct PyLocalHeap {
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
pub(super) struct PyHeap {
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
pub(super) struct PyExternalContext {
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
