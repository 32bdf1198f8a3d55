"""How many replicas an inference endpoint should run, decided from its measured load. Pure: the clock is passed in.

The shape is Knative's autoscaler (KPA), with the knobs of nomad-autoscaler's target-value strategy:

* **The signal** is what HAProxy measures for the endpoint (``stores.endpoint_traffic.EndpointLoad``, about one
  sample a second): the requests in flight (served, queued, or held by the activator during a cold start), or the
  requests per second, from a counter that restarts at 0 when HAProxy does (a drop is read as a restart: the new
  value is the requests since, never negative traffic). The loop keeps the recent samples (:func:`observe`).
* **Two windows**: the *stable* window (default 60 s) averages the signal for the normal decision; the *panic*
  window (default 6 s) sees a burst. Either gives ``ceil(signal / target)`` replicas.
* **Panic**: when the panic window's replicas reach ``panic_threshold`` (default 2) × the ready replicas, the
  endpoint panics for one stable window: it follows the panic window, and never scales down while panicking.
* **No flapping**: a scale-down takes the *highest* recommendation of the last ``scale_down_delay`` seconds (a
  cooldown: demand must stay low that long), and the stable window's average smooths load that hovers around the
  target.
* **Scale to zero** (``min_replicas`` 0 only): once no request was seen for ``scale_to_zero_after`` seconds. A
  request held for an endpoint with no replica (a *wake*) asks for at least one replica at once, whatever the
  windows say.
* **Missing samples**: with no sample newer than :data:`STALE_AFTER` seconds the endpoint's load is unknown, and it
  keeps its replicas (within the bounds): a measurement outage never scales an endpoint down or to zero.

:func:`decide` is the one entry point: rules, samples, replicas, the state it returned last time and ``now`` in,
a :class:`Decision` (desired replicas, the reason in words, whether panicking, the next state) out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from core.durations import duration_input
from core.errors import InvalidInput

MAX_REPLICAS = 16
"""As ``domain.inference.MAX_REPLICAS`` (kept here so the policy imports nothing of the session model)."""
STALE_AFTER = 10.0
"""Seconds after which the latest sample says nothing of now (the ingress samples about every second)."""
DEFAULT_STABLE_WINDOW = 60.0
DEFAULT_PANIC_WINDOW = 6.0
DEFAULT_PANIC_THRESHOLD = 2.0
DEFAULT_SCALE_DOWN_DELAY = 30.0
DEFAULT_SCALE_TO_ZERO_AFTER = 300.0
DEFAULT_DRAIN_TIMEOUT = 30.0
MAX_WINDOW = 3600.0


class Metric(StrEnum):
    IN_FLIGHT = "IN_FLIGHT"
    """``target`` is requests in flight per replica (Knative's concurrency, Ray Serve's ongoing requests)."""
    RPS = "RPS"
    """``target`` is requests per second per replica."""


@dataclass(frozen=True)
class ScalingRules:
    """An endpoint's autoscaling rules (stored on the session; seconds for every window)."""

    min_replicas: int = 1
    max_replicas: int = 1
    metric: Metric = Metric.IN_FLIGHT
    target: float = 10.0
    stable_window: float = DEFAULT_STABLE_WINDOW
    panic_window: float = DEFAULT_PANIC_WINDOW
    panic_threshold: float = DEFAULT_PANIC_THRESHOLD
    """Panic when the panic window asks for at least this many times the ready replicas."""
    scale_down_delay: float = DEFAULT_SCALE_DOWN_DELAY
    """A scale-down happens only once the demand stayed lower for this long (the cooldown)."""
    scale_to_zero_after: float = DEFAULT_SCALE_TO_ZERO_AFTER
    """With ``min_replicas`` 0: no request for this long and the endpoint goes to zero replicas."""
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT
    """A replica taken out of traffic is stopped once its requests ended, or after this long at the latest."""


@dataclass(frozen=True)
class Sample:
    """One load sample as the policy reads it (``EndpointLoad`` without the endpoint's id)."""

    at: float
    in_flight: int
    requests_total: int
    held: int = 0


