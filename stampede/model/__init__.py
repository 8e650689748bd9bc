"""What the measurements mean at scale, pure: the contention model and its fit, the
projection to a rank count that cannot be run and its band, the simulation that checks
the model on a virtual clock, T_MTTR, the workload a verdict is for, the sizing, the
verdict of an archive, a sweep planned to a budget."""
