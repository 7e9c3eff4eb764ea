"""The declared dependency ranges exclude every release known to be bad, have a ceiling, and agree
with the two constraint files CI installs from (docs/install.md)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import Specifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]

# Releases that must never be installable: (distribution, the bad releases, where that comes from).
KNOWN_BAD = (
    (
        "lightning",
        "==2.6.2",
        "GHSA-w37p-236h-pfx3, Lightning-AI/pytorch-lightning#21691: compromised release whose wheel "
        "runs a credential stealer on `import lightning` (April 2026)",
    ),
    ("lightning", "==2.6.3", "GHSA-w37p-236h-pfx3: the second compromised release"),
    (
        "lightning",
        "<2.6.6",
        "CVE-2026-58659, GHSA-qqmf-gpg7-g8gw: arbitrary code execution through a checkpoint's "
        "`_instantiator` hyperparameters, fixed in 2.6.6",
    ),
)


def declared(pyproject_text: str) -> list[Requirement]:
    """Every requirement pyproject.toml declares: the dependencies and each extra's."""
    project = tomllib.loads(pyproject_text)["project"]
    lines = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        lines += extra
    return [Requirement(line) for line in lines]


def _neighbours(version: Version) -> list[Version]:
    """The version itself and the releases just below and above it in each component."""
    parts = list(version.release) + [0] * (3 - len(version.release))
    out = [version]
    for i in range(len(parts)):
        for step in (-1, 1):
            bumped = parts.copy()
            bumped[i] += step
            if bumped[i] >= 0:
                out.append(Version(".".join(map(str, bumped))))
    return out


def common_release(a: SpecifierSet, b: SpecifierSet) -> Version | None:
    """A final release both sets admit, or None. Both sets bound versions only at the versions
    they name, so a shared release exists iff one lies at or next to one of those bounds."""
    named = [Version(re.sub(r"\.\*$", "", s.version)) for s in [*a, *b]]
    for candidate in sorted({n for v in named for n in _neighbours(v)}):
        if candidate in a and candidate in b:
            return candidate
    return None


def known_bad_admitted(requirements: list[Requirement]) -> list[str]:
    found = []
    for req in requirements:
        for name, bad, source in KNOWN_BAD:
            if canonicalize_name(req.name) != canonicalize_name(name):
                continue
            release = common_release(req.specifier, SpecifierSet(bad))
            if release is not None:
                found.append(f"{req} admits {name} {release} ({bad}: {source})")
    return found


def pins(path: Path) -> dict[str, Version]:
    """name -> pinned version of a pip constraints/requirements file (`name==version` lines)."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[canonicalize_name(name.split("[")[0])] = Version(version.split(";")[0].strip())
    return out


def floor(spec: SpecifierSet) -> Version | None:
    lows = [Version(s.version) for s in spec if s.operator in (">=", "==", "~=")]
    return max(lows) if lows else None


PYPROJECT = (ROOT / "pyproject.toml").read_text()


def test_no_declared_range_admits_a_known_bad_release():
    assert known_bad_admitted(declared(PYPROJECT)) == []


@pytest.mark.parametrize(
    "line, admitted",
    [
        ("lightning>=2.6,<2.7", "2.6"),  # the range the kit declared before 2.6.6: the CVE's range
        ("lightning>=2.6.4,<2.7", "2.6.4"),
        ("lightning>=2.6,!=2.6.2,!=2.6.3,<2.7", "2.6"),  # excluding the two is not enough
        ("lightning>=2.6.6,<2.7", None),
        ("lightning==2.6.6", None),
        ("pytorch-lightning>=2.0", None),  # another distribution
    ],
)
def test_the_check_finds_a_planted_bad_range(line, admitted):
    found = known_bad_admitted([Requirement(line)])
    releases = {Version(f.split(" admits lightning ")[1].split(" ")[0]) for f in found}
    assert (Version(admitted) in releases) if admitted else found == []


def test_the_compromised_releases_are_caught_on_their_own():
    only_exact = [bad for _, bad, _ in KNOWN_BAD if bad.startswith("==")]
    assert only_exact, "the table lost its compromised releases"
    for bad in only_exact:
        spec = SpecifierSet(f">=2.6,<2.7,{bad.replace('==', '!=')}")
        assert common_release(spec, SpecifierSet(bad)) is None
        assert common_release(SpecifierSet(">=2.6.1,<2.7"), SpecifierSet(bad)) == Version(bad[2:])


def test_every_range_has_a_floor_and_a_ceiling():
    for req in declared(PYPROJECT):
        ops = {s.operator for s in req.specifier}
        assert floor(req.specifier) is not None, f"{req}: no floor"
        assert "==" in ops or "<" in ops or "<=" in ops or "~=" in ops, f"{req}: no ceiling"


@pytest.mark.parametrize("name", ["lowest.txt", "ci.txt"])
def test_constraint_files_pin_every_declared_dependency_within_its_range(name):
    pinned = pins(ROOT / "constraints" / name)
    for req in declared(PYPROJECT):
        key = canonicalize_name(req.name)
        assert key in pinned, f"constraints/{name} does not pin {req.name}"
        assert pinned[key] in req.specifier, f"constraints/{name}: {req.name}=={pinned[key]} is not in {req}"
    bad = [
        f"{n}=={pinned[canonicalize_name(n)]}"
        for n, spec, _ in KNOWN_BAD
        if canonicalize_name(n) in pinned and pinned[canonicalize_name(n)] in SpecifierSet(spec)
    ]
    assert bad == []


def test_the_lower_bound_job_installs_each_declared_floor():
    """constraints/lowest.txt is uv's lowest-direct resolution: each direct dependency at the floor
    pyproject.toml declares, so the floors are versions CI ran (dev/constraints.sh rewrites it)."""
    pinned = pins(ROOT / "constraints" / "lowest.txt")
    for req in declared(PYPROJECT):
        assert pinned[canonicalize_name(req.name)] == floor(req.specifier), (
            f"{req}: the lower-bound job installs {req.name}=={pinned[canonicalize_name(req.name)]}; "
            f"declare that floor, or lower the pin"
        )


def test_specifier_helpers_agree_with_packaging():
    assert common_release(SpecifierSet(">=1.4,<2"), SpecifierSet("<1.4")) is None
    assert common_release(SpecifierSet(">=1.4,<2"), SpecifierSet(">=1.9.9")) == Version("1.9.9")
    assert floor(SpecifierSet(">=2.6.6,<2.7")) == Version("2.6.6")
    assert Specifier("==2.6.2").contains("2.6.2")
