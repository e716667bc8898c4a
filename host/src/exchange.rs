//! Heap handles: what one rank must tell the others so that they can map its heap, as a plain
//! byte string that any transport can carry (`torch.distributed.all_gather_object`, a TCP store,
//! MPI), and the checks that a gathered set of them describes one consistent symmetric heap.
//!
//! Layout (little-endian, `HANDLE_BYTES` in all):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `IRLKHNDL` |
//! | 8 | 4 | ABI version |
//! | 12 | 4 | rank |
//! | 16 | 4 | world size |
//! | 20 | 4 | process id (for messages) |
//! | 24 | 8 | heap (user region) bytes |
//! | 32 | 8 | signal region bytes |
//! | 40 | 8 | scratch region bytes |
//! | 48 | 8 | node id (hash of the kernel boot id: equal on one machine) |
//! | 56 | 8 | process token (random per process) |
//! | 64 | 16 | GPU UUID |
//! | 80 | 16 | GPU PCI bus id, ASCII, NUL-padded |
//! | 96 | 64 | legacy CUDA IPC handle of the whole allocation |

use crate::abi::ABI_VERSION;
use crate::driver::IPC_HANDLE_BYTES;
use crate::error::{Error, Result};
use std::collections::BTreeMap;

pub const HANDLE_MAGIC: [u8; 8] = *b"IRLKHNDL";
pub const HANDLE_BYTES: usize = 96 + IPC_HANDLE_BYTES;

/// Everything a peer needs to map one rank's heap, and to check that it belongs with the others.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandleInfo {
    pub abi_version: u32,
    pub rank: i32,
    pub world: i32,
    pub pid: u32,
    pub heap_size: u64,
    pub signal_size: u64,
    pub scratch_size: u64,
    pub node_id: u64,
    pub process_token: u64,
    pub uuid: [u8; 16],
    pub pci_bus_id: String,
    pub ipc: [u8; IPC_HANDLE_BYTES],
}

impl HandleInfo {
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HANDLE_BYTES);
        b.extend_from_slice(&HANDLE_MAGIC);
        b.extend_from_slice(&self.abi_version.to_le_bytes());
        b.extend_from_slice(&self.rank.to_le_bytes());
        b.extend_from_slice(&self.world.to_le_bytes());
        b.extend_from_slice(&self.pid.to_le_bytes());
        b.extend_from_slice(&self.heap_size.to_le_bytes());
        b.extend_from_slice(&self.signal_size.to_le_bytes());
        b.extend_from_slice(&self.scratch_size.to_le_bytes());
        b.extend_from_slice(&self.node_id.to_le_bytes());
        b.extend_from_slice(&self.process_token.to_le_bytes());
        b.extend_from_slice(&self.uuid);
        let mut bus = [0u8; 16];
        let n = self.pci_bus_id.len().min(15);
        bus[..n].copy_from_slice(&self.pci_bus_id.as_bytes()[..n]);
        b.extend_from_slice(&bus);
        b.extend_from_slice(&self.ipc);
        debug_assert_eq!(b.len(), HANDLE_BYTES);
        b
    }

    /// Parses a handle; `index` (its position in the exchanged list) only serves the message.
    pub fn from_bytes(b: &[u8], index: usize) -> Result<Self> {
        let bad = |reason: String| Error::BadHandle { index, reason };
        if b.len() != HANDLE_BYTES {
            return Err(bad(format!(
                "expected {HANDLE_BYTES} bytes, got {} (not an ironlink heap handle?)",
                b.len()
            )));
        }
        if b[..8] != HANDLE_MAGIC {
            return Err(bad("wrong magic (not an ironlink heap handle)".into()));
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let abi_version = u32_at(8);
        if abi_version != ABI_VERSION {
            return Err(bad(format!(
                "made by ironlink ABI version {abi_version}, this is version {ABI_VERSION}: \
                 every rank must run the same ironlink build"
            )));
        }
        let bus = &b[80..96];
        let bus_len = bus.iter().position(|&c| c == 0).unwrap_or(16);
        Ok(HandleInfo {
            abi_version,
            rank: u32_at(12) as i32,
            world: u32_at(16) as i32,
            pid: u32_at(20),
            heap_size: u64_at(24),
            signal_size: u64_at(32),
            scratch_size: u64_at(40),
            node_id: u64_at(48),
            process_token: u64_at(56),
            uuid: b[64..80].try_into().unwrap(),
            pci_bus_id: String::from_utf8_lossy(&bus[..bus_len]).into_owned(),
            ipc: b[96..96 + IPC_HANDLE_BYTES].try_into().unwrap(),
        })
    }

    fn sizes(&self) -> (u64, u64, u64) {
        (self.heap_size, self.signal_size, self.scratch_size)
    }
}

