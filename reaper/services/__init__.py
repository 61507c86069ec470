"""Supervised services: helpers that run beside the main child (a log shipper, a
metrics agent, sshd), restarted with backoff, given up on crash loops, stopped in
reverse order at the end. Imported only when a service is configured.

- spec.py: what the options say (NAME=COMMAND, a services directory), checked
  before anything starts;
- restart.py: when a service that ended starts again, or is given up (backoff,
  the start limit); no processes, no clock of its own;
- runner.py: the processes: spawned through the C core, their readiness pipes,
  their exits, the ordered stop in the drain. A policy piece ("services") of the
  failure boundary (reaper/boundary.py).
"""
