"""The package's version, in a module of its own: anything may import it (the Hub cards, the generate job's
invocation stamp, calibration records, ``setup.py``) without importing the package root and everything it loads."""

__version__ = "0.1.0.dev0"
