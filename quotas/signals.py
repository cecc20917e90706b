"""What the quotas app tells the apps above it, by name (it imports none of them)."""

from django.dispatch import Signal

# A queue's settings changed and were saved (sent inside the transaction; receivers defer work to its commit).
# kwargs: queue. Received by `jobs.receivers` to push the Volcano Queue when that backend is on.
queue_changed = Signal()

# A team was created, or its namespace or quota changed (sent inside the transaction). kwargs: team. Received by
# `jobs.receivers` to create or update the team's Kubernetes namespace when that backend is on.
team_changed = Signal()
