"""The ranks' fault records: what each rank writes and what the launcher makes of them."""

from __future__ import annotations

from pathlib import Path

from lightning_embark.search._ranks import fault_reasons, write_fault


def _raise(error: Exception) -> Exception:
    try:
        raise error
    except Exception as caught:
        return caught


def test_a_rank_reason_names_rank_run_type_and_place(tmp_path: Path) -> None:
    write_fault(tmp_path, 2, "trial 5", _raise(ValueError("bad plan")))
    (reason,) = fault_reasons(tmp_path, 4)
    assert reason.startswith("rank 2, trial 5: ValueError: bad plan at test_ranks.py:")


def test_only_lost_peers_name_the_silent_ranks(tmp_path: Path) -> None:
    """A rank killed by SIGKILL writes nothing; its peers only see the connection go."""
    for rank in (1, 3):
        lost = RuntimeError("[pair.cc:553] Connection closed by peer [10.77.0.2]:11947")
        write_fault(tmp_path, rank, "trial 19", _raise(lost))
    reasons = fault_reasons(tmp_path, 4)
    assert len(reasons) == 3
    assert reasons[-1].startswith("ranks [0, 2] wrote no reason: killed by a signal")
    assert "out-of-memory" in reasons[-1]
    assert fault_reasons(tmp_path) == reasons[:2]


def test_a_real_reason_gets_no_hint(tmp_path: Path) -> None:
    write_fault(tmp_path, 0, "trial 1", _raise(MemoryError("out of memory")))
    write_fault(tmp_path, 1, "trial 1", _raise(RuntimeError("Connection reset by peer")))
    assert len(fault_reasons(tmp_path, 4)) == 2
    assert fault_reasons(tmp_path / "empty", 4) == []
