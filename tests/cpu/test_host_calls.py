"""CPU tests of the host ops' launches over a stand-in for torch (`tests/_fake_torch.py`): the
grid they take (tuned, capped where ranks share a GPU), the kernels on heaps of several nodes,
check=True's comparison before launching, tensors outside the heap staged, statuses and
capture, the order of a heap's calls across streams, PDL. The argument checks and the tuning
are tests/cpu/test_ops.py."""

from __future__ import annotations

import types
import warnings
from typing import Any

import pytest

import ironlink
from ironlink.language import _abi
from ironlink.runtime import launch, status_buffers, tuning
from ironlink.runtime.errors import IronlinkError

from _fake_torch import COPIES, STAGED, FakeHeap, FakeStream, FakeTensor  # tests/, beside this file
from _fake_torch import fake_torch  # noqa: F401 - the fixture applies here



def test_host_calls_launch_the_tuned_grid(fake_torch: Any) -> None:
    x = FakeTensor(4096)
    heap = FakeHeap(x)
    ironlink.all_reduce(x, heap=heap, check=True)
    ironlink.all_reduce(x, op="max")  # the heap is remembered
    ctas, warps = tuning.choose("all_reduce", 8192, 8)
    assert fake_torch.launches == [
        ("all_reduce", (ctas,), (0x1234, x, 4096, 0, status_buffers._STATUS[0]), {"num_warps": warps}),
        ("all_reduce", (ctas,), (0x1234, x, 4096, 1, status_buffers._STATUS[0]), {"num_warps": warps}),
    ]
    out, inp = FakeTensor(8 * 1024, ptr=0x20000), FakeTensor(1024, ptr=0x20000 + 3 * 2048)  # in place
    heap.mine |= {id(out), id(inp)}
    ironlink.all_gather(out, inp)
    ironlink.reduce_scatter(inp, out, op="avg")
    ctas, warps = tuning.choose("all_gather", 16384, 8)
    assert fake_torch.launches[-2][1:] == ((ctas,), (0x1234, inp, out, 1024, status_buffers._STATUS[0]), {"num_warps": warps})
    ctas, warps = tuning.choose("reduce_scatter", 16384, 8)
    assert fake_torch.launches[-1][1:3] == ((ctas,), (0x1234, out, inp, 1024, 4, status_buffers._STATUS[0]))
    ironlink.all_reduce(FakeTensor(0), heap=FakeHeap())  # empty: nothing to check in the heap or launch
    assert len(fake_torch.launches) == 4


