//! A context over memory someone else allocated and mapped (PyTorch's symmetric memory).

use super::{build_context, check_rank, ContextOwner, DeviceContext, Regions};
use crate::abi::{self, SymmContext};
use crate::driver::Device;
use crate::error::{Error, Result};

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
    use crate::abi::MAX_RANKS;

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
