"""Every command-line interface of the serving install (translate, serve, score, export-triton), the one
option vocabulary, and the ``mtgate`` dispatcher, which discovers command groups by registration."""
