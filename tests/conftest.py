pytest_plugins = ["tests.zookeeper"]
