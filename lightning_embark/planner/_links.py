"""Pricing the links: a term array's bytes as seconds on each link class.

:class:`~lightning_embark.planner._terms.TermModel` counts the bytes each rank sends and
receives per link class, apart for flat and hierarchical exchanges; this turns them into
time. A flat exchange drives both link classes at once, so it takes as long as the slower
one; a hierarchical exchange runs its stages one after the other, so they add, its
cross-host stage at the calibrated ``hierarchical_inter_efficiency``.
"""

from __future__ import annotations

import numpy as np

from lightning_embark.planner._hardware import Calibration
from lightning_embark.planner._terms import (
    FLAT_INTER_RECEIVED,
    FLAT_INTER_SENT,
    FLAT_INTRA_RECEIVED,
    FLAT_INTRA_SENT,
    HIER_INTER_RECEIVED,
    HIER_INTER_SENT,
    HIER_INTRA_RECEIVED,
    HIER_INTRA_SENT,
)


def link_seconds(terms: np.ndarray, calib: Calibration) -> tuple[np.ndarray, np.ndarray]:
    """Per-rank seconds on intra- and inter-host links: flat exchanges run both link
    classes at once, hierarchical stages run one after the other (the inter-host one at
    the calibrated efficiency of that stage)."""
    flat_intra = (
        np.maximum(terms[FLAT_INTRA_SENT], terms[FLAT_INTRA_RECEIVED]) / calib.intra_bandwidth
    )
    flat_inter = (
        np.maximum(terms[FLAT_INTER_SENT], terms[FLAT_INTER_RECEIVED]) / calib.inter_bandwidth
    )
    hier_intra = (
        np.maximum(terms[HIER_INTRA_SENT], terms[HIER_INTRA_RECEIVED]) / calib.intra_bandwidth
    )
    hier_inter = np.maximum(terms[HIER_INTER_SENT], terms[HIER_INTER_RECEIVED]) / (
        calib.inter_bandwidth * calib.hierarchical_inter_efficiency
    )
    # A flat exchange runs both link classes at once: its time is the slower one's.
    intra = np.where(flat_intra >= flat_inter, flat_intra, 0.0) + hier_intra
    inter = np.where(flat_intra >= flat_inter, 0.0, flat_inter) + hier_inter
    return intra, inter
