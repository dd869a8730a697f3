"""Bytes each collective call sends, per destination rank: the counter's arithmetic.

The accounting layer counts what a rank *sends* on each call. Point-to-point
style collectives (all-to-all, broadcast) send known bytes to known peers. Ring
collectives (all-reduce, all-gather, reduce-scatter) are counted with the ring
algorithm's volume, sent to the next rank of the group's ring, which is what gloo
and NCCL do for large messages. Traffic a rank sends to itself crosses no link
and is left out.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Payload bytes of a dense tensor."""
    return tensor.numel() * tensor.element_size()


def all_to_all_single_sends(
    input: torch.Tensor, input_split_sizes: Sequence[int] | None, group_size: int
) -> list[int]:
    """Bytes sent to each group rank by ``all_to_all_single``.

    Args:
        input: The send tensor, split along dim 0.
        input_split_sizes: Rows per destination, or None for equal splits.
        group_size: Ranks in the group.
    """
    if input.dim() == 0 or input.shape[0] == 0:
        return [0] * group_size
    row_bytes = tensor_bytes(input) // input.shape[0]
    if input_split_sizes is None or len(input_split_sizes) == 0:
        assert input.shape[0] % group_size == 0, "equal splits need rows divisible by group size"
        rows = [input.shape[0] // group_size] * group_size
    else:
        rows = [int(r) for r in input_split_sizes]
    return [r * row_bytes for r in rows]


def all_to_all_list_sends(input_tensor_list: Sequence[torch.Tensor]) -> list[int]:
    """Bytes sent to each group rank by ``all_to_all`` with a list of tensors."""
    return [tensor_bytes(t) for t in input_tensor_list]


def ring_sends(payload_bytes: int, group_size: int, group_rank: int, factor: float) -> list[int]:
    """Bytes a ring collective sends, all to the next rank of the ring.

    Args:
        payload_bytes: Size of the full (reduced or gathered) buffer.
        group_size: Ranks in the ring.
        group_rank: This rank's position in the ring.
        factor: 2 for all-reduce (reduce-scatter then all-gather), 1 for all-gather
            and reduce-scatter; each phase sends (n-1)/n of the buffer.
    """
    sends = [0] * group_size
    if group_size > 1:
        sends[(group_rank + 1) % group_size] = round(
            factor * (group_size - 1) * payload_bytes / group_size
        )
    return sends


def broadcast_sends(
    payload_bytes: int, group_size: int, group_rank: int, group_src: int
) -> list[int]:
    """Bytes ``broadcast`` sends: the source sends the payload to every other rank."""
    if group_rank != group_src:
        return [0] * group_size
    return [0 if peer == group_src else payload_bytes for peer in range(group_size)]
