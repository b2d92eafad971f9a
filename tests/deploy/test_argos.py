"""mt-export format=argos: the package's layout, its position table, its settings' errors.

Serving it with LibreTranslate is tests/deploy/test_serve.py (marked `serve`). Where
argostranslate is installed, every export here also installs the package with it in a
scratch folder and checks it translates as CTranslate2 does (`check_with_argostranslate`).
"""

from __future__ import annotations

import json
import sys
import zipfile

import pytest

from transformer.commands.export import export
from transformer.config import ConfigError, to_dataclass
from transformer.deploy import argos
from transformer.deploy.ct2_export import ExportConfig
from transformer.outputs import OutputError

from helpers import tiny_checkpoint

ctranslate2 = pytest.importorskip("ctranslate2")
spacy = pytest.importorskip("spacy")
spm = pytest.importorskip("sentencepiece")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(checkpoint, the package unpacked, our plain CTranslate2 export). max_positions 300:
    above the 256 tokens CTranslate2 writes at most (a random model writes until then)."""
    tmp = tmp_path_factory.mktemp("argos")
    ckpt = tiny_checkpoint(tmp / "ckpt", max_positions=300)
    package = export(ExportConfig(checkpoint=str(ckpt), output=str(tmp / "tiny.argosmodel"), format="argos"))
    with zipfile.ZipFile(package) as z:
        z.extractall(tmp / "unpacked")
    ct2 = export(ExportConfig(checkpoint=str(ckpt), output=str(tmp / "ct2")))
    return ckpt, tmp / "unpacked" / "tiny", ct2


def test_the_package_is_one_directory_with_what_argos_reads(exported):
    ckpt, root, _ = exported
    assert sorted(p.name for p in root.iterdir()) == [
        "README.md", "metadata.json", "model", "sentencepiece.model", "spacy"]
    assert sorted(p.name for p in (root / "model").iterdir()) == [
        "config.json", "model.bin", "shared_vocabulary.json"]
    meta = json.loads((root / "metadata.json").read_text())
    assert {k: meta[k] for k in ("from_code", "to_code", "from_name", "to_name", "type")} == {
        "from_code": "it", "to_code": "en", "from_name": "Italian", "to_name": "English",
        "type": "translate"}
    assert meta["package_version"] and meta["argos_version"]
    assert (root / "sentencepiece.model").read_bytes() == (ckpt / "tokenizer.model").read_bytes()
    nlp = spacy.load(root / "spacy", exclude=["parser"])
    assert nlp.lang == "it" and nlp.pipe_names == []  # Argos adds the sentencizer (E007 if twice)
    readme = (root / "README.md").read_text()
    assert "ARGOS_CHUNK_TYPE=SPACY" in readme and "| max_positions | 300 |" in readme


def test_the_position_table_reaches_what_argos_lets_ctranslate2_read(exported):
    """Argos cuts nothing: CTranslate2 cuts at 1,024 pieces. Our own export refuses a
    position past max_positions; the package's model takes it."""
    _, root, ct2 = exported
    long_input = [["▁a"] * 600]
    package_model = ctranslate2.Translator(str(root / "model"), compute_type="default")
    assert package_model.translate_batch(long_input, beam_size=1, max_decoding_length=5)
    with pytest.raises(Exception, match="position"):
        ctranslate2.Translator(str(ct2), compute_type="default").translate_batch(
            long_input, beam_size=1, max_decoding_length=5)


def test_the_extended_table_changes_no_translation_within_max_positions(exported, tmp_path):
    _, root, ct2 = exported
    sp = spm.SentencePieceProcessor(model_file=str(root / "sentencepiece.model"))
    package_model = ctranslate2.Translator(str(root / "model"), compute_type="default")
    ours = ctranslate2.Translator(str(ct2), compute_type="default")
    lines = [["Ciao, come stai?"], ["Il gatto dorme.", "Domani piove."], ["Sì_no"]]
    for sentences in lines:
        assert argos.argos_translate(package_model, sp, sentences) == \
            argos.argos_translate(ours, sp, sentences)


def test_argos_translate_joins_sentences_and_writes_underscores_as_spaces():
    class FakeTranslator:  # echoes the pieces, as if the model copied its input
        def translate_batch(self, tokens, **settings):
            assert settings["beam_size"] == 4 and settings["length_penalty"] == 0.2
            return [type("R", (), {"hypotheses": [t]}) for t in tokens]

    class FakeSP:
        def encode(self, s, out_type):
            return ["▁" + w for w in s.split()]

        def decode_pieces(self, pieces):
            return "".join(pieces).replace("▁", " ").strip()

    assert argos.argos_translate(FakeTranslator(), FakeSP(), ["un file_nome.", "Due."]) == \
        "un file nome. Due."


def test_output_is_replaced_only_with_force_and_only_if_mt_export_wrote_it(exported, tmp_path, monkeypatch):
    ckpt, root, _ = exported
    package = root.parent.parent / "tiny.argosmodel"
    monkeypatch.setattr(argos, "check_with_argostranslate", lambda packed, root: None)  # the fixture ran it
    out = tmp_path / "m.argosmodel"
    out.write_bytes(b"not a zip")
    cfg = ExportConfig(checkpoint=str(ckpt), output=str(out), format="argos")
    with pytest.raises(OutputError, match="not an output of mt-export"):
        export(cfg)
    cfg.force = True
    with pytest.raises(OutputError, match=r"not an output of mt-export.*even with force=true"):
        export(cfg)
    assert out.read_bytes() == b"not a zip"
    # a package from elsewhere (the Argos index, another tool): a package, but not ours
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("other/metadata.json", "{}")
        z.writestr("other/README.md", "Italian to English, from the Argos index")
    foreign = out.read_bytes()
    with pytest.raises(OutputError, match="not an output of mt-export"):
        export(cfg)
    assert out.read_bytes() == foreign
    out.unlink()
    cfg.force = False
    export(cfg)
    with pytest.raises(OutputError, match="add force=true"):
        export(cfg)
    cfg.force = True
    export(cfg)  # an earlier package of ours: replaced
    assert argos.is_package(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".mt-outputs.json", "m.argosmodel"]  # no leftovers
    legacy = tmp_path / "legacy.argosmodel"  # written before markers: recognised by its README
    legacy.write_bytes(package.read_bytes())
    assert argos.earlier_package(legacy) and not argos.earlier_package(out.with_name("none"))


def test_settings_errors_are_one_line_naming_the_key():
    with pytest.raises(ConfigError, match="format='onnx': choose one of ct2, argos"):
        to_dataclass(ExportConfig, {"checkpoint": "a", "output": "b", "format": "onnx"})
    with pytest.raises(ConfigError, match=r"output='b': format=argos writes a file ending in \.argosmodel"):
        to_dataclass(ExportConfig, {"checkpoint": "a", "output": "b", "format": "argos"})
    with pytest.raises(ConfigError, match=r"output='b\.argosmodel': an \.argosmodel is written with format=argos"):
        to_dataclass(ExportConfig, {"checkpoint": "a", "output": "b.argosmodel"})


def test_without_spacy_mt_export_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "spacy", None)  # import spacy fails
    with pytest.raises(ConfigError, match=r"format=argos needs spacy.*pip install -e \"\.\[argos\]\""):
        export(ExportConfig(checkpoint="ckpt", output=str(tmp_path / "m.argosmodel"), format="argos"))
