"""``mtgate validate``: package integrity, quality against a baseline, load targets and cost -> PROMOTE or REJECT.

Steps, each adding checks to one verdict:
1. package: every file's checksum, and the parity of every artifact (``converters.parity``, when installed);
2. quality: translate the test set in process (``serving.engine.translator.Translator``), BLEU and chrF with sacrebleu; with
   ``--baseline``, sacrebleu's paired bootstrap test (1000 resamples) decides whether a drop is significant;
3. load: with ``--targets``, start ``mtgate serve`` with the candidate on 127.0.0.1 and run every scenario;
4. cost: price per core-hour x cores / measured output tokens per second, per million output tokens
   (``loadtest.validate.cost``): the throughput of the load scenario that decodes as the quality run did, else the
   median of ``--speed-repeats`` timed passes of the test set in process (``loadtest.validate.speed``).
The report (``validate.json`` and ``validate.html``, plus the hypotheses) goes to ``--report``. Exit 0 PROMOTE,
1 REJECT, 2 usage error.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadtest.capacity import Plan
from loadtest.cli import check_tensorboard, check_writable, default_report_dir
from loadtest.corpus import DEFAULT_REFERENCE, DEFAULT_SOURCE, CorpusError, read_lines
from loadtest.errors import LoadTestError
from loadtest.locust_run import run_all
from loadtest.quality import Analysis, Comparison, SystemScore, analyse, compare, score
from loadtest.report import ScenarioResult, write_text_atomically
from loadtest.server import package_model_name, start_server
from loadtest.targets import QualityTargets, ShadowTargets, TargetsError, TargetsFile, load_targets
from loadtest.validate.cost import (
    capacity_plan,
    estimate_cost,
    load_scenario_for_cost,
    quality_beam,
    throughput_cost,
)
from loadtest.validate.report import describe_package, write_outcome, write_validate_tensorboard
from loadtest.validate.speed import DEFAULT_REPEATS, Pass, Speed, measure_speed, translate_pass

if TYPE_CHECKING:
    from serving.engine.translator import DecodeOptions, Translator

logger = logging.getLogger(__name__)

__all__ = ["Comparison", "SystemScore", "add_arguments", "compare", "estimate_cost", "run", "write_outcome"]


def _usage_error(message: str) -> Exception:
    from serving.commands.options import UsageError

    return UsageError(message)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from serving.commands.options import (
        add_alias,
        add_decoding,
        add_max_batch_size,
        add_model,
        add_runtime,
        positive_float,
        positive_int,
    )
    from serving.package import PRECISION_CHOICES, RUNTIMES
    from serving.server.settings import DEFAULT_MAX_BATCH_SIZE

    add_model(parser, "the candidate: the model package to promote", required=True, aliases=["--candidate"])
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
    parser.add_argument("--baseline-runtime", choices=RUNTIMES,
                        help="runtime for the baseline (default: the candidate's --runtime)")
    add_alias(parser, "--baseline-backend", "baseline_runtime", new="--baseline-runtime", choices=RUNTIMES)
    parser.add_argument("--baseline-precision", choices=PRECISION_CHOICES,
                        help="artifact of the baseline (default: the candidate's --precision; auto chooses by the "
                             "baseline's own manifest), e.g. an int8 candidate against the fp32 model in production")
    add_decoding(parser)
    add_max_batch_size(parser, f"test sentences per engine call (default: {DEFAULT_MAX_BATCH_SIZE})",
                       default=DEFAULT_MAX_BATCH_SIZE, aliases=["--batch-size"])
    parser.add_argument("--speed-repeats", type=positive_int, default=DEFAULT_REPEATS, metavar="N",
                        help="timed passes of the test set per system for the in-process speed, reported as their "
                             f"median and range (default: {DEFAULT_REPEATS}); not run when a load scenario that "
                             "decodes with the same beam measures the throughput")
    parser.add_argument("--shadow-log", type=Path, metavar="LOG",
                        help="add live traffic: the pair log of `mtgate serve --shadow` (and its rotated files), "
                             "gated by the targets file's shadow: rules")
    parser.add_argument("--skip-parity", action="store_true", help="check checksums only, not parity")
    parser.add_argument("--report", type=Path, help="report directory (default: reports/validate-<UTC time>)")
    parser.add_argument("--tensorboard", type=Path, metavar="DIR",
                        help="also write scores, cost, load numbers, the verdict and example translations for "
                             "TensorBoard into a new run directory under DIR")
    parser.add_argument("--server-timeout", type=positive_float, default=120.0, metavar="SECONDS",
                        help="seconds to wait for the candidate's server to become ready (default: 120)")


@dataclass
class Check:
    """One reason for the verdict."""

    name: str
    passed: bool
    detail: str


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
    plan: Plan | None = None
    analysis: Analysis | None = None
    alpha: float = 0.05
    speed_left_to: str | None = None  # the load scenario that measures throughput instead of timed passes in process
    shadow: dict[str, Any] | None = None  # --shadow-log: loadtest.validate.shadow.summarize

    @property
    def verdict(self) -> str:
        return "PROMOTE" if self.checks and all(c.passed for c in self.checks) else "REJECT"


# ---------------------------------------------------------------- package


def package_summary(path: Path, role: str, runtime: str, precision: str, flags: str) -> dict[str, Any]:
    """What the report says of a package: path, name, version, source framework, and the artifact validated (the
    runtime and the precision it is measured at: ``auto`` resolved by ``serving.package.choose_precision``, and why).

    Raises:
        UsageError: not a readable package, or it has no such artifact (``flags`` names the options that choose it).
    """
    from serving.package import PackageError, choose_precision, open_package

    try:
        manifest = open_package(path, verify=False).manifest  # checksums are the candidate's first check
    except PackageError as e:
        raise _usage_error(f"{role}: {e}") from e
    choice = choose_precision(manifest, runtime, precision)
    if choice.precision != precision:
        logger.info("%s: %s", path, choice.describe(runtime))
    try:
        manifest.artifact(runtime, choice.precision)
    except PackageError as e:
        raise _usage_error(f"{role} {path}: {e}; choose one with {flags}") from e
    return {"path": str(path), "name": manifest.name, "version": manifest.version,
            "source": manifest.source_framework, "runtime": runtime, "precision": choice.precision,
            "precision_reason": choice.reason}



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


def load_system(package: Path, args: argparse.Namespace, runtime: str, precision: str) -> Translator:
    """A Translator of ``package``'s ``runtime``/``precision`` artifact (PackageError: it cannot be loaded)."""
    from serving.engine.translator import Translator

    return Translator.load(package, runtime=runtime, precision=precision, threads=args.threads)


