"""Every change of a job's state: submit, transition, dispatch (admission + placement), resubmit and reproduce.
The attempt lifecycle (start, observe, finish, cancel, time out, reconcile) lives in `jobs.lifecycle`.

`job_transition` is the only writer of `Job.state`. Dispatch runs under the pool lock with the queue and
team rows locked, so concurrent submissions can never over-admit a hard quota.
"""

# ruff: noqa: F401 - what the rest of the platform reads of this package (each module is importable too)
from jobs.services.common import InvalidTransition
from jobs.services.rerun import job_reproduce, job_resubmit, job_submission_data
from jobs.services.submission import (
    _reference_card_mib,
    field_rank,
    job_batch_submit,
    job_submit,
    job_validate,
    request_fingerprint,
)
from jobs.services.templates import (
    TEMPLATE_LABEL,
    may_edit_template,
    template_create,
    template_delete,
    template_submit,
    template_update,
)
from jobs.services.transitions import event_record, job_transition
