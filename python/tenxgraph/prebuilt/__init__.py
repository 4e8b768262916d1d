"""Prebuilt pieces: ``tenxgraph.prebuilt.tools`` (handoff tools) and, with the LLM layer,
``tenxgraph.prebuilt.agent``. Import from those subpackages; nothing is loaded here."""
