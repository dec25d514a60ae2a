"""The shadow's Prometheus metrics, in the server's registry (``serving.server.metrics``), labelled by the production
model and the candidate: requests by outcome (``compared``, ``shed``: the shadow queue was full, ``failed``: the
candidate raised, ``unavailable``: it is loading or failed to load), pairs and identical pairs, sentence chrF and BLEU
of the candidate against production, length ratio, both latencies, the cross-likelihood (a model's mean
log-probability of a translation, by scorer and translation), the shadow queue's depth and the candidate's restarts;
and the canary's (``mtgate_canary_*``: :class:`CanaryMetrics`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_SCORE_BUCKETS = (10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 100.0)
_RATIO_BUCKETS = (0.25, 0.5, 0.75, 0.9, 0.95, 1.0, 1.05, 1.1, 1.25, 1.5, 2.0, 4.0)
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_LOG_PROB_BUCKETS = (-8.0, -4.0, -2.0, -1.5, -1.0, -0.75, -0.5, -0.25, -0.1, 0.0)
OUTCOMES = ("compared", "shed", "failed", "unavailable")


class ShadowMetrics:
    """The shadow's series for one production model and one candidate."""

    def __init__(self, registry: CollectorRegistry, model: str, candidate: str) -> None:
        labels = ["model", "candidate"]
        r = registry
        requests = Counter("mtgate_shadow_requests_total",
                           "requests sampled for the shadow, by outcome (compared, shed, failed, unavailable)",
                           [*labels, "outcome"], registry=r)
        self.outcome = {o: requests.labels(model, candidate, o) for o in OUTCOMES}
        for counter in self.outcome.values():
            counter.inc(0)
        self.pairs = Counter("mtgate_shadow_pairs_total", "sentences translated by both and compared", labels,
                             registry=r).labels(model, candidate)
        self.identical = Counter("mtgate_shadow_identical_pairs_total", "compared sentences translated identically",
                                 labels, registry=r).labels(model, candidate)
        self.chrf = Histogram("mtgate_shadow_chrf", "sentence chrF of the candidate's translation against production's",
                              labels, buckets=_SCORE_BUCKETS, registry=r).labels(model, candidate)
        self.bleu = Histogram("mtgate_shadow_bleu", "sentence BLEU of the candidate's translation against production's",
                              labels, buckets=_SCORE_BUCKETS, registry=r).labels(model, candidate)
        self.length_ratio = Histogram("mtgate_shadow_length_ratio",
                                      "characters of the candidate's translation / of production's", labels,
                                      buckets=_RATIO_BUCKETS, registry=r).labels(model, candidate)
        latency = Histogram("mtgate_shadow_latency_seconds",
                            "per shadowed request: production's (admission to answer) and the candidate's (its "
                            "translation on the shadow worker)", [*labels, "side"], buckets=_LATENCY_BUCKETS,
                            registry=r)
        self.production_seconds = latency.labels(model, candidate, "production")
        self.candidate_seconds = latency.labels(model, candidate, "candidate")
        log_prob = Histogram("mtgate_shadow_mean_log_prob",
                             "cross-likelihood: a model's (scorer: candidate, or production with "
                             "shadow_production_score) mean log-probability per token of a translation (the "
                             "candidate's or production's)", [*labels, "scorer", "translation"],
                             buckets=_LOG_PROB_BUCKETS, registry=r)
        self.log_prob = {
            "candidate_own": log_prob.labels(model, candidate, "candidate", "candidate"),
            "candidate_on_production": log_prob.labels(model, candidate, "candidate", "production"),
            "production_own": log_prob.labels(model, candidate, "production", "production"),
            "production_on_candidate": log_prob.labels(model, candidate, "production", "candidate"),
        }
        self.queue_depth = Gauge("mtgate_shadow_queue_depth", "requests waiting for the candidate", labels,
                                 registry=r).labels(model, candidate)
        self.up = Gauge("mtgate_shadow_up", "1 while the candidate is loaded and translating", labels,
                        registry=r).labels(model, candidate)
        self.restarts = Counter("mtgate_shadow_restarts_total", "times the candidate's process died and was restarted",
                                labels, registry=r).labels(model, candidate)


CANARY_OUTCOMES = ("candidate", "fallback")


class CanaryMetrics:
    """The canary's series (``serving.server.shadow.canary``) for one production model and one candidate."""

    def __init__(self, registry: CollectorRegistry, model: str, candidate: str) -> None:
        labels = ["model", "candidate"]
        r = registry
        self.fraction = Gauge("mtgate_canary_fraction", "share of requests answered by the candidate now (0 after a "
                              "rollback)", labels, registry=r).labels(model, candidate)
        requests = Counter("mtgate_canary_requests_total", "requests sampled for the canary, by who answered "
                           "(candidate; fallback: the candidate failed or was too slow, production answered)",
                           [*labels, "outcome"], registry=r)
        self.outcome = {o: requests.labels(model, candidate, o) for o in CANARY_OUTCOMES}
        for counter in self.outcome.values():
            counter.inc(0)
        self.rollbacks = Counter("mtgate_canary_rollbacks_total", "automatic rollbacks of the canary to 0", labels,
                                 registry=r).labels(model, candidate)
        self.rollbacks.inc(0)
        self.rolled_back = Gauge("mtgate_canary_rolled_back", "1 from an automatic rollback until an operator sets the "
                                 "fraction again (POST /v1/shadow/canary), else 0", labels,
                                 registry=r).labels(model, candidate)
        self.sets = Counter("mtgate_canary_fraction_sets_total", "fractions set by an operator (POST "
                            "/v1/shadow/canary; above 0 re-arms a rolled-back canary)", labels,
                            registry=r).labels(model, candidate)
        self.sets.inc(0)
        self.seconds = Histogram("mtgate_canary_latency_seconds", "the candidate's answer time of a canary request "
                                 "(a failure: until it failed)", labels, buckets=_LATENCY_BUCKETS,
                                 registry=r).labels(model, candidate)
        self.error_rate = Gauge("mtgate_canary_window_error_rate", "the candidate's error rate over the window",
                                labels, registry=r).labels(model, candidate)
        self.p95 = Gauge("mtgate_canary_window_p95_seconds", "the candidate's p95 latency over the window", labels,
                         registry=r).labels(model, candidate)
