"""Every command README.md shows, run for real, and the README's configuration table checked against the settings.

How the tour test works:

- ``readme_snippets()`` reads README.md's fenced blocks. A ```sh block is split into commands (one per line, a trailing
  backslash continues it, ``#`` comments are dropped); a ```python block is one snippet. Other fences (```text,
  ```json) are not run, and fences named bash/shell/console are refused (write ```sh).
- ``test_readme_command`` runs every snippet in README order, all in one scratch directory, against small models, on
  127.0.0.1 only, each bounded in time (COMMAND_TIMEOUT_S); SKIPPED lists the commands that cannot run in a test,
  each with its reason. ``test_every_command_is_run_or_skipped`` fails when a command's program is not one this test
  knows how to run safely (RUNNABLE) and the command is not in SKIPPED, so the README cannot gain an unchecked
  command.
- A command passes when its exit code is 0 (or in VERDICTS, for gates whose verdict depends on the tiny models or on
  this machine's speed), its stdout contains EXPECT[command] when given, and a curl answer holds no ``"error"``.

Substitutions (the only differences from what a user types):

1. ``PATH`` starts with this interpreter's bin directory (the checkout's .venv), so ``mtgate`` and ``batch-score``
   are this install's; ``MTGATE_*`` variables of the calling environment are removed; proxies are bypassed for
   127.0.0.1.
2. The scratch directory holds the inputs the README names: ``opus-mt-en-de/`` a tiny random Marian checkpoint
   (tests/utils/marian_factory.py); ``wmt19-en-de/``, ``fairseq/ende/``, ``opus-mt-en-de-npz/``, ``onmt/ende/`` tiny
   random FSMT, fairseq, Marian NMT and OpenNMT-py checkpoints (tests/utils/*_factory.py); ``t2t_train/ende/`` the
   real tensor2tensor test checkpoint
   (tests/data/t2t/transformer_test_ckpt) without its hparams.json, so that ``--hparams-set`` is what decides;
   ``t2t_data/`` its wmt8k vocabulary; ``data/test.{en,de}`` the first 12 lines of tests/data/marian/corpus.{en,de}
   (Multi30k) and ``data/test.tfrecord`` the same pairs as ``tf.train.Example``s (``inputs``, ``targets``);
   ``loadtest/targets/*.yaml`` copies of the repository's targets files with every scenario's duration cut to 1 s.
3. REWRITES: in the T2T conversion, ``--hparams-set transformer_big`` becomes ``transformer_test`` and the wmt32k
   vocabulary the wmt8k one (what the test checkpoint was trained with).
4. ``mtgate translate|serve|batch-score`` given no ``-m``/``--server`` (the bundled demo model, which may not be
   built) get ``-m <demo stand-in>``: the same tiny Marian model converted for ONNX Runtime fp32.
5. ``mtgate serve`` runs in the background on a free port (``--port`` replaced or added; a ``--grpc-port`` too)
   until the next ``mtgate serve`` or the end of the module; ``localhost:8000`` and ``127.0.0.1:8000`` in later
   snippets point at it, and ``localhost:8001`` at its gRPC port.

The table between ``<!-- settings-table ... -->`` and ``<!-- /settings-table -->`` is generated from
serving/server/settings.py; after changing the settings, rewrite it with
``.venv/bin/python -m tests.test_readme --write-settings-table``.
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from tests.utils.server import wait_until_ready

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DATA = ROOT / "tests" / "data"
BIN = Path(sys.executable).parent
COMMAND_TIMEOUT_S = 240
READY_TIMEOUT_S = 120
TEST_LINES = 12

# README command -> why the test does not run it.
SKIPPED: dict[str, str] = {
    "make serve": "builds the demo package and serves it on port 8000 until stopped; the tour's `mtgate serve` runs "
                  "instead",
    "make test": "runs the whole suite, this test included",
    "make perf-analyzer": "installs perf_analyzer into .venv-perf (`make test` runs it before the suite)",
    "mtgate serve --model-repository models/repository --repository-poll-secs 5":
        "needs a repository of versions; tests/serving/server/test_repository.py serves one and switches versions under load",
    "cp -r models/en-de models/repository/en-de/.incoming && mv models/repository/en-de/.incoming "
    "models/repository/en-de/2": "goes with the repository server above; tests/serving/server/test_repository.py does it",
    "LD_LIBRARY_PATH=$(echo .venv-perf/lib/python3*/site-packages/nvidia/cuda_runtime/lib) .venv-perf/bin/perf_analyzer "
    "-m demo-en-de -u localhost:8000 -i http --input-data /tmp/input.json --shape INPUT_TEXT:1 --concurrency-range 1:4":
        "drives the demo model for minutes; tests/serving/server/test_perf_analyzer.py runs it, bounded, on a tiny model",
    "mtgate convert models/demo-en-de-src -o build/demo-shortlist --runtimes onnxruntime --shortlist-corpus "
    "MULTI30K/train.en.gz MULTI30K/train.de.gz --shortlist-eval models/data/multi30k/test_2016_flickr.en.gz "
    "models/data/multi30k/test_2016_flickr.de.gz":
        "needs Multi30k's training split (not shipped); tests/converters/test_shortlist_build.py converts a tiny model "
        "with a shortlist",
    "make demo": "converts the real demo model (minutes, and it may not be trained yet); the test uses a tiny stand-in",
    "python3 -m venv .venv && .venv/bin/pip install -e .": "installs packages; the test runs in the installed .venv",
    ".venv/bin/pip install -e '.[convert]'": "installs packages; the test runs in the installed .venv",
    ".venv/bin/pip install -e '.[batch]'": "installs packages; the test runs in the installed .venv",
    ".venv/bin/pip install -e '.[loadtest]'": "installs packages; the test runs in the installed .venv",
    ".venv/bin/pip install -e '.[batch,ray]'": "installs packages; the test runs in the installed .venv",
    "docker run --rm -p 8000:8000 -v \"$PWD/triton-repo:/models\" nvcr.io/nvidia/tritonserver:24.08-py3 bash -c "
    "'pip install -r /models/opus-mt-en-de/1/requirements.txt && tritonserver --model-repository=/models'":
        "needs Docker, the NVIDIA Triton image and network; tests/deploy/test_triton_export.py drives model.py",
    "docker build -t mtgate:latest .": "needs Docker and network; tests/deploy/test_dockerfile.py lints the file and "
                                       "test_image_install.py runs its install lines",
    "docker run --rm -p 8000:8000 mtgate:latest": "needs Docker",
    "docker build --target batch -t mtgate:batch .": "needs Docker and network; tests/deploy/test_image_install.py "
                                                     "runs its install lines and the Kubernetes Job's command",
    "docker run --rm -p 8000:8000 -v \"$PWD/models/en-de:/models/en-de:ro\" -e MTGATE_MODEL_DIRS='[\"/models/en-de\"]' "
    "mtgate:latest": "needs Docker",
    "kubectl apply -k deploy/k8s": "needs a Kubernetes cluster; tests/deploy/test_k8s_manifests.py validates the "
                                   "manifests",
    "kubectl apply -k deploy/prometheus-operator": "needs a Kubernetes cluster with the Prometheus Operator; "
                                                   "tests/deploy/test_k8s_manifests.py builds and validates it",
    "kubectl apply -k deploy/kserve": "needs a Kubernetes cluster with KServe; tests/deploy/test_kserve_manifests.py "
                                      "checks the runtime against mtgate serve",
    "kubectl apply -k deploy/shadow": "needs a Kubernetes cluster; tests/deploy/test_shadow_overlay.py checks the "
                                      "overlay against the schemas and mtgate serve's settings",
    'kubectl create secret generic mtgate-shadow-salt --from-literal=salt="$(openssl rand -hex 16)"':
        "needs a Kubernetes cluster; goes with deploy/shadow",
    "kubectl apply -f deploy/k8s/batch-score-job.yaml": "needs a Kubernetes cluster; tests/batch/test_batch_deploy.py "
                                                        "checks the Job",
    "docker build --target ray -t mtgate:ray .": "needs Docker and network; tests/batch/test_batch_deploy.py checks "
                                                 "the target",
    "kubectl apply -f deploy/k8s/batch-score-rayjob.yaml": "needs a Kubernetes cluster with KubeRay; "
                                                           "tests/batch/test_batch_deploy.py checks the RayJob",
    ".venv/bin/python -m benchmarks.batch_ray_scaling": "a benchmark (minutes, meaningful on an idle machine only)",
    "benchmarks/setup_peers_venv.sh": "downloads the peer engines (about 2 GB)",
    "mtgate sweep loadtest/sweeps/demo.yaml --dry-run": "needs the bundled demo package, not the tour's tiny models; "
                                                        "tests/loadtest/test_sweep.py lists points",
    "mtgate sweep loadtest/sweeps/demo.yaml --report reports/sweep-demo --tensorboard runs":
        "about 5 minutes of load on the demo model; tests/loadtest/test_sweep_e2e.py runs a 2-point sweep",
    ".venv/bin/python -m benchmarks.bench": "about an hour on an idle machine with the peers' venv",
    ".venv/bin/python -m benchmarks.bench --quick": "builds and converts a model with torch in a subprocess; "
                                                    "tests/benchmarks/test_bench.py runs it",
    ".venv/bin/python -m benchmarks.served_batching --modes request,step --rates 48,64,80,96,112,128,144 --duration 30s":
        "about 10 minutes of load; tests/loadtest/test_served_batching.py runs it for 3 s",
    ".venv/bin/python -m benchmarks.served_batching --modes request,step --rates 96,128,160,192,224,256 --beam-size 1":
        "about 8 minutes of load; tests/loadtest/test_served_batching.py runs it for 3 s",
    ".venv/bin/python -m benchmarks.served_offline -m models/demo-en-de --duration 45s":
        "about 3 minutes of load; tests/loadtest/test_served_offline.py runs it for 3 s",
}

# Programs whose commands this test runs (anything else must be in SKIPPED).
RUNNABLE = frozenset({"mtgate", "batch-score", "curl", "printf", "grep"})

T2T_CONVERT = ("mtgate convert t2t_train/ende -o models/t2t-en-de --name t2t-en-de --hparams-set transformer_big "
               "--vocab t2t_data/vocab.translate_ende_wmt32k.32768.subwords --runtimes onnxruntime --precisions fp32")
LOADTEST = "mtgate loadtest --targets loadtest/targets/smoke.yaml --start-server -m models/en-de"
LOADTEST_ADHOC = "mtgate loadtest --start-server -m models/en-de -u 4 -r 4 -t 5s --user-class TranslateUser --csv run"
VALIDATE = ("mtgate validate -m models/en-de --baseline models/t2t-en-de "
            "--testset data/test.en data/test.de")

# README command -> (old, new) replacements made before running it.
REWRITES: dict[str, list[tuple[str, str]]] = {
    T2T_CONVERT: [("--hparams-set transformer_big", "--hparams-set transformer_test"),
                  ("vocab.translate_ende_wmt32k.32768.subwords", "vocab.translate_ende_wmt8k.8192.subwords")],
}

# Gates whose verdict depends on the tiny random models or on this machine's load: either verdict is fine (exit 0 or
# 1); a usage or run error (2) or a crash is not.
VERDICTS: dict[str, set[int]] = {LOADTEST: {0, 1}, LOADTEST_ADHOC: {0, 1}, VALIDATE: {0, 1}}

# README command -> text its stdout must contain.
EXPECT: dict[str, str] = {
    "mtgate convert opus-mt-en-de -o models/en-de": "wrote models/en-de (opus-mt-en-de 1)",
    "mtgate verify models/en-de": "PASS",
    T2T_CONVERT: "wrote models/t2t-en-de (t2t-en-de 1)",
    "mtgate convert wmt19-en-de -o models/wmt19-en-de --runtimes onnxruntime --precisions fp32":
        "wrote models/wmt19-en-de (wmt19-en-de 1)",
    "mtgate convert fairseq/ende -o models/fairseq-en-de --runtimes onnxruntime --precisions fp32":
        "wrote models/fairseq-en-de (ende 1)",
    "mtgate convert opus-mt-en-de-npz -o models/npz-en-de --runtimes onnxruntime --precisions fp32":
        "wrote models/npz-en-de (opus-mt-en-de-npz 1)",
    "mtgate convert onmt/ende -o models/onmt-en-de --format opennmt-py --runtimes onnxruntime --precisions fp32":
        "wrote models/onmt-en-de (ende 1)",
    "curl -s localhost:8000/v1/models": '"name":"t2t-en-de"',
    "curl -s localhost:8000/v1/translate -H 'Content-Type: application/json' -d '{\"text\": \"A man is riding a "
    "bike.\"}'": '"model":"opus-mt-en-de"',
    "curl -s localhost:8000/v1/translate -H 'Content-Type: application/json' -d '{\"text\": [\"A man is riding a "
    "bike.\", \"Two dogs play in the snow.\"], \"model\": \"t2t-en-de\", \"beam_size\": 1}'": '"model":"t2t-en-de"',
    "curl -sN localhost:8000/v1/translate/stream -H 'Content-Type: application/json' -d '{\"text\": \"A man is riding "
    "a bike.\", \"beam_size\": 1}'": "event: final",
    "printf '%s\\n' '{\"id\": \"s1\", \"text\": \"A man is riding a bike.\"}' '\"Two dogs play in the snow.\"' | curl "
    "-sN 'localhost:8000/v1/translate/bulk?beam_size=1' -H 'Content-Type: application/x-ndjson' --data-binary @-":
        '"id": "s1"',
    "curl -s -o /dev/null -w '%{http_code}\\n' localhost:8000/v2/health/ready": "200",
    "curl -s localhost:8000/metrics | grep '^mtgate_sentences_total'": 'mtgate_sentences_total{model="opus-mt-en-de"}',
    "batch-score data/test.tfrecord -m models/en-de -o data/test.scored.tfrecord":
        f"batch-score: {TEST_LINES} of {TEST_LINES} records translated",
    "batch-score data/test.en --references data/test.de --server http://127.0.0.1:8000 -o data/test.hyp.de": "BLEU",
    "batch-score data/test.en -m models/en-de -o data/test.sampled.de --temperature 0.8 --top-k 20 --seed 7":
        f"batch-score: {TEST_LINES} of {TEST_LINES} records translated",
    LOADTEST: ": report reports/loadtest-",
    LOADTEST_ADHOC: ": report reports/loadtest-",
    VALIDATE: "report: reports/validate-",
    "mtgate export-triton models/en-de -o triton-repo": "wrote Triton model 'opus-mt-en-de' to triton-repo",
    "curl -s localhost:8000/v1/translate -H 'Authorization: Bearer change-me' -H 'Content-Type: application/json' -d "
    "'{\"text\": \"Hello.\"}'": '"translations"',
}


# ------------------------------------------------------------------------------------------------ reading the README


@dataclass(frozen=True)
class Snippet:
    """One runnable unit of the README: a shell command (continuations joined, comment dropped) or a python block."""

    kind: Literal["sh", "python"]
    text: str
    line: int

    @property
    def id(self) -> str:
        words = re.sub(r"\s+", " ", self.text.strip().splitlines()[0] if self.kind == "python" else self.text)
        return f"L{self.line} {words[:60]}"


def strip_comment(line: str) -> str:
    """``line`` without a trailing shell comment (a ``#`` outside quotes that starts a word)."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def fenced_blocks(text: str) -> list[tuple[str, int, list[str]]]:
    """(language, line number of the first content line, lines) of every fenced block."""
    blocks: list[tuple[str, int, list[str]]] = []
    current: tuple[str, int, list[str]] | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("```"):
            if current is None:
                current = (line[3:].strip(), number + 1, [])
            else:
                blocks.append(current)
                current = None
        elif current is not None:
            current[2].append(line)
    assert current is None, "README.md has an unclosed code fence"
    return blocks


def readme_snippets(text: str | None = None) -> list[Snippet]:
    """Every shell command and python block of the README, in order."""
    snippets: list[Snippet] = []
    for language, first, lines in fenced_blocks(README.read_text(encoding="utf-8") if text is None else text):
        if language == "python":
            snippets.append(Snippet("python", "\n".join(lines) + "\n", first))
        elif language == "sh":
            pending, start = "", first
            for number, raw in enumerate(lines, start=first):
                if not pending:
                    start = number
                line = raw.strip() if not pending else " " + raw.strip()
                if line.endswith("\\"):
                    pending += line[:-1].rstrip()
                    continue
                command = strip_comment(pending + line).strip()
                pending = ""
                if command:
                    snippets.append(Snippet("sh", command, start))
            assert not pending, f"README.md line {start}: a command ends with a backslash"
    return snippets


def programs(command: str) -> list[str]:
    """The program of every part of a shell command line (parts split at ``|``, ``&&``, ``||``, ``;``)."""
    lexer = shlex.shlex(command, posix=False, punctuation_chars=True)  # quotes kept: a quoted | is not a pipe
    lexer.whitespace_split = True
    found: list[str] = []
    expecting = True
    for token in lexer:
        if token in {"|", "||", "&&", ";", "&"}:
            expecting = True
        elif expecting and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", token):
            found.append(token)
            expecting = False
    return found


SNIPPETS = readme_snippets()


# ------------------------------------------------------------------------------------------------ the settings table


def _default_text(field: Any) -> str:
    from pydantic_core import PydanticUndefined

    value = field.default_factory() if field.default is PydanticUndefined else field.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, list):
        items = [str(v.relative_to(ROOT)) if isinstance(v, Path) and v.is_relative_to(ROOT) else str(v) for v in value]
        return "`" + "[" + ", ".join(f'"{item}"' for item in items) + "]`"
    return f"`{value}`"


