"""The dispatch counter: every op of the counting thread, of autograd's backward and of the
work that thread queues to the engine's worker threads (the lane, the input pipeline, the
dense all-reduce's worker), whenever it runs; not a thread it did not hand work to. Syncs
are named by call site, scope and thread; host reads no ATen op shows are counted at the
Python call; host work is reported apart; ops inside Triton's interpreter apart too."""

from __future__ import annotations

import inspect
import threading

import torch

from lightning_embark._host_work import host_work
from lightning_embark.accounting import (
    OUTSIDE,
    DispatchCounter,
    DispatchSnapshot,
    format_dispatch,
    scope,
)
from lightning_embark.engine._lane import Lane
from lightning_embark.engine._pipeline import InputPipeline
from lightning_embark.engine.stores import Bags, row_grads
from lightning_embark.sharding._dense_allreduce import SerialWorker

UNIQUE_LINE = (
    next(
        i
        for i, line in enumerate(inspect.getsource(row_grads).splitlines())
        if "torch.unique" in line
    )
    + inspect.getsourcelines(row_grads)[1]
)


def _one_sync() -> None:
    """A sync made from the engine's code: the explicit update path's ``torch.unique``,
    whose output size is read on the host."""
    bags = Bags(indices=torch.tensor([2, 0, 2]), offsets=torch.tensor([0, 1, 3]), weights=None)
    row_grads(bags, torch.ones(2, 4))


def _sites(snapshot: DispatchSnapshot) -> dict[tuple[str, str, str], int]:
    return {(s.site, s.scope, s.thread): n for s, n in snapshot.syncs.items()}


def test_a_sync_is_named_by_its_call_site_scope_and_thread() -> None:
    counter = DispatchCounter()
    with counter.counting(), scope("rb:forward"):
        _one_sync()
    site = f"lightning_embark/engine/stores/_base.py:{UNIQUE_LINE}"
    assert _sites(counter.snapshot()) == {(site, "rb:forward", "MainThread"): 1}


def test_the_engine_threads_count_what_the_counting_thread_queued() -> None:
    lane = Lane(torch.device("cpu"), overlap=True, name="embark-lane")
    pipeline: InputPipeline[None] = InputPipeline(torch.device("cpu"))
    worker = SerialWorker()
    counter = DispatchCounter()
    key = torch.zeros(1)
    try:
        with counter.counting():
            with scope("rb:backward"):
                done = lane.start(_one_sync)
            pipeline.submit(key, _one_sync)
            future = worker.submit(lambda: (_one_sync(), torch.zeros(1))[1])
        # Waited for after the count ended: work counts with the step that queued it.
        done.wait()
        pipeline.take(key)
        future.wait()
        uncounted = lane.start(_one_sync)  # queued outside the count: not counted
        uncounted.wait()
    finally:
        lane.close()
        pipeline.close()
        worker.close()
    by_thread = {
        (scope_, thread): n for (_, scope_, thread), n in _sites(counter.snapshot()).items()
    }
    assert by_thread == {
        ("rb:backward", "embark-lane"): 1,
        (OUTSIDE, "embark-input"): 1,
        (OUTSIDE, "embark-dense-allreduce"): 1,
    }


def test_a_thread_given_no_work_is_not_seen() -> None:
    """Dispatch modes are per thread: what makes the engine's threads count is the hand-over
    of queued work, which a plain thread does not get."""
    counter = DispatchCounter()
    with counter.counting():
        thread = threading.Thread(target=_one_sync)
        thread.start()
        thread.join()
    assert counter.snapshot().total_ops == 0


def test_backward_ops_count_and_host_calls_are_seen() -> None:
    weight = torch.ones(3, requires_grad=True)
    counter = DispatchCounter()
    with counter.counting():
        (weight * 2).sum().backward()
        torch.ones(2).tolist()
        torch.ones(2).cpu()
        torch.tensor([1, 2], device="cpu")
        torch.tensor([1, 2])  # stays on the host: nothing to copy
        with host_work():
            torch.ones(1).tolist()
    snapshot = counter.snapshot()
    assert snapshot.ops_by("thread")["MainThread"] >= 5  # mul, sum, and backward's ops
    ops = {(s.op, s.host_work): n for s, n in snapshot.syncs.items()}
    assert ops == {
        ("Tensor.tolist", False): 1,
        ("Tensor.cpu", False): 1,
        ("torch.tensor", False): 1,
        ("Tensor.tolist", True): 1,
    }
    assert snapshot.device_syncs == 3
    # The wrappers are gone once nothing counts.
    assert "tolist" not in vars(torch.Tensor)


