//! `ironlink._native`: the Python face of the host library (cargo feature `python`).
//!
//! Thin on purpose: collectives over process groups, tensors and dtypes live in Python
//! (`python/ironlink/runtime/`); this module exposes the heap, the context and DLPack capsules.
//! Every host error becomes `ironlink.runtime.errors.IronlinkError` with the host's message.
//!
//! Here the error conversion and the module's table; the classes in `heaps`, the calls on the
//! driver and streams in `device`, the layout and algorithm queries (no GPU) in `queries`.

use crate::error::Error;
use crate::{abi, alloc, exchange, heap};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyType;
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
                let limits = $crate::context::AlgorithmLimits {
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

// After the macro: `macro_rules!` is in scope only below its definition.
mod device;
mod dlpack;
mod heaps;
mod queries;

#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<heaps::PyLocalHeap>()?;
    m.add_class::<heaps::PyHeap>()?;
    m.add_class::<heaps::PyExternalContext>()?;
    m.add_function(wrap_pyfunction!(device::driver_available, m)?)?;
    m.add_function(wrap_pyfunction!(device::device_count, m)?)?;
    m.add_function(wrap_pyfunction!(device::stream_create, m)?)?;
    m.add_function(wrap_pyfunction!(device::stream_write_u64, m)?)?;
    m.add_function(wrap_pyfunction!(device::stream_wait_u64, m)?)?;
    m.add_function(wrap_pyfunction!(device::nvshmem_cumodule_init, m)?)?;
    m.add_function(wrap_pyfunction!(device::nvshmem_init_status, m)?)?;
    m.add_function(wrap_pyfunction!(device::dlpack_capsule, m)?)?;
    m.add_function(wrap_pyfunction!(queries::context_layout, m)?)?;
    m.add_function(wrap_pyfunction!(queries::heap_layout, m)?)?;
    m.add_function(wrap_pyfunction!(queries::all_reduce_algorithm, m)?)?;
    m.add_function(wrap_pyfunction!(queries::gather_algorithm, m)?)?;
    m.add_function(wrap_pyfunction!(queries::tile_all_reduce_algorithm, m)?)?;
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
