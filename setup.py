"""The one native piece of m27: xxh3 over many checkpoint chunks per call (csrc/spans.c).

Everything else is in pyproject.toml. The extension is optional: without a C compiler
the build goes on without it and checkpoints hash chunks from Python (the same values,
a few milliseconds slower per GiB; `m27.checkpoint.native_hashing()` says which).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "m27.checkpoint._spans",
            sources=["csrc/spans.c"],
            depends=["csrc/third_party/xxhash/xxhash.h"],
            include_dirs=["csrc"],
            extra_compile_args=["-O3"],
            optional=True,
        )
    ]
)