def decode_options(args: argparse.Namespace) -> DecodeOptions:
    from serving.engine.translator import DecodeOptions

    return DecodeOptions(beam_size=args.beam_size, max_length=args.max_length)


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
                  f"p = {c.p_value:.4f}: {c.significance(rules.alpha, with_p=False)}; a drop over {allowed:g} with "
                  f"p < {rules.alpha:g} rejects)")
        checks.append(Check(f"{c.metric} not worse than baseline", ok, detail))
    return checks


# ---------------------------------------------------------------- command


def _load_inputs(args: argparse.Namespace) -> tuple[TargetsFile | None, list[str], list[str], Path, Path]:
    if args.model is None:  # not required=True: the old --candidate fills the same destination
        raise _usage_error("give the candidate package with -m/--model PKG")
    if args.baseline is None and (given := [flag for flag, value in (
            ("--baseline-runtime", args.baseline_runtime), ("--baseline-precision", args.baseline_precision))
            if value is not None]):
        raise _usage_error(f"{', '.join(given)} describe the baseline: give --baseline PKG too")
    if args.scenario and args.targets is None:
        raise _usage_error("--scenario needs --targets")
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
    beam, default_beam = quality_beam(args.model, args.beam_size), quality_beam(args.model, None)
    measured_by = load_scenario_for_cost(targets, args.scenario, beam, default_beam)
    outcome.speed_left_to = measured_by
    sys.stderr.write(f"translating {len(sources)} test sentences\n")
    options = decode_options(args)
    try:
        translators = {"candidate": load_system(args.model, args, outcome.candidate["runtime"],
                                                outcome.candidate["precision"])}
    except PackageError as e:
        outcome.checks.append(Check("candidate loads", False, str(e)))
        return
    passes = {"candidate": _quality_pass("candidate", translators["candidate"], sources, options, args.max_batch_size)}
    if outcome.baseline is not None:
        try:
            translators["baseline"] = load_system(args.baseline, args, outcome.baseline["runtime"],
                                                  outcome.baseline["precision"])
        except PackageError as e:
            outcome.checks.append(Check("baseline loads", False, f"cannot compare with the baseline: {e}"))
        else:
            passes["baseline"] = _quality_pass("baseline", translators["baseline"], sources, options,
                                               args.max_batch_size)
    speeds: dict[str, Speed] = {}
    if measured_by is None:
        sys.stderr.write(f"timing {args.speed_repeats} pass(es) of the test set per system\n")
        speeds = measure_speed(translators, sources, options, args.max_batch_size, args.speed_repeats)
    del translators  # free the runtimes before the load test's server starts
    for role, done in passes.items():
        package = args.model if role == "candidate" else args.baseline
        outcome.quality[role] = score(package, done.hypotheses, references, done.output_tokens, done.seconds,
                                      speeds.get(role))
        write_text_atomically(report_dir / f"{role}.hyp.txt", "".join(h + "\n" for h in done.hypotheses))
    systems = {role: done.hypotheses for role, done in passes.items()}
    if "baseline" in systems:
        outcome.comparisons = compare(systems["candidate"], systems["baseline"], references)
    outcome.analysis = analyse(sources, references, systems)
    rules = targets.quality if targets is not None else QualityTargets()
    outcome.alpha = rules.alpha
    outcome.checks += quality_checks(outcome.quality["candidate"], outcome.comparisons, rules)

    if targets is not None:
        _load(args, outcome, targets, source, report_dir)

    cores = args.cores or args.threads or len(os.sched_getaffinity(0))
    outcome.cost = throughput_cost(outcome, outcome.quality["candidate"], cores, args.price_per_core_hour, beam,
                                   default_beam)
    outcome.plan = capacity_plan(outcome, targets.capacity if targets is not None else None, cores)
    limit = targets.cost.max_per_million_tokens if targets is not None else None
    if limit is not None:
        cost = outcome.cost["per_million_tokens"]
        outcome.checks.append(Check(f"cost per million tokens <= {limit:g}", cost is not None and cost <= limit,
                                    "no throughput measured" if cost is None else f"{cost:.4f}"))


