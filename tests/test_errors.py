"""transformer/errors.py: a user's mistake is a `UserError` the commands print in one line;
a file that cannot be opened says which, and which key named it."""

from __future__ import annotations

import errno

import pytest

from transformer.errors import ConfigError, UserError, UserFileError, file_error


def test_a_setting_or_a_file_error_is_a_users_mistake_and_still_what_it_was():
    assert issubclass(ConfigError, UserError) and issubclass(ConfigError, ValueError)
    assert issubclass(UserFileError, UserError) and issubclass(UserFileError, OSError)
    assert not issubclass(ValueError, UserError)  # a bug's ValueError keeps its traceback


@pytest.mark.parametrize("err", [
    FileNotFoundError(errno.ENOENT, "No such file or directory"),
    PermissionError(errno.EACCES, "Permission denied"),
    OSError("disk\n  full"),
    OSError(),
])
def test_a_file_error_is_one_line_naming_the_path_the_key_and_what_failed(err):
    e = file_error(err, "/data/corpus.it", "read", key="data.train_src")
    assert isinstance(e, UserFileError)
    message = str(e)
    assert "\n" not in message
    assert message.startswith("data.train_src=/data/corpus.it: cannot read it (")
    assert message.endswith(")") and message != "data.train_src=/data/corpus.it: cannot read it ()"


def test_without_a_key_the_path_alone_is_named():
    e = file_error(IsADirectoryError(errno.EISDIR, "Is a directory"), "out", "write")
    assert str(e) == "out: cannot write it (Is a directory)"
