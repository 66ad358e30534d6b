"""toolkeeper: a policy-and-proxy layer between an agent and its tools."""

__version__ = "0.1.0"
