"""Programmatic Dependent Launch (PDL) for the latency-bound kernels (all_reduce_rmsnorm, the
all_reduce op): in a stream or a CUDA graph, the kernel launches while the kernel before it is
still running, so its launch and its CTAs' start overlap that kernel's tail.

What Triton offers (the same in every supported release, 3.5 to 3.9):
- `kernel[grid](..., launch_pdl=True)`: a compile option (`CUDAOptions.launch_pdl`) that only the
  launcher reads: it adds CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION to
  cuLaunchKernelEx. It changes no code, but is part of the kernel cache key.
- `triton.language.extra.cuda.gdc_wait()`: `griddepcontrol.wait`. Blocks until the kernels this
  one depends on have completed and their memory operations are visible to it. A no-op when the
  kernel was launched without PDL.
- `gdc_launch_dependents()`: `griddepcontrol.launch_dependents`. Once every CTA of this kernel
  has executed it (or exited), the next kernel, if launched with PDL, may start; it still waits in
  its own `gdc_wait` for this one to complete. A hint: without it the next kernel starts when
  this one's CTAs have exited.
Both need sm_90 (ptxas rejects them for sm_80), so kernels take them behind a constexpr.

The rule for our kernels: nothing before `wait_for_previous_kernel` reads or writes global memory
(inputs, the residual, the norm weight, the heap's counters, LL boxes and signals, the status
buffer: any of them may be the previous kernel's output), and every CTA waits unconditionally.
That also keeps the stream's order transitive: a kernel that waits cannot complete before the
one ahead of it, so a later kernel without PDL sees both. `allow_next_kernel` right after the
wait is then always safe: the next kernel can start only after all of our CTAs are resident, so
it never keeps a CTA of ours (or a grid barrier's co-residence) from running, and what it does
before its own wait touches none of our data.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def wait_for_previous_kernel(PDL: tl.constexpr):
    """With PDL: block until the kernel before this one has completed and its writes are visible."""
    if PDL:
        gdc_wait()


@triton.jit
def allow_next_kernel(PDL: tl.constexpr):
    """With PDL: let the next kernel of the stream start (it waits for this one to complete)."""
    if PDL:
        gdc_launch_dependents()


__all__ = ["allow_next_kernel", "wait_for_previous_kernel"]
