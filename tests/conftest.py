"""Suite-wide guards."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _restore_environment():
    """Undo what a test leaves in os.environ: Lightning's launcher sets LOCAL_RANK, NODE_RANK and
    MASTER_* in the process that calls fit(), and a later launch would inherit them and wait for
    ranks that never come."""
    before = dict(os.environ)
    yield
    if os.environ != before:
        os.environ.clear()
        os.environ.update(before)
