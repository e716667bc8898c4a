//! The device-resident `SymmContext`: building it, writing it to its own small device allocation,
//! and the few fields the host touches afterwards (`error`, `error_detail`, `timeout_ns`).
//! `encode` lays it out as the device reads it; `external` makes one over PyTorch's memory.

mod encode;
mod external;

pub use encode::{encode, encode_with_layout, FieldLayout};
pub use external::{external_context, ExternalContext};

use crate::abi::{self, SymmContext, MAX_RANKS};
use crate::driver::{Device, DeviceBuffer};
use crate::error::{Error, Result};
use encode::offset_of;
use ironlink_device::collectives::choice::with_default_limits;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One rank's three regions: their addresses as mapped in this process, or their sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Regions {
    pub heap: u64,
    pub signal: u64,
    pub scratch: u64,
}

/// Builds a `SymmContext`, the one place the host does: rank and world, the default algorithm
/// limits, the regions' `sizes`, and each of `peers` as (peer table slot, its regions). Fields
/// this leaves alone (backend, node size, unmapped slots) keep `SymmContext::new`'s values.
pub fn build_context(
    rank: i32,
    world: i32,
    sizes: Regions,
    peers: impl IntoIterator<Item = (usize, Regions)>,
) -> SymmContext {
    let mut c = with_default_limits(SymmContext::new(rank, world));
    c.heap_size = sizes.heap;
    c.signal_size = sizes.signal;
    c.scratch_size = sizes.scratch;
    for (slot, r) in peers {
        c.peer_heap[slot] = r.heap;
        c.peer_signal[slot] = r.signal;
        c.peer_scratch[slot] = r.scratch;
    }
    c
}

/// The context's algorithm size limits, in bytes (see `SymmContext::ar_one_shot_max_bytes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AlgorithmLimits {
    pub ar_one_shot_max_bytes: u64,
    pub ar_ll_max_bytes: u64,
    pub gather_ll_max_bytes: u64,
}

/// What owns a device context (an open heap, an external context): the calls both answer, so the
/// Python classes over them share one implementation.
pub trait ContextOwner {
    /// The device context; `Error::Closed` once closed.
    fn context(&self) -> Result<&DeviceContext>;
    fn rank(&self) -> i32;
    fn world(&self) -> i32;
    fn is_closed(&self) -> bool;
    /// Releases what this owns (the context, and a heap's mappings and memory). Idempotent.
    fn close(&mut self) -> Result<()>;

    /// Device address of the `SymmContext` to pass to kernels.
    fn ctx_ptr(&self) -> Result<u64> {
        Ok(self.context()?.ptr())
    }
}

/// A `SymmContext` in device memory (one small allocation), owned by a heap or external context.
#[derive(Debug)]
pub struct DeviceContext {
    buf: DeviceBuffer,
    /// The wait timeout the host set. The context's own copy drops to 0 when a failure among
    /// ranks is recorded (`abi::is_failure_among_ranks`), so every later wait gives up at once;
    /// `clear_error` puts this back.
    timeout_ns: AtomicU64,
}

impl DeviceContext {
    /// Allocates device memory for `c` on `device` and writes it there.
    pub fn create(device: &Arc<Device>, c: &SymmContext) -> Result<Self> {
        let bytes = encode(c);
        let buf = DeviceBuffer::new(device, bytes.len())?;
        device.write(buf.ptr(), &bytes)?;
        Ok(DeviceContext {
            buf,
            timeout_ns: AtomicU64::new(c.timeout_ns),
        })
    }

    /// Writes the context's wait timeout (the device reads it when a wait begins).
    fn write_timeout(&self, ns: u64) -> Result<()> {
        let at = self.buf.ptr() + offset_of("timeout_ns") as u64;
        self.buf.device().write(at, &ns.to_le_bytes())
    }

    /// Device address of the context: the `ctx` argument of every device function.
    pub fn ptr(&self) -> u64 {
        self.buf.ptr()
    }

    /// The context as the device sees it now.
    pub fn read(&self) -> Result<Vec<u8>> {
        let mut b = vec![0u8; self.buf.bytes()];
        self.buf.device().read(self.buf.ptr(), &mut b)?;
        Ok(b)
    }

    /// The first error a device function recorded, as `(status, detail)`; `(0, 0)` if none.
    /// Waits for all work on the device first, so errors of kernels already launched are seen.
    pub fn read_error(&self) -> Result<(i32, i32)> {
        let dev = self.buf.device();
        dev.synchronize()?;
        let off = offset_of("error");
        debug_assert_eq!(offset_of("error_detail"), off + 4);
        let mut b = [0u8; 8];
        dev.read(self.buf.ptr() + off as u64, &mut b)?;
        let code = i32::from_le_bytes(b[0..4].try_into().unwrap());
        let detail = i32::from_le_bytes(b[4..8].try_into().unwrap());
        Ok((code, detail))
    }

