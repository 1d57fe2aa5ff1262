"""Triton compression kernels, installed as ``hetero_strategy.triton_kernels``.

Each op has a private ``@triton.jit`` kernel, a launcher and one ``<op>_torch`` reference in one
file (``ef_accumulate``, ``threshold``, ``compact``, ``topk_select``, ``segments``,
``threshold_select``, ``scatter_add``);
the hooks call :mod:`.dispatch`, which picks Triton for CUDA tensors and the torch path elsewhere:
the reference, except where a faster torch form is checked against it (``segments``' one-pass
sampled selection, ``ef_accumulate``'s in-place form). Importing this package imports neither
Triton nor the op modules. See docs/kernels.md.

Example::

    >>> import torch
    >>> from hetero_strategy.triton_kernels import dispatch
    >>> dispatch.topk_select(torch.tensor([1.0, -2.0]), k=1, capacity=1)[1].tolist()
    [1]
"""

__all__: list[str] = []
