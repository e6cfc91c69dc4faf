"""What a build reads: graph directories of CSV or Parquet tables, one node type or several
(``reader``, ``typed_input``), datasets of small graphs (``graph_dataset``), and the generated
graphs of the demos, tests and benchmarks (``synthetic``, ``synthetic_typed``)."""
