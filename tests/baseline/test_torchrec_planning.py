"""Topology conversion and torchrec's planner on our topology (no processes needed)."""

from __future__ import annotations

import pytest
import torch
from torchrec.distributed.planner.constants import POOLING_FACTOR
from torchrec.distributed.planner.types import ParameterConstraints

from lightning_embark.baseline import (
    apply_sparse_optimizer,
    check_constraints_within,
    check_sharding_types,
    constraints_from_spec,
    embedding_table_names,
    force_sharding_types,
    make_sharders,
    plan_summary,
    plan_table_layout,
    plan_with_torchrec,
    to_torchrec_topology,
)
from lightning_embark.baseline._torchrec_planning import merge_constraints
from lightning_embark.errors import ConfigError
from lightning_embark.models import DLRMModule
from lightning_embark.topology import ranks_per_host_from_env, resolve_topology, topology_preset


@pytest.fixture(autouse=True)
def _no_launcher_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("EMBARK_RANKS_PER_HOST", raising=False)


def test_ranks_per_host_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ranks_per_host_from_env(4) == 4
    assert ranks_per_host_from_env(4, default=2) == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert ranks_per_host_from_env(8, default=2) == 4
    monkeypatch.setenv("EMBARK_RANKS_PER_HOST", "2")
    assert ranks_per_host_from_env(8) == 2
    monkeypatch.setenv("EMBARK_RANKS_PER_HOST", "3")
    with pytest.raises(ConfigError, match="EMBARK_RANKS_PER_HOST=3"):
        ranks_per_host_from_env(8)
    monkeypatch.setenv("EMBARK_RANKS_PER_HOST", "two")
    with pytest.raises(ConfigError, match="not an integer"):
        ranks_per_host_from_env(8)


def test_resolve_topology(monkeypatch: pytest.MonkeyPatch) -> None:
    derived = resolve_topology(None, world_size=4, default_ranks_per_host=2)
    assert (derived.name, derived.num_hosts, derived.ranks_per_host) == ("emulated", 2, 2)
    monkeypatch.setenv("EMBARK_RANKS_PER_HOST", "1")
    dgx = resolve_topology("dgx-h100", world_size=4)
    assert (dgx.name, dgx.num_hosts, dgx.ranks_per_host) == ("dgx-h100", 4, 1)
    given = topology_preset("emulated", num_hosts=2, ranks_per_host=2)
    assert resolve_topology(given, world_size=4) is given
    with pytest.raises(ConfigError, match="runs 2"):
        resolve_topology(given, world_size=2)


def test_torchrec_topology_carries_shape_bandwidth_and_memory() -> None:
    ours = topology_preset("emulated", num_hosts=2, ranks_per_host=2)
    cpu = to_torchrec_topology(ours, compute_device="cpu")
    assert (cpu.world_size, cpu.local_world_size, cpu.compute_device) == (4, 2, "cpu")
    assert cpu.intra_host_bw == pytest.approx(ours.intra_host_bandwidth / 1000)  # bytes/ms
    assert cpu.inter_host_bw == pytest.approx(ours.inter_host_bandwidth / 1000)
    assert all(d.storage.ddr == ours.memory_per_rank for d in cpu.devices)
    cuda = to_torchrec_topology(topology_preset("dgx-h100", num_hosts=1), compute_device="cuda")
    assert all(d.storage.hbm == 80 * 10**9 for d in cuda.devices)
    with pytest.raises(ConfigError, match="tpu"):
        to_torchrec_topology(ours, compute_device="tpu")


def test_constraints_from_spec_and_merge(synthetic) -> None:
    spec = synthetic.tiny_spec(num_tables=2)
    base = constraints_from_spec(spec)
    assert {name: c.pooling_factors for name, c in base.items()} == {"t_f0": [2.0], "t_f1": [2.0]}
    merged = merge_constraints(base, {"t_f0": ParameterConstraints(sharding_types=["table_wise"])})
    assert merged["t_f0"].sharding_types == ["table_wise"] and merged["t_f0"].pooling_factors == [
        2.0
    ]
    explicit = merge_constraints(base, {"t_f1": ParameterConstraints(pooling_factors=[7.0])})
    assert explicit["t_f1"].pooling_factors == [7.0]
    assert POOLING_FACTOR != 2.0


def test_constraints_within_sharding_types() -> None:
    """A table's own choice inside the forced types, or none, passes; one outside is
    refused, naming the table, its choice and where it came from."""
    inside = {
        "t_f0": ParameterConstraints(sharding_types=["table_row_wise"]),
        "t_f1": ParameterConstraints(pooling_factors=[3.0]),
    }
    check_constraints_within(inside, ["table_row_wise", "table_wise"], where="here")
    check_constraints_within(None, ["table_row_wise"], where="here")
    outside = inside | {"t_f2": ParameterConstraints(sharding_types=["table_wise", "row_wise"])}
    with pytest.raises(
        ConfigError, match=r"^here constraints .*\{'t_f2': \['table_wise', 'row_wise'\]\} outside"
    ):
        check_constraints_within(outside, ["table_row_wise", "table_wise"], where="here")


