"""gunicorn's control socket is each instance's own (in its QAG_HOME): two instances on a host keep theirs."""

from __future__ import annotations

import os
import stat

import pytest

from tests.server import wait_for

pytestmark = pytest.mark.e2e


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except FileNotFoundError:
        return False


def test_two_instances_keep_their_own_control_sockets(make_server):
    first, second = make_server(seed=False, workers=1), make_server(seed=False, workers=1)
    mine, theirs = (os.path.join(s.home, "gunicorn.ctl") for s in (first, second))
    assert wait_for(lambda: _is_socket(mine) and _is_socket(theirs), "both control sockets", 10.0)
    assert any(f"Control socket listening at {mine}" in line for line in first.log)
    first.stop()
    assert not _is_socket(mine)          # the first instance removed its own on the way out ...
    assert _is_socket(theirs)            # ... and nothing of the second's
    assert second.get("/health").status == 200
