"""Triton compression kernels, installed as ``hetero_strategy.triton_kernels``.

Each op has a ``@triton.jit`` kernel, a launcher and a ``<op>_torch`` reference in one file.
Importing needs neither Triton nor a GPU.
"""
