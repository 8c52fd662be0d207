"""Fixtures for the tests of the built-in provider profiles against stand-ins of the providers
under their real host names (standins.py). They run inside scripts/msal-session, whose private
network namespace resolves github.com, gitlab.com, accounts.google.com, bitbucket.org,
codeberg.org and their API hosts to 127.0.0.2:

    scripts/msal-session "$PWD/.build-idp/venv/bin/python" -m pytest -q Tests/standins

Everything else is Tests/e2e's: its fixtures (a clean keyring, the browser stand-in, tesserad
started per test) are loaded from its conftest.py.
"""
import importlib.util
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
E2E = os.path.join(os.path.dirname(HERE), "e2e")

if os.environ.get("TESSERA_MSAL_SESSION") != "1":
    pytest.exit(
        "The provider stand-ins answer under real host names only inside scripts/msal-session:\n"
        '  scripts/msal-session "$PWD/.build-idp/venv/bin/python" -m pytest -q Tests/standins',
        returncode=2,
    )

sys.path.insert(0, E2E)
_spec = importlib.util.spec_from_file_location("e2e_conftest", os.path.join(E2E, "conftest.py"))
e2e = importlib.util.module_from_spec(_spec)
sys.modules["e2e_conftest"] = e2e
_spec.loader.exec_module(e2e)
# Tests/e2e's fixtures and names, as if defined here: pytest registers the fixtures a conftest
# holds, and Tests/e2e's modules (`from conftest import ...`) find theirs.
globals().update({name: value for name, value in vars(e2e).items() if not name.startswith("__")})

from standins import StandIns  # noqa: E402


@pytest.fixture(scope="session")
def standins(tmp_path_factory):
    servers = StandIns(str(tmp_path_factory.mktemp("standins")), os.path.join(e2e.IDP_DIR, "ca.pem"),
                       os.path.join(e2e.IDP_DIR, "ca-key.pem"))
    yield servers
    servers.close()
