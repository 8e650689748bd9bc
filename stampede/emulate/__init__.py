"""Stand-ins for infrastructure a laptop lacks: a FUSE metadata server with C slots of S
seconds (mds, writable, service, mount) and an emulated cluster of network namespaces
with shaped NICs and a storage host (topology, cluster, objectstore)."""
