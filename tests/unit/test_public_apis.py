"""gpuwm reaches its dependencies through their public APIs only.

A private name (pydantic's `__pydantic_*__` slots, pynvml's `_nvml…` helpers, kopf's `_core`/`_cogs`
packages) or an allocator knob set from inside the process (glibc's `mallopt`) works until the
dependency's next release changes it without notice. This reads every module of the package as text,
as a reviewer's grep would, and names each line that does so.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "gpuwm"

#: what is private, and why it is named here
PRIVATE_NAMES = {
    "pydantic's internal slots and validators (use model_construct, model_fields_set, model_dump_json)":
        re.compile(r"__pydantic_\w+"),
    "pynvml's private helpers (use its nvml… functions)": re.compile(r"\bpynvml\._\w"),
    "glibc's allocator tuning from inside the process (MALLOC_ARENA_MAX is the documented knob)":
        re.compile(r"\bmallopt\b"),
    "kopf's private packages (use kopf's top-level names)": re.compile(r"\bkopf\._\w"),
    "struct or model fields read past their class's own attribute lookup": re.compile(r"\bobject\.__getattribute__\b"),
    "the standard library's private helpers (use ssl.create_default_context and its attributes)":
        re.compile(r"\b(?:ssl|os|sys|socket|asyncio|json|logging|threading|ctypes)\._[a-z]"),
}

#: known uses that stay until the code around them changes: (path below the package, what the line holds)
KNOWN = {
    # kopf.run takes an Insights, which kopf exports under no public name
    ("controller/command.py", "from kopf._cogs.structs import references"),
    # kopf's watch of new resource kinds, reused for the kinds found absent at start
    ("controller/handlers.py", "from kopf._core.reactor.observation import process_discovered_resource_event"),
    # the logger kopf's observation writes to, by its name
    ("controller/handlers.py", 'logging.getLogger("kopf._core.reactor.observation")'),
}


def private_uses(root: Path) -> list[str]:
    """`path:line: why` for each line below `root` that names a dependency's private name."""
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            for why, pattern in PRIVATE_NAMES.items():
                if pattern.search(line) and not any(relative == where and text in line for where, text in KNOWN):
                    found.append(f"{relative}:{number}: {why}: {line.strip()}")
    return found


def test_the_package_names_no_private_name_of_its_dependencies() -> None:
    assert private_uses(PACKAGE) == []


def test_known_uses_are_still_there() -> None:
    """An entry of KNOWN whose line has gone is removed from it, so that it cannot excuse a new one."""
    for where, text in KNOWN:
        assert text in (PACKAGE / where).read_text(encoding="utf-8"), (where, text)


@pytest.mark.parametrize("line", [
    'object.__setattr__(instance, "__pydantic_fields_set__", shared)',
    'function = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetSamples")',
    "mallopt = _libc_function('mallopt')",
    "from kopf._cogs.configs import configuration",
    "_field = object.__getattribute__",
    "context = ssl._create_unverified_context()",
])
def test_each_kind_of_private_name_is_found(tmp_path: Path, line: str) -> None:
    (tmp_path / "module.py").write_text(f"{line}\n", encoding="utf-8")
    assert len(private_uses(tmp_path)) == 1
