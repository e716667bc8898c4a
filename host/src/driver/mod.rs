//! The only module that calls the CUDA driver. Every other module goes through the safe functions
//! here, which check for the driver library first (cudarc's dynamic loader panics without it),
//! make this device's primary context current for exactly the duration of one call, and turn
//! every `CUresult` into an [`Error`] that names the call.
//!
//! We use the device's *primary* context because it is the one the CUDA runtime (and so PyTorch
//! and Triton) use: pointers we allocate or map there are valid in their kernels.

use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::ffi::{c_char, CStr};
use std::sync::{Arc, OnceLock};

mod owners;

pub use owners::{DeviceBuffer, IpcMapping};

/// Bytes of a legacy CUDA IPC memory handle (`CUipcMemHandle`).
pub const IPC_HANDLE_BYTES: usize = 64;

/// Whether `libcuda` can be loaded. Cached: loading is attempted once per process.
pub fn available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: `is_culib_present` only tries to dlopen the library under its known names; it has
    // no preconditions and does not call into the library.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// Loads the driver and runs `cuInit` once per process.
pub fn init() -> Result<()> {
    static INIT: OnceLock<Result<()>> = OnceLock::new();
    INIT.get_or_init(|| {
        if !available() {
            return Err(Error::NoDriver);
        }
        // SAFETY: the library is present (checked above), so cudarc's loader does not panic;
        // cuInit(0) is valid at any time and idempotent.
        check("cuInit", unsafe { sys::cuInit(0) })
    })
    .clone()
}

/// Turns a driver status into a `Result`, with the driver's own name and description of it.
fn check(call: &'static str, r: sys::CUresult) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let text = |f: unsafe fn(sys::CUresult, *mut *const c_char) -> sys::CUresult| {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: the driver is loaded (we only get here after a driver call returned); the
        // getter writes a pointer to a static NUL-terminated string, or leaves it null.
        let ok = unsafe { f(r, &mut p) } == sys::CUresult::CUDA_SUCCESS && !p.is_null();
        // SAFETY: `p` points to a static NUL-terminated string owned by the driver.
        ok.then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    Err(Error::Driver {
        call,
        code: r as i32,
        name: text(sys::cuGetErrorName).unwrap_or_else(|| format!("{r:?}")),
        description: text(sys::cuGetErrorString).unwrap_or_default(),
    })
}

/// Number of CUDA devices visible to this process.
pub fn device_count() -> Result<i32> {
    init()?;
    let mut n = 0;
    // SAFETY: driver initialized; `n` is a valid out-pointer.
    check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut n) })?;
    Ok(n)
}

/// The ordinal of the device with this PCI bus id, or `None` if it is not visible to this
/// process (e.g. hidden by `CUDA_VISIBLE_DEVICES`).
pub fn device_by_pci_bus_id(bus_id: &str) -> Result<Option<i32>> {
    init()?;
    let Ok(c) = std::ffi::CString::new(bus_id) else {
        return Ok(None);
    };
    let mut dev: sys::CUdevice = 0;
    // SAFETY: driver initialized; `c` is a NUL-terminated string and `dev` a valid out-pointer.
    let r = unsafe { sys::cuDeviceGetByPCIBusId(&mut dev, c.as_ptr()) };
    match r {
        sys::CUresult::CUDA_SUCCESS => Ok(Some(dev)),
        sys::CUresult::CUDA_ERROR_INVALID_VALUE | sys::CUresult::CUDA_ERROR_INVALID_DEVICE => {
            Ok(None)
        }
        e => check("cuDeviceGetByPCIBusId", e).map(|_| None),
    }
}

/// One GPU of this process, with its primary context retained for as long as this value lives.
#[derive(Debug)]
pub struct Device {
    ordinal: i32,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
}

// SAFETY: `ctx` is the device's primary context, a process-wide driver object that any thread may
// make current. We only ever make it current for the duration of one call on the calling thread
// (push/pop in `Scope`), so sharing the handle between threads is sound.
unsafe impl Send for Device {}
// SAFETY: as above; `Device` has no interior mutability of its own.
unsafe impl Sync for Device {}

/// While alive, this device's primary context is current on this thread; dropping it restores the
/// thread's previous context, so we never disturb the caller's (PyTorch's) CUDA state.
struct Scope;

impl Drop for Scope {
    fn drop(&mut self) {
        let mut prev: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: a `Scope` only exists after a successful push on this thread, so there is a
        // context to pop. Nothing useful can be done about an error here.
        let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut prev) };
    }
}

