"""``mtgate validate``: package integrity, quality against a baseline, load targets and cost -> PROMOTE or REJECT.

Steps, each adding checks to one verdict:
1. package: every file's checksum, and the parity of every artifact (``converters.parity``, when installed);
2. quality: translate the test set in process (``serving.engine.Translator``), BLEU and chrF with sacrebleu; with
   ``--baseline``, sacrebleu's paired bootstrap test (1000 resamples) decides whether a drop is significant;
3. load: with ``--targets``, start ``mtgate serve`` with the candidate on 127.0.0.1 and run every scenario;
4. cost: price per core-hour x cores / measured output tokens per second, per million output tokens.
The report (``validate.json`` and ``validate.html``, plus the hypotheses) goes to ``--report``. Exit 0 PROMOTE,
1 REJECT, 2 usage error.
"""

from __future__ import annotations

import argparse
import html
import json
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from loadtest.cli import default_report_dir
from loadtest.corpus import DEFAULT_REFERENCE, DEFAULT_SOURCE, CorpusError, read_lines
from loadtest.report import ScenarioResult, html_page, html_table, scenario_html, write_text_atomically
from loadtest.runner import LoadTestError, run_all
from loadtest.server import package_model_name, start_server
from loadtest.targets import QualityTargets, TargetsError, TargetsFile, load_targets

logger = logging.getLogger(__name__)

BOOTSTRAP_SAMPLES = 1000


def _usage_error(message: str) -> Exception:
    from serving.cli import UsageError

    return UsageError(message)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from serving.cli_options import (
        BACKENDS,
        PRECISIONS,
        add_decoding,
        add_model,
        add_runtime,
        positive_float,
        positive_int,
    )

    add_model(parser, "the candidate: the model package to promote (required)", aliases=["--candidate"])
    parser.add_argument("--baseline", type=Path, metavar="PKG",
                        help="model package in production now, to compare quality with")
    parser.add_argument("--testset", type=Path, nargs=2, metavar=("SRC", "REF"),
                        help="source and reference files, text or .gz, one sentence per line "
                             "(default: the bundled Multi30k test_2016_flickr EN/DE)")
    parser.add_argument("--limit", type=positive_int, metavar="N", help="use only the first N test sentences")
    parser.add_argument("--targets", type=Path, help="targets file: load scenarios, and quality/cost rules")
    parser.add_argument("--scenario", action="append", default=[], metavar="NAME",
                        help="run only this load scenario (repeatable; default: all)")
    parser.add_argument("--price-per-core-hour", type=positive_float, default=0.05, metavar="PRICE",
                        help="price of one CPU core for one hour, for the cost estimate (default: 0.05)")
    parser.add_argument("--cores", type=positive_int, metavar="N",
                        help="cores the server uses, for the cost estimate (default: --threads, else the CPUs this "
                             "process may run on)")
    add_runtime(parser, threads_help="intra-op threads of the runtime, for quality and load (default: the engine's "
                                     "choice for this machine)")
    parser.add_argument("--baseline-backend", choices=BACKENDS,
                        help="runtime for the baseline (default: the candidate's --backend)")
    parser.add_argument("--baseline-precision", choices=PRECISIONS,
                        help="artifact of the baseline (default: the candidate's --precision), e.g. an int8 "
                             "candidate against the fp32 model in production")
    add_decoding(parser)
    parser.add_argument("--batch-size", type=positive_int, default=32, metavar="N",
                        help="test sentences per engine call (default: 32)")
    parser.add_argument("--skip-parity", action="store_true", help="check checksums only, not parity")
    parser.add_argument("--report", type=Path, help="report directory (default: reports/validate-<UTC time>)")
    parser.add_argument("--server-timeout", type=positive_float, default=120.0, metavar="SECONDS",
                        help="seconds to wait for the candidate's server to become ready (default: 120)")


@dataclass
class Check:
    """One reason for the verdict."""

    name: str
    passed: bool
    detail: str