def _meanings() -> dict[str, str]:
    from serving.server.settings import ServingSettings

    doc = inspect.cleandoc(ServingSettings.__doc__ or "")
    section = doc.split("Attributes:", 1)[1]
    meanings: dict[str, str] = {}
    name = ""
    for line in section.splitlines():
        entry = re.match(r"^    (\w+): (.*)$", line)
        if entry:
            name = entry.group(1)
            meanings[name] = entry.group(2).strip()
        elif line.startswith("        ") and name:
            meanings[name] += " " + line.strip()
    return meanings


def _serve_flags() -> dict[str, str]:
    """Setting -> the ``mtgate serve`` option that overrides it."""
    from serving.commands import serve as serve_cli

    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    option = {action.dest: action.option_strings[0] for action in parser._actions
              if action.option_strings and action.help != argparse.SUPPRESS}  # hidden aliases are not shown
    flags = {setting: f"`{option[dest]}`" for dest, setting in serve_cli._SETTINGS_FLAGS.items()}
    flags["model_dirs"] = f"`{option['models']} PKG` (repeatable)"
    flags["access_log"] = f"`{option['access_log']}`"
    flags["log_level"] = "`mtgate --log-level LEVEL serve`"
    return flags


def settings_table() -> str:
    """The Markdown table of every ServingSettings field: env var, serve flag, default, meaning."""
    from serving.server.settings import ServingSettings

    meanings = _meanings()
    flags = _serve_flags()
    prefix = ServingSettings.model_config.get("env_prefix", "")
    rows = ["| setting | environment variable | `mtgate serve` flag | default | meaning |", "|---|---|---|---|---|"]
    for name, field in ServingSettings.model_fields.items():
        meaning = meanings.get(name, "").replace("``", "`")
        rows.append(f"| `{name}` | `{prefix}{name.upper()}` | {flags.get(name, '-')} | {_default_text(field)} | "
                    f"{meaning} |")
    return "\n".join(rows) + "\n"


