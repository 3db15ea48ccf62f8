import os

pytest_plugins = ["tests.zookeeper", "tests.brokers", "tests.leakcheck"]


def pytest_configure(config) -> None:
    # pytest-xdist's workers run with COLUMNS=80, a terminal's width, though their output is
    # a pipe: the CLI's tables would be cut there and nowhere else. Tests that need a width
    # set it themselves.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.pop("COLUMNS", None)
