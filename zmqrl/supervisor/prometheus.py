"""The supervisor's Prometheus endpoint: ``/metrics`` over HTTP, every role's heartbeat counters as
the metrics zmqrl/metrics/catalog.py lists (``PROMETHEUS``), labelled by role and id.

Why the supervisor serves them: it already hears every role's heartbeats (their counters are what
its summary and `zmqrl status` show), so one scrape target covers the whole run, however many
processes and hosts it spans, and no role opens a port it did not have.

Threads: the exposition is prometheus_client's (its WSGI app, OpenMetrics when the scraper asks
for it) with a registry of its own, served by zmqrl/runtime/http_server.py's bounded server (a
daemon thread per connection, each with a timeout, a cap on them, a bounded close: an idle client
can neither hold up a scrape nor the supervisor's exit). The scrape never touches the supervisor's
live slots: the supervisor's loop publishes an immutable :class:`RunView` (copies of the slots'
last counters) at most every :data:`PUBLISH_SECONDS`, and :class:`RunCollector` reads whichever
view is current when a scrape arrives (a reference swap, atomic under the GIL).

Metrics are a report, never a reason to die: an address that cannot be bound is one warning and
the run goes on without /metrics. A bind beyond loopback (0.0.0.0 in a pod, for a Prometheus
elsewhere) is allowed, the endpoint being read-only, and is one warning too.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.core import (
    Metric as Family,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from zmqrl.config import Config
from zmqrl.config_checks import parse_http_address
from zmqrl.metrics.catalog import (
    ANY_ROLE,
    BAD_REASONS,
    COUNTER,
    FEED_BAD,
    FEED_HEARTBEAT_AGE,
    FEED_RESTARTS,
    FEED_RUN,
    FEED_UP,
    HISTOGRAM,
    LAG_BUCKETS,
    PROMETHEUS,
    SUPERVISOR_BAD_REASONS,
    Metric,
)
from zmqrl.runtime.http_server import BoundedServer, exposure_warning
from zmqrl.supervisor.liveness import FINAL_STATES
from zmqrl.supervisor.summary import Slot

# Seconds between two views the supervisor's loop publishes (scrapes are a second or more apart).
PUBLISH_SECONDS = 0.25
# The HTTP path the metrics are served on (every other path answers the same, as the library's).
METRICS_PATH = "/metrics"
# What the launch's line with the bound URL starts with.
URL_LINE = "Prometheus metrics: "
# The config key, named in every warning about the address.
SETTING = "supervisor.metrics_http"
# The histogram of the learner's policy lag (the catalog's row; its feed is a heartbeat counter).
LAG_METRIC = next(m for m in PROMETHEUS if m.kind == HISTOGRAM and m.feed == "policy_lag")


# ------------------------------------------------------------------------------ configuration
def url_of(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}{METRICS_PATH}"


# ------------------------------------------------------------------------------ the published view
@dataclass(frozen=True)
class SlotView:
    """One slot as the scrape sees it: copies, never the supervisor's own objects."""

    role: str
    id: int
    up: bool
    restarts: int
    last_seen: float | None  # the supervisor's clock() at its latest heartbeat
    counters: Mapping[str, float]


@dataclass(frozen=True)
class LagView:
    """The policy-lag histogram so far: cumulative counts per upper bound (+Inf last), and sum."""

    buckets: tuple[tuple[str, float], ...]
    total: float


@dataclass(frozen=True)
class RunView:
    """The run as one scrape exports it."""

    slots: tuple[SlotView, ...] = ()
    supervisor_bad: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    lag: LagView | None = None
    info: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


