//! NVSHMEM's host library (`libnvshmem_host.so.3`), loaded at run time with libloading, as cudarc
//! loads the driver: ironlink builds, and everything else runs, where NVSHMEM is not installed.
//! Its one use here is `nvshmemx_cumodule_init`, which a module linked with NVSHMEM's device
//! bitcode needs after loading and before its first launch (it copies NVSHMEM's device state
//! into the module's `nvshmemi_device_state_d`).

use crate::driver;
use crate::error::{Error, Result};
use cudarc::driver::sys;
use libloading::os::unix::{Library, RTLD_LAZY, RTLD_LOCAL};
use std::ffi::c_int;
use std::sync::OnceLock;

/// The library's soname (NVSHMEM 3.x).
pub const SONAME: &str = "libnvshmem_host.so.3";

/// glibc's `RTLD_NOLOAD` (<dlfcn.h>): open only a library already in the process.
const RTLD_NOLOAD: c_int = 4;

/// `NVSHMEM_STATUS_IS_INITIALIZED` of `nvshmemx_init_status_t`; later values (the MPG modes)
/// are initialized too.
const STATUS_IS_INITIALIZED: c_int = 2;

/// The global NVSHMEM's device code reads its state from (defined in libnvshmem_device.bc).
const DEVICE_STATE: &std::ffi::CStr = c"nvshmemi_device_state_d";

/// The library, loaded once per process and never unloaded (modules keep using its state).
///
/// A copy already in the process (e.g. loaded by PyTorch's NVSHMEM backend) wins: NVSHMEM's
/// state lives in the library instance, and a second copy would be an uninitialized one. Else
/// `fallback` (a path, e.g. from the `nvidia.nvshmem` package), else the soname on the loader path.
pub fn library(fallback: Option<&str>) -> Result<&'static Library> {
    static LIB: OnceLock<&'static Library> = OnceLock::new();
    if let Some(lib) = LIB.get() {
        return Ok(lib);
    }
    // SAFETY: loading runs the library's initializers; NVSHMEM's have no preconditions.
    let open = |name: &str, flags| unsafe { Library::open(Some(name), flags) };
    let lib = open(SONAME, RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD)
        .or_else(|_| match fallback {
            Some(path) => open(path, RTLD_LAZY | RTLD_LOCAL),
            None => open(SONAME, RTLD_LAZY | RTLD_LOCAL),
        })
        .or_else(|e| match fallback {
            Some(_) => open(SONAME, RTLD_LAZY | RTLD_LOCAL).map_err(|_| e),
            None => Err(e),
        })
        .map_err(|e| Error::Nvshmem(format!("cannot load {SONAME} ({e}); install nvidia-nvshmem-cu13 or put it on the loader path")))?;
    Ok(LIB.get_or_init(|| Box::leak(Box::new(lib))))
}

/// The function `name` of the library, typed `F` (the library is never unloaded, so the
/// pointer stays valid).
///
/// # Safety
/// `F` is the function's C prototype.
unsafe fn lib_fn<F: Copy>(fallback: Option<&str>, name: &str) -> Result<F> {
    let lib = library(fallback)?;
    lib.get::<F>(name)
        .map(|f| *f)
        .map_err(|e| Error::Nvshmem(format!("{SONAME} lacks {name}, which ironlink calls: {e}")))
}

/// `nvshmemx_init_status()`: 0 not initialized, 1 bootstrapped, 2 and up initialized.
pub fn init_status(fallback: Option<&str>) -> Result<i32> {
    // SAFETY: NVSHMEM 3.x's prototype `int nvshmemx_init_status(void)`.
    let status =
        unsafe { lib_fn::<unsafe extern "C" fn() -> c_int>(fallback, "nvshmemx_init_status")? };
    // SAFETY: no arguments; reads NVSHMEM's global state.
    Ok(unsafe { status() })
}

/// Whether the loaded module `module` (a `CUmodule`) holds NVSHMEM device code, i.e. defines
/// NVSHMEM's device state. The module's context must be current (as where Triton just loaded it).
pub fn module_uses_nvshmem(module: u64) -> Result<bool> {
    driver::init()?;
    let (mut ptr, mut bytes): (sys::CUdeviceptr, usize) = (0, 0);
    // SAFETY: driver initialized; `module` is a live module handle (the caller's contract, see
    // `cumodule_init`); the out-pointers and the NUL-terminated name are valid.
    let r = unsafe {
        sys::cuModuleGetGlobal_v2(
            &mut ptr,
            &mut bytes,
            module as sys::CUmodule,
            DEVICE_STATE.as_ptr(),
        )
    };
    match r {
        sys::CUresult::CUDA_SUCCESS => Ok(true),
        sys::CUresult::CUDA_ERROR_NOT_FOUND => Ok(false),
        r => Err(Error::Nvshmem(format!(
            "cuModuleGetGlobal({DEVICE_STATE:?}) on module {module:#x} failed: {r:?}"
        ))),
    }
}

/// Runs `nvshmemx_cumodule_init` on `module` if it holds NVSHMEM device code: true when it did,
/// false for a module without NVSHMEM (nothing to do).
///
/// `module` must be a live `CUmodule` of the current context, loaded and not yet launched (a
/// launch before the init reads NVSHMEM state that is all zeros). NVSHMEM must be initialized in
/// this process (e.g. by PyTorch's NVSHMEM backend); otherwise this fails rather than leave the
/// module uninitialized.
pub fn cumodule_init(module: u64, fallback: Option<&str>) -> Result<bool> {
    if module == 0 {
        return Err(Error::InvalidArgument(
            "module handle is null (the kernel is not loaded)".into(),
        ));
    }
    if !module_uses_nvshmem(module)? {
        return Ok(false);
    }
    let s = init_status(fallback)?;
    if s < STATUS_IS_INITIALIZED {
        return Err(Error::Nvshmem(format!(
            "NVSHMEM is not initialized in this process (nvshmemx_init_status() = {s}): set it up \
             first (e.g. torch.distributed._symmetric_memory.set_backend(\"NVSHMEM\") and a \
             rendezvous) before launching kernels linked with NVSHMEM"
        )));
    }
    // SAFETY: NVSHMEM 3.x's prototype `int nvshmemx_cumodule_init(CUmodule)`.
    let init = unsafe {
        lib_fn::<unsafe extern "C" fn(sys::CUmodule) -> c_int>(fallback, "nvshmemx_cumodule_init")?
    };
    // SAFETY: a live module of the current context (this function's contract) holding NVSHMEM's
    // device state (checked above); NVSHMEM is initialized (checked above).
    let r = unsafe { init(module as sys::CUmodule) };
    if r != 0 {
        return Err(Error::Nvshmem(format!(
            "nvshmemx_cumodule_init(module {module:#x}) returned {r}"
        )));
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_null_module_is_refused_before_any_library_is_needed() {
        let e = cumodule_init(0, None).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    }
}
