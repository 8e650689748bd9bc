"""The timed part: setup before the clock, the restore and save patterns each rank runs
between clock stamps, the clock's axis per node, the gathers to rank 0, the exchanges,
the host-to-device copies, the loaders, start-up."""
