"""Package discovery that pyproject.toml alone cannot express.

NOTE: the kernels live in the top-level triton_kernels/ folder but install as
hetero_strategy.triton_kernels: a top-level `triton_kernels` collides with a PyPI package.
"""

from setuptools import find_packages, setup

setup(
    packages=find_packages("src") + ["hetero_strategy.triton_kernels"],
    package_dir={"": "src", "hetero_strategy.triton_kernels": "triton_kernels"},
    # PEP 561 marker: the annotations are for type checkers; the known-card table (cluster/cards.py)
    package_data={"hetero_strategy": ["py.typed"], "hetero_strategy.cluster": ["cards.yaml"]},
)