@dataclass(frozen=True)
class Replicas:
    current: int
    """Replicas the endpoint has now (starting, ready or recovering; draining ones not counted)."""
    ready: int
    """Of those, the ones that pass their health check (``domain.inference.endpoints_of``)."""


@dataclass(frozen=True)
class ScalingState:
    """What the policy remembers between two decisions (the loop keeps it; a new leader starts from the default)."""

    last_request_at: float | None = None
    """When a request was last seen (None: not yet: counted from the first decision)."""
    panic_since: float | None = None
    """When the current panic started; None: not panicking."""
    panic_peak: int = 0
    """The most replicas asked for during this panic (a panic never scales down)."""
    recommendations: tuple[tuple[float, int], ...] = ()
    """``(at, replicas)`` recommended over the last ``scale_down_delay`` seconds."""


@dataclass(frozen=True)
class Decision:
    desired: int
    reason: str
    panicking: bool
    state: ScalingState = field(default_factory=ScalingState)


# -- the signal --


def observe(samples: Sequence[Sample], sample: Sample, *, keep: float) -> tuple[Sample, ...]:
    """``samples`` with ``sample`` added (once: a repeated or older one is ignored) and those older than ``keep``
    seconds before it dropped."""
    if samples and sample.at <= samples[-1].at:
        return tuple(samples)
    return tuple(s for s in samples if s.at >= sample.at - keep) + (sample,)


def requests_between(before: Sample, after: Sample) -> int:
    """Requests counted from one sample to the next; a counter that went down restarted (HAProxy reloaded) at 0."""
    delta = after.requests_total - before.requests_total
    return delta if delta >= 0 else after.requests_total


def _in_window(samples: Sequence[Sample], now: float, window: float) -> list[Sample]:
    return [s for s in samples if now - window < s.at <= now]


def window_value(samples: Sequence[Sample], metric: Metric, now: float, window: float) -> float | None:
    """The signal averaged over the last ``window`` seconds; None with too few samples to say."""
    inside = _in_window(samples, now, window)
    if metric is Metric.IN_FLIGHT:
        return sum(s.in_flight + s.held for s in inside) / len(inside) if inside else None
    # A rate needs two samples: the one just before the window (if kept) starts the first interval.
    earlier = [s for s in samples if s.at <= now - window]
    points = ([earlier[-1]] if earlier else []) + inside
    if len(points) < 2:
        return None
    span = points[-1].at - points[0].at
    counted = sum(requests_between(a, b) for a, b in zip(points, points[1:], strict=False))
    return counted / span if span > 0 else None


def saw_request(samples: Sequence[Sample], since: float | None) -> float | None:
    """The time of the latest sample after ``since`` showing a request (one in flight, held, or counted)."""
    latest = None
    for before, after in zip((None, *samples), samples, strict=False):
        if since is not None and after.at <= since:
            continue
        counted = requests_between(before, after) if before is not None else 0
        if after.in_flight > 0 or after.held > 0 or counted > 0:
            latest = after.at
    return latest


# -- the decision --


def replicas_for(value: float, target: float) -> int:
    """``ceil(value / target)``, with a hair of tolerance so float noise at the target does not add a replica."""
    return max(0, math.ceil(value / target - 1e-9))