/// Identifies this machine: equal for all processes of one node (containers included, since the
/// boot id is the host kernel's), different across nodes.
pub fn node_id() -> u64 {
    let src = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .or_else(|_| std::fs::read_to_string("/proc/sys/kernel/hostname"))
        .unwrap_or_default();
    fnv1a(src.trim().as_bytes())
}

/// Random per process (pids can repeat across PID namespaces on one node).
pub fn process_token() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static TOKEN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TOKEN.get_or_init(|| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish()
    })
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

fn fmt_ranks(r: &[i32]) -> String {
    let v: Vec<String> = r.iter().map(|x| x.to_string()).collect();
    if r.len() == 1 {
        format!("rank {}", v[0])
    } else {
        format!("ranks {}", v.join(", "))
    }
}

/// Whether ranks may share a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuSharing {
    /// One GPU per rank: what every real job runs.
    OnePerRank,
    /// Several ranks on one GPU, for running multi-rank tests on a machine with fewer GPUs
    /// (under CUDA MPS, so that every rank's kernels run at once; `tests/gpu/run.sh
    /// --shared-gpu`). Correct results mean the same there; times mean nothing.
    Shared,
}

/// Parses the handles gathered from all ranks (`all[i]` from whichever rank sent it) and checks
/// that they form one symmetric heap of `world` ranks on one node, one process per rank and one
/// GPU per rank (unless `sharing` allows several). Every rank runs this on the same data, so
/// every rank reaches the same verdict: no rank is left waiting for a peer that gave up. Returns
/// the handles ordered by rank.
pub fn validate(world: i32, all: &[Vec<u8>], sharing: GpuSharing) -> Result<Vec<HandleInfo>> {
    if all.len() != world as usize {
        return Err(Error::Mismatch(format!(
            "expected {world} handles (one per rank), got {}",
            all.len()
        )));
    }
    let infos = all
        .iter()
        .enumerate()
        .map(|(i, b)| HandleInfo::from_bytes(b, i))
        .collect::<Result<Vec<_>>>()?;

    if let Some(h) = infos.iter().find(|h| h.world != world) {
        return Err(Error::Mismatch(format!(
            "rank {} created its heap for world size {}, this rank for {world}",
            h.rank, h.world
        )));
    }
    let mut by_rank: Vec<Option<HandleInfo>> = vec![None; world as usize];
    for h in &infos {
        if h.rank < 0 || h.rank >= world {
            return Err(Error::Mismatch(format!(
                "a handle claims rank {} in a world of {world}",
                h.rank
            )));
        }
        if by_rank[h.rank as usize].replace(h.clone()).is_some() {
            return Err(Error::Mismatch(format!(
                "rank {} sent two handles (two processes created their heap with the same rank)",
                h.rank
            )));
        }
    }
    // `infos.len() == world` and no duplicates: every rank is present.
    let sorted: Vec<HandleInfo> = by_rank.into_iter().map(Option::unwrap).collect();

    let mut sizes: BTreeMap<(u64, u64, u64), Vec<i32>> = BTreeMap::new();
    for h in &sorted {
        sizes.entry(h.sizes()).or_default().push(h.rank);
    }
    if sizes.len() > 1 {
        let parts: Vec<String> = sizes
            .iter()
            .map(|((heap, sig, scr), r)| {
                format!(
                    "{}: heap {heap} B, signal {sig} B, scratch {scr} B",
                    fmt_ranks(r)
                )
            })
            .collect();
        return Err(Error::Mismatch(format!(
            "ranks asked for different heap sizes (every rank must pass the same nbytes and \
             scratch_bytes): {}",
            parts.join("; ")
        )));
    }

    let mut nodes: BTreeMap<u64, Vec<i32>> = BTreeMap::new();
    for h in &sorted {
        nodes.entry(h.node_id).or_default().push(h.rank);
    }
    if nodes.len() > 1 {
        let parts: Vec<String> = nodes.values().map(|r| fmt_ranks(r)).collect();
        return Err(Error::Mismatch(format!(
            "the ranks run on {} different machines ({}); an ironlink heap spans the GPUs of one \
             node (use a per-node process group)",
            nodes.len(),
            parts.join(" | ")
        )));
    }

    for (i, a) in sorted.iter().enumerate() {
        for b in &sorted[i + 1..] {
            if a.process_token == b.process_token {
                return Err(Error::Mismatch(format!(
                    "ranks {} and {} are the same process (pid {}); ironlink needs one process \
                     per GPU (CUDA IPC cannot map memory into the process that owns it)",
                    a.rank, b.rank, a.pid
                )));
            }
            if a.uuid == b.uuid && sharing == GpuSharing::OnePerRank {
                return Err(Error::Mismatch(format!(
                    "ranks {} and {} both use GPU {}; use one GPU per rank (e.g. \
                     torch.cuda.set_device(local_rank) before creating the heap)",
                    a.rank, b.rank, a.pci_bus_id
                )));
            }
        }
    }
    Ok(sorted)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: GpuSharing = GpuSharing::OnePerRank;

    fn info(rank: i32, world: i32) -> HandleInfo {
        HandleInfo {
            abi_version: ABI_VERSION,
            rank,
            world,
            pid: 1000 + rank as u32,
            heap_size: 1 << 20,
            signal_size: 28672,
            scratch_size: 1 << 25,
            node_id: 42,
            process_token: 7 + rank as u64,
            uuid: [rank as u8; 16],
            pci_bus_id: format!("0000:{:02x}:00.0", 0x18 + rank),
            ipc: [0xa0 + rank as u8; IPC_HANDLE_BYTES],
        }
    }

    fn bytes(v: &[HandleInfo]) -> Vec<Vec<u8>> {
        v.iter().map(HandleInfo::to_bytes).collect()
    }

    #[test]
    fn round_trip() {
        let h = info(3, 8);
        let b = h.to_bytes();
        assert_eq!(b.len(), HANDLE_BYTES);
        assert_eq!(&b[..8], b"IRLKHNDL");
        assert_eq!(HandleInfo::from_bytes(&b, 0).unwrap(), h);
    }

    #[test]
    fn validate_orders_by_rank() {
        let mut v: Vec<_> = (0..4).map(|r| info(r, 4)).collect();
        v.reverse();
        let out = validate(4, &bytes(&v), ONE).unwrap();
        assert_eq!(out.iter().map(|h| h.rank).collect::<Vec<_>>(), [0, 1, 2, 3]);
    }

    #[test]
    fn bad_bytes() {
        let mut b = info(0, 1).to_bytes();
        let e = validate(1, &[b[..10].to_vec()], ONE).unwrap_err();
        assert!(matches!(e, Error::BadHandle { index: 0, .. }), "{e}");
        b[0] = b'X';
        assert!(validate(1, &[b.clone()], ONE)
            .unwrap_err()
            .to_string()
            .contains("magic"));
        let mut h = info(0, 1);
        h.abi_version = ABI_VERSION + 1;
        let e = validate(1, &bytes(&[h]), ONE).unwrap_err().to_string();
        assert!(e.contains("ABI version"), "{e}");
    }

    #[test]
    fn size_mismatch_names_ranks_and_sizes() {
        let mut v: Vec<_> = (0..4).map(|r| info(r, 4)).collect();
        v[1].heap_size = 2 << 20;
        v[3].heap_size = 2 << 20;
        let e = validate(4, &bytes(&v), ONE).unwrap_err().to_string();
        assert!(e.contains("ranks 0, 2: heap 1048576 B"), "{e}");
        assert!(e.contains("ranks 1, 3: heap 2097152 B"), "{e}");
    }

    #[test]
    fn rank_and_world_errors() {
        let v: Vec<_> = (0..2).map(|r| info(r, 2)).collect();
        assert!(validate(3, &bytes(&v), ONE).is_err(), "count");
        let w = vec![info(0, 2), info(0, 2)];
        let e = validate(2, &bytes(&w), ONE).unwrap_err().to_string();
        assert!(e.contains("rank 0 sent two handles"), "{e}");
        let w = vec![info(0, 2), info(1, 3)];
        let e = validate(2, &bytes(&w), ONE).unwrap_err().to_string();
        assert!(e.contains("world size 3"), "{e}");
    }

    #[test]
    fn same_gpu_same_process_other_node() {
        let mut v: Vec<_> = (0..3).map(|r| info(r, 3)).collect();
        v[2].uuid = v[0].uuid;
        let e = validate(3, &bytes(&v), ONE).unwrap_err().to_string();
        assert!(e.contains("ranks 0 and 2 both use GPU 0000:18:00.0"), "{e}");
        assert!(validate(3, &bytes(&v), GpuSharing::Shared).is_ok());
        let mut v: Vec<_> = (0..3).map(|r| info(r, 3)).collect();
        v[1].process_token = v[0].process_token;
        let e = validate(3, &bytes(&v), ONE).unwrap_err().to_string();
        assert!(e.contains("same process"), "{e}");
        let mut v: Vec<_> = (0..3).map(|r| info(r, 3)).collect();
        v[2].node_id = 1;
        let e = validate(3, &bytes(&v), ONE).unwrap_err().to_string();
        assert!(e.contains("2 different machines"), "{e}");
    }

    #[test]
    fn node_id_is_stable() {
        assert_eq!(node_id(), node_id());
        assert_eq!(process_token(), process_token());
    }
}
