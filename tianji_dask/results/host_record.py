"""The recorder's view of one host: its latest heartbeat, the offsets that carry its counters
across restarts, and the reference point of its rates."""

from __future__ import annotations

import math

from tianji_dask.roles.heartbeats import ROLES, growing_counters, rates

# Counters that only grow while a host lives. When a host is re-created (its heartbeat has a
# higher ``incarnation``), or one of them goes down, its counters began again at zero; the
# recorder then adds the old totals as an offset so sums over hosts and rates stay monotone.
GROWING = {role: growing_counters(role) for role in ROLES}
# Per role: counter whose rate over the last interval is reported, keyed by the name of the rate.
RATES = {role: rates(role) for role in ROLES}


class HostRecord:
    """Latest heartbeat of one host plus the reference point of its rates."""

    __slots__ = ("t", "raw", "offset", "ref_t", "ref", "rates", "prev_t", "prev_version", "incarnation")

    def __init__(self, t: float, counters: dict[str, float], incarnation: int = 0):
        self.t = t
        self.incarnation = incarnation
        self.raw = counters
        self.prev_t = math.nan  # the heartbeat before the latest: for versions between the two
        self.prev_version = math.nan
        self.offset: dict[str, float] = {}
        self.ref_t = t
        self.ref = dict(counters)
        self.rates: dict[str, float] = {}

    def value(self, key: str, default: float = 0.0) -> float:
        return self.raw.get(key, default) + self.offset.get(key, 0.0)

    def update(self, role: str, t: float, counters: dict[str, float], incarnation: int) -> None:
        """Take a later heartbeat of this host (a later one of the same incarnation, or any of a
        later incarnation); where the host began again, its old totals become offsets."""
        began_again = incarnation > self.incarnation or any(
            counters.get(k, math.inf) < self.raw.get(k, -math.inf) for k in GROWING[role]
        )
        if began_again:
            for k in GROWING[role]:
                if not math.isnan(self.raw.get(k, math.nan)):
                    self.offset[k] = self.offset.get(k, 0.0) + self.raw[k]
        self.prev_t, self.prev_version = self.t, param_version(self)
        self.t, self.raw, self.incarnation = t, counters, incarnation

    def take_rates(self, role: str) -> None:
        """Rates since the heartbeat the previous row used, which becomes the new reference; a
        host with no new heartbeat since (zero interval) keeps its previous rates."""
        dt = self.t - self.ref_t
        if dt > 0:
            for name, counter in RATES[role].items():
                self.rates[name] = (self.value(counter) - self.ref.get(counter, 0.0)) / dt
            self.ref_t = self.t
            self.ref = {c: self.value(c) for c in RATES[role].values()}


def param_version(h: HostRecord) -> float:
    v = h.raw.get("param_version", math.nan)
    return math.nan if v < 0 else v  # -1: no parameters yet
