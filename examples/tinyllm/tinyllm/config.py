"""Typed experiment configuration, loaded from YAML.

A config file has three sections, ``model``, ``train`` and ``data``, each
mapping onto a dataclass below. Unknown keys are errors (a typo must not
silently fall back to a default), values are type-checked, and cross-field
constraints are validated before anything is built. Data paths in a YAML file
are resolved relative to that file.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tinyllm.data.filters import ENTROPY_THRESHOLD, KEEP_EASIEST, KEEP_HARDEST

NORM_KINDS = ("rmsnorm", "layernorm")
ATTENTION_KINDS = ("dense", "topk")
PRECISIONS = ("fp32", "bf16", "fp16")


class ConfigError(ValueError):
    """A configuration value is missing, mistyped or inconsistent."""


@dataclass
class ModelConfig:
    vocab_size: int = 160
    d_model: int = 32
    n_layers: int = 2
    n_heads: int = 4
    max_seq_len: int = 64
    # SwiGLU hidden size; None derives it from d_model (see hidden_dim).
    ffn_hidden: int | None = None
    ffn_multiple_of: int = 16
    norm: str = "rmsnorm"
    # None uses the norm module's EPS.
    norm_eps: float | None = None
    dropout: float = 0.0
    rope_base: float = 10000.0
    attention: str = "dense"
    # Per-layer k for attention="topk"; one entry per layer.
    topk: list[int] | None = None
    shared_ffn: bool = False
    tie_embeddings: bool = False
    init_std: float = 0.02

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def hidden_dim(self) -> int:
        """SwiGLU width: 8/3 * d_model (parameter parity with a 4x MLP), rounded up."""
        if self.ffn_hidden is not None:
            return self.ffn_hidden
        hidden = int(8 * self.d_model / 3)
        return -(-hidden // self.ffn_multiple_of) * self.ffn_multiple_of

    def validate(self) -> None:
        _positive(self, "vocab_size", "d_model", "n_layers", "n_heads", "max_seq_len", "ffn_multiple_of")
        if self.d_model % self.n_heads:
            raise ConfigError(f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}")
        if self.head_dim % 2:
            raise ConfigError(f"rotary embeddings need an even head_dim, got {self.head_dim}")
        if self.ffn_hidden is not None and self.ffn_hidden <= 0:
            raise ConfigError(f"model.ffn_hidden must be positive, got {self.ffn_hidden}")
        _choice("model.norm", self.norm, NORM_KINDS)
        _choice("model.attention", self.attention, ATTENTION_KINDS)
        if self.norm_eps is not None and self.norm_eps <= 0:
            raise ConfigError(f"model.norm_eps must be positive, got {self.norm_eps}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout}")
        if self.attention == "topk":
            if self.topk is None or len(self.topk) != self.n_layers:
                raise ConfigError(
                    f"model.topk needs one k per layer ({self.n_layers}) when attention is 'topk', got {self.topk}"
                )
            if any(k < 1 for k in self.topk):
                raise ConfigError(f"model.topk entries must be at least 1, got {self.topk}")
        elif self.topk is not None:
            raise ConfigError("model.topk is only meaningful with attention: topk")


@dataclass
class TrainConfig:
    seed: int = 0
    batch_size: int = 8
    steps: int = 40
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 5
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    precision: str = "fp32"
    # Layers kept in fp32 when precision is reduced.
    fp32_layers: list[int] = field(default_factory=list)
    # Layers whose activations are recomputed in backward instead of stored.
    checkpoint_layers: list[int] = field(default_factory=list)
    log_every: int = 10

    def validate(self) -> None:
        _positive(self, "batch_size", "steps", "lr", "log_every")
        if self.warmup_steps < 0:
            raise ConfigError(f"train.warmup_steps must be non-negative, got {self.warmup_steps}")
        if not 0 <= self.min_lr <= self.lr:
            raise ConfigError(f"train.min_lr must be in [0, lr={self.lr}], got {self.min_lr}")
        if self.weight_decay < 0:
            raise ConfigError(f"train.weight_decay must be non-negative, got {self.weight_decay}")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"train.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.grad_clip <= 0:
            raise ConfigError(f"train.grad_clip must be positive, got {self.grad_clip}")
        _choice("train.precision", self.precision, PRECISIONS)


@dataclass
class DataConfig:
    corpus: Path = Path("data/corpus.txt")
    domain_terms: Path = Path("data/domain_terms.txt")
    seq_len: int = 32
    entropy_threshold: float = ENTROPY_THRESHOLD
    keep_easiest: float = KEEP_EASIEST
    keep_hardest: float = KEEP_HARDEST
    # Rows are bucketed by domain-consistency score at these edges.
    bucket_edges: list[float] = field(default_factory=lambda: [0.1, 0.25])
    bucket_weights: list[float] = field(default_factory=lambda: [0.3, 0.2, 0.5])

    def validate(self) -> None:
        _positive(self, "seq_len")
        if self.keep_easiest < 0 or self.keep_hardest < 0 or self.keep_easiest + self.keep_hardest > 1:
            raise ConfigError(
                f"data.keep_easiest + data.keep_hardest must be within [0, 1], "
                f"got {self.keep_easiest} + {self.keep_hardest}"
            )
        if sorted(self.bucket_edges) != self.bucket_edges:
            raise ConfigError(f"data.bucket_edges must be sorted, got {self.bucket_edges}")
        if len(self.bucket_weights) != len(self.bucket_edges) + 1:
            raise ConfigError(
                f"data.bucket_weights needs len(bucket_edges) + 1 = {len(self.bucket_edges) + 1} "
                f"entries, got {len(self.bucket_weights)}"
            )
        if any(w < 0 for w in self.bucket_weights) or sum(self.bucket_weights) <= 0:
            raise ConfigError(f"data.bucket_weights must be non-negative with a positive sum, got {self.bucket_weights}")


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)

    def validate(self) -> Config:
        self.model.validate()
        self.train.validate()
        self.data.validate()
        if self.data.seq_len > self.model.max_seq_len:
            raise ConfigError(
                f"data.seq_len={self.data.seq_len} exceeds model.max_seq_len={self.model.max_seq_len}"
            )
        for name in ("fp32_layers", "checkpoint_layers"):
            layers = getattr(self.train, name)
            bad = [i for i in layers if not 0 <= i < self.model.n_layers]
            if bad:
                raise ConfigError(f"train.{name} has indices {bad} outside [0, {self.model.n_layers})")
            if len(set(layers)) != len(layers):
                raise ConfigError(f"train.{name} has duplicate indices: {layers}")
        return self

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for key in ("corpus", "domain_terms"):
            out["data"][key] = str(out["data"][key])
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any], base_dir: Path | None = None) -> Config:
        """Build and validate a Config; relative data paths resolve against ``base_dir``."""
        if not isinstance(raw, dict):
            raise ConfigError(f"a config must be a mapping of sections, got {type(raw).__name__}")
        sections = {"model": ModelConfig, "train": TrainConfig, "data": DataConfig}
        unknown = set(raw) - set(sections)
        if unknown:
            raise ConfigError(f"unknown config section(s) {sorted(unknown)}; expected {sorted(sections)}")
        built = {name: _build_section(name, kind, raw.get(name) or {}) for name, kind in sections.items()}
        cfg = cls(**built)
        if base_dir is not None:
            for key in ("corpus", "domain_terms"):
                path = getattr(cfg.data, key)
                if not path.is_absolute():
                    setattr(cfg.data, key, (base_dir / path).resolve())
        return cfg.validate()


def load_config(path: str | Path) -> Config:
    """Read a YAML config; data paths inside it are relative to the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    with path.open(encoding="utf-8") as fh:
        raw = yaml.safe_load(fh) or {}
    try:
        return Config.from_dict(raw, base_dir=path.resolve().parent)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def _build_section(section: str, kind: type, values: Any) -> Any:
    if not isinstance(values, dict):
        raise ConfigError(f"section '{section}' must be a mapping, got {type(values).__name__}")
    hints = typing.get_type_hints(kind)
    known = {f.name for f in dataclasses.fields(kind)}
    kwargs = {}
    for key, value in values.items():
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"unknown key '{section}.{key}'{hint}")
        kwargs[key] = _coerce(f"{section}.{key}", value, hints[key])
    return kind(**kwargs)


def _coerce(where: str, value: Any, hint: Any) -> Any:
    """Check ``value`` against a dataclass field annotation, converting where lossless."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None:
            return None
        return _coerce(where, value, args[0])
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        (item,) = typing.get_args(hint)
        return [_coerce(f"{where}[{i}]", v, item) for i, v in enumerate(value)]
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return value
    if hint is Path:
        if not isinstance(value, (str, Path)):
            raise ConfigError(f"{where} must be a path, got {value!r}")
        return Path(value)
    raise TypeError(f"unsupported annotation {hint!r} for {where}")


def _positive(section: Any, *names: str) -> None:
    prefix = {ModelConfig: "model", TrainConfig: "train", DataConfig: "data"}[type(section)]
    for name in names:
        value = getattr(section, name)
        if value <= 0:
            raise ConfigError(f"{prefix}.{name} must be positive, got {value}")


def _choice(where: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{where} must be one of {list(allowed)}, got {value!r}")
