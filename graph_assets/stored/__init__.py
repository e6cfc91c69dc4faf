"""The stored graph: the memory-mapped, checksummed store format (``store``), how a graph is
written into it (``writer``), and one copy of its files for every archive version that carries
them (``shared``)."""
