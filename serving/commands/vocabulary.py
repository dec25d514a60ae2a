"""The one vocabulary of command-line options: every option of every ``mtgate`` subcommand and ``batch-score``, what it
is and its old spellings (README.md's option table is generated from :data:`VOCABULARY`;
``tests/test_cli_vocabulary.py`` reads every command's parser against it). The options themselves are registered
by ``serving.commands.options``' ``add_*`` functions.
"""

from __future__ import annotations

from typing import NamedTuple


class Alias(NamedTuple):
    """An old spelling of an option, still accepted and hidden from ``--help``.

    Attributes:
        spelling: the old flag.
        commands: the commands that accept it (empty: every command that has the option).
        deprecated: prints one warning line and goes in the next release; False: a synonym that stays (another
            tool's name for the option).
        note: how README.md's table qualifies it.
    """

    spelling: str
    commands: tuple[str, ...] = ()
    deprecated: bool = True
    note: str = ""

    def text(self) -> str:
        where = ", ".join(self.commands)
        qualifier = "; ".join(part for part in (where, self.note) if part)
        return f"`{self.spelling}`" + (f" ({qualifier})" if qualifier else "")


class Term(NamedTuple):
    """One option of the vocabulary: its spelling, what it is, and its old spellings."""

    option: str
    meaning: str
    aliases: tuple[Alias, ...] = ()

    @property
    def flags(self) -> tuple[str, ...]:
        """The flags of :attr:`option` (``-m, --model PKG`` -> ``("-m", "--model")``)."""
        return tuple(word.rstrip(",") for word in self.option.split() if word.startswith("-"))


VOCABULARY: tuple[Term, ...] = (
    Term("-m, --model PKG", "a model package (what `mtgate convert` writes), in every command that reads one "
         "(`verify` and `export-triton` also take it as their first argument); `serve` takes several",
         (Alias("--candidate", ("validate",)),)),
    Term("--baseline PKG", "the package a candidate is compared with (validate)"),
    Term("--runtime NAME", "the runtime: `onnxruntime` or `openvino`; `convert` writes several (`--runtimes A,B`), "
         "`validate` runs the baseline on `--baseline-runtime`",
         (Alias("--backend"), Alias("--baseline-backend", ("validate",), note="now `--baseline-runtime`"))),
    Term("--precision NAME", "which artifact of the package: `auto` (the default: int8 where the package's "
         "manifest shows it costs at most 1 BLEU, else fp32; `serving/package/precision.py`), `fp32` or `int8`; "
         "`convert` writes several (`--precisions A,B`)", (Alias("--precision", ("convert",), note="now `--precisions`"),)),
    Term("--threads N", "intra-op threads of the runtime"),
    Term("--shortlist", "decode with the package's vocabulary shortlist (`mtgate convert --shortlist-corpus`; "
         "onnxruntime)"),
    Term("--beam-size N", "beams (1: greedy search); at most the server's `max_beam_size`"),
    Term("--max-length N", "most generated tokens per sentence, EOS excluded"),
    Term("--num-hypotheses N", "n-best: translations per sentence, best first (beam search)"),
    Term("--min-length N", "fewest generated tokens per sentence, after the target prefix"),
    Term("--repetition-penalty X", "above 1 discourages repeating a token (transformers' `repetition_penalty`)"),
    Term("--no-repeat-ngram-size N", "no n-gram of this size occurs twice in a translation"),
    Term("--disable-unk", "never generate the unknown token"),
    Term("--temperature X, --top-k N, --top-p X", "sample instead of searching (beam 1), from the model's "
         "distribution warped by these"),
    Term("--seed N", "makes sampling reproducible (and turns it on)"),
    Term("--target-prefix TEXT", "the start every translation is forced to (CTranslate2's `target_prefix`)"),
    Term("--max-batch-size N", "most sentences in one engine batch (Triton's `max_batch_size`); default 32, "
         "`batch-score` 64 (offline: no record waits for a batch; `serving.server.settings`)",
         (Alias("--max-batch-sentences"), Alias("--batch-size", ("validate",)))),
    Term("--max-batch-tokens N", "most padded source tokens times beams (sentences x beams x longest) in one engine "
         "batch; default 4096, `batch-score` 2048 (a worker per core, each holding a batch)",
         (Alias("--max-tokens", ("batch-score",)),)),
    Term("--max-queue-delay-us US", "longest wait of a queued sentence for a fuller batch, in microseconds "
         "(Triton's `max_queue_delay_microseconds`)", (Alias("--max-batch-delay-ms", note="milliseconds"),)),
    Term("--max-queue-size N", "most sentences waiting; beyond it 503 with Retry-After (Triton's `max_queue_size`)",
         (Alias("--queue-capacity"),)),
    Term("--host ADDR", "the address `serve` listens on (uvicorn's `--host`)"),
    Term("--server URL", "a running server's base URL: `batch-score` translates through it, `loadtest` loads it",
         (Alias("--host", ("loadtest",), deprecated=False, note="Locust's name, kept"),)),
    Term("--api-key KEY", "sent or required as `Authorization: Bearer KEY` (default `$MTGATE_API_KEY`)"),
    Term("--model-name NAME", "a model a server serves, by its name (loadtest, batch-score --server)"),
    Term("-o, --output PATH", "where a command writes its result (atomically; refused before any work when it "
         "cannot be written)"),
    Term("--log-level LEVEL", "DEBUG, INFO, WARNING, ERROR; before or after the subcommand"),
    Term("--checkpoint DIR", "a training checkpoint: what `verify` compares a package with, what "
         "`python -m benchmarks.bench` measures", (Alias("--source", ("verify",)), Alias("--model", ("bench",)))),
)
"""Every shared option, in the order README.md's table lists them."""


def vocabulary_table() -> str:
    """README.md's option table (Markdown), from :data:`VOCABULARY`."""
    rows = ["| option | what it is | old spelling (hidden, still accepted) |", "|---|---|---|"]
    rows += [f"| `{t.option}` | {t.meaning} | {', '.join(a.text() for a in t.aliases) or '-'} |" for t in VOCABULARY]
    return "\n".join(rows) + "\n"