def test_the_snapshot_round_trips_and_prints() -> None:
    counter = DispatchCounter()
    with counter.counting(), scope("ub:ahead"):
        _one_sync()
        torch.ones(2).sum()
    snapshot = counter.snapshot()
    again = DispatchSnapshot.from_dict(snapshot.to_dict())
    assert again == snapshot
    text = format_dispatch("embark", snapshot, collectives={"all_to_all_single": 4})
    assert "embark: " in text and "1 would sync the host on CUDA" in text
    assert "| ub:ahead |" in text and "aten._unique2.default" in text
    assert "all_to_all_single 4" in text


def test_ops_inside_the_triton_interpreter_count_apart(triton_cpu: str) -> None:
    from lightning_embark.kernels import ColumnBlock, ExchangeLayout, RankSlice, pack

    layout = ExchangeLayout(
        ranks=(RankSlice(row_start=0, row_stop=4, blocks=(ColumnBlock(start=0, width=8),)),),
        num_rows=4,
        num_cols=8,
    )
    counter = DispatchCounter()
    x = torch.randn(4, 8)
    with counter.counting():
        pack(x, layout, "fp16", backend=triton_cpu)
    snapshot = counter.snapshot()
    assert snapshot.interpreted_kernel_ops > 0
    sites = snapshot.ops_by("site")
    assert "(Triton interpreter)" not in sites
    assert any(site.startswith("triton_kernels/_packing.py:") for site in sites)  # the launch


def test_a_thread_given_only_the_mode_counts_for_its_counter() -> None:
    """Autograd's CUDA device threads run backward with the caller's dispatch modes but none
    of its Python thread-locals: the mode alone makes such a thread count its host calls and
    hand the count on to the work it queues."""
    from lightning_embark.accounting._dispatch import _OpMode

    counter = DispatchCounter()
    lane = Lane(torch.device("cpu"), overlap=True, name="embark-lane")

    def autograd_like() -> None:
        with _OpMode(counter):
            torch.ones(2).tolist()
            lane.start(_one_sync).wait()

    with counter.counting():  # the thread that called backward
        thread = threading.Thread(target=autograd_like, name="autograd")
        thread.start()
        thread.join()
    lane.close()
    assert {(s.op, s.thread) for s in counter.snapshot().syncs} == {
        ("Tensor.tolist", "autograd"),
        ("aten._unique2.default", "embark-lane"),
    }


def test_a_site_is_the_first_frame_outside_torch_and_known_host_reads_are_host_work() -> None:
    """Outside our packages the call site is the caller's own file (here, this test); and a
    host tensor by design of code we do not own reads as host work: torch's optimizers'
    step count (Adagrad, not fused), fbgemm's iteration counter."""
    from pathlib import Path

    import fbgemm_gpu

    from lightning_embark.accounting._call_sites import known_host_read

    counter = DispatchCounter()
    weight = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.Adagrad([weight])
    weight.grad = torch.ones(2)
    with counter.counting():
        torch.ones(2).sum().item()
        optimizer.step()
    syncs = counter.snapshot().syncs
    assert {s.site.partition(":")[0] for s in syncs} == {"test_dispatch.py"}
    assert sorted(s.host_work for s in syncs) == [False, True]  # .item() here, the step's read
    name = "split_table_batched_embeddings_ops_training.py"
    path = str(Path(fbgemm_gpu.__file__).parent / name)
    lines = Path(path).read_text().splitlines()
    counter_line = next(i for i, t in enumerate(lines, 1) if "self.iter_cpu.add_(1).item()" in t)
    assert known_host_read((path, counter_line))
    assert not known_host_read((path, 1))
    assert not known_host_read((__file__, 1))
