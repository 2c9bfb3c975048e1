"""Build of the one compiled part: the sum-tree kernels (zmqrl/replay/_sumtree.c).

Everything else about the package is in pyproject.toml; setuptools reads both. The extension is
optional: where no C compiler or Python headers exist the build goes on without it, and
zmqrl.replay.sumtree falls back to its numpy implementation (slower, same results).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "zmqrl.replay._sumtree",
            sources=["zmqrl/replay/_sumtree.c"],
            optional=True,  # a failed compile is a warning, not a failed install
        )
    ]
)
