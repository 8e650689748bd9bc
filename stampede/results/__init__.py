"""The bottom of the stack: what was measured, as records (model), statistics, archive
rows and sidecars, traces, and their renderings (terminal, HTML, plots). Knows nothing of
MPI or the timed loop: stampede.run builds the records."""