def decide(
    rules: ScalingRules,
    samples: Sequence[Sample],
    replicas: Replicas,
    state: ScalingState,
    *,
    now: float,
    wake: bool = False,
) -> Decision:
    """The replicas the endpoint should run now, why, and the state to pass next time."""
    seen = saw_request(samples, state.last_request_at)
    last_request = now if wake else seen if seen is not None else state.last_request_at
    if last_request is None:
        last_request = now
    fresh = bool(samples) and now - samples[-1].at <= STALE_AFTER
    state = replace(state, last_request_at=last_request)
    if not fresh:
        return _hold(rules, replicas, state, wake, now)
    stable = window_value(samples, rules.metric, now, rules.stable_window)
    panic = window_value(samples, rules.metric, now, rules.panic_window)
    if stable is None or panic is None:  # one sample so far (a rate needs two): nothing to average yet
        return _hold(rules, replicas, state, wake, now)
    unit = "in flight" if rules.metric is Metric.IN_FLIGHT else "req/s"
    want_stable = replicas_for(stable, rules.target)
    want_panic = replicas_for(panic, rules.target)
    # Panic: the short window asks for panic_threshold × what is ready (at least one: from zero, any burst panics).
    over = want_panic >= rules.panic_threshold * max(replicas.ready, 1) and want_panic > replicas.ready
    panic_since = state.panic_since
    if over:
        panic_since = now if panic_since is None else panic_since
    elif panic_since is not None and now - panic_since >= rules.stable_window:
        panic_since = None
    if panic_since is not None:
        peak = max(want_panic, state.panic_peak, replicas.current)
        desired = peak
        reason = f"panic: {panic:.1f} {unit} over {rules.panic_window:g}s, target {rules.target:g} per replica"
        state = replace(state, panic_since=panic_since, panic_peak=peak)
    else:
        desired = want_stable
        reason = f"{stable:.1f} {unit} over {rules.stable_window:g}s, target {rules.target:g} per replica"
        state = replace(state, panic_since=None, panic_peak=0)
    # The cooldown: the highest recommendation of the last scale_down_delay seconds.
    kept = tuple((at, n) for at, n in state.recommendations if at > now - rules.scale_down_delay) + ((now, desired),)
    state = replace(state, recommendations=kept)
    # Never below what ran, as long as a recent recommendation asked for it (an old, higher one scales nothing up).
    floor = min(max(n for _, n in kept), replicas.current)
    if floor > desired:
        reason += f"; kept at {floor} for the scale-down delay ({rules.scale_down_delay:g}s)"
        desired = floor
    return _bounded(rules, desired, reason, replicas, state, wake, now, panicking=panic_since is not None)


def _hold(rules: ScalingRules, replicas: Replicas, state: ScalingState, wake: bool, now: float) -> Decision:
    """No usable signal: keep what runs (a measurement outage never scales down), within the bounds."""
    return _bounded(rules, replicas.current, "no recent load sample: replicas kept", replicas, state, wake, now)


def _bounded(
    rules: ScalingRules,
    desired: int,
    reason: str,
    replicas: Replicas,
    state: ScalingState,
    wake: bool,
    now: float,
    *,
    panicking: bool = False,
) -> Decision:
    idle_for = now - (state.last_request_at if state.last_request_at is not None else now)
    if desired == 0 and rules.min_replicas == 0:
        if wake:
            return Decision(1, "woken: a request is waiting for a replica", panicking, state)
        if idle_for < rules.scale_to_zero_after and replicas.current > 0:
            desired = 1
            reason = f"idle for {idle_for:.0f}s: to zero after {rules.scale_to_zero_after:g}s"
        elif replicas.current > 0:
            reason = f"no request for {idle_for:.0f}s: scaled to zero"
        else:
            reason = "at zero: no request"
    if wake and desired < 1:  # then bounded like any other: a wake asks for a replica, never for fewer than min
        desired, reason = 1, "woken: a request is waiting for a replica"
    if desired > rules.max_replicas:
        return Decision(rules.max_replicas, f"{reason}; capped at max {rules.max_replicas}", panicking, state)
    if desired < rules.min_replicas:
        return Decision(rules.min_replicas, f"{reason}; raised to min {rules.min_replicas}", panicking, state)
    return Decision(desired, reason, panicking, state)


# -- the rules, checked --


