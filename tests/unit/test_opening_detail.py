"""A failure to open a connection: the client library's text, cleaned so that nothing in it tells where, or
whether, the connection's password equals a part of it (qag.backends.base.opening_detail)."""

from __future__ import annotations

from qag.backends.base import OPENING_WITHHELD, opening_detail

PG = 'connection to server at "{host}", port {port} failed: FATAL:  password authentication failed for user "{user}"'


def _text(**fields):
    return PG.format(**{"host": "db.example", "port": 5432, "user": "alice", **fields})


def test_the_connections_own_values_are_shown_by_name():
    fields = {"host": "db.example", "port": 5432, "user": "alice", "password": "hunter2"}
    assert opening_detail(_text(), fields) == ('connection to server at "<host>", port <port> failed: FATAL:  '
                                               'password authentication failed for user "<user>"')


def test_a_password_equal_to_a_field_reads_as_any_other():
    """user == password, database == password, a password that is part of the user name: the same detail as with
    any other password, and the password nowhere in it."""
    other = opening_detail(_text(), {"host": "db.example", "port": 5432, "user": "alice", "password": "zz-9"})
    for password in ("alice", "db.example", "5432", "alic"):
        fields = {"host": "db.example", "port": 5432, "user": "alice", "password": password}
        assert opening_detail(_text(), fields) == other
    # A longer value wins where two overlap: "bobdb" is the database, never "<user>db".
    assert opening_detail('database "bobdb" of user "bob"', {"user": "bob", "database": "bobdb", "password": "bob"}) \
        == 'database "<database>" of user "<user>"'


def test_a_credential_still_in_the_text_withholds_it_whole():
    """Only a credential quoted by the library itself (or part of its own wording): the fixed message, never a
    substitution at its place."""
    fields = {"user": "alice", "password": "pw-9f2", "sslpassword": "key-pass"}
    assert opening_detail("invalid option pw-9f2", fields) == OPENING_WITHHELD
    assert opening_detail("could not decrypt key with key-pass", fields) == OPENING_WITHHELD
    assert opening_detail("plain text", fields) == "plain text"


def test_values_are_replaced_as_whole_words_only():
    fields = {"user": "a", "sslmode": "require", "password": "x-1"}
    assert opening_detail('SSL required for user "a" at a host', fields) == \
        'SSL required for user "<user>" at <user> host'
    assert opening_detail("ok", {"ssl_disabled": True, "db_roles": {"r": "x"}, "password": ""}) == "ok"
