//! Symmetric heaps: one device allocation per rank, mapped into every other rank's process.
//!
//! Where the three regions of a heap sit: [`layout`].
//!
//! # Why legacy CUDA IPC and not the VMM API
//!
//! The peers' allocations are mapped with legacy IPC handles (`cuIpcGetMemHandle` /
//! `cuIpcOpenMemHandle` with `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`):
//!
//! - A legacy handle is a plain 64-byte value. Any transport carries it: we hand the bytes to the
//!   caller, who exchanges them however it likes (`torch.distributed.all_gather_object`, a store,
//!   MPI). VMM's shareable handles are POSIX file descriptors (or fabric handles needing IMEX),
//!   which must travel over Unix sockets with `SCM_RIGHTS`: more code, more failure modes
//!   (socket paths, containers, seccomp), and a second transport next to the user's.
//! - The VMM API's strength is mapping many allocations into one reserved range cheaply and
//!   controlling granularity. We make exactly one allocation per heap and map it once per peer,
//!   so per-allocation mapping cost does not matter.
//! - The one thing only VMM can do is NVLink multicast (`cuMulticast*`, NVLS), which this project
//!   must not use on its shared machines.
//!
//! Legacy IPC needs one process per rank (a process cannot open its own handle), which is how
//! `torchrun` runs anyway; `exchange::validate` reports a violation clearly. Two processes on one
//! GPU can map each other's memory; that serves only tests (`exchange::GpuSharing::Shared`).

mod layout;

pub use layout::{Layout, DEFAULT_SCRATCH_BYTES, REGION_ALIGN, SIGNAL_BYTES};

use crate::abi::{self, SymmContext, MAX_RANKS};
use crate::alloc::Allocator;
use crate::context::{build_context, check_rank, ContextOwner, DeviceContext};
use crate::driver::{self, Device, DeviceBuffer, IpcMapping};
use crate::error::{Context as _, Error, Result};
use crate::exchange::{self, GpuSharing, HandleInfo};
use std::sync::Arc;

/// This rank's heap before the exchange: allocated and zeroed, not yet connected to its peers.
#[derive(Debug)]
pub struct LocalHeap {
    device: Arc<Device>,
    mem: DeviceBuffer,
    layout: Layout,
    info: HandleInfo,
}

impl LocalHeap {
    /// Allocates this rank's heap on CUDA device `device` (this process's ordinal).
    ///
    /// `heap_bytes` and `scratch_bytes` are rounded up to 4 KiB; every rank must pass the same
    /// values (checked in [`LocalHeap::open_peers`]).
    pub fn create(
        device: i32,
        heap_bytes: u64,
        scratch_bytes: u64,
        rank: i32,
        world: i32,
    ) -> Result<LocalHeap> {
        check_rank(rank, world)?;
        let layout = Layout::new(heap_bytes, scratch_bytes)?;
        let dev = Device::open(device)?;
        let bus = dev.pci_bus_id()?;
        let total = layout.total() as usize;
        let mem = DeviceBuffer::new(&dev, total)
            .context(|| format!("allocating the {total}-byte symmetric heap on GPU {bus}"))?;
        // Zero everything: the signal region must start at 0 (the device protocols rely on it),
        // and zeroed scratch and heap make a fresh heap deterministic.
        dev.memset(mem.ptr(), 0, total)?;
        let info = HandleInfo {
            abi_version: abi::ABI_VERSION,
            rank,
            world,
            pid: std::process::id(),
            heap_size: layout.heap,
            signal_size: layout.signal,
            scratch_size: layout.scratch,
            node_id: exchange::node_id(),
            process_token: exchange::process_token(),
            uuid: dev.uuid()?,
            pci_bus_id: bus,
            ipc: dev.ipc_handle(mem.ptr())?,
        };
        Ok(LocalHeap {
            device: dev,
            mem,
            layout,
            info,
        })
    }

