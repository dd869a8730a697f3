"""Where the engine runs on a rank, and how its ranks talk: device, backend, store.

The Lightning strategy knows its rank's device (``root_device``: ``cpu``, or
``cuda:<local rank>`` with one rank per GPU); this module turns it into the engine's
placement, apart from the launch so that CPU tests can check the choices for CUDA:

=========  ==========================  ==============================================
device     process groups              embedding store (``store="auto"``)
=========  ==========================  ==============================================
``cpu``    gloo                        fbgemm's CPU table-batched kernels where they
                                       load, else the pure-torch store
``cuda``   NCCL                        fbgemm's CUDA table-batched kernels where a CUDA
                                       build of fbgemm loads (UVM caches for the blocks
                                       the plan caches), else the pure-torch store
=========  ==========================  ==============================================

The store choice is :func:`placement_store`, a pure function of the device type and
whether fbgemm's CUDA kernels run, so CPU tests cover the CUDA rows; the fbgemm CUDA
store itself has not run on a GPU yet.

Why a backend per device: the engine's exchanges are variable-size ``all_to_all``s,
which gloo implements for CPU tensors only and NCCL for CUDA tensors only, so a
mismatch cannot run and is refused before any group is built.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lightning_embark.errors import ConfigError

#: The engine's store options: fbgemm where it runs (``auto``), fbgemm, or plain torch.
STORES = ("auto", "fbgemm", "torch")

#: The engine's process-group backend for each device type it runs on.
BACKENDS = {"cpu": "gloo", "cuda": "nccl"}


@dataclass(frozen=True, kw_only=True)
class EnginePlacement:
    """The engine's device, process-group backend and embedding store on one rank.

    Attributes:
        device: Where the engine's tables, buffers and exchanges live.
        backend: The backend of the engine's process groups (``gloo`` or ``nccl``).
        store: The store option the engine uses: on the CPU the option as given
            (``auto`` picking fbgemm's CPU kernels when they load); on GPUs ``torch``
            unless fbgemm's CUDA kernels run (:func:`placement_store`).
    """

    device: torch.device
    backend: str
    store: str

    def __post_init__(self) -> None:
        if self.backend != BACKENDS.get(self.device.type):
            raise ConfigError(
                f"the engine on {self.device} needs the {BACKENDS.get(self.device.type)} "
                f"backend, got {self.backend!r}"
            )
        if self.store not in STORES:
            raise ConfigError(f"store must be one of {list(STORES)}, got {self.store!r}")


def placement_store(device_type: str, store: str, *, fbgemm_cuda: bool) -> str:
    """The engine's store option on a device of ``device_type``.

    On the CPU the option as given. On CUDA: ``torch`` stays; ``auto`` stays ``auto``
    (fbgemm's CUDA store where blocks allow, :func:`~lightning_embark.engine.stores.make_store`)
    when fbgemm's CUDA kernels run, else becomes ``torch``; ``fbgemm`` needs them.

    Args:
        device_type: ``cpu`` or ``cuda``.
        store: The strategy's ``store`` option.
        fbgemm_cuda: Whether fbgemm's CUDA kernels run on the device
            (:func:`~lightning_embark.engine.stores.fbgemm_cuda_available`).

    Raises:
        ConfigError: ``store="fbgemm"`` on CUDA without fbgemm's CUDA kernels.
    """
    if device_type != "cuda" or store == "torch":
        return store
    if fbgemm_cuda:
        return store
    if store == "fbgemm":
        raise ConfigError(
            "store='fbgemm' on a GPU needs fbgemm's CUDA kernels, but only fbgemm's CPU "
            "kernels (or no fbgemm) load here: install a CUDA build of fbgemm-gpu, or use "
            "store='auto' or 'torch' (the engine's torch store)"
        )
    return "torch"


def engine_placement(
    root_device: torch.device,
    *,
    store: str = "auto",
    process_group_backend: str | None = None,
    fbgemm_cuda: bool | None = None,
) -> EnginePlacement:
    """The engine's placement for a rank whose Lightning device is ``root_device``.

    Args:
        root_device: The strategy's ``root_device`` (``cpu`` or ``cuda:<i>``).
        store: The strategy's ``store`` option.
        process_group_backend: The backend the user asked Lightning for, if any.
        fbgemm_cuda: Whether fbgemm's CUDA kernels run on the device; None detects it
            (:func:`~lightning_embark.engine.stores.fbgemm_cuda_available`, only on CUDA).

    Raises:
        ConfigError: a device the engine does not run on (MPS, XLA, ...), a backend that
            cannot run its all-to-alls there, or ``store="fbgemm"`` on a GPU without
            fbgemm's CUDA kernels; each names the value and the fix.
    """
    device = torch.device(root_device)
    if device.type not in BACKENDS:
        raise ConfigError(
            f"strategy='embark' runs its engine on CPU (gloo) or CUDA (NCCL) ranks, not on "
            f"{device}; use Trainer(accelerator='cpu') or accelerator='gpu'"
        )
    backend = BACKENDS[device.type]
    if process_group_backend is not None and process_group_backend != backend:
        raise ConfigError(
            f"process_group_backend={process_group_backend!r} cannot run the engine's "
            f"all-to-alls on {device.type} tensors ({backend} can); drop the option or set "
            f"it to {backend!r}"
        )
    if device.type == "cuda" and store != "torch" and fbgemm_cuda is None:
        from lightning_embark.engine.stores import fbgemm_cuda_available

        fbgemm_cuda = fbgemm_cuda_available(device)
    store = placement_store(device.type, store, fbgemm_cuda=bool(fbgemm_cuda))
    return EnginePlacement(device=device, backend=backend, store=store)
