"""The one version source, read by the package, setup and the C build."""

__version__ = "0.2.0"
