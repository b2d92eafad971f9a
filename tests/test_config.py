"""Settings are checked when the config is built: every range, with the key in the message."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from transformer.commands import cli
from transformer.commands.help import config_dataclasses, field_docs
from transformer.commands.translate import InputConfig
from transformer.config import (
    ConfigError,
    DataConfig,
    DecodeConfig,
    ModelConfig,
    PhaseConfig,
    TrainConfig,
    check_device,
    load_preset,
    to_dataclass,
)
from transformer.paths import CONFIG_DIR

from helpers import COMMAND_SCHEMAS, compose_cfg


def train_config(*overrides: str) -> TrainConfig:
    return to_dataclass(TrainConfig, compose_cfg(*overrides))


def test_the_defaults_and_every_group_file_are_valid():
    TrainConfig().validate()
    for group in ("model", "data", "optim", "trainer", "decode"):
        for f in sorted((CONFIG_DIR / group).glob("*.yaml")):
            train_config(f"{group}={f.stem}")  # data=files: train_src is checked when it is read


# (override, what the one-line message must say): each of these used to crash deep inside
# training (IndexError, ZeroDivisionError, torch or sentencepiece internals) or train wrong.
BAD_TRAINING_SETTINGS = [
    ("trainer.accum_steps=0", "trainer.accum_steps=0: must be >= 1"),
    ("trainer.val_every=0", "trainer.val_every=0: must be >= 1"),
    ("trainer.max_steps=-3", "trainer.max_steps=-3: must be >= 1"),
    ("trainer.max_hours=0", "trainer.max_hours=0.0: must be > 0"),
    ("trainer.keep_last=-1", "trainer.keep_last=-1: must be >= 0"),
    ("trainer.patience=0", "trainer.patience=0: must be >= 1 (or null)"),
    ("trainer.precision=fp8", "trainer.precision='fp8': choose one of auto, fp32, bf16, fp16"),
    ("trainer.device=gpu", "trainer.device='gpu': choose auto, cpu, cuda or cuda:N"),
    ("trainer.seed=-1", "trainer.seed=-1: must be >= 0"),
    ("model.n_heads=0", "model.n_heads=0: must be >= 1"),
    ("model.n_heads=3", "model.n_heads=3: must divide model.d_model=256"),
    ("model.dropout=1.0", "model.dropout=1.0: must be in [0, 1)"),
    ("model.max_positions=100", "model.max_positions=100: must exceed data.max_len=128"),
    ("optim.lr=-1", "optim.lr=-1.0: must be > 0"),
    ("optim.label_smoothing=1.5", "optim.label_smoothing=1.5: must be in [0, 1)"),
    ("optim.betas=[0.9,1.5]", "optim.betas=[0.9, 1.5]: must be two numbers in [0, 1)"),
    ("optim.warmup_steps=-1", "optim.warmup_steps=-1: must be >= 0"),
    ("data.max_tokens=100", "data.max_tokens=100: a batch must hold the longest pair"),
    ("data.spm_vocab_size=3", "data.spm_vocab_size=3: must be >= 5"),
    ("data.spm_case_copies=1.5", "data.spm_case_copies=1.5: must be in [0, 1)"),
    ("data.name=wikipedia", "data.name='wikipedia': choose one of"),
    ("data.spm_model_type=word", "data.spm_model_type='word': choose unigram or bpe"),
    ("+data.corpora={tatoeba:1}", "data.corpora={'tatoeba': 1.0}: only for data.name=mix"),
    ("decode.nbest=3", "decode.nbest=3: greedy search gives one hypothesis"),
]


@pytest.mark.parametrize(("override", "message"), BAD_TRAINING_SETTINGS)
def test_an_out_of_range_setting_is_refused_naming_its_key(override, message):
    with pytest.raises(ConfigError) as info:
        train_config(override)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_a_mix_names_known_corpora_with_positive_weights():
    DataConfig(name="mix", corpora={"tatoeba": 1.0, "europarl": 2.0}).validate()
    with pytest.raises(ConfigError, match=r"data.corpora=\{\}: name=mix needs corpora"):
        DataConfig(name="mix").validate()
    with pytest.raises(ConfigError, match=r"data.corpora='flores': can mix the corpora tatoeba, "):
        DataConfig(name="mix", corpora={"flores": 1.0}).validate()
    DataConfig(name="mix", corpora={"sample": 1.0, "files": 1.0}, train_src="bt.tsv").validate()
    with pytest.raises(ConfigError, match=r"^data.train_src=None: a mix with files needs its training pairs"):
        DataConfig(name="mix", corpora={"sample": 1.0, "files": 1.0}).validate()
    with pytest.raises(ConfigError, match=r"^data.tgt_lang='it': must differ from data.src_lang$"):
        DataConfig(src_lang="it", tgt_lang="it").validate()
    with pytest.raises(ConfigError, match=r"data.corpora.europarl=0.0: a weight must be > 0"):
        DataConfig(name="mix", corpora={"tatoeba": 1.0, "europarl": 0.0}).validate()


BAD_SCHEDULES = [
    ("data.phases=[{epochs: 1, corpora: {flores: 1}}]",
     "data.phases[0].corpora='flores': not a corpus of the mix (data.corpora: europarl, tatoeba)"),
    ("data.phases=[{epochs: -1, corpora: {tatoeba: 1}}]", "data.phases[0].epochs=-1: must be >= 0"),
    ("data.phases=[{epochs: 1, corpora: {tatoeba: -1}}]",
     "data.phases[0].corpora.tatoeba=-1.0: a weight must be >= 0"),
    ("data.phases=[{epochs: 1, corpora: {tatoeba: 1}}, {epochs: 2, corpora: {europarl: 0}}]",
     "data.phases[1].corpora={'europarl': 0.0}: a phase needs a corpus with a weight > 0"),
    ("data.epoch_pairs=0", "data.epoch_pairs=0: must be >= 1 (or null)"),
]


@pytest.mark.parametrize(("override", "message"), BAD_SCHEDULES)
def test_a_mixs_schedule_is_checked_naming_its_key(override, message):
    cfg = train_config("data=europarl_tatoeba", "data.epoch_pairs=1000",
                       "data.phases=[{epochs: 2, corpora: {tatoeba: 1}}, {epochs: 0, corpora: {europarl: 1}}]")
    assert [(p.epochs, p.corpora) for p in cfg.data.phases] == [(2, {"tatoeba": 1.0}), (0, {"europarl": 1.0})]
    with pytest.raises(ConfigError) as info:
        train_config("data=europarl_tatoeba", override)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_schedule_is_for_a_mix_only():
    for override in ("data.epoch_pairs=1000", "data.phases=[{epochs: 1, corpora: {tatoeba: 1}}]"):
        with pytest.raises(ConfigError, match=r"only for data.name=mix"):
            train_config("data=tatoeba", override)


BAD_DECODE_SETTINGS = [
    (dict(max_len_a=-1.0, max_len_b=-5), "decode.max_len_a=-1.0: must be >= 0"),
    (dict(max_len_a=0.0, max_len_b=-5), "decode.max_len_b=-5: must be >= 0"),
    (dict(max_len_a=0.0, max_len_b=0), "the length limit a * |x| + b could be 0"),
    (dict(method="greedy", nbest=3), "decode.nbest=3: greedy search gives one hypothesis"),
    (dict(method="beam", beam_size=2, nbest=3), "decode.nbest=3: cannot exceed decode.beam_size=2"),
    (dict(beam_size=0), "decode.beam_size=0: must be >= 1"),
    (dict(min_len=-1), "decode.min_len=-1: must be >= 0"),
    (dict(lenpen=-0.5), "decode.lenpen=-0.5: must be >= 0"),
    (dict(method="sampling"), "decode.method='sampling': choose greedy, beam or sample"),
    (dict(precision="int8"), "decode.precision='int8': choose one of auto, fp32, bf16, fp16"),
    (dict(compile="fast"), "decode.compile='fast': choose one of none, default, reduce-overhead, max-autotune"),
    (dict(sync_every=0), "decode.sync_every=0: must be >= 1"),
    (dict(sync_every=65), "decode.sync_every=65: must be <= 64"),
]


@pytest.mark.parametrize(("settings", "message"), BAD_DECODE_SETTINGS)
def test_bad_decode_settings_are_refused(settings, message):
    with pytest.raises(ConfigError) as info:
        DecodeConfig(**settings).validate()
    assert message in str(info.value)


def test_model_config_checks_its_special_ids():
    with pytest.raises(ConfigError, match=r"model.eos_id=9: must be a token id below model.vocab_size=8"):
        ModelConfig(vocab_size=8, eos_id=9).validate()
    with pytest.raises(ConfigError, match="three different ids"):
        ModelConfig(vocab_size=8, bos_id=3, eos_id=3).validate()


# --- Defaults in one place ------------------------------------------------------------
# Every setting's default and help text live in its dataclass (transformer/config.py).
# `cli.register_configs` stores each group's dataclass as the config `schema/<group>`, each
# preset in configs/<group>/ starts from it and holds only what it changes: a default
# restated in a YAML could drift from the dataclass's, and these tests refuse one.

PRESETS = [(group, path) for group in cli.SCHEMAS for path in sorted((CONFIG_DIR / group).glob("*.yaml"))]
PRESET_IDS = [f"{group}/{path.stem}" for group, path in PRESETS]
# (group, key) -> why its presets set it even where the value is the dataclass's default
PINNED = {("data", "name"): "a data preset names the corpus it loads, whatever DataConfig's default is"}


def defaults_of(schema: type) -> dict:
    """The dataclass's defaults as a composed config holds them (tuples are lists)."""
    return OmegaConf.to_container(OmegaConf.structured(schema))