@dataclass
class SystemScore:
    """A system's translations of the test set and their scores."""

    package: str
    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str
    sentences: int
    output_tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Comparison:
    """Candidate against baseline for one metric (sacrebleu paired bootstrap)."""

    metric: str
    candidate: float
    baseline: float
    delta: float
    p_value: float
    candidate_mean: float
    candidate_ci: float
    baseline_mean: float
    baseline_ci: float
    identical: bool = False

    def significance(self, alpha: float) -> str:
        """In words: identical, no significant difference, or a significant gain or drop."""
        if self.identical:
            return "identical translations: no difference"
        if self.p_value >= alpha:
            return f"no significant difference (p = {self.p_value:.4f})"
        return f"significant {'gain' if self.delta > 0 else 'drop'} (p = {self.p_value:.4f})"


@dataclass
class Outcome:
    """Everything the report shows."""

    candidate: dict[str, Any]
    baseline: dict[str, Any] | None
    testset: dict[str, Any]
    checks: list[Check] = field(default_factory=list)
    parity: list[Any] = field(default_factory=list)
    quality: dict[str, SystemScore] = field(default_factory=dict)
    comparisons: list[Comparison] = field(default_factory=list)
    load: list[ScenarioResult] = field(default_factory=list)
    host: str | None = None
    cost: dict[str, Any] | None = None

    @property
    def verdict(self) -> str:
        return "PROMOTE" if self.checks and all(c.passed for c in self.checks) else "REJECT"


# ---------------------------------------------------------------- package


def _package_summary(path: Path) -> dict[str, Any]:
    from serving.package import read_manifest

    manifest = read_manifest(path)
    return {"path": str(path), "name": manifest.get("name"), "version": manifest.get("version"),
            "source": manifest.get("source", {}).get("framework")}


def check_package(path: Path, role: str, parity: bool, threads: int | None = None) -> tuple[list[Check], list[Any]]:
    """Checksums of every file and, unless ``parity`` is False, the parity of every artifact.

    Returns:
        The checks, and the parity rows of ``converters.parity.run_parity`` (empty when not run).
    """
    from serving.package import PackageError, load_manifest

    try:
        manifest = load_manifest(path, verify=True)
    except PackageError as e:
        return [Check(f"{role} checksums", False, str(e))], []
    checks = [Check(f"{role} checksums", True, f"{len(manifest.get('files', {}))} files match the manifest")]
    if not parity:
        return checks, []
    try:
        from converters.parity import run_parity
    except ImportError as e:
        return [*checks, Check(f"{role} parity", False, f"cannot check parity in this install ({e}); "
                                                        "pass --skip-parity")], []
    try:
        rows = run_parity(path, manifest, threads=threads)
    except Exception as e:  # a verification that cannot run must reject, whatever went wrong inside it
        return [*checks, Check(f"{role} parity", False, f"parity check failed to run: {e}")], []
    failed = [f"{r['artifact']} vs {r['reference']}" for r in rows if not r["passed"]]
    if failed:
        return [*checks, Check(f"{role} parity", False, "mismatch: " + ", ".join(failed))], rows
    detail = (f"{len(rows)} artifact comparison(s) within tolerance" if rows
              else "only the fp32 ONNX reference graphs (nothing to compare)")
    return [*checks, Check(f"{role} parity", True, detail)], rows


# ---------------------------------------------------------------- quality


def translate_testset(package: Path, sources: list[str], args: argparse.Namespace, backend: str,
                      precision: str) -> tuple[list[str], int, float]:
    """Translate in process; return hypotheses, output tokens and seconds spent translating (loading excluded)."""
    from serving.engine import DecodeOptions, Translator

    translator = Translator.load(package, runtime=backend, precision=precision, threads=args.threads)
    options = DecodeOptions(beam_size=args.beam_size, max_length=args.max_length)
    hypotheses: list[str] = []
    tokens = 0
    start = time.perf_counter()
    for i in range(0, len(sources), args.batch_size):
        for t in translator.translate(sources[i : i + args.batch_size], options):
            hypotheses.append(t.text)
            tokens += int(t.output_tokens)
    return hypotheses, tokens, time.perf_counter() - start


