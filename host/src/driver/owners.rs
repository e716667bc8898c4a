//! Owners of what the driver hands out: an allocation and a peer's mapping, each given back
//! on drop (or earlier with `release`, which reports the driver's error). They hold an
//! `Arc<Device>`, so the device's primary context outlives them.

use super::{Device, IPC_HANDLE_BYTES};
use crate::error::Result;
use std::sync::Arc;

/// One device allocation, freed on drop (or earlier by [`DeviceBuffer::release`]).
#[derive(Debug)]
pub struct DeviceBuffer {
    device: Arc<Device>,
    ptr: u64,
    bytes: usize,
}

impl DeviceBuffer {
    pub fn new(device: &Arc<Device>, bytes: usize) -> Result<Self> {
        let ptr = device.alloc(bytes)?;
        Ok(DeviceBuffer {
            device: device.clone(),
            ptr,
            bytes,
        })
    }

    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// Frees now, reporting a driver error (drop frees too, but has to swallow errors).
    pub fn release(mut self) -> Result<()> {
        let p = std::mem::take(&mut self.ptr);
        self.device.free(p)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ptr != 0 {
            let _ = self.device.free(self.ptr);
        }
    }
}

/// A peer's allocation mapped into this process, unmapped on drop.
#[derive(Debug)]
pub struct IpcMapping {
    device: Arc<Device>,
    ptr: u64,
}

impl IpcMapping {
    pub fn open(device: &Arc<Device>, handle: &[u8; IPC_HANDLE_BYTES]) -> Result<Self> {
        let ptr = device.ipc_open(handle)?;
        Ok(IpcMapping {
            device: device.clone(),
            ptr,
        })
    }

    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Unmaps now, reporting a driver error.
    pub fn release(mut self) -> Result<()> {
        let p = std::mem::take(&mut self.ptr);
        self.device.ipc_close(p)
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        if self.ptr != 0 {
            let _ = self.device.ipc_close(self.ptr);
        }
    }
}