def preset(path: Path) -> tuple[list, dict]:
    """A preset's defaults list and the settings it holds itself (read as Hydra reads YAML)."""
    settings = OmegaConf.to_container(OmegaConf.load(path))
    return settings.pop("defaults", []), settings


def test_every_group_has_its_dataclass_as_schema_and_presets():
    assert set(cli.SCHEMAS) == {"model", "data", "optim", "trainer", "decode"}
    assert {f.name for f in dataclasses.fields(TrainConfig)} == set(cli.SCHEMAS)
    for f in dataclasses.fields(TrainConfig):
        assert f.type == cli.SCHEMAS[f.name].__name__, f.name
    assert len(PRESETS) >= 15


@pytest.mark.parametrize(("group", "path"), PRESETS, ids=PRESET_IDS)
def test_a_preset_starts_from_its_dataclass_and_composes_to_its_defaults(group, path):
    """(1) The preset's defaults list starts from the schema; composed, the preset is the
    dataclass's defaults for every key it does not set, its own values for those it does,
    and nothing else."""
    defaults, settings = preset(path)
    assert defaults and defaults[0] == f"/schema/{group}@_here_", f"{path}: start from the schema"
    assert defaults[-1] == "_self_", f"{path}: the preset's own settings go over the schema's"
    composed = OmegaConf.to_container(compose_cfg(f"{group}={path.stem}")[group], throw_on_missing=False)
    expected = defaults_of(cli.SCHEMAS[group])
    assert set(composed) == set(expected), f"{path}: keys other than {cli.SCHEMAS[group].__name__}'s"
    assert {k: v for k, v in composed.items() if k not in settings} == \
        {k: v for k, v in expected.items() if k not in settings}
    assert {k: composed[k] for k in settings} == settings


