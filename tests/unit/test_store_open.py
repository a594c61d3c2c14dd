"""A store that cannot be opened: StoreOpenError, one line naming QAG_HOME or QAG_DATABASE_URL and what to do."""

from __future__ import annotations

import socket

import pytest

from qag.settings import load
from qag.store import StoreError, StoreOpenError, open_store


def _refused(settings_env: dict) -> str:
    with pytest.raises(StoreOpenError) as raised:
        open_store(load(settings_env))
    message = str(raised.value)
    assert isinstance(raised.value, StoreError) and "\n" not in message
    return message


def test_a_home_under_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    home = tmp_path / "f" / "home"
    assert _refused({"QAG_HOME": str(home)}) == (
        f"QAG_HOME {home}: cannot create the folder (Not a directory); create it, or set QAG_HOME to a folder this "
        f"user can write")
    assert _refused({"QAG_HOME": str(tmp_path / "f")}) == \
        f"QAG_HOME {tmp_path / 'f'} is a file, not a folder; set QAG_HOME to a folder"


def test_a_store_file_that_is_not_a_database(tmp_path):
    (tmp_path / "qag.db").write_bytes(b"not a database" * 100)
    assert _refused({"QAG_HOME": str(tmp_path)}) == (
        f"QAG_HOME {tmp_path}: cannot open the store qag.db there (file is not a database); restore the file, or "
        f"set QAG_HOME to another folder")


def test_a_server_that_is_down_names_the_url_without_its_password():
    pytest.importorskip("psycopg2", reason="the postgres extra (pip install 'qag[postgres]'); no server is needed")
    with socket.socket() as s:   # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    message = _refused({"QAG_DATABASE_URL": f"postgresql://u:hunter2@127.0.0.1:{port}/db?password=hunter3"})
    assert message == (f"QAG_DATABASE_URL postgresql://u:***@127.0.0.1:{port}/db?password=***: Connection refused; "
                       f"start the server or fix host/port in the URL")


def test_store_copy_names_its_own_flag(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(StoreOpenError, match=r"^--to .*; create it, or set --to to a folder this user can write$"):
        open_store(load({}), home=str(tmp_path / "f" / "x"), setting="--to")


def test_a_home_where_the_store_file_cannot_be_made(tmp_path, monkeypatch):
    import os
    real_open = os.open

    def refuse(path, *args, **kwargs):   # as a folder this user cannot write (tests may run as root)
        if os.path.basename(path) == "qag.db":
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse)
    assert _refused({"QAG_HOME": str(tmp_path)}) == (
        f"QAG_HOME {tmp_path}: cannot create the store qag.db there (Permission denied); make the folder writable "
        f"for this user, or set QAG_HOME to another folder")