class LagHistogram:
    """Observations of the learner's recent mean policy lag, one per learner heartbeat (the
    heartbeat carries only that mean, not per-batch lags). Kept by the supervisor's loop."""

    def __init__(self, bounds: tuple[float, ...] = LAG_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound
        self.total = 0.0
        self._seen: dict[str, object] = {}  # slot name -> the heartbeat last observed

    def observe_slots(self, slots: Mapping[str, Slot]) -> None:
        for slot in slots.values():
            hb = slot.live.last
            if slot.role != LAG_METRIC.role or hb is None or self._seen.get(slot.name) is hb:
                continue
            self._seen[slot.name] = hb
            lag = hb.counters.get(LAG_METRIC.feed)
            if lag is not None and math.isfinite(lag):
                self.observe(float(lag))

    def observe(self, value: float) -> None:
        index = next((i for i, bound in enumerate(self.bounds) if value <= bound), len(self.bounds))
        self.counts[index] += 1
        self.total += value

    def view(self) -> LagView:
        cumulative, running = [], 0
        for bound, count in zip([*self.bounds, math.inf], self.counts, strict=True):
            running += count
            cumulative.append((floatToGoString(bound), float(running)))  # "1.0", "+Inf": the library's
        return LagView(tuple(cumulative), self.total)


def slot_view(slot: Slot, now: float, heartbeat_timeout: float) -> SlotView:
    """A copy of what the scrape needs of one slot; ``up`` while it heartbeats and is not exiting."""
    live, hb = slot.live, slot.live.last
    heard = live.last_seen is not None and now - live.last_seen <= heartbeat_timeout
    exiting = hb is not None and hb.state in FINAL_STATES
    up = heard and not exiting and not slot.retired and slot.restart_at is None
    counters = dict(hb.counters) if hb is not None else {}
    return SlotView(slot.role, slot.id, up, slot.restarts, live.last_seen, MappingProxyType(counters))


# ------------------------------------------------------------------------------ the collector
class RunCollector(Collector):
    """Turns the current :class:`RunView` into the catalog's metric families, on each scrape."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.view = RunView()
        self._clock = clock

    def publish(self, view: RunView) -> None:
        self.view = view  # one reference swap: a scrape reads the old view or the new one

    def collect(self) -> Iterator[Family]:
        view, now = self.view, self._clock()
        for metric in PROMETHEUS:
            yield self._family(metric, view, now)

    def _family(self, metric: Metric, view: RunView, now: float) -> Family:
        if metric.kind == HISTOGRAM:
            hist = HistogramMetricFamily(metric.family, metric.meaning, labels=list(metric.labels))
            if view.lag is not None:
                for slot in self._slots(metric, view):
                    hist.add_metric([slot.role, str(slot.id)], list(view.lag.buckets), view.lag.total)
            return hist
        family: CounterMetricFamily | GaugeMetricFamily
        if metric.kind == COUNTER:
            family = CounterMetricFamily(metric.family, metric.meaning, labels=list(metric.labels))
        else:
            family = GaugeMetricFamily(metric.family, metric.meaning, labels=list(metric.labels))
        for labels, value in self._samples(metric, view, now):
            family.add_metric(labels, value)
        return family

    @staticmethod
    def _slots(metric: Metric, view: RunView) -> Iterator[SlotView]:
        return (s for s in view.slots if metric.role in (ANY_ROLE, s.role))

    def _samples(self, metric: Metric, view: RunView, now: float) -> Iterator[tuple[list[str], float]]:
        if metric.feed == FEED_RUN:
            if view.info:
                yield [view.info.get(label, "") for label in metric.labels], 1.0
            return
        if metric.feed == FEED_BAD:
            yield from self._bad_messages(view)
            return
        for slot in self._slots(metric, view):
            labels = [slot.role, str(slot.id)]
            if metric.feed == FEED_UP:
                yield labels, 1.0 if slot.up else 0.0
            elif metric.feed == FEED_RESTARTS:
                yield labels, float(slot.restarts)
            elif metric.feed == FEED_HEARTBEAT_AGE:
                if slot.last_seen is not None:
                    yield labels, max(now - slot.last_seen, 0.0)
            elif metric.feed in slot.counters:
                value = float(slot.counters[metric.feed]) * metric.scale
                if math.isfinite(value):
                    yield labels, value

    @staticmethod
    def _bad_messages(view: RunView) -> Iterator[tuple[list[str], float]]:
        for slot in view.slots:
            for counter, reason in BAD_REASONS.items():
                if counter in slot.counters:
                    yield [slot.role, str(slot.id), reason], float(slot.counters[counter])
        for reason in SUPERVISOR_BAD_REASONS:
            if reason in view.supervisor_bad:
                yield ["supervisor", "0", reason], float(view.supervisor_bad[reason])


# ------------------------------------------------------------------------------ the server
class _QuietHandler(WSGIRequestHandler):
    """No access log line per scrape on the supervisor's console."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _BoundedWSGIServer(BoundedServer, WSGIServer):
    """The library's WSGI server made safe to face a network (zmqrl/runtime/http_server.py): a
    thread per connection with a timeout, a cap on them, a close bounded whatever clients do."""


class MetricsServer:
    """``/metrics`` of one registry, served from daemon threads until :meth:`close`."""

    def __init__(self, registry: CollectorRegistry, address: str) -> None:
        host, port = parse_http_address(address)
        # OSError when the address cannot be bound (in use, not this host's): the caller warns.
        self._httpd = make_server(host, port, make_wsgi_app(registry), _BoundedWSGIServer, _QuietHandler)
        bound_port = int(self._httpd.server_address[1])
        self.url = url_of(host, bound_port)
        # Allowed beyond loopback (a Prometheus on another host scrapes it), never silently.
        self.exposed = exposure_warning(SETTING, host, bound_port, METRICS_PATH)
        self._httpd.start("zmqrl-metrics-http")

    def close(self) -> None:
        """Within http_server.CLOSE_SECONDS, even with a client connected that never sends."""
        self._httpd.close()


class PrometheusExporter:
    """What the supervisor's monitor runs: the collector, its registry and server, and the views the
    loop publishes. ``start`` returns the URL served, or None (off, or the address unusable: one
    warning through ``say``)."""

    def __init__(
        self,
        cfg: Config,
        slots: Mapping[str, Slot],
        *,
        command: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self._slots = slots
        self._clock = clock
        self.collector = RunCollector(clock)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self.lag = LagHistogram()
        self.server: MetricsServer | None = None
        self._published_at = -math.inf
        self._bad: dict[str, int] = {}
        self._info = MappingProxyType(
            {"run": cfg.run.name, "command": command, "agent": cfg.agent.kind, "env": cfg.env.id}
        )

    def start(self, say: Callable[[str], None]) -> str | None:
        address = self.cfg.supervisor.metrics_http
        if address is None:
            return None
        try:
            self.server = MetricsServer(self.registry, address)
        except (OSError, ValueError) as exc:
            say(f"warning: {SETTING} {address}: cannot serve /metrics ({exc}); the run goes on without it")
            return None
        if self.server.exposed is not None:
            say(f"warning: {self.server.exposed}")
        self.publish(force=True)
        return self.server.url

    def refresh(self) -> None:
        """From every turn of the supervisor's loop: note new learner heartbeats, publish when due."""
        if self.server is None:
            return
        self.lag.observe_slots(self._slots)
        self.publish()

    def supervisor_counts(self, bad_heartbeats: int, bad_status: int) -> None:
        self._bad = {"heartbeat": bad_heartbeats, "status": bad_status}

    def publish(self, *, force: bool = False) -> None:
        now = self._clock()
        if not force and now - self._published_at < PUBLISH_SECONDS:
            return
        self._published_at = now
        timeout = self.cfg.supervisor.heartbeat_timeout
        self.collector.publish(
            RunView(
                slots=tuple(slot_view(s, now, timeout) for s in self._slots.values()),
                supervisor_bad=MappingProxyType(dict(self._bad)),
                lag=self.lag.view(),
                info=self._info,
            )
        )

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
