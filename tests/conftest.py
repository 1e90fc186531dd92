import os

import pytest

# The two-backend `db_url` fixture (SQLite file, throwaway PostgreSQL database) for every module.
pytest_plugins = ["store_fixtures"]


@pytest.hookimpl(trylast=True)  # after pytest's own tmp_path plugin has set up its factory
def pytest_configure(config):
    # The shipped registry only: a developer's own kernel directories (convsweep.variants) are not
    # what the tests are about; a test that wants extra variants (the red team) sets the variable.
    os.environ.pop("CONVSWEEP_VARIANTS", None)
    # A private cache per test session: tests never depend on what a previous run left behind.
    if "CONVSWEEP_CACHE" not in os.environ:
        cache = config._tmp_path_factory.mktemp("convsweep-cache") if hasattr(config, "_tmp_path_factory") else None
        if cache is not None:
            os.environ["CONVSWEEP_CACHE"] = str(cache)


def pytest_collection_modifyitems(config, items):
    from convsweep.gpu import gpu_available

    if not any("gpu" in item.keywords for item in items):
        return
    ok, why = gpu_available()
    if ok:
        return
    skip = pytest.mark.skip(reason=f"gpu test: {why}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
