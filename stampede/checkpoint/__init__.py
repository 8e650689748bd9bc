"""What stampede writes and how it is laid out: the plans of who reads and writes what,
prepare, the saved versions and their journal, the manifest, formats and content, the
lock that keeps one writer per target, clean."""
