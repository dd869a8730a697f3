"""Link seconds from a term array, by hand.

Round constants (1 GB/s inside a host, 100 MB/s across, the hierarchical cross-host stage
at half that): every byte count is a whole multiple of its bandwidth, so each seconds
figure is one exact quotient (or a sum of two small integers) in float64 and is compared
with ``==``; a wrong link, a missed stage or a wrong efficiency changes it by at least 1 s.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from lightning_embark.planner._hardware import Calibration
from lightning_embark.planner._links import link_seconds
from lightning_embark.planner._terms import (
    FLAT_INTER_SENT,
    FLAT_INTRA_RECEIVED,
    FLAT_INTRA_SENT,
    HIER_INTER_SENT,
    HIER_INTRA_RECEIVED,
    NUM_TERMS,
)

CALIB = Calibration(intra_bandwidth=1e9, inter_bandwidth=1e8, lookup_bandwidth=1e9)


def test_link_seconds_flat_takes_the_slower_link_hierarchical_adds_its_stages() -> None:
    calib = dataclasses.replace(CALIB, hierarchical_inter_efficiency=0.5)
    terms = np.zeros((NUM_TERMS, 3))
    terms[FLAT_INTRA_SENT] = [2e9, 0, 1e9]  # seconds: 2, 0, 1
    terms[FLAT_INTRA_RECEIVED] = [1e9, 0, 0]
    terms[FLAT_INTER_SENT] = [1e8, 5e8, 1e8]  # seconds: 1, 5, 1
    terms[HIER_INTRA_RECEIVED] = [1e9, 3e9, 0]  # seconds: 1, 3, 0
    terms[HIER_INTER_SENT] = [2e8, 0, 0]  # at half the inter bandwidth: 4, 0, 0
    intra, inter = link_seconds(terms, calib)
    # rank 0: flat intra 2 > flat inter 1; rank 1: flat inter 5 wins; rank 2: a tie goes
    # to the intra link
    assert intra.tolist() == [2 + 1, 0 + 3, 1 + 0]
    assert inter.tolist() == [0 + 4, 5 + 0, 0 + 0]