    /// Records `(code, detail)` for a failure the host found among ranks (check=True's
    /// comparison of the calls: a rank never made one), as a device function records its own:
    /// the first error wins, so `heap.check()` raises it and the device's later waits give up at
    /// once (its wait timeout set to 0 until `clear_error`). Returns the error that stands.
    /// Waits for the device first: no kernel of this context may write `error` between the read
    /// and the write.
    pub fn record_error(&self, code: i32, detail: i32) -> Result<i32> {
        if code == 0 {
            return Err(Error::InvalidArgument(
                "record_error needs a non-zero status".into(),
            ));
        }
        let (standing, _) = self.read_error()?;
        if standing != 0 {
            return Ok(standing);
        }
        let mut b = [0u8; 8];
        b[0..4].copy_from_slice(&code.to_le_bytes());
        b[4..8].copy_from_slice(&detail.to_le_bytes());
        let dev = self.buf.device();
        dev.write(self.buf.ptr() + offset_of("error") as u64, &b)?;
        if abi::is_failure_among_ranks(code) {
            self.write_timeout(0)?; // as the device's `record_error` does
        }
        Ok(code)
    }

    /// Resets `error` and `error_detail` to 0 (after the host has raised them) and puts back the
    /// wait timeout that a failure among ranks set to 0.
    pub fn clear_error(&self) -> Result<()> {
        let dev = self.buf.device();
        dev.synchronize()?;
        dev.write(self.buf.ptr() + offset_of("error") as u64, &[0u8; 8])?;
        self.write_timeout(self.timeout_ns.load(Ordering::Relaxed))
    }

    /// Sets how long device-side waits on peers spin before giving up with `TIMEOUT`. While a
    /// failure among ranks stands (not yet cleared) the waits keep giving up at once; the new
    /// timeout applies from `clear_error` on. Must not race with running kernels of this
    /// context, so it waits for the device first.
    pub fn set_timeout_ns(&self, ns: u64) -> Result<()> {
        if ns == 0 {
            return Err(Error::InvalidArgument(
                "timeout must be positive (0 would fail every wait at once)".into(),
            ));
        }
        let (standing, _) = self.read_error()?; // synchronizes
        self.timeout_ns.store(ns, Ordering::Relaxed);
        if abi::is_failure_among_ranks(standing) {
            return Ok(());
        }
        self.write_timeout(ns)
    }

    /// Sets the message sizes (bytes) up to which all-reduce uses one-shot LL and then two-shot
    /// LL, and all_gather / reduce_scatter use LL (see `SymmContext::ar_one_shot_max_bytes`).
    /// Every rank must set the same values: the algorithm is chosen on each rank independently.
    /// Waits for the device first.
    pub fn set_algorithm_limits(&self, limits: AlgorithmLimits) -> Result<()> {
        let dev = self.buf.device();
        dev.synchronize()?;
        let off = offset_of("ar_one_shot_max_bytes");
        debug_assert_eq!(offset_of("ar_ll_max_bytes"), off + 8);
        debug_assert_eq!(offset_of("gather_ll_max_bytes"), off + 16);
        let mut b = [0u8; 24];
        b[..8].copy_from_slice(&limits.ar_one_shot_max_bytes.to_le_bytes());
        b[8..16].copy_from_slice(&limits.ar_ll_max_bytes.to_le_bytes());
        b[16..].copy_from_slice(&limits.gather_ll_max_bytes.to_le_bytes());
        dev.write(self.buf.ptr() + off as u64, &b)
    }

    /// Frees the device memory now, reporting a driver error.
    pub fn release(self) -> Result<()> {
        self.buf.release()
    }
}

/// Checks rank/world arguments shared by heaps and external contexts of one node.
pub fn check_rank(rank: i32, world: i32) -> Result<()> {
    if world < 1 || world as usize > MAX_RANKS {
        return Err(Error::InvalidArgument(format!(
            "world size {world} is outside 1..={MAX_RANKS} (one context addresses one node)"
        )));
    }
    check_rank_in(rank, world)
}

/// Checks the rank, world and grouping of a multi-node context: what the device's
/// `runtime::context::any_context` admits.
pub fn check_nodes(rank: i32, world: i32, node_size: i32) -> Result<()> {
    let (max_node, max_world) = (MAX_RANKS as i32, abi::MAX_WORLD as i32);
    if world < 1 || world > max_world {
        return Err(Error::InvalidArgument(format!(
            "world size {world} is outside 1..={max_world} (MAX_NODES nodes of MAX_RANKS ranks)"
        )));
    }
    if node_size < 1 || node_size > max_node || world % node_size != 0 {
        return Err(Error::InvalidArgument(format!(
            "node size {node_size} must be 1..={max_node} and divide the world size {world}"
        )));
    }
    if world / node_size > abi::MAX_NODES as i32 {
        return Err(Error::InvalidArgument(format!(
            "{world} ranks as nodes of {node_size} are {} nodes; at most {}",
            world / node_size,
            abi::MAX_NODES
        )));
    }
    check_rank_in(rank, world)
}

fn check_rank_in(rank: i32, world: i32) -> Result<()> {
    if rank < 0 || rank >= world {
        return Err(Error::InvalidArgument(format!(
            "rank {rank} is outside 0..{world}"
        )));
    }
    Ok(())
}
