"""``manifest.json`` as types: :class:`Manifest` and its sections (``serving.package.parse`` builds them from the JSON,
validated; :meth:`Manifest.to_dict` writes the same JSON ``converters`` always wrote, format ``mtgate-model/4``: the
ONNX Runtime decoder keeps a stationary cache, ``converters.onnx_emitter``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import PurePosixPath
from typing import Any, Literal, get_args

FORMAT = "mtgate-model/4"
MANIFEST = "manifest.json"
Runtime = Literal["onnxruntime", "openvino"]
"""The runtimes a package has artifacts for and the engine runs (the one list: ``RUNTIMES``)."""
RUNTIMES: tuple[Runtime, ...] = get_args(Runtime)
DEFAULT_RUNTIME: Runtime = "onnxruntime"
PRECISIONS = ("fp32", "int8")
DEFAULT_REFERENCE = {"encoder": "onnx/encoder.onnx", "decoder": "onnx/decoder.onnx"}

Activation = Literal["relu", "swish", "gelu", "gelu_tanh", "gelu_sigmoid"]
"""``gelu``: exact (erf); ``gelu_tanh``: the tanh approximation (HF ``gelu_new``, fairseq ``gelu_accurate``);
``gelu_sigmoid``: ``x * sigmoid(1.702 x)`` (Marian NMT's ``gelu``, HF ``quick_gelu``); ``swish``: ``x * sigmoid(x)``."""
LengthPenaltyKind = Literal["hf", "gnmt"]


class PackageError(Exception):
    """The directory is not a usable model package (the message says why, naming the file)."""


@dataclass(frozen=True)
class Stack:
    """The shape of one stack (:attr:`Architecture.encoder`, :attr:`Architecture.decoder`).

    Attributes:
        layers: number of layers.
        heads: attention heads (the decoder's for its self- and cross-attention, and for the caches).
        head_dim: ``d_model // heads``.
        ffn_dim: width of the feed-forward layers.
        activation: the feed-forward activation.
        pre_norm: each sub-layer normalizes its input (``x + f(LN(x))``) instead of its output (``LN(x + f(x))``).
        final_norm: a layer norm after the last layer.
        embed_norm: a layer norm after the embedding (token + position), before the first layer.
    """

    layers: int
    heads: int
    head_dim: int
    ffn_dim: int
    activation: Activation
    pre_norm: bool
    final_norm: bool
    embed_norm: bool


@dataclass(frozen=True)
class Architecture:
    """The model's hyperparameters (``converters.spec.TransformerConfig`` is this class). Booleans say which
    optional weights exist and where norms go.

    ``num_heads``, ``ffn_dim``, ``activation`` and ``pre_norm`` are the encoder's, and the decoder's unless a
    ``decoder_*`` field says otherwise (``None``: as the encoder; packages written before these fields existed had
    equal stacks). Read a stack's shape through :attr:`encoder` and :attr:`decoder`.

    The fields with defaults describe what packages written before them were:

    - ``encoder_embed_norm`` / ``decoder_embed_norm``: a layer norm right after the embedding (fairseq
      ``layernorm_embedding``, Marian ``--transformer-postprocess-emb n``).
    - ``shared_positions``: one ``positions`` table for both stacks; False: ``encoder.positions`` and
      ``decoder.positions`` (fairseq's learned positions).
    - ``decoder_start_zero``: the decoder's first step (position 0) embeds to a zero vector whatever the start id
      (Marian NMT starts from an all-zero embedding).
    - ``mask_source_eos``: the source EOS the engine appends is masked out of attention, as if absent (OpenNMT-py
      sources have no EOS).
    """

    source_vocab_size: int
    target_vocab_size: int
    d_model: int
    num_heads: int
    encoder_layers: int
    decoder_layers: int
    ffn_dim: int
    activation: Activation
    pre_norm: bool
    encoder_final_norm: bool
    decoder_final_norm: bool
    norm_epsilon: float
    embedding_scale: float
    max_positions: int
    shared_embeddings: bool
    tied_output: bool
    attention_bias: bool
    ffn_bias: bool
    logits_bias: bool
    encoder_embed_bias: bool = False
    decoder_num_heads: int | None = None
    decoder_ffn_dim: int | None = None
    decoder_activation: Activation | None = None
    decoder_pre_norm: bool | None = None
    encoder_embed_norm: bool = False
    decoder_embed_norm: bool = False
    shared_positions: bool = True
    decoder_start_zero: bool = False
    mask_source_eos: bool = False

    @property
    def encoder(self) -> Stack:
        """The encoder stack's shape."""
        return Stack(layers=self.encoder_layers, heads=self.num_heads, head_dim=self.d_model // max(1, self.num_heads),
                     ffn_dim=self.ffn_dim, activation=self.activation, pre_norm=self.pre_norm,
                     final_norm=self.encoder_final_norm, embed_norm=self.encoder_embed_norm)

    @property
    def decoder(self) -> Stack:
        """The decoder stack's shape (``decoder_*`` fields, the encoder's values where they are None)."""
        heads = self.num_heads if self.decoder_num_heads is None else self.decoder_num_heads
        return Stack(layers=self.decoder_layers, heads=heads, head_dim=self.d_model // max(1, heads),
                     ffn_dim=self.ffn_dim if self.decoder_ffn_dim is None else self.decoder_ffn_dim,
                     activation=self.activation if self.decoder_activation is None else self.decoder_activation,
                     pre_norm=self.pre_norm if self.decoder_pre_norm is None else self.decoder_pre_norm,
                     final_norm=self.decoder_final_norm, embed_norm=self.decoder_embed_norm)


@dataclass(frozen=True)
class SpecialIds:
    """Token ids with a fixed meaning. ``zero_embedding_id``: this id embeds to an all-zero vector (T2T's PAD 0)."""

    pad: int
    eos: int
    decoder_start: int
    unk: int | None = None
    zero_embedding_id: int | None = None


@dataclass(frozen=True)
class DecodingDefaults:
    """How the source framework decodes by default.

    ``length_penalty_kind``: ``"hf"`` divides the summed log-prob by ``len ** length_penalty`` (transformers beam
    search); ``"gnmt"`` divides by ``((5 + len) / 6) ** length_penalty`` (tensor2tensor). ``max_length`` caps generated
    tokens including EOS (HF ``max_length - 1`` since HF counts the start token); ``extra_length``, when set, caps them at
    ``source tokens (incl. EOS) + extra_length`` instead (T2T ``decode_length``). ``bad_word_ids`` are never generated;
    ``forced_eos``: at the last allowed step only EOS may be chosen (HF ``forced_eos_token_id``).
    ``renormalize_logits``: log-softmax again after the decoding rules (bad words, forced EOS) masked some ids, so beam
    scores are over the allowed ids only (HF ``renormalize_logits``; opus-mt generation configs set it).
    """

    beam_size: int = 4
    length_penalty: float = 1.0
    length_penalty_kind: LengthPenaltyKind = "hf"
    max_length: int = 256
    extra_length: int | None = None
    bad_word_ids: tuple[int, ...] = ()
    forced_eos: bool = False
    early_stopping: bool = False
    renormalize_logits: bool = False


@dataclass(frozen=True)
class TokenizerEntry:
    """Which tokenizer, and its files (role -> package-relative path); ``settings``: the entry's other keys
    (``unk_id`` for sentencepiece), as ``serving.engine.tokenizers.load_tokenizer`` reads them."""

    kind: str
    files: dict[str, str]
    settings: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any]) -> TokenizerEntry:
        """The entry as written in a manifest (``kind``, ``files``, other keys as ``settings``), unchecked."""
        settings = {k: v for k, v in entry.items() if k not in ("kind", "files")}
        return cls(kind=str(entry["kind"]), files=dict(entry.get("files") or {}), settings=settings)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "files": dict(self.files), **self.settings}


