from pathlib import Path

import pytest

from tinyllm.config import Config, ConfigError, DataConfig, ModelConfig, TrainConfig, load_config

pytestmark = pytest.mark.correctness

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
BUNDLED = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_config_loads_and_points_at_real_files(name):
    cfg = load_config(CONFIG_DIR / f"{name}.yaml")
    assert cfg.data.corpus.is_file()
    assert cfg.data.domain_terms.is_file()
    assert cfg.data.seq_len <= cfg.model.max_seq_len


def test_tiny_yaml_values(tiny_config):
    m, t, d = tiny_config.model, tiny_config.train, tiny_config.data
    assert (m.vocab_size, m.d_model, m.n_layers, m.n_heads, m.max_seq_len) == (160, 32, 2, 4, 32)
    assert (m.norm, m.attention, m.topk) == ("rmsnorm", "dense", None)
    assert (t.seed, t.batch_size, t.steps) == (1234, 8, 40)
    assert d.bucket_edges == [0.1, 0.25]
    assert d.bucket_weights == [0.3, 0.2, 0.5]


def test_sparse_yaml_sets_one_k_per_layer():
    cfg = load_config(CONFIG_DIR / "sparse.yaml")
    assert cfg.model.attention == "topk"
    assert cfg.model.topk == [4, 12]
    assert len(cfg.model.topk) == cfg.model.n_layers


def test_layernorm_yaml_overrides_norm_eps():
    cfg = load_config(CONFIG_DIR / "layernorm.yaml")
    assert cfg.model.norm == "layernorm"
    assert cfg.model.norm_eps == 1e-5


def test_omitted_keys_take_dataclass_defaults():
    cfg = load_config(CONFIG_DIR / "sparse.yaml")
    assert cfg.data.bucket_edges == DataConfig().bucket_edges
    assert cfg.model.dropout == ModelConfig().dropout
    assert cfg.model.norm_eps is None


def test_default_config_is_valid():
    Config().validate()


def test_data_paths_resolve_relative_to_the_yaml_file(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "run.yaml").write_text("data:\n  corpus: ../corpus.txt\n")
    cfg = load_config(tmp_path / "sub" / "run.yaml")
    assert cfg.data.corpus == (tmp_path / "corpus.txt").resolve()


def test_to_dict_round_trips(tiny_config):
    rebuilt = Config.from_dict(tiny_config.to_dict())
    assert rebuilt == tiny_config


def test_integer_accepted_for_float_field():
    cfg = Config.from_dict({"train": {"lr": 1, "min_lr": 0}})
    assert isinstance(cfg.train.lr, float) and cfg.train.lr == 1.0


@pytest.mark.parametrize(
    "d_model,multiple_of,expected",
    [(32, 16, 96), (48, 16, 128), (40, 32, 128), (64, 64, 192)],
)
def test_swiglu_hidden_dim_rounds_up(d_model, multiple_of, expected):
    assert ModelConfig(d_model=d_model, ffn_multiple_of=multiple_of).hidden_dim == expected


def test_explicit_ffn_hidden_wins():
    assert ModelConfig(ffn_hidden=50).hidden_dim == 50