def test_ranks_sharing_a_gpu_launch_their_share_of_it(fake_torch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """With IRONLINK_SHARED_GPU=1 and 4 ranks on one 132-SM GPU, no collective launches more than
    16 CTAs (every rank's CTAs must be resident at once: half its 33, SHARED_GPU_SM_DIVISOR),
    whatever the tuning says or ctas asks."""
    from ironlink.runtime.distributed import grid_cap, ranks_per_gpu, sm_share

    fake_torch.cuda.device_count = lambda: 1
    assert (ranks_per_gpu(), grid_cap(0), sm_share(0)) == (1, ironlink.tuning.MAX_CTAS, 132)
    assert ironlink.sm_share is sm_share  # the public name, for users' persistent kernels
    monkeypatch.setenv("IRONLINK_SHARED_GPU", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert (ranks_per_gpu(), grid_cap(0), sm_share(0)) == (4, 16, 16)
    x, out = FakeTensor(2048, ptr=0x1000000), FakeTensor(8 * 1024, ptr=0x20000)
    counts = FakeTensor(8, "int64", ptr=0x90000)
    recv_counts, recv_offsets = FakeTensor(8, "int64", ptr=0x91000), FakeTensor(8, "int64", ptr=0x92000)
    heap = FakeHeap(x, out, counts, recv_counts, recv_offsets)
    assert tuning.choose("all_reduce", 2048 * 2, 8)[0] > 16  # the cap is what limits it here
    ironlink.all_reduce(x, heap=heap)
    ironlink.all_to_all_v(out, counts, out, recv_counts, recv_offsets, heap=heap, ctas=132)
    assert [grid for _, grid, *_ in fake_torch.launches] == [(16,), (16,)]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert grid_cap(0) == 33


def test_ranks_confined_by_mps_launch_the_sms_the_gpu_reports(fake_torch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under MPS with $CUDA_MPS_ACTIVE_THREAD_PERCENTAGE at most 100 / ranks a GPU, the GPU
    reports the rank's own share of SMs: that is the share, not divided by the ranks again (only
    by SHARED_GPU_SM_DIVISOR, as every share). A percentage
    that lets the ranks overlap (or none) gets the SMs over the ranks, and init_distributed
    warns that waits can then time out."""
    from ironlink.runtime.distributed import grid_cap, mps_confined, sm_share, warn_unless_confined

    fake_torch.cuda.device_count = lambda: 1
    monkeypatch.setenv("IRONLINK_SHARED_GPU", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "25")
    fake_torch.cuda.get_device_properties = lambda d: types.SimpleNamespace(multi_processor_count=32)
    assert mps_confined(4) and (sm_share(0), grid_cap(0)) == (16, 16)
    for bad in ("50", "0", "x", ""):
        monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", bad)
        assert not mps_confined(4) and sm_share(0) == 4
    with pytest.warns(UserWarning, match="CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25"):
        warn_unless_confined()
    # A TIMEOUT says so too (without meeting the other ranks); confined, it is as it was.
    from ironlink.runtime.errors import device_error
    from ironlink.runtime.failure_notes import explained

    def no_asymmetry(e: Any) -> Any:
        raise AssertionError("the heap-call report is for HEAP_ASYMMETRIC only")

    timeout = device_error(_abi.STATUS["TIMEOUT"], 0, 3)
    noted = explained(timeout, no_asymmetry)
    assert str(noted).startswith(str(timeout)) and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in str(noted)
    assert (noted.status, noted.function) == (timeout.status, timeout.function)
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "25")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_unless_confined()
    assert explained(timeout, no_asymmetry) is timeout


def test_multi_node_heaps_take_the_same_kernels_and_refuse_the_rest(fake_torch: Any) -> None:
    # One kernel per collective: @ironlink.jit compiles it for several nodes by the context
    # (tests/compile/test_topology.py); the host call launches the same kernel on any heap.
    x, out = FakeTensor(4096), FakeTensor(8 * 4096, ptr=0x20000)
    counts = FakeTensor(8, "int64", ptr=0x90000)
    heap = FakeHeap(x, out, counts)
    heap.node_size = 2  # 8 ranks as 4 nodes of 2
    recv_counts, recv_offsets = FakeTensor(8, "int64", ptr=0x91000), FakeTensor(8, "int64", ptr=0x92000)
    heap.mine |= {id(recv_counts), id(recv_offsets)}
    ironlink.all_reduce(x, heap=heap)
    ironlink.all_gather(out, x, heap=heap)
    ironlink.reduce_scatter(x, out, heap=heap)
    ironlink.all_to_all_v(x, counts, out, recv_counts, recv_offsets, heap=heap)
    assert [k for k, *_ in fake_torch.launches] == ["all_reduce", "all_gather", "reduce_scatter", "all_to_all_v"]
    assert launch.MULTI_NODE_OPS == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all_v",
                                  "all_reduce_rmsnorm", "matmul_all_reduce", "all_gather_matmul",
                                  "matmul_reduce_scatter"}
    with pytest.raises(IronlinkError, match=r"ironlink.barrier has no multi-node version yet; this heap spans 4 "
                                            r"nodes of 2 ranks, where all_gather, all_gather_matmul, all_reduce, "
                                            r"all_reduce_rmsnorm, all_to_all_v, matmul_all_reduce, "
                                            r"matmul_reduce_scatter, reduce_scatter run"):
        launch.launch_with_status("barrier", heap, 1, lambda status: None, False)
    assert len(fake_torch.launches) == 4  # refused before any launch


def _fused_operands() -> tuple[FakeTensor, ...]:
    """The four fused ops' tensors at world 8: all_reduce_rmsnorm's x, residual, out [4, 4096] and
    weight; the matmuls' a [64, 512], b [512, 256], matmul_all_reduce's out, all_gather_matmul's
    a_full and out, matmul_reduce_scatter's out."""
    t, h = 4, 4096
    x, res, out = (FakeTensor(t * h, ptr=p, shape=(t, h)) for p in (0x100000, 0x200000, 0x300000))
    w = FakeTensor(h, ptr=0x400000)
    a, b = FakeTensor(64 * 512, ptr=0x500000, shape=(64, 512)), FakeTensor(512 * 256, ptr=0x600000, shape=(512, 256))
    c = FakeTensor(64 * 256, ptr=0x700000, shape=(64, 256))
    a_full = FakeTensor(8 * 64 * 512, ptr=0x800000, shape=(8 * 64, 512))
    gathered_out = FakeTensor(8 * 64 * 256, ptr=0x900000, shape=(8 * 64, 256))
    scattered = FakeTensor(8 * 256, ptr=0xA00000, shape=(8, 256))
    return x, res, out, w, a, b, c, a_full, gathered_out, scattered


def test_checked_calls_compare_what_every_rank_must_share_before_launching(fake_torch: Any) -> None:
    x, out = FakeTensor(4096), FakeTensor(8 * 4096, ptr=0x20000)
    counts = FakeTensor(8, "int64", ptr=0x90000)
    recv_counts, recv_offsets = FakeTensor(8, "int64", ptr=0x91000), FakeTensor(8, "int64", ptr=0x92000)
    xs, res, normed, w, a, b, c, a_full, gathered_out, scattered = _fused_operands()
    heap = FakeHeap(x, out, counts, recv_counts, recv_offsets, xs, c, a_full)
    ironlink.all_reduce(x, op="max", heap=heap)  # unchecked: nothing compared
    assert heap.compared == []
    ironlink.all_reduce(x, op="max", heap=heap, check=True)
    ironlink.all_gather(out, x, heap=heap, check=True)
    ironlink.reduce_scatter(x, out, heap=heap, check=True)
    ironlink.all_to_all_v(x, counts, out, recv_counts, recv_offsets, heap=heap, check=True)
    ironlink.all_reduce_rmsnorm(xs, res, w, out=normed, heap=heap, check=True)
    ironlink.matmul_all_reduce(a, b, out=c, heap=heap, check=True)
    ironlink.all_gather_matmul(a, b, heap, a_full=a_full, out=gathered_out, method="kernel", check=True,
                               exchange=tuning.GatherExchange(copy_engine=False))
    ironlink.matmul_reduce_scatter(a, b, heap, out=scattered, method="kernel", check=True)
    bf16 = "torch.bfloat16"
    assert heap.compared == [
        ("all_reduce", {"elements": 4096, "dtype": "bfloat16", "op": "max"}),
        ("all_gather", {"elements": 4096, "dtype": "bfloat16"}),
        ("reduce_scatter", {"elements": 4096, "dtype": "bfloat16", "op": "sum"}),
        ("all_to_all_v", {"row_elements": 1, "dtype": bf16, "grid": fake_torch.launches[4][1][0]}),
        ("all_reduce_rmsnorm", {"x": (4, 4096), "dtype": bf16, "mode": None, "out": bf16, "residual_out": False}),
        ("matmul_all_reduce", {"a": (64, 512), "b": (512, 256), "dtype": bf16, "method": None}),
        ("all_gather_matmul", {"a_shard": (64, 512), "b": (512, 256), "dtype": bf16, "method": "kernel"}),
        ("matmul_reduce_scatter", {"a": (64, 512), "b": (512, 256), "dtype": bf16, "method": "kernel"}),
    ]
    launched = len(fake_torch.launches)
    heap.differs = "the ranks' calls differ in elements: rank 0: ...; rank 3: ..."
    with pytest.raises(IronlinkError, match=r"ironlink.all_reduce\(check=True\) on rank 3: the ranks' calls differ"):
        ironlink.all_reduce(x, heap=heap, check=True)
    with pytest.raises(IronlinkError, match="nothing was launched"):
        ironlink.matmul_all_reduce(a, b, out=c, heap=heap, check=True)
    assert len(fake_torch.launches) == launched  # refused before any launch


def test_fused_ops_stage_tensors_outside_the_heap(fake_torch: Any) -> None:
    # Any tensor in (issue 63): all_reduce_rmsnorm's x, matmul_all_reduce's out and
    # all_gather_matmul's a_full, outside the heap, go through the op's heap workspace (at one
    # offset on every rank, as the torch operators stage): x copied in and the sum copied back;
    # out and a_full, which the ops only write, copied back alone.
    x, res, normed, w, a, b, c, a_full, gathered_out, _ = _fused_operands()
    heap = FakeHeap()  # none of them is the heap's
    COPIES.clear()
    ironlink.all_reduce_rmsnorm(x, res, w, out=normed, heap=heap)
    args = fake_torch.launches[-1][2]
    assert args[1].ptr == STAGED and args[5] is normed  # x: the workspace; out where it is
    assert COPIES == [(STAGED, x.ptr), (x.ptr, STAGED)]
    COPIES.clear()
    done = ironlink.all_reduce_rmsnorm(x, res, w, out=x, heap=heap)  # out=x: the normalized rows into x
    assert done[0] is x and fake_torch.launches[-1][2][5].ptr == STAGED
    assert COPIES == [(STAGED, x.ptr), (x.ptr, STAGED)]
    COPIES.clear()
    assert ironlink.matmul_all_reduce(a, b, out=c, heap=heap) is c
    assert all(arg is not c for arg in fake_torch.launches[-1][2]) and COPIES == [(c.ptr, STAGED)]
    COPIES.clear()
    got = ironlink.all_gather_matmul(a, b, heap, a_full=a_full, out=gathered_out, method="kernel",
                                     exchange=tuning.GatherExchange(copy_engine=False))
    assert got == (a_full, gathered_out) and all(arg is not a_full for arg in fake_torch.launches[-1][2])
    assert COPIES == [(a_full.ptr, STAGED)]
    # Heap tensors stay where they are: no copies.
    heap.mine |= {id(x), id(c), id(a_full)}
    COPIES.clear()
    ironlink.all_reduce_rmsnorm(x, res, w, out=normed, heap=heap)
    assert fake_torch.launches[-1][2][1] is x
    ironlink.matmul_all_reduce(a, b, out=c, heap=heap)
    ironlink.all_gather_matmul(a, b, heap, a_full=a_full, out=gathered_out, method="kernel",
                               exchange=tuning.GatherExchange(copy_engine=False))
    assert COPIES == []
    # Without heap= a tensor outside every heap is still refused, naming it.
    with pytest.raises(IronlinkError, match=r"x is not in a symmetric heap ironlink knows of"):
        ironlink.all_reduce_rmsnorm(FakeTensor(4 * 4096, ptr=0x990000, shape=(4, 4096)), res, w)
    # The heap it takes to stage: the workspace of the largest call beside the op's own.
    for op, args in ((ironlink.all_reduce_rmsnorm, (4, 4096, 8)), (ironlink.matmul_all_reduce, (64, 256, 512, 8))):
        assert op.heap_bytes(*args, outside_heap=True) == op.heap_bytes(*args) + 2 * 64 * 256 * 2 - 4096
    assert ironlink.all_gather_matmul.heap_bytes(512, 256, 512, 8, outside_heap=True) == \
        ironlink.all_gather_matmul.heap_bytes(512, 256, 512, 8, a_full=True) + 2 * 512 * 512 * 2 - 4096


def test_host_collectives_stage_tensors_outside_the_heap(fake_torch: Any) -> None:
    # all_gather, reduce_scatter and all_to_all_v take tensors outside the heap as their torch
    # operators do: each one not of the heap through the op's heap workspace for its position,
    # the written ones copied back; heap tensors where they are.
    heap = FakeHeap()
    out, inp = FakeTensor(8 * 1024, ptr=0x20000), FakeTensor(1024, ptr=0x30000)
    COPIES.clear()
    assert ironlink.all_gather(out, inp, heap=heap) is out
    args = fake_torch.launches[-1][2]
    staged = STAGED, STAGED + (1 << 20)  # the workspaces of argument positions 0 and 1
    assert (args[1].ptr, args[2].ptr) == staged[::-1]  # the kernel takes (inp, out)
    assert COPIES == [(staged[0], out.ptr), (staged[1], inp.ptr), (out.ptr, staged[0])]
    COPIES.clear()
    assert ironlink.reduce_scatter(inp, out, heap=heap) is inp
    assert COPIES == [(staged[0], inp.ptr), (staged[1], out.ptr), (inp.ptr, staged[0])]
    heap.mine |= {id(out)}  # out on the heap: only inp staged for all_gather
    COPIES.clear()
    ironlink.all_gather(out, inp, heap=heap)
    assert fake_torch.launches[-1][2][2] is out and COPIES == [(staged[1], inp.ptr)]
    rows, counts = FakeTensor(16, ptr=0x40000), FakeTensor(8, "int64", ptr=0x50000)
    got_rows, recv_counts, recv_offsets = FakeTensor(64, ptr=0x60000), FakeTensor(8, "int64", ptr=0x70000), \
        FakeTensor(8, "int64", ptr=0x80000)
    COPIES.clear()
    result = ironlink.all_to_all_v(rows, counts, got_rows, recv_counts, recv_offsets, heap=heap)
    assert result == (got_rows, recv_counts, recv_offsets)
    assert COPIES[-3:] == [(got_rows.ptr, STAGED + (2 << 20)), (recv_counts.ptr, STAGED + (3 << 20)),
                           (recv_offsets.ptr, STAGED + (4 << 20))]


@pytest.mark.parametrize("node_size", [8, 2])
def test_fused_ops_take_the_hierarchical_kernels_on_several_nodes(fake_torch: Any, node_size: int) -> None:
    x, res, out, w, a, b, c, a_full, gathered_out, scattered = _fused_operands()
    heap = FakeHeap(x, c, a_full)
    heap.node_size = node_size  # 8: one node of 8; 2: four nodes of 2
    ironlink.all_reduce_rmsnorm(x, res, w, out=out, heap=heap)
    ironlink.matmul_all_reduce(a, b, out=c, heap=heap)
    # One node: the kernels whose CTAs push (the copy-engine launches need real streams: GPU cases).
    ironlink.all_gather_matmul(a, b, heap, a_full=a_full, out=gathered_out, method="kernel",
                               exchange=tuning.GatherExchange(copy_engine=False))
    ironlink.matmul_reduce_scatter(a, b, heap, out=scattered, method="kernel")
    several = node_size < heap.world_size
    suffix = "_hierarchical" if several else ""
    assert [k for k, *_ in fake_torch.launches] == [f"allreduce_rmsnorm{suffix}",
                                                    # one node of 8: push, two-shot (one-shot is world 2's)
                                                    "matmul_allreduce_hierarchical" if several else "matmul_allreduce_owner",
                                                    f"allgather_matmul{suffix}", f"matmul_reducescatter{suffix}"]
    if several:  # the reduce-scatter runs in place in a workspace of the whole product, then to `out`
        rs_args, rs_kw = fake_torch.launches[3][2:]
        assert rs_args[3] is scattered and rs_args[4].ptr == 0xF000000  # out, the workspace
        assert rs_args[5:8] == (64, 256, 512) and rs_kw["WORLD"] == 8  # M, N, K: the whole product
    assert fake_torch.launches[0][3]["WHOLE"] == several  # several nodes: "whole" by default
    ironlink.all_reduce_rmsnorm(x, res, w, out=out, heap=heap, mode="rows")
    assert fake_torch.launches[-1][0] == f"allreduce_rmsnorm{suffix}" and not fake_torch.launches[-1][3]["WHOLE"]


def test_host_call_statuses_and_capture(fake_torch: Any) -> None:
    x = FakeTensor(4096)
    heap = FakeHeap(x)
    fake_torch.capturing = True
    with pytest.raises(IronlinkError, match="call each one once outside capture first"):
        ironlink.all_reduce(x, heap=heap)  # the status buffer cannot be allocated while capturing
    fake_torch.capturing = False
    ironlink.all_reduce(x, check=True)
    status_buffers._STATUS[0].values[1] = -7  # a CTA's status
    with pytest.raises(IronlinkError, match=r"symm_all_reduce returned TIMEOUT \(-7\) on rank 3"):
        ironlink.all_reduce(x, check=True)
    status_buffers._STATUS[0].values[1] = _abi.STATUS["HEAP_ASYMMETRIC"]
    with pytest.raises(IronlinkError, match=r"returned HEAP_ASYMMETRIC \(-12\) on rank 3\. The first heap call") as e:
        ironlink.all_reduce(x, check=True)
    assert e.value.status == -12 and e.value.function == "symm_all_reduce"
    ironlink.all_reduce(x)  # not checked: no error
    fake_torch.capturing = True
    with pytest.raises(ValueError, match="capture forbids; call heap.check"):
        ironlink.all_reduce(x, check=True)
    ironlink.all_reduce(x)
    assert len(fake_torch.launches) == 5
    with pytest.raises(TypeError, match="t must be a torch.Tensor, got str"):
        ironlink.all_reduce("x")
    out, elsewhere = FakeTensor(8, ptr=0x20000), FakeTensor(1, ptr=0x90000)
    elsewhere.device = "cuda:1"  # on another GPU than the heap: not staged, refused
    with pytest.raises((IronlinkError, ValueError), match=r"inp"):
        ironlink.all_gather(out, elsewhere, heap=FakeHeap(out))


# --- stream order and unusable heaps (runtime.launch.launch_with_status) --------------------------------------


def test_stream_order_waits_only_when_the_stream_changes() -> None:
    from ironlink.runtime.streams import StreamOrder

    order, a, b, c = StreamOrder(), FakeStream("a"), FakeStream("b"), FakeStream("c")
    order.before_call(a, capturing=False)
    order.before_call(a, capturing=False)
    assert a.waited == [] and order.last is a
    order.before_call(b, capturing=False)  # another stream: waits for a's calls first
    assert b.waited == ["a"] and order.last is b
    order.before_call(c, capturing=True)  # capture: no wait recorded, c does not become the last
    assert c.waited == [] and order.last is b
    order.before_call(a, capturing=False)
    assert a.waited == ["b"] and order.last is a


def test_host_calls_order_a_heaps_calls_across_streams(fake_torch: Any) -> None:
    x = FakeTensor(4096)
    heap, a, b = FakeHeap(x), fake_torch.stream, FakeStream("b")
    ironlink.all_reduce(x, heap=heap)
    fake_torch.stream = b
    ironlink.all_reduce(x)  # on another stream: b waits for a before the launch
    ironlink.all_reduce(x)
    assert len(fake_torch.launches) == 3 and b.waited == ["default"] and a.waited == []
    fake_torch.stream, fake_torch.capturing = a, True
    ironlink.all_reduce(x)  # captured: no wait, and the capture stream is not the last one
    assert a.waited == [] and heap.stream_order.last is b


def test_host_calls_refuse_a_closed_heap_before_launching(fake_torch: Any) -> None:
    x = FakeTensor(4096)
    heap = FakeHeap(x)
    heap.unusable = "the symmetric heap's process group was destroyed"
    with pytest.raises(IronlinkError, match=r"ironlink.all_reduce: the symmetric heap's process group was destroyed"):
        ironlink.all_reduce(x, heap=heap)
    assert fake_torch.launches == [] and heap.stream_order.last is None


@pytest.mark.parametrize("major", [8, 9])
def test_decode_ops_launch_with_pdl_where_the_gpu_has_it(fake_torch: Any, major: int) -> None:
    fake_torch.cuda.get_device_capability = lambda d: (major, 0)
    t, h = 4, 4096
    x, res, out = (FakeTensor(t * h, ptr=p, shape=(t, h)) for p in (0x100000, 0x200000, 0x300000))
    w = FakeTensor(h, ptr=0x400000)
    heap = FakeHeap(x)
    ironlink.all_reduce(x, heap=heap)
    ironlink.all_reduce_rmsnorm(x, res, w, out=out, heap=heap)
    ironlink.all_reduce(x, heap=heap, pdl=False)
    ironlink.all_reduce_rmsnorm(x, res, w, out=out, heap=heap, pdl=False)
    with_pdl = {"PDL": True, "launch_pdl": True}  # the griddepcontrol code and Triton's launch attribute
    got = [{k: kw[k] for k in with_pdl if k in kw} for *_, kw in fake_torch.launches]
    assert got == [with_pdl if major >= 9 else {}] * 2 + [{}] * 2  # default on from sm_90; pdl=False: off
    gathered, mine = FakeTensor(8 * 1024, ptr=0x500000), FakeTensor(1024, ptr=0x500000 + 3 * 2048)
    heap.mine |= {id(gathered), id(mine)}
    ironlink.all_gather(gathered, mine)  # not a decode op: never with PDL
    assert "launch_pdl" not in fake_torch.launches[-1][3]
    if major < 9:
        with pytest.raises(ValueError, match=r"ironlink.all_reduce\(pdl=True\): it needs compute capability 9.0"):
            ironlink.all_reduce(x, heap=heap, pdl=True)


def test_ranks_sharing_a_gpu_launch_without_pdl_unless_asked(fake_torch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks sharing a GPU: with PDL a rank's next kernel could hold the SMs a peer's kernel needs
    (matmul_all_reduce "lamport", 8 launches, 4 ranks on one H200 stalled), so PDL is off by
    default there; asked for, it is on."""
    fake_torch.cuda.get_device_capability = lambda d: (9, 0)
    fake_torch.cuda.device_count = lambda: 1
    monkeypatch.setenv("IRONLINK_SHARED_GPU", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    x = FakeTensor(4096, ptr=0x100000)
    heap = FakeHeap(x)
    ironlink.all_reduce(x, heap=heap)
    ironlink.all_reduce(x, heap=heap, pdl=True)
    assert ["launch_pdl" in kw for *_, kw in fake_torch.launches] == [False, True]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # one rank a GPU: the default is on again
    ironlink.all_reduce(x, heap=heap)
    assert fake_torch.launches[-1][3].get("launch_pdl") is True


def test_all_reduce_stages_a_tensor_outside_the_heap(fake_torch: Any) -> None:
    # Any tensor in (issue 63): the device library's all-reduce reads the peers' copies at the
    # buffer's offset, so a tensor outside the heap goes through the heap workspace
    # (runtime.staging, at the same offset on every rank): copied in, reduced there, copied back.
    x, heap = FakeTensor(4096, ptr=0x777000), FakeHeap()
    COPIES.clear()
    ironlink.all_reduce(x, heap=heap)
    (name, _, args, _), = fake_torch.launches
    assert name == "all_reduce" and args[1].ptr == STAGED and args[2] == 4096
    assert COPIES == [(STAGED, 0x777000), (0x777000, STAGED)]
    # A heap tensor is reduced where it is, and without heap= a foreign tensor is still refused.
    heap.mine.add(id(x))
    ironlink.all_reduce(x, heap=heap)
    assert fake_torch.launches[-1][2][1] is x and len(COPIES) == 2
    with pytest.raises(IronlinkError, match=r"t is not in a symmetric heap ironlink knows of"):
        ironlink.all_reduce(FakeTensor(8, ptr=0x999000))
