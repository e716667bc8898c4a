//! The one error type of the host library. Every message names the problem and, where it helps,
//! the ranks, GPUs and sizes involved, because these errors surface as Python exceptions in
//! multi-process jobs where a vague message costs a debugging session.

use std::fmt;

/// Result alias of the host library.
pub type Result<T> = std::result::Result<T, Error>;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// `libcuda.so` could not be loaded: no NVIDIA driver on this machine (or not on the loader path).
    NoDriver,
    /// A CUDA driver call failed.
    Driver {
        call: &'static str,
        code: i32,
        name: String,
        description: String,
    },
    /// An argument is outside its documented range.
    InvalidArgument(String),
    /// The user region of the heap cannot hold an allocation of `requested` bytes.
    OutOfMemory {
        requested: u64,
        free: u64,
        largest_free: u64,
        capacity: u64,
    },
    /// An op's workspace (`Allocator::alloc_top`) of `requested` bytes does not fit under
    /// `floor`, the lowest workspace so far (or the region's end): the user's allocations reach
    /// into the workspaces' region (`blocking`: the nearest one under the floor), or the heap is
    /// too small.
    WorkspaceRegionTaken {
        requested: u64,
        floor: u64,
        blocking: Option<(u64, u64)>,
        capacity: u64,
    },
    /// `free` of an offset that is not the start of a live allocation.
    NotAllocated(u64),
    /// The object was closed; `what` names it.
    Closed(&'static str),
    /// A serialized heap handle could not be parsed; `index` is its position in the exchanged list.
    BadHandle { index: usize, reason: String },
    /// The exchanged handles do not describe one consistent symmetric heap.
    Mismatch(String),
    /// Two GPUs of the group cannot reach each other peer-to-peer.
    NoPeerAccess {
        rank: i32,
        gpu: String,
        peer_rank: i32,
        peer_gpu: String,
    },
    /// `cause`, while doing `what` (e.g. "mapping the heap of rank 3 (GPU 0000:9a:00.0)").
    Context { what: String, cause: Box<Error> },
    /// An external signal pad (PyTorch symmetric memory) is smaller than the ABI needs.
    SignalPadTooSmall { size: u64, needed: u64 },
    /// NVSHMEM's host library is missing, incomplete, uninitialized or failed a call.
    Nvshmem(String),
    /// Memory someone else mapped (NVSHMEM) has no load/store address in this process for some
    /// ranks: they are on another node, which only the (future) cross-node path reaches.
    PeerNotMapped { rank: i32, peers: Vec<i32> },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoDriver => write!(
                f,
                "the CUDA driver library (libcuda.so / libcuda.so.1) could not be loaded: ironlink \
                 needs an NVIDIA GPU and its driver to build symmetric memory; check that the \
                 driver is installed and on the loader path (LD_LIBRARY_PATH)"
            ),
            Error::Driver {
                call,
                code,
                name,
                description,
            } => write!(
                f,
                "CUDA driver call {call} failed: {name} ({code}): {description}"
            ),
            Error::InvalidArgument(msg) => write!(f, "invalid argument: {msg}"),
            Error::OutOfMemory {
                requested,
                free,
                largest_free,
                capacity,
            } => write!(
                f,
                "symmetric heap out of memory: requested {requested} bytes, but only {free} of \
                 {capacity} bytes are free (largest free block {largest_free} bytes); create the \
                 heap with more bytes or free tensors first"
            ),
            Error::WorkspaceRegionTaken {
                requested,
                floor,
                blocking,
                capacity,
            } => {
                write!(
                    f,
                    "symmetric heap out of memory for an op's workspace: {requested} bytes are \
                     needed under offset {floor} of the {capacity}-byte region (the ops' \
                     workspaces are a stack at its end, at the same offsets on every rank)"
                )?;
                if let Some((o, l)) = blocking {
                    write!(f, "; the tensor at [{o}, {}) lies in the way", o + l)?;
                }
                write!(
                    f,
                    "; create the heap with more bytes (the ops' heap_bytes() say how many) or \
                     free tensors first"
                )
            }
            Error::NotAllocated(off) => write!(
                f,
                "offset {off} of the symmetric heap is not the start of a live allocation \
                 (double free, or a view into an allocation?)"
            ),
            Error::Closed(what) => write!(f, "{what} is closed; it cannot be used any more"),
            Error::BadHandle { index, reason } => {
                write!(
                    f,
                    "heap handle #{index} of the exchange is invalid: {reason}"
                )
            }
            Error::Mismatch(msg) => write!(f, "symmetric heap exchange failed: {msg}"),
            Error::NoPeerAccess {
                rank,
                gpu,
                peer_rank,
                peer_gpu,
            } => write!(
                f,
                "GPU {gpu} (rank {rank}) cannot access GPU {peer_gpu} (rank {peer_rank}) \
                 peer-to-peer (cuDeviceCanAccessPeer = 0); ironlink needs every pair of GPUs \
                 of the group connected by NVLink or PCIe P2P"
            ),
            Error::Context { what, cause } => write!(f, "{what}: {cause}"),
            Error::SignalPadTooSmall { size, needed } => write!(
                f,
                "the signal pad has {size} bytes but ironlink needs at least {needed}; with \
                 PyTorch symmetric memory call \
                 torch.distributed._symmetric_memory.set_signal_pad_size({needed}) (or larger) \
                 before the first symmetric allocation"
            ),
            Error::Nvshmem(msg) => write!(f, "NVSHMEM: {msg}"),
            Error::PeerNotMapped { rank, peers } => {
                let list: Vec<String> = peers.iter().map(|p| p.to_string()).collect();
                write!(
                    f,
                    "rank {rank} has no load/store address for the symmetric memory of rank(s) {}                      (NVSHMEM gives none for a GPU on another node); a heap of one node needs                      every rank's, one of several nodes (node_size) its own node's (see                      docs/backends.md)",
                    list.join(", ")
                )
            }
        }
    }
}

impl std::error::Error for Error {}

/// Adds what we were doing to an error, for messages like "allocating 1 GiB on GPU ...: ...".
pub trait Context<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> Context<T> for Result<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|cause| Error::Context {
            what: what(),
            cause: Box::new(cause),
        })
    }
}