_TABLE = re.compile(r"(<!-- settings-table[^\n]*-->\n)(.*?)(<!-- /settings-table -->)", re.DOTALL)


def readme_with_settings_table(text: str) -> str:
    match = _TABLE.search(text)
    assert match is not None, "README.md lost its <!-- settings-table --> markers"
    return text[: match.start(2)] + settings_table() + text[match.end(2) :]


# ------------------------------------------------------------------------------------------------ the tour


def _tfrecord(path: Path, pairs: list[tuple[str, str]]) -> None:
    """``tf.train.Example``s {inputs, targets} as bytes features, encoded by hand (no tensorflow import here):
    Example{1: Features{1: map<string, Feature{1: BytesList{1: bytes}}>}}."""
    from batch.framing import frame_record

    def field(number: int, payload: bytes) -> bytes:
        size, length = len(payload), b""
        while True:
            byte, size = size & 0x7F, size >> 7
            length += bytes([byte | (0x80 if size else 0)])
            if not size:
                return bytes([number << 3 | 2]) + length + payload

    def feature_entry(key: str, value: str) -> bytes:
        feature = field(1, field(1, value.encode()))
        return field(1, field(1, key.encode()) + field(2, feature))

    with path.open("wb") as f:
        for source, reference in pairs:
            example = field(1, feature_entry("inputs", source) + feature_entry("targets", reference))
            f.write(frame_record(example))


