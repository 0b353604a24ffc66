"""Which Python ran a benchmark: a build without profile-guided and link-time optimisation runs this code slower.

The container image's interpreter (`python:3.11-slim-bookworm`) is configured with
`--enable-optimizations --with-lto`; pyenv's default build (the development VM's `.venv`) has neither:
20-33 % slower on plain Python work, 4 % on the controller's cycle (much of it in C), less than the
host's own speed moves (bench/README.md, "The interpreter's build"). Distributions set those options in
their own build rules, so an optimised Debian build names neither here.
"""

from __future__ import annotations

import os
import platform
import sys
import sysconfig

OPTIMISING_OPTIONS = ("--enable-optimizations", "--with-lto")


def interpreter_description() -> str:
    """Implementation, version, the real executable and which optimising configure options its build names."""
    arguments = str(sysconfig.get_config_var("CONFIG_ARGS") or "")
    named = [option for option in OPTIMISING_OPTIONS if option in arguments]
    build = (" ".join(named) if named else
             "its configure arguments name neither; a distribution's build may set them in its own rules")
    return (f"{platform.python_implementation()} {platform.python_version()} at {os.path.realpath(sys.executable)} "
            f"({build})")