def _plan(synthetic, preset: str, hosts: int, per_host: int):
    module = DLRMModule(
        synthetic.tiny_spec(), dense_arch_layer_sizes=[16], over_arch_layer_sizes=[8, 1]
    )
    sparse = module.sparse_optimizer_spec()
    apply_sparse_optimizer(module.embedding_modules().values(), sparse)
    topology = topology_preset(preset, num_hosts=hosts, ranks_per_host=per_host)
    plan = plan_with_torchrec(
        module,
        make_sharders(device=torch.device("cpu"), fused_params=sparse.fused_params()),
        topology=to_torchrec_topology(topology, compute_device="cpu"),
        batch_size=64,
        constraints=constraints_from_spec(module.spec),
    )
    return plan, topology


def test_plan_reflects_topology(synthetic) -> None:
    """DGX links: one host of 2 ranks splits tables row-wise over both (NVLink is cheap);
    2 hosts x 2 ranks keep each table inside one host (table-row-wise), away from the
    18x slower cross-host links."""
    one_host, _ = _plan(synthetic, "dgx-h100", 1, 2)
    two_hosts, topology = _plan(synthetic, "dgx-h100", 2, 2)
    one_layout, two_layout = plan_table_layout(one_host), plan_table_layout(two_hosts)
    assert len(one_layout) == len(two_layout) == 4
    assert all(len(set(ranks)) == 2 for _, ranks in one_layout.values()), one_layout
    for table, (kind, ranks) in two_layout.items():
        assert len({topology.host_of(r) for r in ranks}) == 1, (table, kind, ranks)
    assert {kind for kind, _ in two_layout.values()} != {kind for kind, _ in one_layout.values()}
    summary = plan_summary(two_hosts, topology)
    assert "2 host(s) x 2 rank(s)" in summary and "t_f0" in summary and "(fused)" in summary


def test_plan_on_slow_emulated_links_avoids_splitting(synthetic) -> None:
    """On the emulated cluster's ~1 GB/s links the tiny tables are cheapest whole."""
    plan, _ = _plan(synthetic, "emulated", 2, 1)
    assert {kind for kind, _ in plan_table_layout(plan).values()} == {"table_wise"}


def test_forced_table_row_wise_plan_keeps_each_table_inside_one_host(synthetic) -> None:
    """``torchrec-twrw``'s constraints: every table (named from the module, pooling
    factors kept from the spec) limited to table-row-wise, so on 2 hosts x 2 ranks
    torchrec's planner splits each table's rows over both ranks of one host, whichever
    layout it would have chosen itself (it keeps these tiny tables whole on the emulated
    links, see above)."""
    module = DLRMModule(
        synthetic.tiny_spec(), dense_arch_layer_sizes=[16], over_arch_layer_sizes=[8, 1]
    )
    sparse = module.sparse_optimizer_spec()
    apply_sparse_optimizer(module.embedding_modules().values(), sparse)
    tables = embedding_table_names(module.embedding_modules().values())
    assert tables == ["t_f0", "t_f1", "t_f2", "t_f3"]
    forced = force_sharding_types(constraints_from_spec(module.spec), tables, ["table_row_wise"])
    assert {c.pooling_factors[0] for c in forced.values()} == {2.0}
    topology = topology_preset("emulated", num_hosts=2, ranks_per_host=2)
    plan = plan_with_torchrec(
        module,
        make_sharders(device=torch.device("cpu"), fused_params=sparse.fused_params()),
        topology=to_torchrec_topology(topology, compute_device="cpu"),
        batch_size=64,
        constraints=forced,
    )
    layout = plan_table_layout(plan)
    assert len(layout) == 4
    for table, (kind, ranks) in layout.items():
        assert kind == "table_row_wise", (table, kind)
        assert len(set(ranks)) == 2 and len({topology.host_of(r) for r in ranks}) == 1, ranks
    types = ["table_row_wise", "row_wise"]
    narrower = force_sharding_types(
        {"a": ParameterConstraints(sharding_types=["row_wise"])}, ["a", "b"], types
    )
    assert narrower["a"].sharding_types == ["row_wise"] and narrower["b"].sharding_types == types
    assert check_sharding_types("table_row_wise", where="x") == ("table_row_wise",)
    with pytest.raises(ConfigError, match=r"x sharding_types=\[\]"):
        check_sharding_types([], where="x")
