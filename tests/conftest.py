pytest_plugins = ["trainflow.testing"]