def score(package: Path, hypotheses: list[str], references: list[str], tokens: int, seconds: float) -> SystemScore:
    from sacrebleu.metrics.bleu import BLEU
    from sacrebleu.metrics.chrf import CHRF

    bleu, chrf = BLEU(), CHRF()
    b = bleu.corpus_score(hypotheses, [references])
    c = chrf.corpus_score(hypotheses, [references])
    return SystemScore(str(package), b.score, c.score, str(bleu.get_signature()), str(chrf.get_signature()),
                       len(hypotheses), tokens, seconds)


def compare(candidate: list[str], baseline: list[str], references: list[str]) -> list[Comparison]:
    """sacrebleu's paired bootstrap resampling test (``sacrebleu --paired-bs``), baseline first."""
    from sacrebleu.metrics.bleu import BLEU
    from sacrebleu.metrics.chrf import CHRF
    from sacrebleu.significance import PairedTest

    metrics = {"BLEU": BLEU(references=[references]), "chrF": CHRF(references=[references])}
    test = PairedTest([("baseline", baseline), ("candidate", candidate)], metrics, references=None, test_type="bs",
                      n_samples=BOOTSTRAP_SAMPLES)
    _, scores = test()
    identical = list(candidate) == list(baseline)
    out = []
    for metric in ("BLEU", "chrF2" if "chrF2" in scores else "chrF"):
        base, cand = scores[metric]
        assert not isinstance(base, str) and not isinstance(cand, str)
        delta = float(cand.score) - float(base.score)
        # sacrebleu counts resampled differences strictly above the real one, plus one: with no difference at all
        # (every resample's difference is 0 too) that reads p = 1/(n+1), "significant". Nothing differs: p = 1.
        p_value = 1.0 if identical or delta == 0 else float(cand.p_value if cand.p_value is not None else 1.0)
        out.append(Comparison(
            metric="chrF" if metric.startswith("chrF") else metric, candidate=float(cand.score),
            baseline=float(base.score), delta=delta, p_value=p_value,
            candidate_mean=float(cand.mean or 0.0), candidate_ci=float(cand.ci or 0.0),
            baseline_mean=float(base.mean or 0.0), baseline_ci=float(base.ci or 0.0), identical=identical))
    return out


def quality_checks(candidate: SystemScore, comparisons: list[Comparison], rules: QualityTargets) -> list[Check]:
    checks = []
    for metric, floor, value in (("BLEU", rules.min_bleu, candidate.bleu), ("chrF", rules.min_chrf, candidate.chrf)):
        if floor is not None:
            checks.append(Check(f"{metric} >= {floor:g}", value >= floor, f"candidate {metric} {value:.2f}"))
    for c in comparisons:
        allowed = rules.max_bleu_drop if c.metric == "BLEU" else rules.max_chrf_drop
        drop = -c.delta
        significant = c.p_value < rules.alpha
        ok = not (drop > allowed and significant)
        detail = (f"candidate {c.candidate:.2f} vs baseline {c.baseline:.2f} (delta {c.delta:+.2f}, "
                  f"p = {c.p_value:.4f}: {c.significance(rules.alpha)}; a drop over {allowed:g} with "
                  f"p < {rules.alpha:g} rejects)")
        checks.append(Check(f"{c.metric} not worse than baseline", ok, detail))
    return checks


# ---------------------------------------------------------------- cost


def estimate_cost(tokens_per_s: float, cores: int, price_per_core_hour: float) -> float | None:
    """Price per million output tokens at this throughput, or None without throughput."""
    if tokens_per_s <= 0:
        return None
    return price_per_core_hour * cores / 3600.0 / tokens_per_s * 1e6


