//! ironlink's host library: allocates symmetric heaps across the GPUs of a node, maps every
//! peer's, and builds the device `SymmContext` (see `device/src/abi.rs`).

pub use ironlink_device::abi;
