//! ironlink's host library: allocates symmetric heaps across the GPUs of a node, maps every
//! peer's, and builds the device `SymmContext` (see `device/src/abi.rs`).
//!
//! Flow, per process (one process per GPU):
//! 1. [`LocalHeap::create`] allocates this rank's heap and produces handle bytes;
//! 2. the caller exchanges the bytes of all ranks over any transport;
//! 3. [`LocalHeap::open_peers`] validates them, maps every peer and writes the context;
//!    [`SymmHeap::ctx_ptr`] is what kernels receive.
//!
//! [`ExternalContext`] builds the same context over memory PyTorch's symmetric memory allocated;
//! [`external_heap::open_external_heap`] a whole heap over a PyTorch NVSHMEM buffer.

pub use ironlink_device::abi;

pub mod alloc;
pub mod context;
pub mod driver;
pub mod error;
pub mod exchange;
pub mod external_heap;
pub mod heap;
pub mod nvshmem_host;
#[cfg(feature = "python")]
mod python;

pub use context::ExternalContext;
pub use error::{Error, Result};
pub use heap::{Layout, LocalHeap, SymmHeap};
