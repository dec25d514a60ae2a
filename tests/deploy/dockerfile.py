"""The Dockerfile, parsed: its instructions by stage (continuation lines joined, comments dropped) and what each
stage copies, runs and sets, for the tests that check it without a Docker engine (test_dockerfile.py: lint and
structure; test_image_install.py: the installs replayed), and Docker's .dockerignore matching."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


@dataclass(frozen=True)
class Instruction:
    stage: str
    keyword: str
    args: str


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions in order, continuation lines joined, comments dropped, each tagged with its stage name."""
    instructions: list[Instruction] = []
    stage = ""
    logical = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not logical and (not stripped or stripped.startswith("#")):
            continue
        if logical and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            logical += stripped[:-1] + " "
            continue
        logical += stripped
        keyword, _, args = logical.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            match = re.search(r"\bAS\s+(\S+)\s*$", args, flags=re.I)
            stage = match.group(1) if match else args
        instructions.append(Instruction(stage, keyword, " ".join(args.split())))
        logical = ""
    return instructions


INSTRUCTIONS = parse_dockerfile(DOCKERFILE.read_text(encoding="utf-8"))
STAGES = [i.stage for i in INSTRUCTIONS if i.keyword == "FROM"]
FINAL = STAGES[-1]
FORBIDDEN = ("torch", "transformers")  # never in any image
BATCH = "batch"  # `docker build --target batch`: the image of deploy/k8s/batch-score-job.yaml


def ancestry(stage: str) -> list[str]:
    """``stage`` and the stages it is built ``FROM``, the first stage of the chain first."""
    [source] = [i.args.split()[0] for i in INSTRUCTIONS if i.keyword == "FROM" and i.stage == stage]
    return [*ancestry(source), stage] if source in STAGES else [stage]


def base_image(stage: str) -> str:
    """The external image at the root of ``stage``'s chain."""
    [source] = [i.args.split()[0] for i in INSTRUCTIONS if i.keyword == "FROM" and i.stage == ancestry(stage)[0]]
    return source


def of(keyword: str, stage: str | None = None, inherited: bool = False) -> list[str]:
    """The arguments of each ``keyword`` instruction (of ``stage``; ``inherited``: and of the stages it is built on)."""
    stages = None if stage is None else (ancestry(stage) if inherited else [stage])
    return [i.args for i in INSTRUCTIONS if i.keyword == keyword and (stages is None or i.stage in stages)]


def env_of(stage: str) -> dict[str, str]:
    """The environment of an image of ``stage`` (its own ENV and what it inherits)."""
    env: dict[str, str] = {}
    for args in of("ENV", stage, inherited=True):
        for token in shlex.split(args):
            key, _, value = token.partition("=")
            env[key] = value
    return env


def copies(stage: str) -> list[tuple[str, PurePosixPath]]:
    """(source, absolute path in the image) of each COPY from the build context (not ``--from``) in ``stage``."""
    found = []
    workdir = PurePosixPath("/")
    for i in INSTRUCTIONS:
        if i.stage not in ancestry(stage):
            continue
        if i.stage != stage and i.keyword == "COPY":
            continue
        if i.keyword == "WORKDIR":
            workdir = workdir / i.args
        if i.keyword != "COPY" or "--from" in i.args:
            continue
        *sources, dest = [p for p in i.args.split() if not p.startswith("--")]
        for source in sources:
            target = workdir / dest
            if dest.endswith("/") or dest == ".":  # into a directory: a file keeps its name
                target = target / PurePosixPath(source).name
            found.append((source, target))
    return found


def run_steps(stage: str) -> list[list[str]]:
    """The ``&&``-joined commands of each RUN of ``stage``, without BuildKit's ``--mount`` flags."""
    steps = []
    for args in of("RUN", stage):
        command = " ".join(p for p in args.split() if not p.startswith("--mount="))
        steps.append([s.strip() for s in command.split("&&")])
    return steps


def dockerignore_excludes(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent directories decides."""
    excluded = False
    parts = PurePosixPath(path).parts
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern[1:] if negate else pattern
        body = body.strip("/")
        regex = re.escape(body).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*").replace(r"\*", "[^/]*")
        if any(re.fullmatch(regex, c) for c in candidates):
            excluded = not negate
    return excluded
