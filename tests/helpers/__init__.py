"""What the tests share: job files, real servers, real checkpoints, the fault
file system, the scripts run under mpiexec, and the rule for optional packages."""
