"""``batch-score``: translate and score TFRecord, JSONL or text files, sharded and resumable.

One way through the modules (each imports only those before it):

- ``errors``: what goes wrong, by who must act (exit 2 for the command, 1 for the run);
- ``example``: ``tf.train.Example`` without tensorflow (protobuf only);
- ``framing``: TFRecord framing (crc32c, resync after corruption) and each file's record positions;
- ``inputs``: which files, in which format, with which references; every record position, numbered (``scan``);
- ``schema``: where the source and the reference live; ``records``: an entry's bytes -> ``Record`` or ``Reject``;
- ``job``: what to read and write and how to translate, with their fingerprints;
- ``outputs``: output items, atomic writes, output paths checked up front; ``state``: ``<output>.partial/``, commits
  and the resume check; ``assembly``: the output, rejects and summary from the committed chunks;
- ``workers`` (in process, in worker processes), ``remote`` (through a server): what translates a chunk;
- ``resources``: workers x threads from the cores and memory; ``scoring``: BLEU, chrF, TER;
- ``run_loop``: the run loop; ``report``: what is said on the console; ``cli``: the command.
"""
