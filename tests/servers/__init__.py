"""The servers tests start, shared with the benchmarks: TorchServe, redis-server and a Redis
Cluster on free loopback ports with their own directories, stopped by PID; the session-shared
Redis instances the tests use."""
