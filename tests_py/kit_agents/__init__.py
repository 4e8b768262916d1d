"""Graphs for tests_py/test_testing_kit.py, importable by child processes as ``tests_py.kit_agents.*``."""
