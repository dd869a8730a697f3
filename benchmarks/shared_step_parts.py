"""What every strategy's tiny-batch step runs alike, timed alone on one CPU thread.

Two parts of a DLRM step are the same code under ``strategy="embark"`` and under torchrec:

- ``dense``: torchrec's ``DenseArch``, dot ``InteractionArch`` and ``OverArch`` over
  ``F`` pooled features of width 128 at a batch of ``--batch`` samples, then the BCE
  loss's backward and a ``torch.optim.Adagrad`` step (the bench model's dense part:
  ``--dense-arch 16 --over-arch 16,1``);
- ``tbe``: fbgemm's CPU table-batched kernel (``SplitTableBatchedEmbeddingBagsCodegen``,
  exact row-wise Adagrad fused in backward) over ``T`` tables of 10,000 x 128 with ``B``
  bags of ``L`` IDs: forward, and backward with the update.

CPU time (``time.process_time``) per call, the median of ``--repeats`` calls after 3 warm-up
ones. No other rank shares the core, so these are lower bounds of what the parts cost a
rank of the 4-on-2-cores bench::

    python benchmarks/shared_step_parts.py [--features 510,26] [--tbe 128x32x5,510x16x5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch

from lightning_embark.lists import parse_list

WIDTH, ROWS, DENSE_IN = 128, 10_000, 13


def _median_cpu_ms(fn: Callable[[], object], repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return 1000 * statistics.median(times)


def dense_step(features: int, batch: int) -> Callable[[], None]:
    """One forward, backward and Adagrad step of the bench model's dense part."""
    from torchrec.models.dlrm import DenseArch, InteractionArch, OverArch

    dense = DenseArch(DENSE_IN, [16, WIDTH])
    interaction = InteractionArch(features)
    over = OverArch(WIDTH + (features + 1) * features // 2, [16, 1])
    optimizer = torch.optim.Adagrad([*dense.parameters(), *over.parameters()], lr=0.01)
    labels = torch.ones(batch)

    def step() -> None:
        pooled = torch.randn(batch, features, WIDTH, requires_grad=True)
        logits = over(interaction(dense(torch.randn(batch, DENSE_IN)), pooled)).squeeze(-1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return step


def tbe_calls(tables: int, bags: int, hotness: int) -> tuple[Callable[[], object], ...]:
    """fbgemm's CPU kernel over ``tables`` tables: (forward, forward + backward)."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        EmbeddingLocation,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(ROWS, WIDTH, EmbeddingLocation.HOST, ComputeDevice.CPU)] * tables,
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        learning_rate=0.01,
    )
    ids = torch.randint(0, ROWS, (tables * bags * hotness,))
    offsets = torch.arange(0, ids.numel() + 1, hotness)

    def both() -> None:
        out = tbe(ids, offsets)
        out.backward(torch.ones_like(out))

    return (lambda: tbe(ids, offsets)), both


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--features", default="510,26", help="comma list of F")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tbe", default="128x32x5,510x16x5", help="comma list of TxBxL")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"{'part':<24} {'CPU ms':>8}")
    for features in parse_list(args.features, int, what="--features"):
        ms = _median_cpu_ms(dense_step(features, args.batch), args.repeats)
        print(f"{f'dense F={features} B={args.batch}':<24} {ms:>8.2f}")
    shapes: tuple[str, ...] = parse_list(args.tbe, what="--tbe")
    for shape in shapes:
        tables, bags, hotness = (int(x) for x in shape.split("x"))
        forward, both = tbe_calls(tables, bags, hotness)
        fwd = _median_cpu_ms(forward, args.repeats)
        total = _median_cpu_ms(both, args.repeats)
        label = f"tbe {tables}x{bags}x{hotness}"
        print(f"{label + ' forward':<24} {fwd:>8.2f}")
        print(f"{label + ' backward':<24} {total - fwd:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
