"""The scripted model server: a development and demo tool, the one stand-in for a model (none runs here).

It is no part of the product's HTTP layer: it speaks the three APIs as the
real servers do, from a script, for `toolkeeper model`, the demo and the
tests (`python -m toolkeeper.scripted --port 0`). It imports nothing of the
rest of toolkeeper.
"""

from toolkeeper.scripted.server import ScriptedModel, run_scripted, serve_scripted

__all__ = ["ScriptedModel", "run_scripted", "serve_scripted"]