    /// The bytes to send to every other rank (see `exchange` for the format).
    pub fn handle_bytes(&self) -> Vec<u8> {
        self.info.to_bytes()
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Maps every peer's heap from the gathered handles (`all`: one per rank, any order,
    /// including this rank's own) and builds the device context.
    ///
    /// Fails, with the same message on every rank, if the handles disagree (world size, ranks,
    /// sizes, node) or two ranks share a process, or a GPU where `sharing` does not allow it;
    /// fails if this GPU cannot reach a
    /// peer's GPU peer-to-peer. On failure everything is released.
    pub fn open_peers(self, all: &[Vec<u8>], sharing: GpuSharing) -> Result<SymmHeap> {
        let (rank, world) = (self.info.rank, self.info.world);
        let infos = exchange::validate(world, all, sharing)?;
        if infos[rank as usize] != self.info {
            return Err(Error::Mismatch(format!(
                "the handle exchanged for rank {rank} is not the one this process created \
                 (were handles from another heap mixed in?)"
            )));
        }
        for p in infos.iter().filter(|p| p.rank != rank) {
            // A GPU hidden from this process (CUDA_VISIBLE_DEVICES) cannot be queried; legacy IPC
            // can still map its memory, and cuIpcOpenMemHandle reports if it cannot.
            // A GPU is not its own peer (cuDeviceCanAccessPeer says 0); ranks sharing one map each
            // other's memory by IPC all the same.
            if let Some(ordinal) = driver::device_by_pci_bus_id(&p.pci_bus_id)? {
                let own_gpu = ordinal == self.device.ordinal();
                if !own_gpu && !self.device.can_access_peer(ordinal)? {
                    return Err(Error::NoPeerAccess {
                        rank,
                        gpu: self.info.pci_bus_id.clone(),
                        peer_rank: p.rank,
                        peer_gpu: p.pci_bus_id.clone(),
                    });
                }
            }
        }
        let mut peers: Vec<Option<IpcMapping>> = Vec::with_capacity(world as usize);
        let mut bases = Vec::with_capacity(world as usize);
        for p in &infos {
            let base = if p.rank == rank {
                peers.push(None);
                self.mem.ptr()
            } else {
                // On error, the mappings opened so far are closed when `peers` drops.
                let m = IpcMapping::open(&self.device, &p.ipc).context(|| {
                    format!(
                        "mapping the heap of rank {} (GPU {}, pid {}) into rank {rank}",
                        p.rank, p.pci_bus_id, p.pid
                    )
                })?;
                let b = m.ptr();
                peers.push(Some(m));
                b
            };
            bases.push((p.rank as usize, self.layout.regions_at(base)));
        }
        let ctx = build_context(rank, world, self.layout.sizes(), bases);
        let dctx = DeviceContext::create(&self.device, &ctx)?;
        Ok(SymmHeap::assemble(
            Inner {
                ctx: dctx,
                peers,
                mem: Some(self.mem),
            },
            &ctx,
            self.device.ordinal(),
            self.layout,
        ))
    }
}

/// The resources of an open heap, released in field order: context, peer mappings, our memory.
/// A heap over someone else's memory (`external_heap`) owns only its context.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) ctx: DeviceContext,
    pub(crate) peers: Vec<Option<IpcMapping>>,
    pub(crate) mem: Option<DeviceBuffer>,
}

/// An open symmetric heap: every rank's regions mapped here, a device context describing them,
/// and the allocator of the user region.
#[derive(Debug)]
pub struct SymmHeap {
    inner: Option<Inner>,
    device: i32,
    rank: i32,
    world: i32,
    layout: Layout,
    /// Ranks per node (the world for a one-node heap): `peer_heap` holds this rank's node.
    node_size: i32,
    peer_heap: [u64; MAX_RANKS],
    alloc: Allocator,
}

impl SymmHeap {
    /// An open heap from its resources and the context they were described by.
    pub(crate) fn assemble(inner: Inner, ctx: &SymmContext, device: i32, layout: Layout) -> Self {
        SymmHeap {
            inner: Some(inner),
            device,
            rank: ctx.rank,
            world: ctx.world_size,
            layout,
            node_size: match ctx.node_size {
                0 => ctx.world_size,
                n => n as i32,
            },
            peer_heap: ctx.peer_heap,
            alloc: Allocator::new(layout.heap),
        }
    }

    fn inner(&self) -> Result<&Inner> {
        self.inner
            .as_ref()
            .ok_or(Error::Closed("the symmetric heap"))
    }

