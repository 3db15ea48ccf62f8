pytest_plugins = ["tests.zookeeper", "tests.brokers", "tests.leakcheck"]