def _cost(outcome: Outcome, candidate: SystemScore, cores: int, price: float) -> dict[str, Any]:
    measured = [(r.run.tokens.output_tokens_per_s, f"load scenario {r.scenario.name}")
                for r in outcome.load if r.run.tokens is not None and r.run.tokens.output_tokens]
    tokens_per_s, source = max(measured) if measured else (candidate.tokens_per_s, "test set, in process")
    return {"price_per_core_hour": price, "cores": cores, "tokens_per_s": tokens_per_s, "throughput_source": source,
            "per_million_tokens": estimate_cost(tokens_per_s, cores, price)}


# ---------------------------------------------------------------- report


def to_json(outcome: Outcome) -> dict[str, Any]:
    return {
        "verdict": outcome.verdict,
        # REJECT: what failed; PROMOTE: what was checked.
        "reasons": [f"{c.name}: {c.detail}" for c in outcome.checks if not c.passed]
        or [f"{c.name}: {c.detail}" for c in outcome.checks],
        "checks": [asdict(c) for c in outcome.checks],
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "candidate": outcome.candidate,
        "baseline": outcome.baseline,
        "testset": outcome.testset,
        "parity": outcome.parity,
        "quality": {role: {**asdict(s), "tokens_per_s": s.tokens_per_s} for role, s in outcome.quality.items()},
        "comparison": [asdict(c) for c in outcome.comparisons],
        "load": None if outcome.host is None else {
            "host": outcome.host,
            "scenarios": [{"name": r.scenario.name, "passed": r.passed,
                           "output_tokens_per_s": r.run.tokens.output_tokens_per_s if r.run.tokens else None,
                           "checks": [{"target": c.target, "key": c.key, "limit": c.limit, "measured": c.measured,
                                       "passed": c.passed, "detail": c.detail} for c in r.checks]}
                          for r in outcome.load]},
        "cost": outcome.cost,
    }


def to_html(outcome: Outcome) -> str:
    verdict = outcome.verdict
    cls = "pass" if verdict == "PROMOTE" else "fail"
    parts = [f'<h1>Validation: <span class="{cls} verdict">{verdict}</span></h1>',
             f"<p>Candidate <code>{html.escape(str(outcome.candidate.get('path')))}</code>"
             + (f", baseline <code>{html.escape(str(outcome.baseline.get('path')))}</code>" if outcome.baseline else "")
             + f"; test set {html.escape(str(outcome.testset.get('source')))} "
               f"({outcome.testset.get('sentences')} sentences).</p>",
             "<h2>Checks</h2>",
             html_table([["check", "result", "detail"],
                         *([c.name, "pass" if c.passed else "FAIL", c.detail] for c in outcome.checks)])]
    if outcome.parity:
        rows = [["artifact", "reference", "result", "details"]]
        rows += [[str(r.get("artifact")), str(r.get("reference")), "pass" if r.get("passed") else "FAIL",
                  ", ".join(f"{k} {_short(v)}" for k, v in r.items() if k not in ("artifact", "reference", "passed"))]
                 for r in outcome.parity]
        parts += ["<h2>Parity</h2>", html_table(rows)]
    if outcome.quality:
        rows = [["system", "BLEU", "chrF", "sentences", "output tokens/s (in process)"]]
        rows += [[role, f"{s.bleu:.2f}", f"{s.chrf:.2f}", str(s.sentences), f"{s.tokens_per_s:.1f}"]
                 for role, s in outcome.quality.items()]
        parts += ["<h2>Quality</h2>", html_table(rows)]
        if outcome.comparisons:
            rows = [["metric", "candidate", "baseline", "delta", "p-value", "candidate mean ± 95% CI",
                     "baseline mean ± 95% CI"]]
            rows += [[c.metric, f"{c.candidate:.2f}", f"{c.baseline:.2f}", f"{c.delta:+.2f}", f"{c.p_value:.4f}",
                      f"{c.candidate_mean:.2f} ± {c.candidate_ci:.2f}", f"{c.baseline_mean:.2f} ± {c.baseline_ci:.2f}"]
                     for c in outcome.comparisons]
            parts += [f"<p>Paired bootstrap resampling, {BOOTSTRAP_SAMPLES} samples (sacrebleu).</p>",
                      html_table(rows)]
        sigs = {s.bleu_signature for s in outcome.quality.values()} | {s.chrf_signature for s in outcome.quality.values()}
        parts.append("<p>" + "<br>".join(f"<code>{html.escape(sig)}</code>" for sig in sorted(sigs)) + "</p>")
    if outcome.cost is not None:
        c = outcome.cost
        per_million = c["per_million_tokens"]
        parts += ["<h2>Cost</h2>", html_table([
            ["price per core-hour", "cores", "output tokens/s", "measured by", "per million output tokens"],
            [f"{c['price_per_core_hour']:g}", str(c["cores"]), f"{c['tokens_per_s']:.1f}", c["throughput_source"],
             "–" if per_million is None else f"{per_million:.4f}"]])]
    if outcome.load:
        parts += [f"<h2>Load (server at {html.escape(outcome.host or '')})</h2>", *(scenario_html(r) for r in outcome.load)]
    return html_page(f"mtgate validate: {verdict}", "\n".join(parts))