INVALID = [
    pytest.param({"model": {"d_model": 30, "n_heads": 4}}, "not divisible by model.n_heads", id="heads-divide-d_model"),
    pytest.param({"model": {"d_model": 12, "n_heads": 4}}, "even head_dim", id="even-head-dim"),
    pytest.param({"model": {"norm": "batchnorm"}}, "model.norm must be one of", id="norm-kind"),
    pytest.param({"model": {"attention": "sliding"}}, "model.attention must be one of", id="attention-kind"),
    pytest.param({"model": {"dropout": 1.0}}, r"model.dropout must be in \[0, 1\)", id="dropout-range"),
    pytest.param({"model": {"norm_eps": 0.0}}, "model.norm_eps must be positive", id="norm-eps-positive"),
    pytest.param({"model": {"vocab_size": 0}}, "model.vocab_size must be positive", id="vocab-positive"),
    pytest.param({"model": {"attention": "topk"}}, "one k per layer", id="topk-missing"),
    pytest.param({"model": {"attention": "topk", "topk": [4]}}, "one k per layer", id="topk-length"),
    pytest.param({"model": {"attention": "topk", "topk": [4, 0]}}, "at least 1", id="topk-positive"),
    pytest.param({"model": {"topk": [4, 4]}}, "only meaningful with attention: topk", id="topk-without-topk-attention"),
    pytest.param({"train": {"precision": "fp8"}}, "train.precision must be one of", id="precision-kind"),
    pytest.param({"train": {"min_lr": 1.0}}, "train.min_lr", id="min-lr-range"),
    pytest.param({"train": {"beta2": 1.0}}, "train.beta2", id="beta2-range"),
    pytest.param({"train": {"grad_clip": 0.0}}, "train.grad_clip must be positive", id="grad-clip-positive"),
    pytest.param({"train": {"checkpoint_layers": [2]}}, r"train.checkpoint_layers has indices \[2\] outside", id="checkpoint-layer-range"),
    pytest.param({"train": {"fp32_layers": [0, 0]}}, "duplicate", id="fp32-layers-unique"),
    pytest.param({"data": {"bucket_weights": [1.0]}}, "data.bucket_weights needs", id="bucket-weights-length"),
    pytest.param({"data": {"bucket_edges": [0.3, 0.1]}}, "must be sorted", id="bucket-edges-sorted"),
    pytest.param({"data": {"bucket_weights": [0.0, 0.0, 0.0]}}, "positive sum", id="bucket-weights-sum"),
    pytest.param({"data": {"seq_len": 128}}, "exceeds model.max_seq_len", id="seq-len-vs-max"),
    pytest.param({"data": {"keep_easiest": 0.8, "keep_hardest": 0.3}}, "keep_easiest", id="keep-fractions-sum"),
]


@pytest.mark.parametrize("raw,message", INVALID)
def test_invalid_values_are_rejected_with_field_name(raw, message):
    with pytest.raises(ConfigError, match=message):
        Config.from_dict(raw)


@pytest.mark.parametrize(
    "raw,message",
    [
        ({"model": {"d_model": "32"}}, "model.d_model must be an integer"),
        ({"model": {"d_model": 32.0}}, "model.d_model must be an integer"),
        ({"model": {"n_layers": True}}, "model.n_layers must be an integer"),
        ({"model": {"shared_ffn": "yes"}}, "model.shared_ffn must be true or false"),
        ({"train": {"lr": "fast"}}, "train.lr must be a number"),
        ({"model": {"topk": 4}}, "model.topk must be a list"),
        ({"data": {"bucket_edges": [0.1, "x"]}}, r"data.bucket_edges\[1\] must be a number"),
    ],
)
def test_wrong_types_are_rejected(raw, message):
    with pytest.raises(ConfigError, match=message):
        Config.from_dict(raw)


def test_unknown_key_suggests_closest_field():
    with pytest.raises(ConfigError, match="unknown key 'model.dmodel'; did you mean 'd_model'"):
        Config.from_dict({"model": {"dmodel": 32}})


def test_unknown_section_is_rejected():
    with pytest.raises(ConfigError, match=r"unknown config section\(s\) \['optimizer'\]"):
        Config.from_dict({"optimizer": {"lr": 1e-3}})


def test_section_must_be_a_mapping():
    with pytest.raises(ConfigError, match="section 'train' must be a mapping"):
        Config.from_dict({"train": [1, 2]})


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "absent.yaml")


def test_errors_from_a_file_name_the_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("model:\n  n_heads: 5\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml: model.d_model=32 is not divisible"):
        load_config(path)


def test_train_config_validates_alone():
    with pytest.raises(ConfigError, match="train.batch_size must be positive"):
        TrainConfig(batch_size=0).validate()
