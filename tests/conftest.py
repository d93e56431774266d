"""Shared test fixtures: an isolated cache directory for every test session, tiny models on the path."""

from __future__ import annotations

import os
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# tests/ mirrors the packages (tests/predictor/, tests/prior/, ...); the shared helpers (_models, _compare,
# _scripts) and the test modules other folders' tests borrow fixtures from are importable by name from any folder.
sys.path.insert(0, str(Path(__file__).parent))
sys.path[1:1] = sorted(str(d) for d in Path(__file__).parent.iterdir()
                       if d.is_dir() and d.name not in {"data", "__pycache__"} and any(d.glob("test_*.py")))

PG_ENV = "DIPPM_NAS_TEST_PG_URL"
SHARED_DATA = Path(os.environ.get("DIPPM_NAS_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def pytest_configure(config: pytest.Config) -> None:
    """Hypothesis keeps its files (an example database, constants and Unicode caches) in a folder of the
    temporary directory, never in the repository: the property tests run with ``database=None`` and a
    derandomized profile, so nothing there changes a run (tests/reliability/test_fuzz_registry.py)."""
    try:
        from hypothesis.configuration import set_hypothesis_home_dir
    except ImportError:  # hypothesis is in the dev extra; the tests that need it skip without it
        return
    set_hypothesis_home_dir(str(Path(tempfile.gettempdir()) / "dippm-nas-hypothesis"))


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Never touch the user's ~/.cache from tests."""
    d = tmp_path_factory.mktemp("dippm-cache")
    old = {k: os.environ.get(k) for k in ("DIPPM_NAS_CACHE_DIR", "DIPPM_NAS_CACHE_URL")}
    os.environ["DIPPM_NAS_CACHE_DIR"] = str(d)
    os.environ.pop("DIPPM_NAS_CACHE_URL", None)
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def shared_data_or_skip(name: str) -> Path:
    """Path of a file of ../shared/data, or skip the test with the reason."""
    p = SHARED_DATA / name
    if not p.is_file():
        pytest.skip(f"needs the public measurement file {p} (../shared/data is not part of the repository)")
    return p


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh schema of the PostgreSQL server at ``$DIPPM_NAS_TEST_PG_URL`` (dropped after the test), or skip."""
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(f"needs a PostgreSQL server: set {PG_ENV}=postgresql+psycopg2://user:pw@127.0.0.1/db "
                    "(.ci/run starts one)")
    pytest.importorskip("psycopg2", reason="needs psycopg2 (pip install 'dippm-nas[postgres]')")
    import sqlalchemy as sa

    schema = f"dippm_test_{uuid.uuid4().hex[:10]}"
    engine = sa.create_engine(base)
    with engine.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    url = sa.engine.make_url(base).update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        engine.dispose()