def _quality_pass(role: str, translator: Translator, sources: list[str], options: DecodeOptions,
                  batch_size: int) -> Pass:
    """The test set translated by one system, with a progress bar on a terminal (``serving.commands.progress``)."""
    from serving.commands.progress import bar

    with bar(f"translating ({role})", "sentences", len(sources)) as done:
        return translate_pass(translator, sources, options, batch_size, done.update)


def _load(args: argparse.Namespace, outcome: Outcome, targets: TargetsFile, source: Path, report_dir: Path) -> None:
    """Start the candidate's server on 127.0.0.1 and run the scenarios; the test set is the default corpus."""
    scenarios = targets.select(args.scenario)
    sys.stderr.write(f"load: {len(scenarios)} scenario(s) against the candidate on 127.0.0.1\n")
    extra = ["--runtime", outcome.candidate["runtime"], "--precision", outcome.candidate["precision"]]
    if args.threads:
        extra += ["--threads", str(args.threads)]
    try:
        with start_server(args.model, report_dir / "server.log", args.server_timeout, extra, wait=False) as server:
            outcome.host = server.url
            outcome.load = run_all(server.url, scenarios, report_dir, None, package_model_name(args.model),
                                   None, default_corpus=source, ready=server.wait_ready)
    except (LoadTestError, CorpusError) as e:
        outcome.checks.append(Check("load test", False, str(e)))
    for r in outcome.load:
        failed = [f"{c.target} (measured {c.measured_text})" for c in r.checks if not c.passed]
        outcome.checks.append(Check(f"load scenario {r.scenario.name}", r.passed,
                                    "every target met" if r.passed else "missed: " + "; ".join(failed)))


def run(args: argparse.Namespace) -> int:
    targets, sources, references, source, reference = _load_inputs(args)
    report_dir: Path = args.report or default_report_dir("validate")
    check_writable(report_dir, "--report", directory=True)
    if args.tensorboard is not None:
        check_tensorboard(args.tensorboard)
    candidate = package_summary(args.model, "candidate", args.runtime, args.precision, "--runtime/--precision")
    baseline = package_summary(args.baseline, "baseline", args.baseline_runtime or args.runtime,
                               args.baseline_precision or args.precision,
                               "--baseline-runtime/--baseline-precision") if args.baseline else None
    outcome = Outcome(candidate=candidate, baseline=baseline,
                      testset={"source": str(source), "reference": str(reference), "sentences": len(sources)})
    if getattr(args, "shadow_log", None) is not None:  # before any work: a missing or empty log is a usage error
        from loadtest.validate.shadow import ShadowLogError, shadow_checks, summarize

        try:
            outcome.shadow = summarize(args.shadow_log)
        except ShadowLogError as e:
            raise _usage_error(str(e)) from None
    _evaluate(args, outcome, targets, sources, references, source, report_dir)
    if outcome.shadow is not None:
        rules = targets.shadow if targets is not None else ShadowTargets()
        outcome.checks += [Check(*check) for check in shadow_checks(outcome.shadow, rules)]

    data, page = write_outcome(report_dir, outcome)
    sys.stdout.write(f"{outcome.verdict}\n")
    sys.stdout.write(f"  candidate {describe_package(candidate)}\n")
    if baseline is not None:
        sys.stdout.write(f"  baseline  {describe_package(baseline)}\n")
    for role, system in outcome.quality.items():
        if system.speed is not None:
            sys.stdout.write(f"  {role:9} {system.speed.text()} output tokens/s in process\n")
    for c in outcome.checks:
        sys.stdout.write(f"  {'pass' if c.passed else 'FAIL'}  {c.name}: {c.detail}\n")
    sys.stdout.write(f"report: {page} and {data}\n")
    if args.tensorboard is not None:
        sys.stdout.write(f"tensorboard: {write_validate_tensorboard(args.tensorboard, outcome)}\n")
    return 0 if outcome.verdict == "PROMOTE" else 1
