"""What the runs of one engine share (private): the services every run session is given,
the heartbeat that keeps their leases, the fleet's model rate in this process and the
pacing of a busy event loop."""
