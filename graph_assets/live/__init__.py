"""The live graph: typed update operations (``operations``), the overlay that applies them on
top of a stored graph and answers as one (``overlay``), and the durable logs every worker and
replica replays them from (``update_log`` on a file, ``redis_log`` in Redis, their lineage
across compactions in ``log_lineage``)."""
