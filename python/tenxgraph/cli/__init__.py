"""``tenxgraph`` (also ``python -m tenxgraph``): inspect and operate a checkpointer's threads.

    tenxgraph threads list [--user U] [--status S] [--since 2h]
    tenxgraph threads show THREAD
    tenxgraph threads messages THREAD
    tenxgraph ledger THREAD [--call KEY]
    tenxgraph migrate
    tenxgraph stop THREAD

Point it at a store with ``--sqlite PATH``, ``--dsn postgresql://...`` (or ``$TENXGRAPH_DSN``),
or ``--config 10xgraph.json`` (the default when that file is in the current directory). Tables by
default, ``--json`` for scripts. Exit codes: 0 ok, 1 failed, 2 usage, 3 thread or call not found,
4 store unreachable or invalid, 5 bad 10xgraph.json.
"""

from tenxgraph.cli.main import main

__all__ = ["main"]
