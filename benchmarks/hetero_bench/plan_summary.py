"""``bench plan``'s figures: predicted against measured, per configuration and method (pure functions).

* measured step time of a method: its median step over the round's measured window (the time
  from one step's start to the next on rank 0), then the median over rounds, with [min, max];
* measured bytes per rank: the bytes each rank's interface sent per measured step (its transmit
  counter, inside its namespace: headers and acknowledgements included), the mean over ranks;
* predicted figures: each round is predicted from the profile measured just before it (this
  host's speed moves by 2-15% within seconds, its noise level from minute to minute: a profile and
  a run far apart in time may see different machines); the prediction of a method is the median
  over rounds (:func:`combine_rounds`), and ``step_error_rounds`` pairs round with round;
* error: predicted / measured - 1 (0.10 = predicted 10% high);
* ``ranked_first``: the method the planner predicts fastest (``ranked_first_tied``: the methods
  it predicts as that same run, codec, split and time alike, e.g. ``hetero_auto`` where auto keeps
  dense, which is ``hetero``); ``measured_fastest``: the method with the least measured median
  step; the ordering goal holds when the first (the median of all the tied methods' rounds) is
  within ``ORDER_TOLERANCE`` of every other method's median.
"""

from __future__ import annotations

import itertools
import math
import statistics
from typing import Any

from hetero_strategy.runtime.metrics import median_step

__all__ = ["BYTES_GOAL", "ORDER_TOLERANCE", "STEP_GOAL", "balance_round", "codec_rounds", "combine_rounds", "compare",
           "summarise"]

STEP_GOAL = 0.15
BYTES_GOAL = 0.10
ORDER_TOLERANCE = 0.05


def _per_step(counter: list[int], last: int) -> float:
    """The median of a per-step counter's increments over the last ``last`` steps."""
    return statistics.median([b - a for a, b in itertools.pairwise(counter)][-last:])


def balance_round(raw: dict[str, list[dict]], measure: int) -> dict[str, dict[str, Any]]:
    """One round of ``balance_worker`` records (mode -> every rank's record) -> mode -> step_s,
    bytes_per_rank (None where the run did not count bytes), batch_sizes."""
    out = {}
    for mode, ranks in raw.items():
        sent = [_per_step(r["sent"], measure) for r in ranks if r.get("sent")]
        out[mode] = {"step_s": median_step(ranks[0]["starts"], measure),
                     "bytes_per_rank": statistics.fmean(sent) if len(sent) == len(ranks) else None,
                     "batch_sizes": [int(statistics.median(r["batches"][-measure:])) for r in ranks],
                     "codec": ranks[0].get("codec")}
    return out


def codec_rounds(steptime: dict[str, Any], methods: list[str]) -> dict[str, dict[str, list[float]]]:
    """``compression_worker steptime``'s output (rank 0; methods alternate step by step, one step
    per round) -> method -> per-round step_s and bytes_per_rank (its interface's count; on two
    ranks of equal links a ring sends as much from each rank)."""
    return {m: {"step_s": list(steptime[m]["step_s"]), "bytes_per_rank": [float(b) for b in steptime[m]["wire_bytes"]]}
            for m in methods}


