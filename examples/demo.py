"""``make demo``: train a DLRM on synthetic data on an emulated 2-host x 2-rank cluster.

Runs torchrec's DistributedModelParallel baseline (``strategy="torchrec"``) and the
EMBark strategy (``strategy="embark"``, automatic plan, fp16 exchange allowed) side by
side inside network-namespace "hosts" joined by a shaped link (plain loopback,
labelled as such, when not root), then prints embark's plan, throughput, bytes per
step intra-/inter-host and the validation AUC of each.
"""

from __future__ import annotations

import sys
import time

from lightning_embark.harness import BenchConfig, format_table, run_benchmark


def main() -> int:
    config = BenchConfig(
        model="demo-small",
        num_hosts=2,
        ranks_per_host=2,
        batch_size=1024,
        steps=40,
        warmup=5,
        strategies=("torchrec", "embark"),
        allow=("fp16",),
        interaction="dot",
        dense_arch="64",
        over_arch="128,64,1",
        val_batches=8,
    )
    started = time.perf_counter()
    result = run_benchmark(config)
    print()
    print(f"== lightning-embark demo ({time.perf_counter() - started:.0f} s) ==")
    print(result["config"]["spec"])
    print(result["config"]["cluster"]["description"])
    embark = next(run for run in result["runs"] if run["strategy"] == "embark")
    print(embark.get("plan_summary", ""))
    print(format_table(result["runs"]))
    for run in result["runs"]:
        validation = run.get("validation", {})
        print(
            f"{run['strategy']:<10} throughput {run['samples_per_s']:.0f} samples/s | "
            f"bytes/step intra-host {run['bytes_per_step']['intra_host'] / 1e6:.2f} MB, "
            f"inter-host {run['bytes_per_step']['inter_host'] / 1e6:.2f} MB | "
            f"validation AUC {validation.get('val_auc', float('nan')):.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
