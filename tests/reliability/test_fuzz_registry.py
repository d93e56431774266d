"""Every public entry point is in the fuzz registry, and every registered one holds under hostile input.

- :func:`test_every_public_name_verb_and_option_is_registered` enumerates ``__all__`` of every public face and
  every CLI verb and option that takes a value (from the argparse parser) and fails on one the registry lacks;
  the two tests after it prove that on a scratch public function and a scratch CLI verb added in the test.
- :func:`test_entry_holds_under_hostile_input` is the property of each entry: a ``DippmNasError`` (exit 1 or 2
  for the CLI), a flagged fallback or a handled value; never another exception, a hang (each example runs in a
  worker thread with a deadline), a changed input file, or a silent wrong value where the entry has an oracle.
- :func:`test_no_password_in_any_text` is the credential property of every object holding a storage URL.

Profiles (Hypothesis settings profiles): ``default`` draws a few examples per entry, derandomized (the same
examples on every run) and writes no example database; ``DIPPM_NAS_FUZZ_PROFILE=deep`` draws 100 per entry from
a random seed and shrinks what fails.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from pathlib import Path
import pytest

pytest.importorskip("hypothesis", reason="the fuzz registry needs hypothesis (pip install 'dippm-nas[dev]')")
from hypothesis import HealthCheck, Phase, settings  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import fuzz_hostile as H  # noqa: E402
import fuzz_registry as R  # noqa: E402

settings.register_profile("default", max_examples=3, derandomize=True, database=None, deadline=None,
                          phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
settings.register_profile("deep", max_examples=100, derandomize=False, database=None, deadline=None,
                          suppress_health_check=list(HealthCheck))
PROFILE = os.environ.get("DIPPM_NAS_FUZZ_PROFILE", "default")

_SURFACES = R.cli_surfaces()
_REGISTRY = R.build_registry(_SURFACES)
_FUZZED = sorted(n for n, e in _REGISTRY.items() if not e.exempt and e.strategy is not None)


# --------------------------------------------------------------------------------------------- coverage
def test_every_public_name_verb_and_option_is_registered() -> None:
    gaps = R.missing(_REGISTRY, R.public_names(), _SURFACES)
    assert not gaps, ("public entry points with no entry in tests/reliability/fuzz_registry.py (give each a "
                      f"strategy, or a reason it needs none): {gaps}")


def test_each_name_is_in_one_list_of_the_registry() -> None:
    lists = (R.CONSTANTS, R.TYPE_ALIASES, R.EXCEPTIONS, R.MODULES, R.RECORDS, R.GENERIC, list(R.NO_ARGUMENT),
             list(R.OBJECT_ONLY), list(R.NEEDS_OBJECTS), list(R.KERNELS), list(R.THROUGH),
             list(R.CUSTOM))
    seen: dict[str, int] = {}
    for names in lists:
        for n in names:
            seen[n] = seen.get(n, 0) + 1
    assert [n for n, c in seen.items() if c > 1] == []
    stale = [n for n in seen if not _resolves(n)]
    assert stale == [], f"registered names that are no longer public: {stale}"


def _resolves(path: str) -> bool:
    try:
        R._resolve(path)
    except (ImportError, AttributeError):
        return False
    return True


def scratch_function(x: float) -> float:
    """A new public function nobody registered."""
    return x


def test_an_unregistered_public_function_fails_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    import dippm_nas.units as units
    monkeypatch.setattr(units, "scratch_function", scratch_function, raising=False)
    monkeypatch.setattr(units, "__all__", [*units.__all__, "scratch_function"])
    gaps = R.missing(_REGISTRY, R.public_names(), _SURFACES)
    assert gaps == ["dippm_nas.units.scratch_function"]


def test_an_unregistered_cli_verb_and_option_fail_the_registry() -> None:
    from dippm_nas.cli._main import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    scratch = sub.add_parser("scratch-verb")
    scratch.add_argument("--scratch-value", type=int)
    scratch.add_argument("--scratch-flag", action="store_true")  # takes no value: nothing to fuzz
    predict = sub.choices["predict"]
    predict.add_argument("--scratch-budget", type=float)
    surfaces = R.cli_surfaces(parser)
    gaps = R.missing(R.build_registry(surfaces), R.public_names(), surfaces)
    assert gaps == ["cli:predict --scratch-budget", "cli:scratch-verb", "cli:scratch-verb --scratch-value"]


def test_the_runner_classifies_what_it_cannot_accept(tmp_path: Path) -> None:
    """The property can fail: another exception is a crash, a call past the deadline a hang, a changed input
    lost (each case the registry's property refuses)."""
    from dippm_nas.errors import InvalidValueError

    def bad_value() -> None:
        raise InvalidValueError("x = nan: expected a finite number")

    with H.scene() as sc:
        assert H.run_case(bad_value, sc).outcome == "clear error"
        assert H.run_case(lambda: {}["k"], sc).outcome == "crash"
        fifo = sc.special("fifo")
        assert H.run_case(lambda: Path(fifo).read_text(), sc, deadline_s=0.5).outcome == "hang"
        victim = sc.input_file(b"data")
        assert H.run_case(lambda: victim.write_bytes(b"{}"), sc).outcome == "lost"
        assert H.run_case(lambda: warnings.warn("fell back", UserWarning), sc).outcome == "fallback"
        assert H.run_case(lambda: 1, sc, oracle=lambda v: "1 is wrong").outcome == "silent wrong"


# --------------------------------------------------------------------------------------------- the property
@pytest.mark.parametrize("name", _FUZZED)
def test_entry_holds_under_hostile_input(name: str) -> None:
    entry = _REGISTRY[name]
    bad: list[str] = []
    R.run_entry(entry, settings.get_profile(PROFILE), record=lambda r: bad.append(str(r)) if r.outcome in H.BAD
                else None)
    assert not bad, f"{name}: " + " | ".join(bad[:3])


# --------------------------------------------------------------------------------------------- credentials
@pytest.mark.parametrize("url", R._pw_urls(), ids=["refused", "port", "driver", "malformed"])
@pytest.mark.parametrize("name", sorted(R.CREDENTIALS))
def test_no_password_in_any_text(name: str, url: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = R.credential_case(name, url)
    texts = [caplog.text, *(str(w.message) for w in caught)]
    assert res.outcome not in H.BAD, f"{name}: {res}"
    assert not [t for t in texts if H.PASSWORD in t], f"{name}: the password is in a log record or a warning"