def combine_rounds(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per-round predictions (method -> step_s, bytes_per_rank, ...) -> one per method: the median
    step_s and bytes over rounds; the other fields (codec, batch_sizes) those of the round whose
    step is the median's (the lower one of an even count); ``step_rounds_s`` keeps every round's."""
    out = {}
    for m in rounds[0]:
        per = sorted((r[m] for r in rounds if m in r), key=lambda p: p["step_s"])
        middle = per[(len(per) - 1) // 2]
        out[m] = {**middle, "step_s": statistics.median(p["step_s"] for p in per),
                  "step_rounds_s": [r[m]["step_s"] for r in rounds if m in r],
                  **{k: statistics.median(p[k] for p in per) for k in ("bytes_per_rank", "wire_bytes_per_rank")
                     if all(p.get(k) is not None for p in per)}}
    return out


def _median(values: list[float | None]) -> tuple[float | None, list[float] | None]:
    got = [v for v in values if v is not None]
    if not got:
        return None, None
    return statistics.median(got), [min(got), max(got)]


def _paired(predicted: list[float], measured: list[float]) -> list[float | None] | None:
    """Round against round: each round's prediction over the median of that round's measurements
    (a round measured k values in turn, as the codec configuration's 4 blocks), minus 1; None
    where the counts do not divide."""
    k, rest = divmod(len(measured), len(predicted)) if predicted else (0, 1)
    if k == 0 or rest:
        return None
    return [_error(p, statistics.median(measured[i * k:(i + 1) * k])) for i, p in enumerate(predicted)]


def _error(predicted: float | None, measured: float | None) -> float | None:
    return None if predicted is None or not measured else predicted / measured - 1.0


def compare(predicted: dict[str, dict[str, Any]], measured: dict[str, dict[str, list]]) -> dict[str, Any]:
    """One configuration: ``predicted[method]`` has step_s and bytes_per_rank (and anything else to
    keep, e.g. codec, batch_sizes); ``measured[method]`` per-round lists of step_s and bytes_per_rank.
    Methods measured but not predicted (or the reverse) are left out."""
    methods: dict[str, dict[str, Any]] = {}
    for m in [m for m in predicted if m in measured]:
        step, step_spread = _median(measured[m]["step_s"])
        sent, sent_spread = _median(measured[m].get("bytes_per_rank", []))
        p = predicted[m]
        wire = p.get("wire_bytes_per_rank", p["bytes_per_rank"])  # headers in: the interface counts them
        methods[m] = {"predicted_step_s": p["step_s"], "measured_step_s": step, "measured_step_spread_s": step_spread,
                      "step_error": _error(p["step_s"], step),
                      "predicted_bytes_per_rank": wire, "measured_bytes_per_rank": sent,
                      "measured_bytes_spread": sent_spread, "bytes_error": _error(wire, sent),
                      **{k: v for k, v in p.items() if k not in ("step_s", "bytes_per_rank", "step_rounds_s")},
                      **({"predicted_step_rounds_s": p["step_rounds_s"],
                          "step_error_rounds": _paired(p["step_rounds_s"], measured[m]["step_s"])}
                         if "step_rounds_s" in p else {})}
    first = min(methods, key=lambda m: methods[m]["predicted_step_s"])
    tied = [m for m in methods if _same_run(methods[m], methods[first])]
    fastest = min(methods, key=lambda m: methods[m]["measured_step_s"])
    # NOTE: methods the planner predicts as one run (hetero_auto keeping dense is hetero: codec,
    # split and time alike) are one first: measured as the median of all their rounds, not the
    # best of them, against every other method
    joint, _ = _median([x for m in tied for x in measured[m]["step_s"]])
    others = [methods[m]["measured_step_s"] for m in methods if m not in tied]
    behind = joint / min([joint, *others]) - 1.0
    steps = [abs(v["step_error"]) for v in methods.values() if v["step_error"] is not None]
    sent = [abs(v["bytes_error"]) for v in methods.values() if v["bytes_error"] is not None]
    return {"methods": methods, "ranked_first": first, "ranked_first_tied": tied, "measured_fastest": fastest,
            "ranked_first_behind_fastest": behind,
            "max_abs_step_error": max(steps) if steps else None, "max_abs_bytes_error": max(sent) if sent else None,
            "goals": {"step_within_15pct": bool(steps) and max(steps) <= STEP_GOAL,
                      "bytes_within_10pct": bool(sent) and max(sent) <= BYTES_GOAL,
                      "ranked_first_within_5pct_of_fastest": behind <= ORDER_TOLERANCE}}


def _same_run(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two methods' predictions describe one run: the same codec and split, the same time."""
    return a.get("codec") == b.get("codec") and a.get("batch_sizes") == b.get("batch_sizes") \
        and math.isclose(a["predicted_step_s"], b["predicted_step_s"], rel_tol=1e-9)


def summarise(configs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every configuration's comparison, and whether each goal holds on all of them."""
    names = ("step_within_15pct", "bytes_within_10pct", "ranked_first_within_5pct_of_fastest")
    return {"configs": configs, "goals": {g: all(c["goals"][g] for c in configs.values()) for g in names}}
