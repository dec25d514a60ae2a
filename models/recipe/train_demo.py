"""Train the bundled EN->DE demo model: a small Marian Transformer on Multi30k.

Resumable: every epoch writes ``WORK/checkpoint.pt`` atomically; rerunning the same
command continues from it. When all epochs are done (or with ``--export-only``), the
model is written in the Hugging Face opus-mt layout to ``WORK/export`` (config.json,
generation_config.json, model.safetensors, source.spm, target.spm, vocab.json), which
``mtgate convert`` turns into a model package.

    python models/recipe/train_demo.py --data MULTI30K --work build/demo-train

``MULTI30K``: a folder with Multi30k task 1's ``train.{en,de}.gz`` and ``val.{en,de}.gz``.

``--paragraphs F`` adds paragraph pairs to every epoch: the training pairs are cut into consecutive spans of 2-8 pairs
(drawn anew each epoch from the seed), a fraction F of the spans is kept and each becomes one pair (sources joined
with a space, targets likewise; ``paragraphs.py``), so that the model learns to translate every sentence of a long
input. ``--init-from DIR`` starts from an exported model and reuses its SentencePiece model, so ids do not change.
Validation (greedy, the first 500 val pairs): BLEU and the mean output/input token ratio of the single sentences
and of the paragraphs made of them (4-8 consecutive sentences).

Data: Multi30k task 1 (Elliott et al., 2016, W16-3210), research and education use only.
Needs the ``train`` extra (torch, transformers, sentencepiece, sacrebleu); never imported
by the serving path.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import math
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import sentencepiece as spm
import torch
from paragraphs import eval_paragraphs, join, spans
from transformers import GenerationConfig, MarianConfig, MarianMTModel

logger = logging.getLogger("train_demo")

EOS_ID = 0
UNK_ID = 1
MAX_POSITIONS = 256


def read_lines(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.strip() for line in f]


def train_sentencepiece(data: Path, work: Path, vocab_size: int, init_from: Path | None) -> Path:
    """Joint unigram model on both sides; ids: eos 0, unk 1, pieces..., pad appended last. With ``init_from``, that
    model's own (``source.spm``; the demo's target.spm is the same file)."""
    model_path = work / "spm.model"
    if model_path.exists():
        return model_path
    if init_from is not None:
        shutil.copy(init_from / "source.spm", model_path)
        return model_path
    corpus = work / "spm_corpus.txt"
    lines = read_lines(data / "train.en.gz") + read_lines(data / "train.de.gz")
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(work / "spm"),
        vocab_size=vocab_size - 1,  # the pad token is appended after the pieces
        model_type="unigram",
        character_coverage=1.0,
        eos_id=EOS_ID,
        unk_id=UNK_ID,
        bos_id=-1,
        pad_id=-1,
        num_threads=2,
        minloglevel=2,
    )
    return model_path


def make_config(vocab_size: int, args: argparse.Namespace) -> MarianConfig:
    pad_id = vocab_size - 1
    return MarianConfig(
        vocab_size=vocab_size,
        decoder_vocab_size=vocab_size,
        d_model=args.d_model,
        encoder_layers=args.layers,
        decoder_layers=args.layers,
        encoder_attention_heads=args.heads,
        decoder_attention_heads=args.heads,
        encoder_ffn_dim=args.ffn,
        decoder_ffn_dim=args.ffn,
        activation_function="swish",
        max_position_embeddings=MAX_POSITIONS,
        dropout=args.dropout,
        attention_dropout=0.0,
        activation_dropout=0.0,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        pad_token_id=pad_id,
        eos_token_id=EOS_ID,
        decoder_start_token_id=pad_id,
        forced_eos_token_id=EOS_ID,
    )


def encode(sp: spm.SentencePieceProcessor, lines: list[str], max_len: int) -> list[list[int]]:
    return [ids[: max_len - 1] + [EOS_ID] for ids in sp.encode(lines)]


def paragraph_pairs(
    sp: spm.SentencePieceProcessor, src_lines: list[str], tgt_lines: list[str], fraction: float, rng: random.Random
) -> tuple[list[list[int]], list[list[int]]]:
    """One epoch's paragraph pairs: spans of 2-8 consecutive pairs, each kept with probability ``fraction``; a pair
    longer than the model's positions on either side (EOS included) is left out rather than cut."""
    groups = [g for g in spans(len(src_lines), 2, 8, rng) if rng.random() < fraction]
    src = [ids + [EOS_ID] for ids in sp.encode(join(src_lines, groups))]
    tgt = [ids + [EOS_ID] for ids in sp.encode(join(tgt_lines, groups))]
    keep = [i for i in range(len(src)) if len(src[i]) <= MAX_POSITIONS and len(tgt[i]) <= MAX_POSITIONS]
    return [src[i] for i in keep], [tgt[i] for i in keep]


