"""Moving rows between ranks: the collectives every embedding cluster rides.

* :class:`AllToAll` (:class:`FlatAllToAll`, :class:`HierarchicalAllToAll`): a
  variable-size all-to-all of rows over one process group, flat or inside the host
  first and then among same-local-rank peers across hosts.
* :func:`peer_failures`: a collective that failed because another rank died or
  stalled, re-raised as a :class:`~lightning_embark.errors.PeerError` saying so;
  :func:`dense_peer_failures` does the same for a step's other collectives (DDP's, Lightning's);
  :func:`start_liveness`, :func:`census` and :func:`farewell` name the rank that is gone.
* :func:`exchange`: a differentiable compressed exchange of dense rows over any
  transport (the kernels' pack and unpack, with their adjoint backward).
"""

from lightning_embark.exchange._alltoall import (
    AllToAll,
    FlatAllToAll,
    HierarchicalAllToAll,
    all_to_all_rows,
    make_exchange,
)
from lightning_embark.exchange._compressed import Transport, exchange, loopback, over
from lightning_embark.exchange._hierarchy import (
    cross_host_rows,
    hierarchy_groups,
    release_hierarchy_groups,
)
from lightning_embark.exchange._liveness import Census, Peer, census, farewell, start_liveness
from lightning_embark.exchange._peers import (
    dense_peer_failures,
    is_peer_failure,
    named_peer_failures,
    peer_failures,
    stopped_by,
)

__all__ = [
    "AllToAll",
    "Census",
    "FlatAllToAll",
    "HierarchicalAllToAll",
    "Peer",
    "Transport",
    "all_to_all_rows",
    "census",
    "cross_host_rows",
    "dense_peer_failures",
    "exchange",
    "farewell",
    "hierarchy_groups",
    "is_peer_failure",
    "loopback",
    "make_exchange",
    "named_peer_failures",
    "over",
    "peer_failures",
    "release_hierarchy_groups",
    "start_liveness",
    "stopped_by",
]