@pytest.mark.parametrize(("group", "path"), PRESETS, ids=PRESET_IDS)
def test_a_preset_holds_only_what_it_changes(group, path):
    """(2) No preset sets a key to the dataclass's default (unless PINNED, with its reason):
    a default restated here could drift from the dataclass's."""
    _, settings = preset(path)
    defaults = defaults_of(cli.SCHEMAS[group])
    restated = [key for key, value in settings.items() if value == defaults.get(key, object())
                and (group, key) not in PINNED]
    assert not restated, f"{path} restates the defaults of {restated}: delete them"


def test_every_pinned_key_is_still_pinned_somewhere():
    for group, key in PINNED:
        assert any(key in preset(path)[1] for g, path in PRESETS if g == group), (group, key)


def documented_fields(schema: type) -> dict[str, str]:
    """Each field of a settings dataclass -> its help: the docstring under it (what
    `mt-* --help` prints and the API reference shows)."""
    return field_docs(schema)


SETTINGS_CLASSES = [*cli.SCHEMAS.values(), *COMMAND_SCHEMAS.values()]
SETTINGS_CLASSES = list(dict.fromkeys(c for s in SETTINGS_CLASSES for c in config_dataclasses(s)))


def test_the_settings_classes_include_the_nested_ones():
    assert {PhaseConfig, InputConfig} <= set(SETTINGS_CLASSES)  # data.phases' items; mt-translate's input


@pytest.mark.parametrize("schema", SETTINGS_CLASSES, ids=lambda s: s.__name__)
def test_every_setting_has_its_help_text_in_its_dataclass(schema):
    """(3) The help text of a setting is written once, under its default: no field is
    without one."""
    helps = documented_fields(schema)
    missing = [f.name for f in dataclasses.fields(schema) if not helps.get(f.name, "").strip()]
    assert not missing, f"{schema.__name__}: no docstring under {missing}"


def _phrases(text: str, n: int = 4) -> set[tuple[str, ...]]:
    words = re.findall(r"[\w.|*/+-]+", text.lower())
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


@pytest.mark.parametrize(("group", "path"), PRESETS, ids=PRESET_IDS)
def test_a_preset_does_not_repeat_the_help_text(group, path):
    """(3) A comment on a preset's setting says why the preset chooses its value; what the
    setting means is the dataclass's help, and four of its words in a row repeated here
    are refused."""
    helps = documented_fields(cli.SCHEMAS[group])
    for line in path.read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in helps and "#" in rest:
            comment = rest.split("#", 1)[1]
            repeated = _phrases(comment) & _phrases(helps[key])
            assert not repeated, f"{path}: {key}'s comment repeats its help text: {sorted(repeated)[0]}"


