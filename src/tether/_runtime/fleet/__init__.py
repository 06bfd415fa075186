"""The fleet (private): what a worker does beside carrying one run. The runner the
``Worker`` owns (claims), recovery of orphans, upkeep (expiry, notices, retention),
agent versions across deploys, and firing schedules."""
