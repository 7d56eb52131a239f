"""trainflow's release: what the package says it is, and part of every prepared split's cache key."""

__version__ = "0.3.0"
