//! The calls on the CUDA driver, NVSHMEM's host library and streams, and DLPack capsules.

use super::{dlpack, IntoPy};
use crate::driver;
use pyo3::prelude::*;

/// Whether the CUDA driver library can be loaded in this process.
#[pyfunction]
pub(super) fn driver_available() -> bool {
    driver::available()
}

/// Runs NVSHMEM's `nvshmemx_cumodule_init` on the loaded `module` (a `CUmodule` handle, e.g.
/// Triton's `CompiledKernel.module`) if it holds NVSHMEM device code, before its first launch;
/// returns whether it did. `library` is where to find libnvshmem_host.so.3 when the process has
/// not loaded it yet. Call it where the module's context is current.
#[pyfunction]
#[pyo3(signature = (module, library=None))]
pub(super) fn nvshmem_cumodule_init(
    py: Python<'_>,
    module: u64,
    library: Option<String>,
) -> PyResult<bool> {
    py.detach(|| crate::nvshmem_host::cumodule_init(module, library.as_deref()))
        .py()
}

/// NVSHMEM's `nvshmemx_init_status()` (0 not initialized, 1 bootstrapped, 2+ initialized), from
/// the libnvshmem_host.so.3 the module init uses (`library` as in `nvshmem_cumodule_init`).
#[pyfunction]
#[pyo3(signature = (library=None))]
pub(super) fn nvshmem_init_status(library: Option<String>) -> PyResult<i32> {
    crate::nvshmem_host::init_status(library.as_deref()).py()
}

/// Device `device`'s `stream` (a `CUstream` handle, e.g. `torch.cuda.Stream.cuda_stream`)
/// writes `value` to the u64 at `addr` after its earlier work (`Device::stream_write_u64`).
#[pyfunction]
pub(super) fn stream_write_u64(device: i32, stream: u64, addr: u64, value: u64) -> PyResult<()> {
    driver::Device::open(device)
        .and_then(|d| d.stream_write_u64(stream, addr, value))
        .py()
}

/// Device `device`'s `stream` waits until the u64 at `addr` equals `value`
/// (`Device::stream_wait_u64`).
#[pyfunction]
pub(super) fn stream_wait_u64(device: i32, stream: u64, addr: u64, value: u64) -> PyResult<()> {
    driver::Device::open(device)
        .and_then(|d| d.stream_wait_u64(stream, addr, value))
        .py()
}

/// A new stream of device `device` (a `CUstream` handle for `torch.cuda.ExternalStream`) that
/// only its caller uses, kept for the life of the process (`Device::stream_create`).
#[pyfunction]
pub(super) fn stream_create(device: i32) -> PyResult<u64> {
    driver::Device::open(device)
        .and_then(|d| d.stream_create())
        .py()
}

/// Number of CUDA devices visible to this process (raises without a driver).
#[pyfunction]
pub(super) fn device_count() -> PyResult<i32> {
    driver::device_count().py()
}

/// A DLPack capsule over `nbytes` bytes at `ptr` (1-D uint8) on (`device_type`, `device_id`);
/// `owner` stays alive while any consumer tensor does. 2 = kDLCUDA, 1 = kDLCPU.
#[pyfunction]
#[pyo3(signature = (ptr, nbytes, device_type, device_id, owner))]
pub(super) fn dlpack_capsule<'py>(
    py: Python<'py>,
    ptr: u64,
    nbytes: u64,
    device_type: i32,
    device_id: i32,
    owner: Py<PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    dlpack::capsule(py, ptr, nbytes, device_type, device_id, owner)
}