def _plain(value: Any) -> Any:
    """numpy scalars (in parity rows) as Python numbers; anything else unknown as text."""
    return value.item() if hasattr(value, "item") else str(value)


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def write_outcome(directory: Path, outcome: Outcome) -> tuple[Path, Path]:
    data, page = directory / "validate.json", directory / "validate.html"
    write_text_atomically(data, json.dumps(to_json(outcome), indent=2, default=_plain) + "\n")
    write_text_atomically(page, to_html(outcome))
    return data, page


# ---------------------------------------------------------------- command


def _load_inputs(args: argparse.Namespace) -> tuple[TargetsFile | None, list[str], list[str], Path, Path]:
    if args.model is None:  # not required=True: the old --candidate fills the same destination
        raise _usage_error("give the candidate package with -m/--model PKG")
    try:
        targets = load_targets(args.targets) if args.targets else None
        if targets is not None:
            targets.select(args.scenario)  # unknown names are a usage error now, not after the quality pass
    except TargetsError as e:
        raise _usage_error(str(e)) from e
    source, reference = args.testset or (DEFAULT_SOURCE, DEFAULT_REFERENCE)
    try:
        sources = read_lines(source, keep_empty=True)
        references = read_lines(reference, keep_empty=True)
    except CorpusError as e:
        raise _usage_error(f"{e}{'' if args.testset else ' (pass --testset SRC REF)'}") from e
    if len(sources) != len(references):
        raise _usage_error(f"test set: {source} has {len(sources)} lines but {reference} has {len(references)}")
    if args.limit is not None:
        sources, references = sources[: args.limit], references[: args.limit]
    return targets, sources, references, source, reference


