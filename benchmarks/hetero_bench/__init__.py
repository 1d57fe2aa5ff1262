"""The benchmarks behind ``hetero-strategy bench <mode>``: one module per mode, its workers beside it.

They live in the checkout, not in the installed package (PyTorch and torchtitan keep theirs so
too): they need the ``recipes`` extra (torchvision, scikit-learn) and a GradBucket stand-in
(:mod:`.flat_bucket`), and the library never imports them. ``hetero-strategy bench`` finds this
folder from an editable install (``make install``) and puts it on ``sys.path``; a worker is
started with :func:`hetero_bench._ranks.worker`, which puts it on ``PYTHONPATH`` for the ranks.

Example::

    flock /tmp/hetero_cpu.lock hetero-strategy bench compression --json benchmarks/results/compression.json
"""

from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results"
"""benchmarks/results/ of this checkout: the default place of every mode's --json, wherever it runs from."""