def checked_rules(
    *,
    min_replicas: int,
    max_replicas: int,
    metric: Metric = Metric.IN_FLIGHT,
    target: float,
    stable_window: float | None = None,
    panic_window: float | None = None,
    panic_threshold: float | None = None,
    scale_down_delay: float | None = None,
    scale_to_zero_after: float | None = None,
    drain_timeout: float | None = None,
) -> ScalingRules:
    """The rules a user gave, or INVALID_INPUT naming the field (windows in seconds, already parsed)."""
    if not 0 <= min_replicas <= MAX_REPLICAS:
        raise InvalidInput(f"minReplicas must be between 0 and {MAX_REPLICAS}", field="minReplicas")
    if not 1 <= max_replicas <= MAX_REPLICAS:
        raise InvalidInput(f"maxReplicas must be between 1 and {MAX_REPLICAS}", field="maxReplicas")
    if min_replicas > max_replicas:
        raise InvalidInput("minReplicas must not exceed maxReplicas", field="minReplicas")
    if not math.isfinite(target) or target <= 0:
        raise InvalidInput("target must be a positive number (per replica)", field="target")
    stable = DEFAULT_STABLE_WINDOW if stable_window is None else stable_window
    panic = DEFAULT_PANIC_WINDOW if panic_window is None else panic_window
    windows = {
        "stableWindow": (stable, 1.0),
        "panicWindow": (panic, 1.0),
        "scaleDownDelay": (DEFAULT_SCALE_DOWN_DELAY if scale_down_delay is None else scale_down_delay, 0.0),
        "scaleToZeroAfter": (
            DEFAULT_SCALE_TO_ZERO_AFTER if scale_to_zero_after is None else scale_to_zero_after,
            1.0,
        ),
        "drainTimeout": (DEFAULT_DRAIN_TIMEOUT if drain_timeout is None else drain_timeout, 0.0),
    }
    for name, (seconds, least) in windows.items():
        if not least <= seconds <= MAX_WINDOW:
            raise InvalidInput(f"{name} must be between {least:g}s and {MAX_WINDOW:g}s", field=name)
    if panic > stable:
        raise InvalidInput("panicWindow must not be longer than stableWindow", field="panicWindow")
    threshold = DEFAULT_PANIC_THRESHOLD if panic_threshold is None else panic_threshold
    if not math.isfinite(threshold) or not 1.0 < threshold <= 100.0:
        raise InvalidInput("panicThreshold must be above 1 and at most 100", field="panicThreshold")
    return ScalingRules(
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        metric=metric,
        target=float(target),
        stable_window=stable,
        panic_window=panic,
        panic_threshold=threshold,
        scale_down_delay=windows["scaleDownDelay"][0],
        scale_to_zero_after=windows["scaleToZeroAfter"][0],
        drain_timeout=windows["drainTimeout"][0],
    )


@dataclass(frozen=True)
class ScalingRequest:
    """Autoscaling rules as a user wrote them (durations as text: ``"90s"``, ``"5m"`` or seconds)."""

    min_replicas: int
    max_replicas: int
    target: float
    metric: Metric = Metric.IN_FLIGHT
    stable_window: str | None = None
    panic_window: str | None = None
    panic_threshold: float | None = None
    scale_down_delay: str | None = None
    scale_to_zero_after: str | None = None
    drain_timeout: str | None = None


def rules_of_request(request: ScalingRequest) -> ScalingRules:
    """:func:`checked_rules` of a request; INVALID_INPUT naming the field for a bad duration too."""
    return checked_rules(
        min_replicas=request.min_replicas,
        max_replicas=request.max_replicas,
        metric=request.metric,
        target=request.target,
        stable_window=duration_input("stableWindow", request.stable_window),
        panic_window=duration_input("panicWindow", request.panic_window),
        panic_threshold=request.panic_threshold,
        scale_down_delay=duration_input("scaleDownDelay", request.scale_down_delay),
        scale_to_zero_after=duration_input("scaleToZeroAfter", request.scale_to_zero_after),
        drain_timeout=duration_input("drainTimeout", request.drain_timeout),
    )


def initial_replicas(rules: ScalingRules, replicas: int | None) -> int:
    """The replicas an autoscaled endpoint starts with: ``replicas`` if given (within the rules), else the least the
    rules allow but at least one (an endpoint starts, becomes RUNNING, and goes to zero only once idle)."""
    start = max(rules.min_replicas, 1) if replicas is None else replicas
    if not max(rules.min_replicas, 1) <= start <= rules.max_replicas:
        raise InvalidInput(
            f"replicas must be between {max(rules.min_replicas, 1)} and maxReplicas ({rules.max_replicas})",
            field="replicas",
        )
    return start