def _evaluate(args: argparse.Namespace, outcome: Outcome, targets: TargetsFile | None, sources: list[str],
              references: list[str], source: Path, report_dir: Path) -> None:
    """Add every check to ``outcome``; stop early when the candidate cannot be trusted or loaded."""
    from serving.package import PackageError

    sys.stderr.write("checking the candidate package\n")
    package_checks, outcome.parity = check_package(args.model, "candidate", not args.skip_parity, args.threads)
    outcome.checks += package_checks
    if not package_checks[0].passed:
        return  # modified or missing files: nothing measured on them would mean anything
    sys.stderr.write(f"translating {len(sources)} test sentences\n")
    try:
        hyps, tokens, seconds = translate_testset(args.model, sources, args, args.backend, args.precision)
    except PackageError as e:
        outcome.checks.append(Check("candidate loads", False, str(e)))
        return
    outcome.quality["candidate"] = score(args.model, hyps, references, tokens, seconds)
    write_text_atomically(report_dir / "candidate.hyp.txt", "".join(h + "\n" for h in hyps))
    if args.baseline:
        try:
            base_hyps, base_tokens, base_seconds = translate_testset(
                args.baseline, sources, args, args.baseline_backend or args.backend,
                args.baseline_precision or args.precision)
        except PackageError as e:
            outcome.checks.append(Check("baseline loads", False, f"cannot compare with the baseline: {e}"))
        else:
            outcome.quality["baseline"] = score(args.baseline, base_hyps, references, base_tokens, base_seconds)
            write_text_atomically(report_dir / "baseline.hyp.txt", "".join(h + "\n" for h in base_hyps))
            outcome.comparisons = compare(hyps, base_hyps, references)
    rules = targets.quality if targets is not None else QualityTargets()
    outcome.checks += quality_checks(outcome.quality["candidate"], outcome.comparisons, rules)

    if targets is not None:
        _load(args, outcome, targets, source, report_dir)

    cores = args.cores or args.threads or len(os.sched_getaffinity(0))
    outcome.cost = _cost(outcome, outcome.quality["candidate"], cores, args.price_per_core_hour)
    limit = targets.cost.max_per_million_tokens if targets is not None else None
    if limit is not None:
        cost = outcome.cost["per_million_tokens"]
        outcome.checks.append(Check(f"cost per million tokens <= {limit:g}", cost is not None and cost <= limit,
                                    "no throughput measured" if cost is None else f"{cost:.4f}"))


def _load(args: argparse.Namespace, outcome: Outcome, targets: TargetsFile, source: Path, report_dir: Path) -> None:
    """Start the candidate's server on 127.0.0.1 and run the scenarios; the test set is the default corpus."""
    scenarios = targets.select(args.scenario)
    sys.stderr.write(f"load: {len(scenarios)} scenario(s) against the candidate on 127.0.0.1\n")
    extra = ["--backend", args.backend, "--precision", args.precision]
    if args.threads:
        extra += ["--threads", str(args.threads)]
    try:
        with start_server(args.model, report_dir / "server.log", args.server_timeout, extra) as server:
            outcome.host = server.url
            outcome.load = run_all(server.url, scenarios, report_dir, None, package_model_name(args.model),
                                   None, default_corpus=source)
    except (LoadTestError, CorpusError) as e:
        outcome.checks.append(Check("load test", False, str(e)))
    for r in outcome.load:
        failed = [f"{c.target} (measured {c.measured_text})" for c in r.checks if not c.passed]
        outcome.checks.append(Check(f"load scenario {r.scenario.name}", r.passed,
                                    "every target met" if r.passed else "missed: " + "; ".join(failed)))


def run(args: argparse.Namespace) -> int:
    from serving.package import PackageError

    targets, sources, references, source, reference = _load_inputs(args)
    report_dir: Path = args.report or default_report_dir("validate")
    try:
        outcome = Outcome(candidate={**_package_summary(args.model), "backend": args.backend,
                                     "precision": args.precision},
                          baseline={**_package_summary(args.baseline), "backend": args.baseline_backend or args.backend,
                                    "precision": args.baseline_precision or args.precision} if args.baseline else None,
                          testset={"source": str(source), "reference": str(reference), "sentences": len(sources)})
    except PackageError as e:
        raise _usage_error(str(e)) from e
    _evaluate(args, outcome, targets, sources, references, source, report_dir)

    data, page = write_outcome(report_dir, outcome)
    sys.stdout.write(f"{outcome.verdict}\n")
    for c in outcome.checks:
        sys.stdout.write(f"  {'pass' if c.passed else 'FAIL'}  {c.name}: {c.detail}\n")
    sys.stdout.write(f"report: {page} and {data}\n")
    return 0 if outcome.verdict == "PROMOTE" else 1