@dataclass(frozen=True)
class Artifact:
    """One runtime/precision variant: its encoder and decoder-step graphs (package-relative paths), and the decoder
    that scores a vocabulary shortlist only (``serving.engine.shortlist``; None: the package has no shortlist)."""

    runtime: str
    precision: str
    encoder: str
    decoder: str
    shortlist_decoder: str | None = None

    @property
    def key(self) -> str:
        return f"{self.runtime}/{self.precision}"

    def to_dict(self) -> dict[str, Any]:
        files = {"encoder": self.encoder, "decoder": self.decoder}
        if self.shortlist_decoder is not None:
            files["shortlist_decoder"] = self.shortlist_decoder
        return {"runtime": self.runtime, "precision": self.precision, "files": files}


@dataclass(frozen=True)
class Manifest:
    """A parsed, validated ``manifest.json``.

    Attributes:
        name: package name (None: unnamed; serving uses the directory name).
        version: package version.
        architecture: the model's hyperparameters.
        special_ids: pad, EOS, decoder start (and unk, the zero-embedding id).
        decoding: the source framework's decoding defaults.
        tokenizer: which tokenizer and its files.
        reference: the fp32 ONNX graphs (``encoder``, ``decoder``): the package's own parity reference.
        artifacts: every runtime/precision variant.
        files: package-relative path -> sha256 of every file but the manifest.
        source, parity, quality, conversion: what conversion recorded (free-form JSON objects).
        shortlist: the vocabulary shortlist (``serving.engine.shortlist``): ``table``, the package-relative path of its
            table, and what conversion recorded of how it was built and what it costs in BLEU; None: no shortlist.
    """

    architecture: Architecture
    special_ids: SpecialIds
    tokenizer: TokenizerEntry
    decoding: DecodingDefaults = DecodingDefaults()
    artifacts: tuple[Artifact, ...] = ()
    reference: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_REFERENCE))
    name: str | None = None
    version: str | None = None
    created: str | None = None
    mtgate_version: str | None = None
    source: dict[str, Any] = field(default_factory=dict)
    parity: dict[str, Any] = field(default_factory=dict)
    quality: dict[str, Any] | None = None
    conversion: dict[str, Any] | None = None
    files: dict[str, str] = field(default_factory=dict)
    shortlist: dict[str, Any] | None = None

    @property
    def source_framework(self) -> str:
        return str(self.source.get("framework") or "unknown")

    def artifact(self, runtime: str, precision: str) -> Artifact:
        """The artifact for ``runtime``/``precision``.

        Raises:
            PackageError: the package has none (the message lists what it has).
        """
        for artifact in self.artifacts:
            if artifact.runtime == runtime and artifact.precision == precision:
                return artifact
        have = ", ".join(a.key for a in self.artifacts) or "none"
        raise PackageError(f"package has no {runtime}/{precision} artifact (available: {have})")

    def shortlist_decoder(self, artifact: Artifact) -> str:
        """The artifact's vocabulary-shortlist decoder (package-relative path).

        Raises:
            PackageError: the package has no shortlist for this artifact.
        """
        if self.shortlist is None or artifact.shortlist_decoder is None:
            raise PackageError(f"no vocabulary shortlist for {artifact.key} (convert with --shortlist-corpus; the "
                               "shortlist runs on onnxruntime only)")
        return artifact.shortlist_decoder

    def opened_files(self) -> list[str]:
        """Every file the loader may open: the tokenizer's, the reference graphs, every artifact's graphs, and the
        files a runtime opens beside a graph (OpenVINO's ``.bin``)."""
        paths = [*self.tokenizer.files.values(), self.reference["encoder"], self.reference["decoder"]]
        for artifact in self.artifacts:
            paths += [artifact.encoder, artifact.decoder]
            if artifact.shortlist_decoder is not None:
                paths.append(artifact.shortlist_decoder)
        if self.shortlist is not None:
            paths.append(self.shortlist["table"])
        paths += [c for c in map(companion, paths) if c is not None]
        return list(dict.fromkeys(paths))

    def to_dict(self) -> dict[str, Any]:
        """The manifest as written (keys in the order ``converters`` always wrote them)."""
        data: dict[str, Any] = {"name": self.name, "version": self.version, "created": self.created,
                                "mtgate_version": self.mtgate_version, "source": self.source,
                                "architecture": asdict(self.architecture), "special_ids": asdict(self.special_ids),
                                "decoding": _jsonable(asdict(self.decoding)), "tokenizer": self.tokenizer.to_dict(),
                                "reference": dict(self.reference),
                                "artifacts": [a.to_dict() for a in self.artifacts], "parity": self.parity,
                                "quality": self.quality, "conversion": self.conversion, "shortlist": self.shortlist}
        data = {k: v for k, v in data.items() if v is not None}
        return data | {"format": FORMAT, "files": dict(self.files)}


def companion(path: str) -> str | None:
    """The file a runtime opens beside a graph: ``x.bin`` for OpenVINO's ``x.xml`` (None for other graphs)."""
    return str(PurePosixPath(path).with_suffix(".bin")) if path.endswith(".xml") else None


def _jsonable(value: Any) -> Any:
    """Tuples as lists (what JSON holds)."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value
