"""Old module paths (before the role packages) still import for one release, with a warning."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from zmqrl.moved import MOVED, MOVED_PACKAGES, moved_to


def test_every_old_path_names_a_module_that_exists() -> None:
    for new in [*MOVED.values(), *MOVED_PACKAGES.values()]:
        importlib.import_module(new)


def test_a_package_that_left_zmqrl_forwards_every_module_under_it() -> None:
    assert moved_to("zmqrl.bench") == "zmqrl_bench"
    assert moved_to("zmqrl.bench.report") == "zmqrl_bench.report"
    assert moved_to("zmqrl.benchmarks") is None  # a prefix of the name is not its package
    assert moved_to("zmqrl.api") is None
    code = (
        "import sys, warnings\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        "try:\n"
        "    import zmqrl.bench.report\n"
        "except DeprecationWarning as warning:\n"
        "    print(warning)\n"
        "assert 'zmqrl_bench' not in sys.modules, 'zmqrl imported the benchmarks by itself'\n"
        "warnings.simplefilter('ignore')\n"
        "import zmqrl.bench.report, zmqrl_bench, zmqrl_bench.report\n"
        "from zmqrl.bench.cli import app\n"
        "import zmqrl_bench.cli\n"
        "assert zmqrl.bench is zmqrl_bench and zmqrl.bench.report is zmqrl_bench.report\n"
        "assert app is zmqrl_bench.cli.app\n"
        "old = [m for m in sys.modules if m.startswith('zmqrl.bench')]\n"
        "assert sorted(old) == ['zmqrl.bench', 'zmqrl.bench.cli', 'zmqrl.bench.report'], old\n"
        "assert all(sys.modules[m] is sys.modules['zmqrl_bench' + m[11:]] for m in old), 'ran twice'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("zmqrl.bench moved to zmqrl_bench; the old path goes in the next release")


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
