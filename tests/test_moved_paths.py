"""Old module paths (before the role packages) still import for one release, with a warning."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from zmqrl.moved import MOVED


def test_every_old_path_names_a_module_that_exists() -> None:
    for new in MOVED.values():
        importlib.import_module(new)


def test_an_old_path_is_the_new_module_and_warns_with_its_new_name() -> None:
    # A fresh interpreter, so the warning is not swallowed by an import this session already made.
    code = (
        "import warnings\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        "try:\n"
        "    import zmqrl.acting\n"
        "except DeprecationWarning as warning:\n"
        "    print(warning)\n"
        "warnings.simplefilter('ignore')\n"
        "import zmqrl.acting, zmqrl.actor.sampler, zmqrl.monitoring.status, zmqrl.supervisor.status\n"
        "assert zmqrl.acting is zmqrl.actor.sampler\n"
        "assert zmqrl.monitoring.status is zmqrl.supervisor.status\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "zmqrl.acting moved to zmqrl.actor.sampler" in out


@pytest.mark.parametrize(("package", "name"), [("zmqrl.envs", "make_env"), ("zmqrl.cli", "main")])
def test_a_module_that_became_a_package_forwards_its_old_names(package: str, name: str) -> None:
    module = importlib.import_module(package)
    with pytest.warns(DeprecationWarning, match=f"{package}.{name} moved"):
        assert callable(getattr(module, name))
    with pytest.raises(AttributeError):
        module.no_such_name  # noqa: B018