def make_batches(
    src: list[list[int]], tgt: list[list[int]], max_tokens: int, rng: random.Random
) -> list[list[int]]:
    order = sorted(range(len(src)), key=lambda i: (len(src[i]), len(tgt[i]), rng.random()))
    batches: list[list[int]] = []
    batch: list[int] = []
    longest = 0
    for i in order:
        longest_if_added = max(longest, len(src[i]), len(tgt[i]))
        if batch and longest_if_added * (len(batch) + 1) > max_tokens:
            batches.append(batch)
            batch, longest_if_added = [], max(len(src[i]), len(tgt[i]))
        batch.append(i)
        longest = longest_if_added
    if batch:
        batches.append(batch)
    rng.shuffle(batches)
    return batches


def pad(seqs: list[list[int]], value: int) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    return torch.tensor([s + [value] * (width - len(s)) for s in seqs], dtype=torch.long)


def lr_at(step: int, args: argparse.Namespace) -> float:
    step = max(step, 1)
    return args.lr * min(step / args.warmup, math.sqrt(args.warmup / step))


def save_atomic(obj: Any, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


@torch.no_grad()
def greedy(model: MarianMTModel, sp: spm.SentencePieceProcessor, src: list[str], batch: int) -> list[list[int]]:
    """Greedy translations (ids without EOS), up to the model's positions; batches of similar lengths."""
    pad_id = model.config.pad_token_id
    src_ids = encode(sp, src, MAX_POSITIONS)
    order = sorted(range(len(src)), key=lambda i: len(src_ids[i]))
    hyps: list[list[int]] = [[] for _ in src]
    for start in range(0, len(order), batch):
        chunk = order[start : start + batch]
        ids = pad([src_ids[i] for i in chunk], pad_id)
        out = model.generate(input_ids=ids, attention_mask=ids != pad_id, num_beams=1, max_new_tokens=MAX_POSITIONS - 1)
        for i, row in zip(chunk, out.tolist(), strict=True):
            row = [t for t in row[1:] if t != pad_id]
            hyps[i] = row[: row.index(EOS_ID)] if EOS_ID in row else row
    return hyps


def evaluate(model: MarianMTModel, sp: spm.SentencePieceProcessor, src: list[str], ref: list[str]) -> dict[str, float]:
    """Greedy BLEU and mean output/input token ratio of the single sentences, then of their paragraphs."""
    import sacrebleu

    model.eval()
    record: dict[str, float] = {}
    para_src, groups = eval_paragraphs(src)
    for name, lines, refs, batch in (("val500", src, ref, 64), ("val500_paragraphs", para_src, join(ref, groups), 8)):
        hyps = greedy(model, sp, lines, batch)
        src_lengths = [len(ids) for ids in sp.encode(lines)]
        record[f"{name}_greedy_bleu"] = float(sacrebleu.corpus_bleu([sp.decode(h) for h in hyps], [refs]).score)
        record[f"{name}_length_ratio"] = sum(len(h) / n for h, n in zip(hyps, src_lengths, strict=True)) / len(hyps)
    model.train()
    return record


def export(model: MarianMTModel, sp_path: Path, out: Path, num_beams: int) -> None:
    """Write the opus-mt layout; weights stored in float16 to keep the bundled source small."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.config.dropout = 0.1
    model.half().save_pretrained(tmp, safe_serialization=True)
    model.float()
    pad_id = model.config.pad_token_id
    GenerationConfig(
        num_beams=num_beams,
        max_length=256,
        bad_words_ids=[[pad_id]],
        decoder_start_token_id=pad_id,
        pad_token_id=pad_id,
        eos_token_id=EOS_ID,
        forced_eos_token_id=EOS_ID,
    ).save_pretrained(tmp)
    shutil.copy(sp_path, tmp / "source.spm")
    shutil.copy(sp_path, tmp / "target.spm")
    sp = spm.SentencePieceProcessor(model_file=str(sp_path))
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    vocab["<pad>"] = pad_id
    (tmp / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=1), encoding="utf-8")
    (tmp / "tokenizer_config.json").write_text(
        json.dumps({"source_lang": "en", "target_lang": "de", "model_max_length": 256}), encoding="utf-8"
    )
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="Multi30k folder with train.{en,de}.gz, val.{en,de}.gz")
    parser.add_argument("--work", type=Path, required=True, help="working folder (checkpoints, logs, export)")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ffn", type=int, default=1024)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--label-smoothing", type=float, default=0.1)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=800)
    parser.add_argument("--max-tokens", type=int, default=3000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--eval-every", type=int, default=2, help="greedy val BLEU every N epochs (0: never)")
    parser.add_argument(
        "--paragraphs", type=float, default=0.0, metavar="F",
        help="add paragraph pairs (2-8 consecutive pairs joined) covering a fraction F of the training pairs per epoch",
    )
    parser.add_argument("--export-only", action="store_true", help="export the latest checkpoint and stop")
    parser.add_argument(
        "--init-from", type=Path, help="start from an exported model (e.g. the bundled source) instead of random weights"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)

    sp_path = train_sentencepiece(args.data, args.work, args.vocab_size, args.init_from)
    sp = spm.SentencePieceProcessor(model_file=str(sp_path))
    src_lines, tgt_lines = read_lines(args.data / "train.en.gz"), read_lines(args.data / "train.de.gz")
    src, tgt = encode(sp, src_lines, 128), encode(sp, tgt_lines, 128)
    val_src, val_ref = read_lines(args.data / "val.en.gz")[:500], read_lines(args.data / "val.de.gz")[:500]

    torch.manual_seed(args.seed)
    config = make_config(args.vocab_size, args)
    model = MarianMTModel(config)
    if args.init_from is not None:
        # Continuing from a published export: its weights (fp16 on disk) seed a fresh run with a fresh optimizer.
        model = MarianMTModel.from_pretrained(args.init_from, dtype=torch.float32)
        model.config.dropout = args.dropout
        if model.config.vocab_size != sp.get_piece_size() + 1:
            parser.error(f"{args.init_from}: vocabulary of {model.config.vocab_size} ids, its source.spm has "
                         f"{sp.get_piece_size()} pieces (+ pad expected)")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0)
    ckpt_path = args.work / "checkpoint.pt"
    epoch, step, history = 0, 0, []
    if ckpt_path.exists():
        state = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        epoch, step, history = state["epoch"], state["step"], state["history"]
        logger.info("resumed after epoch %d (step %d)", epoch, step)
    n_params = sum(p.numel() for p in model.parameters())
    logger.info("model: %d parameters, %d training pairs", n_params, len(src))
    if args.init_from is not None and not history and args.eval_every and not args.export_only:
        history.append({"epoch": 0} | evaluate(model, sp, val_src, val_ref))  # the starting point
        logger.info("before training %s", history[-1])

    pad_id = config.pad_token_id
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=-100, label_smoothing=args.label_smoothing)
    model.train()
    while epoch < args.epochs and not args.export_only:
        rng = random.Random(args.seed * 1000 + epoch)
        started, total_loss, total_tokens = time.time(), 0.0, 0
        epoch_src, epoch_tgt = src, tgt
        if args.paragraphs > 0:
            para_src, para_tgt = paragraph_pairs(sp, src_lines, tgt_lines, args.paragraphs, rng)
            epoch_src, epoch_tgt = src + para_src, tgt + para_tgt
        for batch in make_batches(epoch_src, epoch_tgt, args.max_tokens, rng):
            input_ids = pad([epoch_src[i] for i in batch], pad_id)
            labels = pad([epoch_tgt[i] for i in batch], -100)
            decoder_input_ids = torch.cat(
                [torch.full((len(batch), 1), pad_id), labels[:, :-1].masked_fill(labels[:, :-1] == -100, pad_id)], dim=1
            )
            logits = model(
                input_ids=input_ids,
                attention_mask=input_ids != pad_id,
                decoder_input_ids=decoder_input_ids,
            ).logits
            loss = loss_fn(logits.view(-1, logits.size(-1)), labels.view(-1))
            step += 1
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, args)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            n_tok = int((labels != -100).sum())
            total_loss += float(loss.detach()) * n_tok
            total_tokens += n_tok
            if step % 50 == 0:
                logger.info("epoch %d step %d loss %.3f lr %.2e", epoch + 1, step, float(loss), lr_at(step, args))
        epoch += 1
        record: dict[str, float] = {
            "epoch": epoch,
            "pairs": len(epoch_src),
            "steps": step,
            "loss": total_loss / max(total_tokens, 1),
            "seconds": time.time() - started,
        }
        if args.eval_every and (epoch % args.eval_every == 0 or epoch == args.epochs):
            record |= evaluate(model, sp, val_src, val_ref)
        history.append(record)
        logger.info("finished %s", record)
        save_atomic(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch, "step": step,
             "history": history,
             "args": vars(args) | {"data": str(args.data), "work": str(args.work), "init_from": str(args.init_from)}},
            ckpt_path,
        )
        (args.work / "history.json").write_text(json.dumps(history, indent=1))

    export(model, sp_path, args.work / "export", num_beams=4)
    logger.info("exported to %s", args.work / "export")


if __name__ == "__main__":
    main()
