//! The device-resident `SymmContext`: encoding it, writing it to its own small device allocation,
//! and the few fields the host touches afterwards (`error`, `error_detail`, `timeout_ns`).
//!
//! The encoder writes the fields one by one in the order and widths the host believes in,
//! independently of Rust's `repr(C)` layout computation; the layout test checks that this agrees
//! with `abi::CONTEXT_FIELDS` (what the device reads), so a field reordered on one side fails CI.

use crate::abi::{self, SymmContext, MAX_RANKS};
use crate::driver::{Device, DeviceBuffer};
use crate::error::{Error, Result};
use ironlink_device::collectives::choice::with_default_limits;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// (field name, byte offset, byte size), as the encoder writes them.
pub type FieldLayout = Vec<(&'static str, usize, usize)>;

struct Writer {
    bytes: Vec<u8>,
    fields: FieldLayout,
}

impl Writer {
    fn field(&mut self, name: &'static str, data: &[u8]) {
        self.fields.push((name, self.bytes.len(), data.len()));
        self.bytes.extend_from_slice(data);
    }

    fn array(&mut self, name: &'static str, a: &[u64; MAX_RANKS]) {
        let v: Vec<u8> = a.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.field(name, &v);
    }
}

/// Serializes `c` into the bytes the device reads, and the layout used.
pub fn encode_with_layout(c: &SymmContext) -> (Vec<u8>, FieldLayout) {
    let mut w = Writer {
        bytes: Vec::with_capacity(abi::CONTEXT_SIZE),
        fields: Vec::new(),
    };
    w.field("magic", &c.magic.to_le_bytes());
    w.field("version", &c.version.to_le_bytes());
    w.field("backend", &c.backend.to_le_bytes());
    w.field("rank", &c.rank.to_le_bytes());
    w.field("world_size", &c.world_size.to_le_bytes());
    w.field("error", &c.error.to_le_bytes());
    w.field("error_detail", &c.error_detail.to_le_bytes());
    w.field("node_size", &c.node_size.to_le_bytes());
    w.field("heap_size", &c.heap_size.to_le_bytes());
    w.field("signal_size", &c.signal_size.to_le_bytes());
    w.field("scratch_size", &c.scratch_size.to_le_bytes());
    w.field("timeout_ns", &c.timeout_ns.to_le_bytes());
    w.field(
        "ar_one_shot_max_bytes",
        &c.ar_one_shot_max_bytes.to_le_bytes(),
    );
    w.field("ar_ll_max_bytes", &c.ar_ll_max_bytes.to_le_bytes());
    w.field("gather_ll_max_bytes", &c.gather_ll_max_bytes.to_le_bytes());
    w.array("peer_heap", &c.peer_heap);
    w.array("peer_signal", &c.peer_signal);
    w.array("peer_scratch", &c.peer_scratch);
    w.field("heap_digest", &c.heap_digest.to_le_bytes());
    (w.bytes, w.fields)
}

/// Serializes `c` into the bytes the device reads.
pub fn encode(c: &SymmContext) -> Vec<u8> {
    encode_with_layout(c).0
}

/// Byte offset of a context field, from the host encoder's layout.
fn offset_of(name: &str) -> usize {
    let (_, fields) = encode_with_layout(&SymmContext::new(0, 1));
    fields
        .iter()
        .find(|f| f.0 == name)
        .map(|f| f.1)
        .expect("known context field")
}

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

/// Builds the `SymmContext` for memory that someone else allocated and mapped (PyTorch's
/// symmetric memory): per-rank buffer bases, their common size, per-rank signal pads and their
/// common size. There is no scratch region (`scratch_size = 0`, collectives that need scratch
/// must use an ironlink heap).
pub fn external_context(
    rank: i32,
    world: i32,
    buffer_ptrs: &[u64],
    buffer_size: u64,
    signal_ptrs: &[u64],
    signal_size: u64,
) -> Result<SymmContext> {
    check_rank(rank, world)?;
    let w = world as usize;
    if buffer_ptrs.len() != w || signal_ptrs.len() != w {
        return Err(Error::InvalidArgument(format!(
            "need one buffer and one signal pad pointer per rank: world size {world}, got {} \
             buffer pointer(s) and {} signal pad pointer(s)",
            buffer_ptrs.len(),
            signal_ptrs.len()
        )));
    }
    if let Some(r) = (0..w).find(|&r| buffer_ptrs[r] == 0 || signal_ptrs[r] == 0) {
        return Err(Error::InvalidArgument(format!(
            "rank {r}'s buffer or signal pad pointer is null"
        )));
    }
    if buffer_size == 0 {
        return Err(Error::InvalidArgument("buffer size is 0".into()));
    }
    let needed = abi::signal::MIN_BYTES as u64;
    if signal_size < needed {
        return Err(Error::SignalPadTooSmall {
            size: signal_size,
            needed,
        });
    }
    let sizes = Regions {
        heap: buffer_size,
        signal: signal_size,
        scratch: 0,
    };
    let peers = (0..w).map(|r| {
        let regions = Regions {
            heap: buffer_ptrs[r],
            signal: signal_ptrs[r],
            scratch: 0,
        };
        (r, regions)
    });
    Ok(build_context(rank, world, sizes, peers))
}

/// A context over external memory, living in its own device allocation.
#[derive(Debug)]
pub struct ExternalContext {
    ctx: Option<DeviceContext>,
    rank: i32,
    world: i32,
}

impl ExternalContext {
    /// See [`external_context`] for the arguments; `device` is this process's CUDA ordinal.
    pub fn create(
        device: i32,
        rank: i32,
        world: i32,
        buffer_ptrs: &[u64],
        buffer_size: u64,
        signal_ptrs: &[u64],
        signal_size: u64,
    ) -> Result<Self> {
        let c = external_context(
            rank,
            world,
            buffer_ptrs,
            buffer_size,
            signal_ptrs,
            signal_size,
        )?;
        let dev = Device::open(device)?;
        Ok(ExternalContext {
            ctx: Some(DeviceContext::create(&dev, &c)?),
            rank,
            world,
        })
    }
}

impl ContextOwner for ExternalContext {
    fn context(&self) -> Result<&DeviceContext> {
        self.ctx
            .as_ref()
            .ok_or(Error::Closed("the external context"))
    }

    fn rank(&self) -> i32 {
        self.rank
    }

    fn world(&self) -> i32 {
        self.world
    }

    fn is_closed(&self) -> bool {
        self.ctx.is_none()
    }

    /// Frees the context's device memory; the external buffers are not ours. Idempotent.
    fn close(&mut self) -> Result<()> {
        match self.ctx.take() {
            Some(c) => c.release(),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A context whose every field holds a distinct recognizable value.
    fn sample() -> SymmContext {
        let mut c = SymmContext::new(3, 8);
        c.error = -7;
        c.error_detail = 11;
        c.node_size = 2;
        c.heap_size = 0x1111_2222_3333_4444;
        c.signal_size = 0x5555_6666;
        c.scratch_size = 0x7777_8888_9999;
        c.timeout_ns = 123_456_789;
        c.ar_one_shot_max_bytes = 0xaaaa_bbbb;
        c.ar_ll_max_bytes = 0xcccc_dddd_eeee;
        c.gather_ll_max_bytes = 0x1234_5678_9abc;
        c.heap_digest = 0x0bad_cafe_f00d_1234;
        for r in 0..MAX_RANKS as u64 {
            c.peer_heap[r as usize] = 0x7f00_0000_0000 + r * 0x1000_0000;
            c.peer_signal[r as usize] = 0x7e00_0000_0000 + r * 0x1000_0000;
            c.peer_scratch[r as usize] = 0x7d00_0000_0000 + r * 0x1000_0000;
        }
        c
    }

    #[test]
    fn host_layout_matches_device_abi() {
        let c = sample();
        let (bytes, fields) = encode_with_layout(&c);
        assert_eq!(bytes.len(), abi::CONTEXT_SIZE, "context size");
        assert_eq!(
            fields.len(),
            abi::CONTEXT_FIELDS.len(),
            "field count: host {fields:?} vs device {:?}",
            abi::CONTEXT_FIELDS
        );
        for &(name, off, size) in abi::CONTEXT_FIELDS {
            let host = fields.iter().find(|f| f.0 == name);
            assert_eq!(host, Some(&(name, off, size)), "field {name}");
        }
        // The bytes at each device offset hold the value the host meant for that field.
        let at = |name: &str| {
            let &(_, off, size) = abi::CONTEXT_FIELDS.iter().find(|f| f.0 == name).unwrap();
            &bytes[off..off + size]
        };
        assert_eq!(at("magic"), abi::CTX_MAGIC.to_le_bytes());
        assert_eq!(at("version"), abi::ABI_VERSION.to_le_bytes());
        assert_eq!(at("backend"), abi::backend::P2P.to_le_bytes());
        assert_eq!(at("rank"), 3i32.to_le_bytes());
        assert_eq!(at("world_size"), 8i32.to_le_bytes());
        assert_eq!(at("error"), (-7i32).to_le_bytes());
        assert_eq!(at("error_detail"), 11i32.to_le_bytes());
        assert_eq!(at("node_size"), 2u32.to_le_bytes());
        assert_eq!(at("heap_size"), c.heap_size.to_le_bytes());
        assert_eq!(at("signal_size"), c.signal_size.to_le_bytes());
        assert_eq!(at("scratch_size"), c.scratch_size.to_le_bytes());
        assert_eq!(at("timeout_ns"), c.timeout_ns.to_le_bytes());
        assert_eq!(
            at("ar_one_shot_max_bytes"),
            c.ar_one_shot_max_bytes.to_le_bytes()
        );
        assert_eq!(at("ar_ll_max_bytes"), c.ar_ll_max_bytes.to_le_bytes());
        assert_eq!(
            at("gather_ll_max_bytes"),
            c.gather_ll_max_bytes.to_le_bytes()
        );
        assert_eq!(at("peer_heap")[8 * 5..8 * 6], c.peer_heap[5].to_le_bytes());
        assert_eq!(at("peer_signal")[..8], c.peer_signal[0].to_le_bytes());
        assert_eq!(at("peer_scratch")[8 * 7..], c.peer_scratch[7].to_le_bytes());
    }

    #[test]
    fn encoding_equals_in_memory_struct() {
        // What the device dereferences is the repr(C) struct; our bytes must be exactly it.
        let c = sample();
        // SAFETY: SymmContext is repr(C), Copy, and has no padding (every u32 field comes in
        // pairs before the u64 fields); reading it as bytes is sound.
        let raw = unsafe {
            std::slice::from_raw_parts(
                (&c as *const SymmContext).cast::<u8>(),
                std::mem::size_of::<SymmContext>(),
            )
        };
        assert_eq!(encode(&c), raw);
    }

    #[test]
    fn external_context_checks() {
        let b = [0x1000, 0x2000];
        let s = [0x3000, 0x4000];
        let min = abi::signal::MIN_BYTES as u64;
        let c = external_context(1, 2, &b, 1 << 20, &s, min).unwrap();
        assert_eq!(c.peer_heap[..2], b);
        assert_eq!(c.peer_signal[..2], s);
        assert_eq!((c.scratch_size, c.peer_scratch), (0, [0; MAX_RANKS]));
        let e = external_context(1, 2, &b, 1 << 20, &s, 2048).unwrap_err();
        assert_eq!(
            e,
            Error::SignalPadTooSmall {
                size: 2048,
                needed: min
            }
        );
        assert!(e.to_string().contains("set_signal_pad_size"), "{e}");
        assert!(external_context(1, 2, &b[..1], 1 << 20, &s, min).is_err());
        assert!(external_context(2, 2, &b, 1 << 20, &s, min).is_err());
        assert!(external_context(0, 2, &[0, 1], 1 << 20, &s, min).is_err());
        assert!(external_context(0, 9, &b, 1 << 20, &s, min).is_err());
    }
}