@pytest.mark.parametrize("command", sorted(COMMAND_SCHEMAS))
def test_a_commands_config_starts_from_its_dataclass_and_restates_nothing(command):
    """configs/<command>.yaml: the command's dataclass first (`cli.hydra_entry` registers
    it), then its groups; of its own settings only Hydra's, none of the dataclass's."""
    defaults, settings = preset(CONFIG_DIR / f"{command}.yaml")
    assert defaults[0] == f"/schema/{command}@_here_"
    assert set(settings) <= {"hydra"}, f"{command}.yaml restates {sorted(set(settings) - {'hydra'})}"
    composed = compose_cfg(*(["checkpoint=x"] if command in ("translate", "evaluate", "export") else []),
                           config=command)
    assert OmegaConf.get_type(composed) is COMMAND_SCHEMAS[command]


@pytest.mark.parametrize(("group", "path"), PRESETS, ids=PRESET_IDS)
def test_a_script_reads_a_preset_as_hydra_composes_it(group, path):
    """`load_preset` (the benchmarks read configs/model/small.yaml without Hydra) gives the
    dataclass that composing `<group>=<preset>` gives."""
    schema = cli.SCHEMAS[group]
    assert to_dataclass(schema, load_preset(schema, path)) == \
        to_dataclass(schema, compose_cfg(f"{group}={path.stem}")[group])


@pytest.mark.parametrize("multiple, max_tokens, ok", [(64, 21, False), (64, 64, True), (8, 24, True), (8, 23, False)])
def test_pad_to_multiple_is_checked_against_the_longest_pair_it_pads(multiple, max_tokens, ok):
    """max_len=20: the longest pair is 21 tokens with BOS/EOS, padded to 64 (or 24): the
    batch budget must hold it, or training fails later in a traceback that blames max_len."""
    cfg = DataConfig(max_len=20, max_tokens=max_tokens, pad_to_multiple=multiple)
    if ok:
        cfg.validate()
        return
    with pytest.raises(ConfigError, match=rf"data.pad_to_multiple={multiple}: pads the longest pair "
                                          rf"\(data.max_len=20, \+1 for BOS/EOS\) to {-(-21 // multiple) * multiple} "
                                          rf"tokens, more than data.max_tokens={max_tokens}"):
        cfg.validate()


@pytest.mark.parametrize("key", ["trainer.device", "device"])
def test_mps_where_there_is_none_is_refused_with_the_settings(key, monkeypatch):
    """Every command checks `device` with its settings (check_device), before any work."""
    import torch

    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=rf"^{key}='mps': Apple's MPS is not available on this machine: "
                                          rf"use {key}=cpu or {key}=auto$"):
        check_device(key, "mps")
    if key == "trainer.device":
        with pytest.raises(ConfigError, match="Apple's MPS is not available"):
            to_dataclass(TrainConfig, compose_cfg("debug=default", "data=sample", "trainer.device=mps"))


def test_the_old_decode_max_tokens_moves_to_batch_tokens_with_one_warning(monkeypatch, caplog):
    """decode.max_tokens is accepted as the old name of decode.batch_tokens: a one-line
    warning (once a process) names the new key; both given differently are refused."""
    import logging

    from transformer import config as config_module

    monkeypatch.setattr(config_module, "_deprecations_told", set())
    with caplog.at_level(logging.WARNING, logger="transformer.config"):
        old = DecodeConfig(max_tokens=300)
        typed = to_dataclass(DecodeConfig, {"max_tokens": 500})
    assert (old.batch_tokens, old.max_tokens) == (300, None) and typed.batch_tokens == 500
    assert old == DecodeConfig(batch_tokens=300)
    assert [r.getMessage() for r in caplog.records] == [
        "decode.max_tokens is deprecated: it is now decode.batch_tokens (source tokens per decoding batch)"]
    assert DecodeConfig(max_tokens=300, batch_tokens=300).batch_tokens == 300
    with pytest.raises(ConfigError, match=r"^decode.max_tokens=300: the old name of decode.batch_tokens, "
                                          r"which holds 200: set decode.batch_tokens alone$"):
        DecodeConfig(max_tokens=300, batch_tokens=200)
    with pytest.raises(ConfigError, match=r"^decode.max_tokens=0: must be >= 1$"):
        DecodeConfig(max_tokens=0)
    with pytest.raises(ConfigError, match=r"^decode.max_tokens=1000000: must be <= 131072"):
        DecodeConfig(max_tokens=1_000_000)