def _local_only(text: str) -> None:
    hosts = re.findall(r"https?://([^/:\s'\"]+)", text) + re.findall(r"['\"\s]([A-Za-z0-9.-]+):\d{2,5}\b", text)
    assert set(hosts) <= {"127.0.0.1", "localhost"}, f"refusing to run a snippet that names other hosts: {hosts}"


class Tour:
    """The scratch directory, the environment and the background server the README's snippets run with."""

    def __init__(self, work: Path, demo: Path) -> None:
        self.work = work
        self.demo = demo
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("MTGATE_")}
        self.env["PATH"] = f"{BIN}{os.pathsep}{self.env.get('PATH', '')}"
        self.env["NO_PROXY"] = self.env["no_proxy"] = "127.0.0.1,localhost"
        self.server: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        self.grpc_port: int | None = None
        self.server_log = work / "serve.log"

    def prepare(self, snippet: Snippet) -> str:
        text = snippet.text
        for old, new in REWRITES.get(text, []):
            assert old in text, f"REWRITES for {text!r}: {old!r} not in the command"
            text = text.replace(old, new)
        if snippet.kind == "sh" and not re.search(r"(^|\s)(-m|--model|--server)(\s|=)", text):
            text = re.sub(r"(mtgate\s+(?:translate|serve|batch-score)|(?<![\w-])batch-score)(?=\s|$)",
                          lambda m: f"{m.group(1)} -m {shlex.quote(str(self.demo))}", text, count=1)
        if re.search(r"\b(localhost|127\.0\.0\.1):8000\b", text) and not self.is_serve(text):
            assert self.port is not None, "this snippet needs a server, but no `mtgate serve` ran before it"
            text = re.sub(r"\b(localhost|127\.0\.0\.1):8000\b", f"127.0.0.1:{self.port}", text)
        if re.search(r"\b(localhost|127\.0\.0\.1):8001\b", text) and not self.is_serve(text):
            assert self.grpc_port is not None, "this snippet needs gRPC, but no `mtgate serve --grpc-port` ran before it"
            text = re.sub(r"\b(localhost|127\.0\.0\.1):8001\b", f"127.0.0.1:{self.grpc_port}", text)
        _local_only(text)
        return text

    @staticmethod
    def is_serve(command: str) -> bool:
        return programs(command)[:1] == ["mtgate"] and re.search(r"(^|\s)mtgate\s+serve(\s|$)", command) is not None

    def run(self, snippet: Snippet) -> subprocess.CompletedProcess[str]:
        text = self.prepare(snippet)
        if snippet.kind == "python":
            argv = [sys.executable, "-c", text]
        elif self.is_serve(text):
            self.start_server(text)
            return subprocess.CompletedProcess(text, 0, "", "")
        else:
            argv = ["bash", "-o", "pipefail", "-c", text]
        return subprocess.run(argv, cwd=self.work, env=self.env, capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)

    def start_server(self, command: str) -> None:
        from loadtest.cli import free_port

        self.stop_server()
        port = free_port()
        if re.search(r"--port[ =]\d+", command):
            command = re.sub(r"--port[ =]\d+", f"--port {port}", command)
        else:
            command += f" --port {port}"
        grpc_port = free_port() if re.search(r"--grpc-port[ =]\d+", command) else None
        if grpc_port is not None:
            command = re.sub(r"--grpc-port[ =]\d+", f"--grpc-port {grpc_port}", command)
        with self.server_log.open("ab") as log:
            log.write(f"$ {command}\n".encode())
            log.flush()
            # its own process group, so that stopping it reaches mtgate behind bash
            self.server = subprocess.Popen(["bash", "-c", command], cwd=self.work, env=self.env, stdout=log,
                                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        wait_until_ready(f"http://127.0.0.1:{port}", self.server, READY_TIMEOUT_S,
                         lambda: f"`{command}`: {self.log_tail()}")
        self.port = port
        self.grpc_port = grpc_port

    def log_tail(self) -> str:
        return "\n".join(self.server_log.read_text(encoding="utf-8", errors="replace").splitlines()[-20:])

    def stop_server(self) -> None:
        server, self.server, self.port, self.grpc_port = self.server, None, None, None
        if server is None or server.poll() is not None:
            return
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


@pytest.fixture(scope="module")
def tour(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tour]:
    pytest.importorskip("torch")
    from converters.convert import convert
    from tests.utils.marian_factory import make_marian_dir

    assert (BIN / "mtgate").exists() and (BIN / "batch-score").exists(), f"console scripts not installed in {BIN}"
    work = tmp_path_factory.mktemp("readme")
    source = make_marian_dir(work / "opus-mt-en-de")
    from tests.utils.fairseq_factory import make_fairseq_dir
    from tests.utils.fsmt_factory import make_fsmt_dir
    from tests.utils.marian_npz_factory import make_marian_npz_dir
    from tests.utils.onmt_factory import make_onmt_dir

    make_fsmt_dir(work / "wmt19-en-de")
    make_fairseq_dir(work / "fairseq" / "ende")
    make_marian_npz_dir(work / "opus-mt-en-de-npz")
    make_onmt_dir(work / "onmt" / "ende")
    demo = tmp_path_factory.mktemp("demo-stand-in") / "demo-en-de"
    convert(source, demo, runtimes=["onnxruntime"], precisions=["fp32"], verify=False, name="demo-en-de",
            version="test")

    shutil.copytree(DATA / "t2t" / "transformer_test_ckpt", work / "t2t_train" / "ende",
                    ignore=shutil.ignore_patterns("hparams.json"))
    (work / "t2t_data").mkdir()
    shutil.copy(DATA / "t2t" / "vocab.translate_ende_wmt8k.8192.subwords", work / "t2t_data")

    (work / "data").mkdir()
    sources = (DATA / "marian" / "corpus.en").read_text(encoding="utf-8").splitlines()[:TEST_LINES]
    references = (DATA / "marian" / "corpus.de").read_text(encoding="utf-8").splitlines()[:TEST_LINES]
    (work / "data" / "test.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (work / "data" / "test.de").write_text("\n".join(references) + "\n", encoding="utf-8")
    _tfrecord(work / "data" / "test.tfrecord", list(zip(sources, references, strict=True)))

    targets = work / "loadtest" / "targets"
    targets.mkdir(parents=True)
    for path in (ROOT / "loadtest" / "targets").glob("*.yaml"):
        text = path.read_text(encoding="utf-8")
        (targets / path.name).write_text(re.sub(r"(?m)^(\s*duration:\s*)\S+", r"\g<1>1s", text), encoding="utf-8")

    running = Tour(work, demo)
    try:
        yield running
    finally:
        running.stop_server()


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.id for s in SNIPPETS])
def test_readme_command(snippet: Snippet, request: pytest.FixtureRequest) -> None:
    """One README snippet; they depend on each other, so run the whole module (parametrized in README order)."""
    if snippet.text in SKIPPED:
        pytest.skip(SKIPPED[snippet.text])
    tour: Tour = request.getfixturevalue("tour")  # after the skip: skipped commands need no models
    started = time.monotonic()
    result = tour.run(snippet)
    took = time.monotonic() - started
    shown = f"`{snippet.text}` (README line {snippet.line}, {took:.1f} s)"
    details = f"\n--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}"
    assert result.returncode in VERDICTS.get(snippet.text, {0}), f"{shown} exited {result.returncode}{details}"
    if snippet.text in EXPECT:
        assert EXPECT[snippet.text] in result.stdout, f"{shown}: no {EXPECT[snippet.text]!r} in stdout{details}"
    if snippet.kind == "sh" and "curl" in programs(snippet.text):
        assert '"error"' not in result.stdout, f"{shown} answered an error{details}"
    if snippet.kind == "python":
        assert result.stdout.strip(), f"{shown} printed nothing{details}"


