//! DLPack capsules over raw device memory: how the Python layer turns heap addresses into
//! `torch.Tensor`s without a compiled PyTorch extension.
//!
//! Why DLPack and not `__cuda_array_interface__`: PyTorch builds a tensor from the CUDA array
//! interface with `from_blob` *without* a target device, so it asks the driver which device the
//! pointer belongs to. For a peer's memory mapped through IPC that is the peer's GPU, and the
//! tensor would land on the wrong device. `fromDLPack` passes the device from the DLPack struct
//! explicitly, so a peer view is a tensor of *this* GPU, which is what a kernel launched here
//! dereferences. The capsule also carries a deleter, which holds the owner (the heap) alive for
//! as long as any tensor over its memory lives.

use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_void, CStr};

// The DLPack v0.x ABI (`dlpack.h`), the legacy unversioned `DLManagedTensor` every consumer reads.
#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

const KDL_UINT: u8 = 1;
const CAPSULE_NAME: &CStr = c"dltensor";

/// What the capsule points to: the managed tensor first (so the capsule pointer is also a
/// `DLManagedTensor*`), then the storage its `shape` points into, then the owner reference.
#[repr(C)]
struct Holder {
    managed: DLManagedTensor,
    shape: [i64; 1],
    owner: Option<Py<PyAny>>,
}

/// The DLPack deleter: frees the holder and releases the owner. Consumers (PyTorch) call it when
/// the last tensor over the memory dies, possibly on a thread without the GIL.
unsafe extern "C" fn deleter(m: *mut DLManagedTensor) {
    if m.is_null() {
        return;
    }
    // SAFETY: `manager_ctx` is the `Box<Holder>` leaked in `capsule`, and DLPack guarantees the
    // deleter runs once per managed tensor.
    let mut h = unsafe { Box::from_raw((*m).manager_ctx.cast::<Holder>()) };
    if let Some(owner) = h.owner.take() {
        // Dropping a Python reference needs the interpreter. During interpreter shutdown we cannot
        // attach; then leak the reference (the process is ending anyway) rather than crash.
        let mut slot = Some(owner);
        if Python::try_attach(|_| drop(slot.take())).is_none() {
            std::mem::forget(slot);
        }
    }
}

/// Capsule destructor: frees the tensor only if no consumer took it (a consumer renames the
/// capsule to "used_dltensor" and becomes responsible for calling the deleter).
unsafe extern "C" fn capsule_destructor(cap: *mut ffi::PyObject) {
    // SAFETY: called by Python with the GIL held on a capsule we created; IsValid and GetPointer
    // only inspect it.
    unsafe {
        if ffi::PyCapsule_IsValid(cap, CAPSULE_NAME.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(cap, CAPSULE_NAME.as_ptr()).cast::<DLManagedTensor>();
            deleter(m);
        }
    }
}

/// A legacy DLPack capsule ("dltensor") describing `nbytes` bytes at `ptr` as a 1-D uint8 array
/// on (`device_type`, `device_id`) — 2 is `kDLCUDA`, 1 is `kDLCPU`. `owner` is kept alive until
/// the consumer's last tensor is gone.
pub fn capsule<'py>(
    py: Python<'py>,
    ptr: u64,
    nbytes: u64,
    device_type: i32,
    device_id: i32,
    owner: Py<PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let n = i64::try_from(nbytes)
        .map_err(|_| pyo3::exceptions::PyValueError::new_err("nbytes too large"))?;
    let h = Box::new(Holder {
        managed: DLManagedTensor {
            dl_tensor: DLTensor {
                data: ptr as *mut c_void,
                device: DLDevice {
                    device_type,
                    device_id,
                },
                ndim: 1,
                dtype: DLDataType {
                    code: KDL_UINT,
                    bits: 8,
                    lanes: 1,
                },
                shape: std::ptr::null_mut(),
                // NULL strides: compact row-major, as DLPack defines.
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(deleter),
        },
        shape: [n],
        owner: Some(owner),
    });
    let raw = Box::into_raw(h);
    // SAFETY: `raw` is a valid, uniquely owned Holder; we point its self-references at itself.
    // The heap allocation does not move, so the pointers stay valid until the deleter frees it.
    unsafe {
        (*raw).managed.dl_tensor.shape = (*raw).shape.as_mut_ptr();
        (*raw).managed.manager_ctx = raw.cast();
    }
    // SAFETY: `raw` points to a live Holder whose first field is the DLManagedTensor; the name is
    // a static C string, as the capsule API requires (it does not copy it).
    let cap =
        unsafe { ffi::PyCapsule_New(raw.cast(), CAPSULE_NAME.as_ptr(), Some(capsule_destructor)) };
    if cap.is_null() {
        // SAFETY: the capsule was not created, so we still own `raw`.
        unsafe { deleter(raw.cast()) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `cap` is a new (owned) reference returned by PyCapsule_New.
    Ok(unsafe { Bound::from_owned_ptr(py, cap) })
}
