"""Helpers of the suite's own tests that start or make real things (servers, builds, models)."""