def test_every_command_is_run_or_skipped() -> None:
    fences = {language for language, _, _ in fenced_blocks(README.read_text(encoding="utf-8"))}
    assert fences <= {"sh", "python", "text", "json"}, f"unexpected fences {fences - {'sh', 'python', 'text', 'json'}}"
    commands = {s.text for s in SNIPPETS if s.kind == "sh"}
    unchecked = [c for c in commands if c not in SKIPPED and not set(programs(c)) <= RUNNABLE]
    assert not unchecked, f"README commands neither run by this test nor in SKIPPED: {unchecked}"
    for table in (SKIPPED, EXPECT, VERDICTS, REWRITES):
        stale = [c for c in table if c not in commands]
        assert not stale, f"listed here but not in README.md (update the test): {stale}"


def test_parsing_the_readme() -> None:
    text = "\n".join([
        "```sh", "mtgate a  # comment", "", "# only a comment", "curl -s 'x # not a comment' \\", "    -d y",
        "```", "```text", "mtgate not-run", "```", "```python", "print(1)", "```",
    ])
    assert readme_snippets(text) == [Snippet("sh", "mtgate a", 2), Snippet("sh", "curl -s 'x # not a comment' -d y", 5),
                                     Snippet("python", "print(1)\n", 12)]
    assert programs("A=1 B=2 mtgate serve | grep x && printf '|' > out") == ["mtgate", "grep", "printf"]


