"""pytest plugin (`-p fact_needs_log`, calibration/ on PYTHONPATH, FACT_NEEDS_LOG=FILE): write
every SpecError built while the tests run, as calibration/check_fact_needs.py's records (key:
the test and the error's ordinal in it), so that two versions' hints can be compared over
the existing test inputs (`check_fact_needs.py compare`)."""

from __future__ import annotations

import json
import os

import pytest

from diffperf.errors import SpecError

_LOG = open(os.environ["FACT_NEEDS_LOG"], "w")  # noqa: SIM115 (open for the whole run)
_STATE = {"test": "", "n": 0}
_INIT = SpecError.__init__


def _init(self, message="", **kw):
    _INIT(self, message, **kw)
    _STATE["n"] += 1
    _LOG.write(json.dumps(dict(key=f"{_STATE['test']}#{_STATE['n']}", message=str(message),
                               field=self.field,
                               needs=list(getattr(self, "needs", None) or ()))) + "\n")


SpecError.__init__ = _init


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _STATE["test"], _STATE["n"] = item.nodeid, 0


def pytest_unconfigure(config):
    _LOG.close()
