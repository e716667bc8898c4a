//! A symmetric heap over memory that someone else allocated and mapped: PyTorch's NVSHMEM
//! symmetric memory (`SymmetricHeap(..., backend="nvshmem")`).
//!
//! The caller allocates one buffer of [`Layout::total`] bytes per rank from NVSHMEM's symmetric
//! heap and hands us every rank's address of it as mapped in this process (`nvshmem_ptr`, what
//! PyTorch's `buffer_ptrs` are). The regions sit at the same offsets as in our own heap, so the
//! device code, the allocator and the Python layer are the same; only the memory is not ours:
//! closing frees the context alone, the owner frees the buffer.

use crate::abi::{self, SymmContext};
use crate::context::{build_context, check_nodes, check_rank, DeviceContext};
use crate::driver::Device;
use crate::error::{Error, Result};
use crate::heap::{Inner, Layout, SymmHeap};

/// The context for an external buffer of `layout` at `bases[r]` for every rank `r` (as mapped
/// in this process), with backend kind `backend` (NVSHMEM), on nodes of `node_size` ranks (0, or
/// the world size: one node).
///
/// One node: every base must be non-null; a null one is a peer on another node
/// ([`Error::PeerNotMapped`], naming all of them). Several nodes (`node_size` divides the world,
/// at most MAX_RANKS per node and MAX_NODES nodes): a multi-node context
/// (`backend::NVSHMEM_MULTI_NODE`) whose peer tables hold this rank's node, whose bases must be
/// non-null; other nodes' bases are not used (NVSHMEM reaches them by PE number).
pub fn external_heap_context(
    rank: i32,
    world: i32,
    backend: u32,
    node_size: i32,
    layout: Layout,
    bases: &[u64],
) -> Result<SymmContext> {
    let multi_node = node_size != 0 && node_size != world;
    if multi_node {
        check_nodes(rank, world, node_size)?;
    } else {
        check_rank(rank, world)?;
    }
    if backend != abi::backend::NVSHMEM {
        return Err(Error::InvalidArgument(format!(
            "a heap over external memory must be of backend kind NVSHMEM ({}), got {backend}",
            abi::backend::NVSHMEM
        )));
    }
    let w = world as usize;
    if bases.len() != w {
        return Err(Error::InvalidArgument(format!(
            "need one buffer address per rank: world size {world}, got {}",
            bases.len()
        )));
    }
    // The ranks whose memory this process reaches by loads and stores: its node.
    let size = if multi_node { node_size } else { world };
    let node = rank / size * size..rank / size * size + size;
    let unmapped: Vec<i32> = node.clone().filter(|&r| bases[r as usize] == 0).collect();
    if !unmapped.is_empty() {
        return Err(Error::PeerNotMapped {
            rank,
            peers: unmapped,
        });
    }
    let mut peers = Vec::with_capacity(size as usize);
    for r in node {
        let base = bases[r as usize];
        let end = base.checked_add(layout.total());
        if end.is_none() {
            return Err(Error::InvalidArgument(format!(
                "rank {r}'s buffer at {base:#x} would wrap the address space"
            )));
        }
        let slot = r as usize % abi::MAX_RANKS; // one node's ranks never share a slot
        peers.push((slot, layout.regions_at(base)));
    }
    let mut c = build_context(rank, world, layout.sizes(), peers);
    c.backend = backend;
    if multi_node {
        c.backend = abi::backend::NVSHMEM_MULTI_NODE;
        c.node_size = node_size as u32;
    }
    Ok(c)
}