impl Device {
    /// Opens device `ordinal` (as CUDA numbers the devices visible to this process).
    pub fn open(ordinal: i32) -> Result<Arc<Device>> {
        let count = device_count()?;
        if ordinal < 0 || ordinal >= count {
            return Err(Error::InvalidArgument(format!(
                "CUDA device {ordinal} does not exist: this process sees {count} device(s)"
            )));
        }
        let mut dev: sys::CUdevice = 0;
        // SAFETY: driver initialized (device_count); `ordinal` is in range; valid out-pointer.
        check("cuDeviceGet", unsafe {
            sys::cuDeviceGet(&mut dev, ordinal)
        })?;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: `dev` is a valid device; retaining its primary context is reference counted and
        // balanced by the release in `Drop`.
        check("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
        })?;
        Ok(Arc::new(Device { ordinal, dev, ctx }))
    }

    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    fn scope(&self) -> Result<Scope> {
        // SAFETY: `self.ctx` is a retained (hence live) primary context; pushing it is undone by
        // `Scope::drop` on this same thread.
        check("cuCtxPushCurrent", unsafe {
            sys::cuCtxPushCurrent_v2(self.ctx)
        })?;
        Ok(Scope)
    }

    /// The PCI bus id, e.g. `0000:18:00.0`: the name we give GPUs in messages.
    pub fn pci_bus_id(&self) -> Result<String> {
        let mut buf = [0 as c_char; 32];
        // SAFETY: `buf` has room for `len` bytes; the driver NUL-terminates within it.
        check("cuDeviceGetPCIBusId", unsafe {
            sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, self.dev)
        })?;
        // SAFETY: NUL-terminated by the driver within `buf` (zero-initialized as a backstop).
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// The GPU's UUID: identifies a physical GPU across processes whatever their device numbering.
    pub fn uuid(&self) -> Result<[u8; 16]> {
        let mut u = sys::CUuuid { bytes: [0; 16] };
        // SAFETY: valid device and out-pointer.
        check("cuDeviceGetUuid", unsafe {
            sys::cuDeviceGetUuid_v2(&mut u, self.dev)
        })?;
        Ok(u.bytes.map(|b| b as u8))
    }

    /// Whether this GPU can map memory of device `peer_ordinal` (a device of this process).
    pub fn can_access_peer(&self, peer_ordinal: i32) -> Result<bool> {
        let mut peer: sys::CUdevice = 0;
        // SAFETY: driver initialized; valid out-pointer; the driver rejects a bad ordinal.
        check("cuDeviceGet", unsafe {
            sys::cuDeviceGet(&mut peer, peer_ordinal)
        })?;
        let mut can = 0;
        // SAFETY: both are valid devices; valid out-pointer.
        check("cuDeviceCanAccessPeer", unsafe {
            sys::cuDeviceCanAccessPeer(&mut can, self.dev, peer)
        })?;
        Ok(can != 0)
    }

    /// Allocates `bytes` of device memory (`cuMemAlloc`, 2 MiB granularity, IPC-exportable).
    pub fn alloc(&self, bytes: usize) -> Result<u64> {
        let _s = self.scope()?;
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: our context is current; valid out-pointer.
        check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut p, bytes) })?;
        Ok(p)
    }

    /// Makes `stream` (a `CUstream` of this device) write `value` to the u64 at device address
    /// `addr` once its earlier work is done, after a fence that makes that work's writes visible
    /// first (`cuStreamWriteValue64`, no SM involved): how a copy engine's transfer is announced
    /// to a kernel that waits on the word (`symm_signal_wait_at`). Asynchronous, capturable.
    pub fn stream_write_u64(&self, stream: u64, addr: u64, value: u64) -> Result<()> {
        let _s = self.scope()?;
        // SAFETY: our context is current; the caller passes a live stream of this device and an
        // 8-byte-aligned device address it may write (the driver checks both and fails cleanly).
        check("cuStreamWriteValue64", unsafe {
            sys::cuStreamWriteValue64_v2(
                stream as sys::CUstream,
                addr,
                value,
                sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32,
            )
        })
    }

    /// Makes `stream` wait until the u64 at device address `addr` equals `value` before its later
    /// work (`cuStreamWaitValue64`): a copy engine's transfer started by a kernel. Asynchronous,
    /// capturable. The word must be one a kernel of this process always sets (a wait on a stream
    /// has no timeout).
    pub fn stream_wait_u64(&self, stream: u64, addr: u64, value: u64) -> Result<()> {
        let _s = self.scope()?;
        // SAFETY: as in `stream_write_u64`.
        check("cuStreamWaitValue64", unsafe {
            sys::cuStreamWaitValue64_v2(
                stream as sys::CUstream,
                addr,
                value,
                sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_EQ as u32,
            )
        })
    }

    /// Creates a stream of this device's primary context that no one else hands out
    /// (`cuStreamCreate`, `CU_STREAM_NON_BLOCKING` as PyTorch's own streams): for the copy engine's
    /// transfers, which must not queue behind a caller's work on a shared stream. The caller keeps
    /// it for the life of the process (a stream in use by captured graphs must not be destroyed).
    pub fn stream_create(&self) -> Result<u64> {
        let _s = self.scope()?;
        let mut stream: sys::CUstream = std::ptr::null_mut();
        // SAFETY: our context is current; valid out-pointer; the flag is a valid stream flag.
        check("cuStreamCreate", unsafe {
            sys::cuStreamCreate(
                &mut stream,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
            )
        })?;
        Ok(stream as u64)
    }

    /// Frees memory from [`Device::alloc`].
    pub fn free(&self, ptr: u64) -> Result<()> {
        let _s = self.scope()?;
        // SAFETY: callers pass a pointer from `alloc` on this device that they own and free once.
        check("cuMemFree", unsafe { sys::cuMemFree_v2(ptr) })
    }

    /// Sets `bytes` bytes at `ptr` to `value` (synchronous with respect to the host).
    pub fn memset(&self, ptr: u64, value: u8, bytes: usize) -> Result<()> {
        let _s = self.scope()?;
        // SAFETY: callers pass a range inside an allocation they own.
        check("cuMemsetD8", unsafe {
            sys::cuMemsetD8_v2(ptr, value, bytes)
        })?;
        // cuMemsetD8 is asynchronous for device memory; callers rely on it having happened.
        // SAFETY: our context is current.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
    }

    /// Copies `src` to device address `ptr` (synchronous).
    pub fn write(&self, ptr: u64, src: &[u8]) -> Result<()> {
        let _s = self.scope()?;
        // SAFETY: `src` is valid for `src.len()` bytes; callers pass a device range they own.
        check("cuMemcpyHtoD", unsafe {
            sys::cuMemcpyHtoD_v2(ptr, src.as_ptr().cast(), src.len())
        })
    }

    /// Copies device memory at `ptr` into `dst` (synchronous).
    pub fn read(&self, ptr: u64, dst: &mut [u8]) -> Result<()> {
        let _s = self.scope()?;
        // SAFETY: `dst` is valid for writes of `dst.len()` bytes; callers pass a device range
        // they own.
        check("cuMemcpyDtoH", unsafe {
            sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), ptr, dst.len())
        })
    }

    /// Waits for all work on this device's primary context (every stream) to finish.
    pub fn synchronize(&self) -> Result<()> {
        let _s = self.scope()?;
        // SAFETY: our context is current.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
    }

    /// The legacy IPC handle of an allocation from [`Device::alloc`] (`ptr` must be its base).
    pub fn ipc_handle(&self, ptr: u64) -> Result<[u8; IPC_HANDLE_BYTES]> {
        let _s = self.scope()?;
        let mut h = sys::CUipcMemHandle {
            reserved: [0; IPC_HANDLE_BYTES],
        };
        // SAFETY: our context is current; `ptr` is the base of a cuMemAlloc allocation.
        check("cuIpcGetMemHandle", unsafe {
            sys::cuIpcGetMemHandle(&mut h, ptr)
        })?;
        Ok(h.reserved.map(|b| b as u8))
    }

    /// Maps another process's allocation into this device's context. Peer access is enabled
    /// lazily by the driver (`CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`), so we never toggle it globally.
    pub fn ipc_open(&self, handle: &[u8; IPC_HANDLE_BYTES]) -> Result<u64> {
        let _s = self.scope()?;
        let h = sys::CUipcMemHandle {
            reserved: handle.map(|b| b as c_char),
        };
        let mut p: sys::CUdeviceptr = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: our context is current; the handle bytes came from cuIpcGetMemHandle in another
        // process (the driver validates them); valid out-pointer.
        check("cuIpcOpenMemHandle", unsafe {
            sys::cuIpcOpenMemHandle_v2(&mut p, h, flags)
        })?;
        Ok(p)
    }

    /// Unmaps a pointer from [`Device::ipc_open`].
    pub fn ipc_close(&self, ptr: u64) -> Result<()> {
        let _s = self.scope()?;
        // SAFETY: callers pass a pointer from `ipc_open` on this device, closed once.
        check("cuIpcCloseMemHandle", unsafe {
            sys::cuIpcCloseMemHandle(ptr)
        })
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `open`; everything we allocated in this context was
        // freed before (owners hold an `Arc<Device>`, so they drop first).
        let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
    }
}
