"""What a collective's failure says about the peers.

gloo, NCCL and the TCP store word a silent or vanished peer in a few ways; these functions read
those words, so the stall watch and the hybrid period store classify a failure alike.
"""

from __future__ import annotations

__all__ = ["StallError", "is_peer_failure", "is_peer_gone"]

_PEER_GONE = ("connection closed", "connection reset", "broken pipe", "connection refused", "socket closed")
_PEER_FAILURE = ("timed out", "timing out", "watchdog", *_PEER_GONE)


class StallError(RuntimeError):
    """A peer stayed silent beyond ``stall_timeout_s`` (or vanished); raised on every surviving rank."""


def is_peer_failure(error: BaseException) -> bool:
    """Whether ``error`` is a collective failing because of a peer (not a bug in this rank's code).

    Example::

        except RuntimeError as e:
            if is_peer_failure(e): raise StallError(...) from e
    """
    if isinstance(error, StallError) or not isinstance(error, RuntimeError):  # DistError is a RuntimeError
        return False
    # NOTE: by its words only: other DistErrors (a CUDA fault, mismatched collectives) are not stalls
    return any(s in str(error).lower() for s in _PEER_FAILURE)


def is_peer_gone(text: str) -> bool:
    """Whether an error's text says the peer's connection ended (rather than that it timed out)."""
    return any(s in text.lower() for s in _PEER_GONE)
