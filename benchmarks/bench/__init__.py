"""``python -m benchmarks.bench``: generated tokens per second of mtgate's engines side by side with peer engines.

Run from a checkout of the repository (it is not part of the wheel): it converts models with ``mtgate convert``, keeps
its models in a cache folder and starts one process per engine. benchmarks/README.md has the workload, the
engines, the checks and the commands.

The workload: a Marian model (a random-weight model of the opus-mt-en-de shape built from a config with a fixed
seed, or any Hugging Face Marian directory given with ``--checkpoint``), N source sentences (Multi30k test_2016
lengths, or a file), exactly ``--new-tokens`` generated tokens per sentence, greedy and beam search, batch 1 and 16,
on a fixed number of threads. Every engine runs in its own process, one after another, over the same token ids and
the same batches, once per case and round (``--rounds``, ``--interleave``; the engines' order reversed from one to the
next):

- mtgate: every runtime x precision of a package converted once from the model (``mtgate convert``, cached), run
  through ``Translator.translate`` with this interpreter (:mod:`benchmarks.bench.mtgate_worker`);
- peers (``benchmarks/peers.py``, run with ``--peer-python``, a venv from ``benchmarks/setup_peers_venv.sh``):
  transformers fp32, CTranslate2 float32 and int8, optimum ONNX Runtime fp32 and int8 (dynamic), optimum-intel
  OpenVINO fp32, default and int8 weights. Peer artifacts are converted once from the same directory and cached.

Each engine process warms up, then times ``--repeats`` passes over all sentences; the harness reports median tokens/s
over every round's passes, their spread ((max - min) / median), ms per sentence, CPU seconds per pass and the peak
RSS. It checks that every engine generated exactly ``sentences x new tokens`` tokens and that the fp32 engines
generated the same tokens as the reference (transformers fp32, else the first fp32 engine), computes ratios against
the best peer (paired round by round: the median of the rounds' ratios), and writes JSON and Markdown.

Modules, in the order a run uses them:

=================  ==========================================================================================
``cli``            the options, the resolved :class:`~benchmarks.bench.cli.Plan`, ``main``
``workload``       sentences, random source ids of the same lengths, summaries
``engines``        which engines exist (:class:`~benchmarks.bench.engines.EngineSpec`)
``rounds``         builds/converts the models once (cached), runs one process per engine, case and round, writes
                   the reports
``measure``        the measuring loop every engine process runs (standard library and numpy only: the peers'
                   interpreter imports it without mtgate's dependencies)
``mtgate_worker``  mtgate's engine process (``python -m benchmarks.bench.mtgate_worker CONFIG``)
``analysis``       token checks, agreement with the fp32 reference, best peer, ratios and targets
``report``         the Markdown report
=================  ==========================================================================================
"""
