"""The ordered versions a bisection walks: PyPI releases matching a requirement, an explicit list, or the commits
of a local git checkout. Each :class:`Version` carries what was known of it when it was resolved (its upload or
commit date, a yank), so that a report made later never asks the network."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version as Pep440

PYPI_JSON = "https://pypi.org/pypi/{name}/json"


@dataclass(frozen=True)
class Version:
    """One version of the candidate's package: ``name`` (a release, or a commit's short hash), how to install it
    (``install``: a requirement for uv, or a commit of ``checkout``), and what was known of it when resolved."""

    name: str
    install: str
    date: str | None = None  # the first upload of the release (UTC, ISO 8601), or the commit's date
    yanked: str | None = None  # the yank's reason ("" when none was given); None: not yanked
    checkout: str | None = None  # a local git checkout (commits)

    def record(self) -> dict:
        return {"version": self.name, "install": self.install, "date": self.date, "yanked": self.yanked,
                "checkout": self.checkout}


def fetch_pypi(name: str) -> dict:
    """PyPI's JSON document of project ``name`` (a ValueError of one line when it cannot be read)."""
    url = PYPI_JSON.format(name=canonicalize_name(name))
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return json.load(response)
    except Exception as exc:  # noqa: BLE001 - offline, unknown project, a proxy: one line either way
        raise ValueError(f"cannot read {url} ({type(exc).__name__}: {exc}); give the versions from a machine that "
                         f"reaches PyPI, or --git DIR --commits A..B") from None


def _release_facts(document: dict) -> dict[str, tuple[str | None, str | None]]:
    """Each release with files -> (its first upload time, its yank reason or None)."""
    facts = {}
    for version, files in document.get("releases", {}).items():
        if not files:
            continue
        first = min(f.get("upload_time_iso_8601") or f.get("upload_time") or "" for f in files) or None
        yanked = files[0].get("yanked_reason") or "" if all(f.get("yanked") for f in files) else None
        facts[version] = (first, yanked)
    return facts


def parse_versions(text: str) -> tuple[str, SpecifierSet | None, list[str] | None]:
    """``'tpu-inference>=0.20,<=0.32'`` -> (dist, specifier, None); ``'tpu-inference==0.20.0,0.21.0'`` (an explicit
    list, kept in its order) -> (dist, None, [versions]). A ValueError of one line for anything else."""
    name, sep, listed = text.partition("==")
    if sep and "," in listed and not any(c in listed for c in "<>=!~"):
        versions = [v.strip() for v in listed.split(",") if v.strip()]
        for v in versions:
            try:
                Pep440(v)
            except InvalidVersion:
                raise ValueError(f"--versions {text!r}: {v!r} is not a version (PEP 440)") from None
        if len(set(versions)) != len(versions):
            raise ValueError(f"--versions {text!r} names a version twice")
        return name.strip(), None, versions
    try:
        requirement = Requirement(text)
    except InvalidRequirement as exc:
        raise ValueError(f"--versions {text!r} is neither a requirement ('tpu-inference>=0.20,<=0.32') nor a list "
                         f"('tpu-inference==0.20.0,0.21.0'): {exc}") from None
    if requirement.url or requirement.extras or requirement.marker:
        raise ValueError(f"--versions {text!r}: give a name and version specifiers only")
    return requirement.name, requirement.specifier, None


def pypi_versions(text: str, fetch: Callable[[str], dict] = fetch_pypi) -> tuple[str, list[Version], list[str]]:
    """The releases ``text`` names (:func:`parse_versions`), oldest first, with their upload dates and yanks from
    PyPI's JSON (``fetch``), and notes on what was left out (pre-releases unless the specifier names one, yanked
    releases unless named in a list). A list keeps its order and may name a release PyPI lacks (its install then
    fails, as a row)."""
    dist, specifier, listed = parse_versions(text)
    facts = _release_facts(fetch(dist))
    notes = []
    if listed is not None:
        chosen = listed
    else:
        known = sorted(facts, key=Pep440)
        chosen = [v for v in known if specifier.contains(v, prereleases=bool(specifier.prereleases))]
        yanked = [v for v in chosen if facts[v][1] is not None]
        if yanked:
            notes.append(f"left out as yanked (pip would not pick them): {', '.join(yanked)}")
        chosen = [v for v in chosen if facts[v][1] is None]
        pre = [v for v in known if Pep440(v).is_prerelease and specifier.contains(v, prereleases=True)]
        if pre and not specifier.prereleases:
            notes.append(f"{len(pre)} pre-releases and nightlies left out (name one in the specifier to include "
                         f"them)")
    if not chosen:
        raise ValueError(f"--versions {text!r} matches no release of {dist} on PyPI")
    versions = [Version(v, f"{dist}=={v}", *facts.get(v, (None, None))) for v in chosen]
    return dist, versions, notes


def _git(checkout: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise ValueError(f"git {' '.join(args)} in {checkout}: {last}")
    return done.stdout


def git_versions(checkout: Path, commits: str) -> list[Version]:
    """The commits ``A..B`` of a local checkout, A first (git bisect's good end), then each first-parent commit
    after it up to B, with their committer dates."""
    checkout = Path(checkout)
    if not (checkout / ".git").exists() and not _git_ok(checkout):
        raise ValueError(f"--git {checkout} is not a git checkout")
    first, sep, last = commits.partition("..")
    if not sep or not first or not last:
        raise ValueError(f"--commits {commits!r} must be A..B (two commits of {checkout})")
    shas = [_git(checkout, "rev-parse", "--verify", f"{first}^{{commit}}").strip()]
    shas += _git(checkout, "rev-list", "--reverse", "--first-parent", f"{first}..{last}").split()
    versions = []
    for sha in shas:
        date = _git(checkout, "show", "-s", "--format=%cI", sha).strip()
        versions.append(Version(sha[:12], sha, date=date, checkout=str(checkout.resolve())))
    return versions


def _git_ok(checkout: Path) -> bool:
    try:
        _git(checkout, "rev-parse", "--git-dir")
    except ValueError:
        return False
    return True


def declared_refusal(declarations) -> Callable[[str], str | None]:
    """A binding's refusal of versions: ``declarations``, pairs (PEP 440 specifier, reason) on the implementation
    object (``version_refusals``), the first that holds the version giving its reason. A version that is no PEP 440
    version (a commit) is never refused here: its binding refuses cases as it runs."""
    rules = [(SpecifierSet(spec), reason) for spec, reason in declarations]

    def refusal(version: str) -> str | None:
        try:
            parsed = Pep440(version)
        except InvalidVersion:
            return None
        return next((reason for spec, reason in rules if spec.contains(parsed, prereleases=True)), None)

    return refusal