    pub fn device(&self) -> i32 {
        self.device
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Base of `rank`'s user region as mapped in this process (`rank == self.rank()`: ours);
    /// an error for a rank on another node of a multi-node heap, which has no address here.
    pub fn peer_base(&self, rank: i32) -> Result<u64> {
        self.inner()?;
        if rank < 0 || rank >= self.world {
            return Err(Error::InvalidArgument(format!(
                "peer rank {rank} is outside 0..{}",
                self.world
            )));
        }
        if rank / self.node_size != self.rank / self.node_size {
            return Err(Error::PeerNotMapped {
                rank: self.rank,
                peers: vec![rank],
            });
        }
        Ok(self.peer_heap[rank as usize % MAX_RANKS])
    }

    /// Allocates `bytes` in the user region; returns the offset (the same on every rank that
    /// makes the same sequence of calls).
    pub fn alloc(&mut self, bytes: u64) -> Result<u64> {
        self.inner()?;
        self.alloc.alloc(bytes)
    }

    /// Allocates an op's workspace of `bytes` at the end of the user region
    /// (`Allocator::alloc_top`): the same offset on every rank that made the same workspace calls,
    /// whatever tensors each allocated.
    pub fn alloc_top(&mut self, bytes: u64) -> Result<u64> {
        self.inner()?;
        self.alloc.alloc_top(bytes)
    }

    /// Frees the allocation at `offset`.
    pub fn free(&mut self, offset: u64) -> Result<()> {
        self.inner()?;
        self.alloc.free(offset).map(|_| ())
    }

    /// The live allocation containing user-region byte `offset`, as (start, length).
    pub fn find(&self, offset: u64) -> Option<(u64, u64)> {
        self.alloc.find(offset)
    }

    /// The digest of every allocation and free so far (`Allocator::digest`): what the context's
    /// `heap_digest` must hold for kernels launched after the last of them. The caller writes it
    /// there in its stream's order (the Python heap does, before the next launch: `heap.ctx`).
    pub fn digest(&self) -> u64 {
        self.alloc.digest()
    }

    pub fn allocator(&self) -> &Allocator {
        &self.alloc
    }
}

impl ContextOwner for SymmHeap {
    fn context(&self) -> Result<&DeviceContext> {
        Ok(&self.inner()?.ctx)
    }

    fn rank(&self) -> i32 {
        self.rank
    }

    fn world(&self) -> i32 {
        self.world
    }

    fn is_closed(&self) -> bool {
        self.inner.is_none()
    }

    /// Unmaps the peers and frees this rank's memory and context. Idempotent. Peers must not
    /// be accessing this rank's memory any more (the Python layer synchronizes all ranks first).
    fn close(&mut self) -> Result<()> {
        let Some(inner) = self.inner.take() else {
            return Ok(());
        };
        let mut first: Result<()> = Ok(());
        let mut keep = |r: Result<()>| {
            if first.is_ok() {
                first = r;
            }
        };
        keep(inner.ctx.release());
        for m in inner.peers.into_iter().flatten() {
            keep(m.release());
        }
        if let Some(mem) = inner.mem {
            keep(mem.release());
        }
        first
    }
}

impl Drop for SymmHeap {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_without_driver_is_a_clean_error() {
        // On a machine without libcuda this must be an error, not cudarc's panic. With a driver,
        // device -1 is still invalid: either way an error, never a panic.
        let e = LocalHeap::create(-1, 1 << 20, 0, 0, 1).unwrap_err();
        if !driver::available() {
            assert_eq!(e, Error::NoDriver);
            assert!(e.to_string().contains("libcuda"), "{e}");
            let pad = abi::signal::MIN_BYTES as u64;
            let e = crate::context::ExternalContext::create(0, 0, 1, &[1], 1, &[1], pad);
            assert_eq!(e.unwrap_err(), Error::NoDriver);
        }
        assert!(
            LocalHeap::create(0, 1 << 20, 0, 2, 2).is_err(),
            "rank >= world"
        );
        assert!(LocalHeap::create(0, 0, 0, 0, 1).is_err(), "empty heap");
    }
}