def test_settings_table_lists_every_setting() -> None:
    from serving.server.settings import ServingSettings

    text = README.read_text(encoding="utf-8")
    match = _TABLE.search(text)
    assert match is not None, "README.md lost its <!-- settings-table --> markers"
    listed = re.findall(r"^\| `(\w+)` \| `MTGATE_(\w+)` \|", match.group(2), flags=re.MULTILINE)
    assert [name for name, _ in listed] == list(ServingSettings.model_fields)
    assert all(env == name.upper() for name, env in listed)
    assert all(_meanings().get(name) for name in ServingSettings.model_fields), "a setting has no docstring entry"
    assert match.group(2) == settings_table(), (
        "README.md's settings table is out of date: run .venv/bin/python -m tests.test_readme --write-settings-table")


def test_bench_table_placeholder() -> None:
    text = README.read_text(encoding="utf-8")
    assert text.count("<!-- bench-table -->") == 1 and text.count("<!-- /bench-table -->") == 1
    assert text.index("<!-- bench-table -->") < text.index("<!-- /bench-table -->")


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    cli.add_argument("--write-settings-table", action="store_true", help="rewrite README.md's settings table")
    if cli.parse_args().write_settings_table:
        README.write_text(readme_with_settings_table(README.read_text(encoding="utf-8")), encoding="utf-8")
    else:
        sys.stdout.write(settings_table())
