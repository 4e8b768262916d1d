"""Optional integrations. Each module imports a third-party package that the core does not depend
on; install it with the matching extra (``pip install "10xgraph[prometheus]"`` / ``[otel]``)."""
