"""transformer/paths.py: the user's files resolve against the working directory, the
project's folders against the project root, wherever the command runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from transformer.config import DataConfig
from transformer.paths import CONFIG_DIR, PROJECT_ROOT, USER_PATH_KEYS, project_path, user_path


def test_the_project_root_holds_the_package_and_the_configs():
    assert (PROJECT_ROOT / "transformer" / "paths.py").is_file()
    assert (CONFIG_DIR / "train.yaml").is_file()


@pytest.mark.parametrize("name", ["data", "data/cache", "configs/model"])
def test_a_relative_project_path_is_under_the_project_root_whatever_the_working_directory(
        name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert project_path(name) == PROJECT_ROOT / name
    monkeypatch.chdir(PROJECT_ROOT)
    assert project_path(name) == PROJECT_ROOT / name


@pytest.mark.parametrize("name", ["corpus.it", "sub/dir/test.en", "../up.txt"])
def test_a_relative_user_path_is_under_the_working_directory(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert user_path(name) == Path.cwd() / name
    assert user_path(name).is_absolute()


def test_an_absolute_path_is_itself_under_both_rules(tmp_path, monkeypatch):
    monkeypatch.chdir(PROJECT_ROOT)
    assert project_path(tmp_path / "x") == tmp_path / "x"
    assert user_path(tmp_path / "x") == tmp_path / "x"


def test_the_home_directory_is_expanded_under_both_rules(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert project_path("~/corpora") == tmp_path / "corpora"
    assert user_path("~/corpora") == tmp_path / "corpora"


def test_the_user_path_keys_are_data_settings():
    """Every key named as the user's own file is a DataConfig field (a renamed key fails here)."""
    fields = {f.name for f in dataclasses.fields(DataConfig)}
    assert set(USER_PATH_KEYS) <= fields
    assert {"root", "cache_dir"}.isdisjoint(USER_PATH_KEYS)  # the project's folders
