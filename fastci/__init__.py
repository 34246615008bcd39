"""FastCI: run only the tests a change can affect, riskiest first, and say why."""

__version__ = "0.1.0"