/// Opens a heap over the external buffers (see [`external_heap_context`]) on CUDA device
/// `device`: zeroes this rank's buffer (the signal region must start at 0; the caller holds
/// every rank back until all have zeroed theirs) and writes the context.
pub fn open_external_heap(
    device: i32,
    rank: i32,
    world: i32,
    backend: u32,
    node_size: i32,
    layout: Layout,
    bases: &[u64],
) -> Result<SymmHeap> {
    let ctx = external_heap_context(rank, world, backend, node_size, layout, bases)?;
    let dev = Device::open(device)?;
    dev.memset(bases[rank as usize], 0, layout.total() as usize)?;
    let inner = Inner {
        ctx: DeviceContext::create(&dev, &ctx)?,
        peers: Vec::new(),
        mem: None,
    };
    Ok(SymmHeap::assemble(inner, &ctx, dev.ordinal(), layout))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::backend;

    #[test]
    fn context_places_the_regions_at_the_heap_offsets() {
        let l = Layout::new(1 << 20, 1 << 16).unwrap();
        let bases = [0x7000_0000_0000, 0x7100_0000_0000, 0x7200_0000_0000];
        let c = external_heap_context(1, 3, backend::NVSHMEM, 0, l, &bases).unwrap();
        assert_eq!((c.backend, c.rank, c.world_size), (backend::NVSHMEM, 1, 3));
        assert_eq!(
            (c.heap_size, c.signal_size, c.scratch_size),
            (l.heap, l.signal, l.scratch)
        );
        for (r, &b) in bases.iter().enumerate() {
            assert_eq!(c.peer_heap[r], b);
            assert_eq!(c.peer_signal[r], b + l.signal_offset());
            assert_eq!(c.peer_scratch[r], b + l.scratch_offset());
        }
        assert_eq!(c.peer_heap[3], 0, "past the world");
        assert!(c.ar_one_shot_max_bytes > 0, "default limits filled in");
    }

    #[test]
    fn context_refuses_unmapped_peers_and_bad_arguments() {
        let l = Layout::new(4096, 0).unwrap();
        let e = external_heap_context(0, 4, backend::NVSHMEM, 0, l, &[1 << 20, 0, 2 << 20, 0])
            .unwrap_err();
        assert_eq!(
            e,
            Error::PeerNotMapped {
                rank: 0,
                peers: vec![1, 3]
            }
        );
        let msg = e.to_string();
        assert!(
            msg.contains("rank(s) 1, 3") && msg.contains("one node"),
            "{msg}"
        );
        let ok = [1 << 20, 2 << 20];
        assert!(external_heap_context(0, 2, backend::P2P, 0, l, &ok).is_err());
        assert!(external_heap_context(0, 3, backend::NVSHMEM, 0, l, &ok).is_err());
        assert!(external_heap_context(2, 2, backend::NVSHMEM, 0, l, &ok).is_err());
        assert!(external_heap_context(0, 2, backend::NVSHMEM, 0, l, &[1 << 20, u64::MAX]).is_err());
    }

    #[test]
    fn multi_node_context_maps_its_node_only() {
        let l = Layout::new(4096, 0).unwrap();
        // 16 ranks as 2 nodes of 8; rank 11 (slot 3) is on node 1; other nodes' bases are 0.
        let bases: Vec<u64> = (0..16)
            .map(|r| if r >= 8 { (r as u64 + 1) << 32 } else { 0 })
            .collect();
        let c = external_heap_context(11, 16, backend::NVSHMEM, 8, l, &bases).unwrap();
        assert_eq!(
            (c.backend, c.node_size, c.world_size),
            (backend::NVSHMEM_MULTI_NODE, 8, 16)
        );
        for (r, &base) in bases.iter().enumerate().skip(8) {
            assert_eq!(c.peer_heap[r % 8], base);
        }
        // A hole on its own node is refused; bad groupings too.
        let mut holed = bases.clone();
        holed[9] = 0;
        let e = external_heap_context(11, 16, backend::NVSHMEM, 8, l, &holed).unwrap_err();
        assert_eq!(
            e,
            Error::PeerNotMapped {
                rank: 11,
                peers: vec![9]
            }
        );
        for (world, size) in [(16, 3), (16, 16), (12, 0), (512, 8), (16, -2), (64, 1)] {
            let b = vec![1u64 << 32; world];
            let r = external_heap_context(0, world as i32, backend::NVSHMEM, size, l, &b);
            assert!(r.is_err(), "{world} as nodes of {size}");
        }
    }

    #[test]
    fn open_without_driver_is_a_clean_error() {
        let l = Layout::new(4096, 0).unwrap();
        let e = open_external_heap(0, 0, 1, backend::NVSHMEM, 0, l, &[1 << 20]).unwrap_err();
        if !crate::driver::available() {
            assert_eq!(e, Error::NoDriver);
        }
    }
}
