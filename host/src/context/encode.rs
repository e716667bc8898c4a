//! The encoder of `SymmContext`: the fields one by one in the order and widths the host believes
//! in, independently of Rust's `repr(C)` layout computation; the layout test checks that this
//! agrees with `abi::CONTEXT_FIELDS` (what the device reads), so a field reordered on one side
//! fails CI.

use crate::abi::{self, SymmContext, MAX_RANKS};

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
pub(super) fn offset_of(name: &str) -> usize {
    let (_, fields) = encode_with_layout(&SymmContext::new(0, 1));
    fields
        .iter()
        .find(|f| f.0 == name)
        .map(|f| f.1)
        .expect("known context field")
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
}
