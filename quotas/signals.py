"""What the quotas app tells the apps above it, by name (it imports none of them)."""

from django.dispatch import Signal

# A queue's settings changed and were saved (sent inside the transaction; receivers defer work to its commit).
# kwargs: queue. Received by `jobs.receivers` to push the Volcano Queue when that backend is on.
queue_changed = Signal()
